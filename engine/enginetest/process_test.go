package enginetest

import (
	"testing"

	"ptfs/decode"
	"ptfs/decode/ptenc"
	"ptfs/engine"
)

// TestPTWProcess replays three CPUs: records carry the process of their
// thread (from ITRACE_START and switches) and its name (a COMM of the main
// thread, else the lookup), a thread's own rename does not rename its
// process, an exit forgets the name, and %pid/%comm filters drop records
// of other or unknown processes, counted as filtered and not as losses.
func TestPTWProcess(t *testing.T) {
	r, err := NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	var col collector
	lookups := map[int32]int{}
	lookup := func(pid int32) string {
		lookups[pid]++
		if pid == 10 {
			return "boot"
		}
		return ""
	}
	p, err := engine.NewPTW(r, engine.PTWOptions{Comm: lookup}, col.sink)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	evPID := &decode.Event{ID: 0x700, Group: "ptfs_t", Name: "p", Args: []decode.Arg{{}}, Filter: decode.Filter{PID: 20}}
	evComm := &decode.Event{ID: 0x701, Group: "ptfs_t", Name: "c", Args: []decode.Arg{{}}, Filter: decode.Filter{Comm: "worker"}}
	for _, ev := range []*decode.Event{evA, evPID, evComm} {
		if err := p.Add(ev); err != nil {
			t.Fatal(err)
		}
	}
	at := func(e *ptenc.Encoder, tsc uint64, ev *decode.Event, args ...uint64) {
		e.TSC(tsc)
		e.Probe(ev.ID, stub, true, args...)
	}
	e0, e1, e2 := ptenc.New(), ptenc.New(), ptenc.New()
	psbPlus(e0, 100)
	at(e0, 100, evA, 1, 2)
	at(e0, 110, evPID, 3)  // pid 10: filtered
	at(e0, 120, evComm, 4) // "boot": filtered
	cut := e0.Len()
	at(e0, 300, evA, 5, 6) // after the exit of 10: looked up again
	psbPlus(e1, 200)
	at(e1, 200, evA, 7, 8)
	at(e1, 210, evPID, 9)
	at(e1, 220, evComm, 10)
	at(e1, 230, evA, 11, 12) // the other thread of 20, renamed itself
	psbPlus(e2, 100)
	at(e2, 100, evA, 13, 14) // no side band: no thread, no process
	at(e2, 110, evPID, 15)   // unknown process: filtered
	err = r.Queue(Batch{
		0: {
			TimeConv(conv(1e9)),
			Side(engine.SideEvent{Kind: engine.SideITraceStart, Time: 1e9, PID: 10, TID: 100}),
			Trace(e0.Bytes()[:cut]),
		},
		1: {
			TimeConv(conv(1e9)),
			Side(engine.SideEvent{Kind: engine.SideITraceStart, Time: 1e9 + 10, PID: 20, TID: 200}),
			Side(engine.SideEvent{Kind: engine.SideComm, Time: 1e9 + 20, PID: 20, TID: 20, Comm: "worker"}),
			Side(engine.SideEvent{Kind: engine.SideSwitchOut, Time: 1e9 + 225, PID: 20, TID: 200, NextPID: 20, NextTID: 201}),
			Side(engine.SideEvent{Kind: engine.SideComm, Time: 1e9 + 226, PID: 20, TID: 201, Comm: "helper"}),
			Trace(e1.Bytes()),
		},
		2: {TimeConv(conv(1e9)), Trace(e2.Bytes())},
	}, Batch{
		0: {
			Side(engine.SideEvent{Kind: engine.SideExit, Time: 1e9 + 250, PID: 10, TID: 10}),
			Trace(e0.Bytes()[cut:]),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Remove(evComm.ID); err != nil {
		t.Fatal(err)
	}
	checkLines(t, col.take(),
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=1, y=2] tid=100 cpu=0 time=1.000000100 pid=10 comm=boot",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=13, y=14] cpu=2 time=1.000000100",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=7, y=8] tid=200 cpu=1 time=1.000000200 pid=20 comm=worker",
		"record 1: event=ptfs_t/p id=0x700 args=[9] tid=200 cpu=1 time=1.000000210 pid=20 comm=worker",
		"record 1: event=ptfs_t/c id=0x701 args=[10] tid=200 cpu=1 time=1.000000220 pid=20 comm=worker",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=11, y=12] tid=201 cpu=1 time=1.000000230 pid=20 comm=worker",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=5, y=6] tid=100 cpu=0 time=1.000000300 pid=10 comm=boot",
	)
	st := p.Stats()
	if st.Filtered != 3 || st.Decode.Dropped != 0 || st.Decode.Errors != 0 {
		t.Errorf("filtered %d dropped %d errors %d, want 3 0 0", st.Filtered, st.Decode.Dropped, st.Decode.Errors)
	}
	// 10 looked up at its first record and again after its exit; 20
	// named by its COMM; the unknown process never.
	if lookups[10] != 2 || lookups[20] != 0 || len(lookups) != 1 {
		t.Errorf("lookups %v, want 10 twice", lookups)
	}
}
