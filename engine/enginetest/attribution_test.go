package enginetest

import (
	"testing"
	"time"

	"ptfs/decode"
	"ptfs/decode/ptenc"
	"ptfs/engine"
)

// at returns the trace of one hit of evA with args x and y at tsc, after a
// PSB+ (a trace resumed after a flush begins with one).
func at(tsc, x, y uint64) []byte {
	e := ptenc.New()
	psbPlus(e, tsc)
	e.Probe(evA.ID, stub, true, x, y)
	return e.Bytes()
}

func sw(kind engine.SideKind, time uint64, tid, next int32) Step {
	return Side(engine.SideEvent{Kind: kind, Time: time, TID: tid, NextTID: next})
}

// TestPTWAttributionWindows replays the windows in which a CPU's thread is
// known or not: before its first ITRACE_START, across a flush window whose
// switches the side band still delivers (the dummy tracking event keeps
// recording while PT is stopped), after side band lost on one CPU
// (LossSideBand) and on all (a LOST out of CPU range). A record gets the
// thread that ran at its time or none, never the thread of before the
// loss.
func TestPTWAttributionWindows(t *testing.T) {
	r, err := NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	var col collector
	p := newPTW(t, r, &col, evA)
	err = r.Queue(
		Batch{
			0: {
				TimeConv(conv(0)),
				Trace(at(5, 0, 5)), // before ITRACE_START: unknown
				sw(engine.SideITraceStart, 10, 100, 0),
				Trace(at(20, 0, 20)),
				// A flush window with two switches in it.
				Loss(engine.LossFlush, 1),
				sw(engine.SideSwitchOut, 30, 100, 101),
				sw(engine.SideSwitchIn, 30, 101, 0),
				sw(engine.SideSwitchOut, 50, 101, 102),
				sw(engine.SideSwitchIn, 50, 102, 0),
				Trace(append(at(45, 0, 45), at(55, 0, 55)...)),
				// Side band lost after the switch at 50: a switch may be
				// among the lost records, so 102 is not known to run.
				Loss(engine.LossSideBand, 2),
				Trace(append(at(60, 0, 60), at(75, 0, 75)...)),
				sw(engine.SideSwitchIn, 80, 103, 0),
				Trace(at(85, 0, 85)),
			},
			1: {
				TimeConv(conv(0)),
				sw(engine.SideITraceStart, 10, 200, 0),
				Trace(at(15, 1, 15)),
			},
		},
		// A LOST record of no known CPU: no CPU's thread is known.
		Batch{9000: {Loss(engine.LossSideBand, 3)}},
		Batch{
			0: {Trace(at(90, 0, 90))},
			1: {
				Trace(at(95, 1, 95)),
				sw(engine.SideSwitchIn, 100, 201, 0),
				Trace(at(105, 1, 105)),
			},
		},
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	checkLines(t, col.take(),
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=5] cpu=0 time=0.000000005",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=1, y=15] tid=200 cpu=1 time=0.000000015",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=20] tid=100 cpu=0 time=0.000000020",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=45] tid=101 cpu=0 time=0.000000045",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=55] tid=102 cpu=0 time=0.000000055",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=60] cpu=0 time=0.000000060",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=75] cpu=0 time=0.000000075",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=85] tid=103 cpu=0 time=0.000000085",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=90] cpu=0 time=0.000000090",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=1, y=95] cpu=1 time=0.000000095",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=1, y=105] tid=201 cpu=1 time=0.000000105",
	)
	st := p.Stats()
	if st.Unattributed != 5 || st.Untimed != 0 || st.Late != 0 ||
		st.Losses[engine.LossSideBand] != 2+3 || st.Losses[engine.LossFlush] != 1 ||
		st.Decode != (decode.Counters{Records: 11, Errors: 2 + 3}) {
		t.Errorf("stats %+v", st)
	}
}

// TestPTWNoTimeConv replays a CPU whose mmap page had no
// cap_user_time_zero (no TimeConv) beside one that had it. Its records
// carry neither time (never time 0) nor thread, are counted, and go out
// at the next round by arrival, while the timed CPU's records are held
// back for ordering; nothing counts as late.
func TestPTWNoTimeConv(t *testing.T) {
	r, err := NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	var col collector
	// A latency no loaded machine reaches between two rounds: the timed
	// record must be held until the flush.
	p, err := engine.NewPTW(r, engine.PTWOptions{Latency: time.Hour}, col.sink)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if err := p.Add(evA); err != nil {
		t.Fatal(err)
	}
	err = r.Queue(Batch{
		0: {
			sw(engine.SideITraceStart, 10, 100, 0),
			Trace(append(at(1e6, 0, 1), at(2e6, 0, 2)...)),
		},
		1: {
			TimeConv(conv(0)),
			sw(engine.SideITraceStart, 10, 200, 0),
			Trace(at(1500, 1, 1)),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	// The timed record is held back; the untimed ones are
	// not held behind it.
	checkLines(t, col.take(),
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=1] cpu=0",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=2] cpu=0",
	)
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	checkLines(t, col.take(), "record 1: event=ptfs_t/a id=0x6c2 args=[x=1, y=1] tid=200 cpu=1 time=0.000001500")
	// Released after a timed record: merged behind what went out, not
	// before it, so neither late nor held.
	if err := r.Queue(Batch{0: {Trace(at(3e6, 0, 3))}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	checkLines(t, col.take(), "record 1: event=ptfs_t/a id=0x6c2 args=[x=0, y=3] cpu=0")
	st := p.Stats()
	if st.Untimed != 3 || st.Unattributed != 3 || st.Late != 0 || st.CPUs != 2 || st.NoTimeConv != 1 ||
		st.Records != 4 {
		t.Errorf("stats %+v", st)
	}
}
