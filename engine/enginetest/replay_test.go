package enginetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"ptfs/decode"
	"ptfs/decode/ptenc"
	"ptfs/engine"
	"ptfs/perfdata"
)

// callLog is a TraceSink that logs its calls.
type callLog struct {
	mu    sync.Mutex
	calls []string
	kept  []byte // the last Trace's data, kept against the contract
	seen  []byte // what kept held during the call
}

func (l *callLog) add(s string) {
	l.mu.Lock()
	l.calls = append(l.calls, s)
	l.mu.Unlock()
}

func (l *callLog) TimeConv(cpu int, tc perfdata.TimeConv) {
	l.add(fmt.Sprintf("tc %d %d", cpu, tc.Zero))
}
func (l *callLog) Trace(cpu int, data []byte) {
	l.kept = data
	l.seen = slices.Clone(data)
	l.add(fmt.Sprintf("trace %d %x", cpu, data))
}
func (l *callLog) Loss(cpu int, why engine.LossKind, n uint64) {
	l.add(fmt.Sprintf("loss %d %s %d", cpu, why, n))
}
func (l *callLog) Side(cpu int, ev *engine.SideEvent) {
	l.add(fmt.Sprintf("side %d %d tid %d", cpu, ev.Kind, ev.TID))
}
func (l *callLog) Round(flush bool) { l.add(fmt.Sprintf("round %v", flush)) }

func (l *callLog) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.Join(l.calls, "; ")
	l.calls = nil
	return s
}

func TestReplay(t *testing.T) {
	r, err := NewReplay(Batch{
		1: {Trace([]byte{1, 2})},
		0: {TimeConv(perfdata.TimeConv{Zero: 5}), Side(engine.SideEvent{Kind: engine.SideSwitchIn, TID: 9})},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Flush before Start: %v", err)
	}
	if err := r.Stop(); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Stop before Start: %v", err)
	}
	if err := r.Queue(Batch{0: {{Kind: 0}}}); !errors.Is(err, ErrBadStep) {
		t.Errorf("Queue of a step without kind: %v", err)
	}
	if err := r.Queue(Batch{-1: {Trace(nil)}}); !errors.Is(err, ErrBadStep) {
		t.Errorf("Queue for cpu -1: %v", err)
	}
	var l callLog
	if err := r.Start(&l); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(&l); !errors.Is(err, ErrRunning) {
		t.Errorf("second Start: %v", err)
	}
	if err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	if got, want := l.take(), "tc 0 5; side 0 2 tid 9; trace 1 0102; round false; round false"; got != want {
		t.Errorf("first batch and Sync:\n got %s\nwant %s", got, want)
	}
	if !slices.Equal(l.seen, []byte{1, 2}) || !slices.Equal(l.kept, []byte{0xff, 0xff}) {
		t.Errorf("trace data %x during the call, %x after; want it overwritten after", l.seen, l.kept)
	}
	if err := r.Queue(Batch{0: {Loss(engine.LossTruncated, 1)}}, Batch{1: {Loss(engine.LossSideBand, 3)}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, want := l.take(), "loss 0 aux truncated 1; round false; loss 1 side band lost 3; round false; round true"; got != want {
		t.Errorf("two batches and Flush:\n got %s\nwant %s", got, want)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := l.take(), "round true"; got != want {
		t.Errorf("Stop: got %s, want %s", got, want)
	}
	r.FailNextStart(errors.New("boom"))
	if err := r.Start(&l); err == nil || r.Running() {
		t.Errorf("Start after FailNextStart: %v, running %v", err, r.Running())
	}
	if err := r.Start(&l); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if s, st, f := r.Counts(); s != 2 || st != 2 || f != 1 {
		t.Errorf("counts: %d starts, %d stops, %d flushes", s, st, f)
	}
}

// collector is a Sink that keeps copies of the records and notices
// concurrent calls, which the contract forbids.
type collector struct {
	mu   sync.Mutex
	recs []decode.Record
	in   atomic.Int32
	bad  atomic.Bool
}

func (c *collector) sink(rs []decode.Record) {
	if c.in.Add(1) != 1 {
		c.bad.Store(true)
	}
	c.mu.Lock()
	c.recs = append(c.recs, rs...)
	c.mu.Unlock()
	c.in.Add(-1)
}

func (c *collector) take() []decode.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.recs
	c.recs = nil
	return r
}

// Events as LoadEvents would build them from the format files of ptw
// probes; the ids are those tracefs gave.
var (
	evA = &decode.Event{ID: 0x6c2, Group: "ptfs_t", Name: "a", Args: []decode.Arg{{Name: "x"}, {Name: "y"}}}
	evB = &decode.Event{ID: 0x6c3, Group: "ptfs_t", Name: "b", Args: []decode.Arg{{Type: decode.X32}}}
)

const stub = 0x7ffff7ff0000

// conv converts TSC to ns as tsc + zero.
func conv(zero uint64) perfdata.TimeConv {
	return perfdata.TimeConv{Shift: 10, Mult: 1024, Zero: zero}
}

// psbPlus starts a stream (or resumes after a gap) at tsc.
func psbPlus(e *ptenc.Encoder, tsc uint64) {
	e.PSB()
	e.TSC(tsc)
	e.ModeExec(true, false)
	e.PSBEnd()
}

// newPTW returns a PTW on r that is closed at cleanup.
func newPTW(t *testing.T, r *Replay, col *collector, evs ...*decode.Event) *engine.PTW {
	t.Helper()
	p, err := engine.NewPTW(r, engine.PTWOptions{}, col.sink)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if col.bad.Load() {
			t.Errorf("concurrent sink calls")
		}
	})
	for _, ev := range evs {
		if err := p.Add(ev); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// line formats r as the records file does, with the record's own TID, CPU
// and time.
func line(r decode.Record) string {
	return strings.TrimSuffix(string(decode.AppendRecord(nil, 1, &r)), "\n")
}

func lines(recs []decode.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, line(r))
	}
	return out
}

func checkLines(t *testing.T, recs []decode.Record, want ...string) {
	t.Helper()
	got := lines(recs)
	if !slices.Equal(got, want) {
		t.Errorf("records:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
}

// TestPTWTwoCPUs replays two CPUs whose records interleave in time, with
// thread switches in the side band and a record cut by a chunk boundary.
func TestPTWTwoCPUs(t *testing.T) {
	r, err := NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	var col collector
	p := newPTW(t, r, &col, evA, evB)
	if s, _, _ := r.Counts(); s != 1 {
		t.Fatalf("%d starts after two Adds, want 1", s)
	}
	// The trace is built once the event ids are known, as a live probe's.
	e0 := ptenc.New()
	psbPlus(e0, 100)
	e0.Probe(evA.ID, stub, true, 1, 2)
	e0.TSC(300)
	e0.Probe(evB.ID, stub+0x40, true, 0xdead)
	e1 := ptenc.New()
	psbPlus(e1, 100)
	e1.Probe(evA.ID, stub, true, 3, 4)
	e1.TSC(200)
	e1.Probe(evB.ID, stub+0x40, true, 0xbeef)
	cut := e0.Len() - 5 // inside the last argument word
	err = r.Queue(
		Batch{
			0: {
				TimeConv(conv(1e9)),
				Side(engine.SideEvent{Kind: engine.SideITraceStart, Time: 1e9, PID: 10, TID: 100}),
				// The switch precedes the AUX record whose bytes it falls
				// among, as in the data ring.
				Side(engine.SideEvent{Kind: engine.SideSwitchOut, Time: 1e9 + 250, PID: 10, TID: 100, NextPID: 10, NextTID: 101}),
				Trace(e0.Bytes()[:cut]),
			},
			1: {
				TimeConv(conv(1e9 + 50)),
				Side(engine.SideEvent{Kind: engine.SideITraceStart, Time: 1e9 + 10, PID: 20, TID: 200}),
				Side(engine.SideEvent{Kind: engine.SideSwitchIn, Time: 1e9 + 200, PID: 20, TID: 201}),
				Side(engine.SideEvent{Kind: engine.SideComm, Time: 1e9 + 200, PID: 20, TID: 201, Comm: "t"}),
				Trace(e1.Bytes()),
			},
		},
		Batch{0: {Trace(e0.Bytes()[cut:])}},
	)
	if err != nil {
		t.Fatal(err)
	}
	// Remove flushes: every record traced so far reaches the sink first.
	if err := p.Remove(evB.ID); err != nil {
		t.Fatal(err)
	}
	checkLines(t, col.take(),
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=1, y=2] tid=100 cpu=0 time=1.000000100 pid=10",
		"record 1: event=ptfs_t/a id=0x6c2 args=[x=3, y=4] tid=200 cpu=1 time=1.000000150 pid=20",
		"record 1: event=ptfs_t/b id=0x6c3 args=[0xbeef] tid=201 cpu=1 time=1.000000250 pid=20",
		"record 1: event=ptfs_t/b id=0x6c3 args=[0xdead] tid=101 cpu=0 time=1.000000300 pid=10",
	)
	st := p.Stats()
	want := engine.PTWStats{
		Records: 4,
		Bytes:   uint64(e0.Len() + e1.Len()),
		Side:    engine.SideStats{ITraceStart: 2, SwitchIn: 1, SwitchOut: 1, Comm: 1},
		CPUs:    2,
		Decode:  decode.Counters{Records: 4},
	}
	if st != want {
		t.Errorf("stats\n got %+v\nwant %+v", st, want)
	}
	if _, stops, flushes := r.Counts(); stops != 0 || flushes != 1 {
		t.Errorf("Remove of one of two events: %d stops, %d flushes", stops, flushes)
	}
	if err := p.Remove(evA.ID); err != nil {
		t.Fatal(err)
	}
	if _, stops, _ := r.Counts(); stops != 1 || r.Running() {
		t.Errorf("last Remove: %d stops, running %v", stops, r.Running())
	}
}

// TestPTWLosses replays each kind of loss on CPU 0 while CPU 1 runs clean:
// no record spans a loss, every loss is counted, records after the next
// PSB are fine.
func TestPTWLosses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps func() []Step
		want  []string
		check func(st engine.PTWStats) bool
	}{
		{
			name: "overflow mid-record",
			steps: func() []Step {
				e := ptenc.New()
				psbPlus(e, 10)
				e.PTW(ptenc.Header(evA.ID, 2), 8, true)
				e.IP(ptenc.FUP, stub)
				e.PTW(7, 8, true)
				e.IP(ptenc.FUP, stub+8)
				e.OVF()
				e.IP(ptenc.FUP, 0x401000)
				e.PTW(8, 8, false) // the rest of the hit, now stray
				psbPlus(e, 30)
				e.Probe(evA.ID, stub, true, 5, 6)
				return []Step{Trace(e.Bytes())}
			},
			want: []string{
				"record 1: event=ptfs_t/b id=0x6c3 args=[0x1] cpu=1 time=0.000000020",
				"record 1: event=ptfs_t/a id=0x6c2 args=[x=5, y=6] tid=7 cpu=0 time=0.000000030",
			},
			check: func(st engine.PTWStats) bool {
				return st.Decode == decode.Counters{Records: 2, Dropped: 1, Stray: 1, Errors: 1} && st.Manual == 1
			},
		},
		{
			name: "aux truncated mid-record",
			steps: func() []Step {
				e := ptenc.New()
				psbPlus(e, 10)
				e.PTW(ptenc.Header(evA.ID, 2), 8, true)
				e.IP(ptenc.FUP, stub)
				e.PTW(1, 8, true)
				before := slices.Clone(e.Bytes())
				e = ptenc.New()
				e.PTW(2, 8, true) // would complete the record across the gap
				e.IP(ptenc.FUP, stub+16)
				psbPlus(e, 30)
				e.Probe(evA.ID, stub, true, 8, 9)
				return []Step{Trace(before), Loss(engine.LossTruncated, 1), Trace(e.Bytes())}
			},
			want: []string{
				"record 1: event=ptfs_t/b id=0x6c3 args=[0x1] cpu=1 time=0.000000020",
				"record 1: event=ptfs_t/a id=0x6c2 args=[x=8, y=9] tid=7 cpu=0 time=0.000000030",
			},
			check: func(st engine.PTWStats) bool {
				return st.Decode == decode.Counters{Records: 2, Dropped: 1, Errors: 1} &&
					st.Losses[engine.LossTruncated] == 1
			},
		},
		{
			name: "unknown event id",
			steps: func() []Step {
				e := ptenc.New()
				psbPlus(e, 30)
				e.Probe(0x99, stub, true, 1, 2)
				e.Probe(evA.ID, stub, true, 3, 4)
				return []Step{Trace(e.Bytes())}
			},
			want: []string{
				"record 1: event=ptfs_t/b id=0x6c3 args=[0x1] cpu=1 time=0.000000020",
				"record 1: event=ptfs_t/a id=0x6c2 args=[x=3, y=4] tid=7 cpu=0 time=0.000000030",
			},
			check: func(st engine.PTWStats) bool {
				return st.Decode == decode.Counters{Records: 2, Stray: 3} && st.Manual == 3
			},
		},
		{
			// The lost records may have held a switch: TID 7 is not
			// known to run any more, and no other thread is.
			name: "side band lost",
			steps: func() []Step {
				e := ptenc.New()
				psbPlus(e, 30)
				e.Probe(evA.ID, stub, true, 3, 4)
				return []Step{Loss(engine.LossSideBand, 5), Trace(e.Bytes())}
			},
			want: []string{
				"record 1: event=ptfs_t/b id=0x6c3 args=[0x1] cpu=1 time=0.000000020",
				"record 1: event=ptfs_t/a id=0x6c2 args=[x=3, y=4] cpu=0 time=0.000000030",
			},
			check: func(st engine.PTWStats) bool {
				return st.Decode == decode.Counters{Records: 2, Errors: 5} && st.Losses[engine.LossSideBand] == 5 &&
					st.Unattributed == 2
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e1 := ptenc.New()
			psbPlus(e1, 20)
			e1.Probe(evB.ID, stub, false, 1)
			steps0 := append([]Step{
				TimeConv(conv(0)),
				// TID 7 runs on CPU 0 from time 25: the record at 30 is
				// its, CPU 1 has no side band (TID unknown).
				Side(engine.SideEvent{Kind: engine.SideITraceStart, Time: 25, TID: 7}),
			}, tc.steps()...)
			r, err := NewReplay()
			if err != nil {
				t.Fatal(err)
			}
			var col collector
			// Both events are known before the trace plays: the
			// source starts at the first Add.
			p := newPTW(t, r, &col, evA, evB)
			if err := r.Queue(Batch{0: steps0, 1: {TimeConv(conv(0)), Trace(e1.Bytes())}}); err != nil {
				t.Fatal(err)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			checkLines(t, col.take(), tc.want...)
			if st := p.Stats(); !tc.check(st) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestPTWRestart: the last Remove stops the source, the next Add starts it
// again, and the new trace decodes from its own start.
func TestPTWRestart(t *testing.T) {
	r, err := NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	var col collector
	p := newPTW(t, r, &col, evA)
	e := ptenc.New()
	psbPlus(e, 10)
	e.Probe(evA.ID, stub, true, 1, 2)
	e.PTW(ptenc.Header(evA.ID, 2), 8, true) // cut by the stop
	e.IP(ptenc.FUP, stub)
	if err := r.Queue(Batch{0: {TimeConv(conv(0)), Trace(e.Bytes())}}); err != nil {
		t.Fatal(err)
	}
	if err := p.Remove(evA.ID); err != nil {
		t.Fatal(err)
	}
	if got := len(col.take()); got != 1 {
		t.Fatalf("%d records before the stop, want 1", got)
	}
	if err := p.Add(evA); err != nil {
		t.Fatal(err)
	}
	e = ptenc.New()
	psbPlus(e, 50)
	e.Probe(evA.ID, stub, true, 3, 4)
	if err := r.Queue(Batch{0: {TimeConv(conv(0)), Trace(e.Bytes())}}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	checkLines(t, col.take(), "record 1: event=ptfs_t/a id=0x6c2 args=[x=3, y=4] cpu=0 time=0.000000050")
	if s, st, _ := r.Counts(); s != 2 || st != 2 {
		t.Errorf("%d starts, %d stops, want 2 and 2", s, st)
	}
	if st := p.Stats(); st.Decode != (decode.Counters{Records: 2, Dropped: 2}) {
		t.Errorf("stats %+v", st)
	}
}

// TestPTWStartFails: an Add whose Start fails leaves nothing behind.
func TestPTWStartFails(t *testing.T) {
	r, err := NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	var col collector
	p := newPTW(t, r, &col)
	boom := errors.New("no intel_pt")
	r.FailNextStart(boom)
	if err := p.Add(evA); !errors.Is(err, boom) {
		t.Fatalf("Add: %v, want %v", err, boom)
	}
	if err := p.Remove(evA.ID); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("Remove after the failed Add: %v", err)
	}
	if err := p.Add(evA); err != nil {
		t.Fatalf("Add again: %v", err)
	}
}

// TestPTWConcurrent runs Stats, Add and Remove against a replay that plays
// batch after batch; run it with -race.
func TestPTWConcurrent(t *testing.T) {
	r, err := NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	var col collector
	p := newPTW(t, r, &col, evA)
	const batches = 200
	var wg, statsWG sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(2)
	statsWG.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(0); i < batches; i++ {
			b := Batch{}
			for cpu := 0; cpu < 2; cpu++ {
				e := ptenc.New()
				psbPlus(e, 1000*i+10*uint64(cpu))
				e.Probe(evA.ID, stub, true, i, uint64(cpu))
				b[cpu] = []Step{TimeConv(conv(0)), Trace(e.Bytes())}
			}
			if err := r.Queue(b); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer statsWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
				p.Stats()
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 50; i++ {
			if err := p.Add(evB); err != nil {
				t.Error(err)
				return
			}
			if err := p.Remove(evB.ID); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	statsWG.Wait()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	recs := col.take()
	if len(recs) != 2*batches {
		t.Fatalf("%d records, want %d", len(recs), 2*batches)
	}
	for i, rec := range recs {
		if want := uint64(1000*(i/2) + 10*(i%2)); rec.Time != want || rec.CPU != int32(i%2) {
			t.Fatalf("record %d: time %d cpu %d, want %d and %d", i, rec.Time, rec.CPU, want, i%2)
		}
	}
	if st := p.Stats(); st.Late != 0 || st.Records != 2*batches {
		t.Errorf("stats %+v", st)
	}
	if _, _, flushes := r.Counts(); flushes != 50 {
		t.Errorf("%d flushes, want one per Remove of a second event", flushes)
	}
}

// TestReplayStopDuringFlush: a Flush racing a Stop returns, served or
// refused, and never blocks.
func TestReplayStopDuringFlush(t *testing.T) {
	r, err := NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	var l callLog
	for i := 0; i < 100; i++ {
		if err := r.Start(&l); err != nil {
			t.Fatal(err)
		}
		res := make(chan error, 1)
		go func() { res <- r.Flush() }()
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := <-res; err != nil && !errors.Is(err, ErrNotRunning) {
			t.Fatalf("Flush during Stop: %v", err)
		}
	}
}
