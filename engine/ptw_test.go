package engine

import (
	"errors"
	"slices"
	"testing"
	"time"

	"ptfs/decode"
	"ptfs/decode/ptenc"
	"ptfs/internal/testkit"
	"ptfs/perfdata"
)

// The Replay-driven tests of PTW (two CPUs, losses, Remove, restarts,
// races) are in enginetest, which imports this package. These tests drive
// the sink directly, from the test goroutine, through stepSource.

// stepSource is a TraceSource whose "reader" is the test itself: the test
// calls the sink, and Flush and Stop only end with Round(true).
type stepSource struct {
	sink                   TraceSink
	starts, stops, flushes int
	startErr               error
}

func (s *stepSource) Start(sink TraceSink) error {
	if s.startErr != nil {
		return s.startErr
	}
	s.sink = sink
	s.starts++
	return nil
}

func (s *stepSource) Flush() error {
	s.flushes++
	s.sink.Round(true)
	return nil
}

func (s *stepSource) Stop() error {
	s.stops++
	s.sink.Round(true)
	s.sink = nil
	return nil
}

// identity converts TSC to ns as ns = tsc + zero.
func identity(zero uint64) perfdata.TimeConv {
	return perfdata.TimeConv{Shift: 10, Mult: 1024, Zero: zero}
}

var (
	evA = &decode.Event{ID: 0x10, Group: "g", Name: "a", Args: []decode.Arg{{Name: "x"}, {Name: "y"}}}
	evB = &decode.Event{ID: 0x20, Group: "g", Name: "b", Args: []decode.Arg{{Type: decode.X32}}}
)

// newTestPTW returns a PTW on a stepSource with a clock the test sets, and
// the records it delivers.
func newTestPTW(t testing.TB, o PTWOptions) (*PTW, *stepSource, *time.Duration, *[]decode.Record) {
	t.Helper()
	src := &stepSource{}
	var got []decode.Record
	p, err := NewPTW(src, o, func(rs []decode.Record) { got = append(got, rs...) })
	if err != nil {
		t.Fatal(err)
	}
	now := new(time.Duration)
	p.clock = func() time.Duration { return *now }
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return p, src, now, &got
}

// hit returns the trace of one hit of ev with args at tsc, after a PSB+.
func hit(tsc uint64, ev *decode.Event, args ...uint64) []byte {
	e := ptenc.New()
	e.PSB()
	e.TSC(tsc)
	e.PSBEnd()
	e.Probe(ev.ID, 0x7fff0000, true, args...)
	return e.Bytes()
}

func TestPTWOptions(t *testing.T) {
	src := &stepSource{}
	sink := func([]decode.Record) {}
	for _, tc := range []struct {
		name string
		src  TraceSource
		o    PTWOptions
		sink Sink
	}{
		{"nil source", nil, PTWOptions{}, sink},
		{"nil sink", src, PTWOptions{}, nil},
		{"negative latency", src, PTWOptions{Latency: -1}, sink},
		{"negative pending", src, PTWOptions{MaxPending: -1}, sink},
	} {
		if _, err := NewPTW(tc.src, tc.o, tc.sink); !errors.Is(err, ErrOptions) {
			t.Errorf("%s: %v, want ErrOptions", tc.name, err)
		}
	}
	p, err := NewPTW(src, PTWOptions{}, sink)
	if err != nil {
		t.Fatal(err)
	}
	if p.latency != DefaultPTWLatency || p.merge.max != MaxPending {
		t.Errorf("defaults: latency %v, max pending %d", p.latency, p.merge.max)
	}
	if err := p.Add(nil); !errors.Is(err, ErrBadEvent) {
		t.Errorf("Add(nil): %v, want ErrBadEvent", err)
	}
	if err := p.Add(&decode.Event{ID: 1, Args: make([]decode.Arg, 9)}); !errors.Is(err, ErrBadEvent) {
		t.Errorf("Add of 9 arguments: %v, want ErrBadEvent", err)
	}
	if src.starts != 0 {
		t.Errorf("a refused Add started the source")
	}
}

func TestPTWLifecycle(t *testing.T) {
	p, src, _, got := newTestPTW(t, PTWOptions{})
	if err := p.Remove(evA.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Remove before Add: %v, want ErrNotFound", err)
	}
	src.startErr = errors.New("no pt")
	if err := p.Add(evA); !errors.Is(err, src.startErr) {
		t.Fatalf("Add with a failing Start: %v", err)
	}
	src.startErr = nil
	if err := p.Add(evA); err != nil {
		t.Fatalf("Add after a failed Start: %v", err)
	}
	if err := p.Add(evA); !errors.Is(err, ErrExists) {
		t.Errorf("second Add: %v, want ErrExists", err)
	}
	if err := p.Add(evB); err != nil {
		t.Fatal(err)
	}
	if src.starts != 1 {
		t.Fatalf("starts %d after two Adds, want 1", src.starts)
	}
	s := src.sink
	s.TimeConv(0, identity(0))
	s.Trace(0, hit(100, evA, 1, 2))
	s.Trace(0, hit(200, evB, 3))
	s.Round(false)
	if len(*got) != 0 {
		t.Fatalf("records went out before the latency: %v", times(*got))
	}
	if err := p.Remove(evA.ID); err != nil {
		t.Fatal(err)
	}
	if len(*got) != 2 || src.flushes != 1 || src.stops != 0 {
		t.Fatalf("Remove of one of two: %d records, %d flushes, %d stops", len(*got), src.flushes, src.stops)
	}
	// evA is gone: its hits are stray now.
	s.Trace(0, hit(300, evA, 1, 2))
	s.Trace(0, hit(400, evB, 4))
	if err := p.Remove(evB.ID); err != nil {
		t.Fatal(err)
	}
	if len(*got) != 3 || src.stops != 1 {
		t.Fatalf("last Remove: %d records, %d stops", len(*got), src.stops)
	}
	st := p.Stats()
	if st.Records != 3 || st.Decode.Records != 3 || st.Decode.Stray != 3 || st.Manual != 3 {
		t.Errorf("stats %+v", st)
	}
	if err := p.Add(evB); err != nil || src.starts != 2 {
		t.Fatalf("Add after the last Remove: %v, starts %d", err, src.starts)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if src.stops != 2 {
		t.Errorf("Close of a running PTW: stops %d, want 2", src.stops)
	}
	if err := p.Close(); err != nil || src.stops != 2 {
		t.Errorf("second Close: %v, stops %d", err, src.stops)
	}
	if err := p.Add(evA); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close: %v", err)
	}
	if err := p.Remove(evB.ID); !errors.Is(err, ErrClosed) {
		t.Errorf("Remove after Close: %v", err)
	}
}

// TestPTWHoldBack checks the release rule: a record goes out at a Round
// once the highest record time seen Latency ago reaches it.
func TestPTWHoldBack(t *testing.T) {
	p, src, now, got := newTestPTW(t, PTWOptions{Latency: time.Second})
	if err := p.Add(evA); err != nil {
		t.Fatal(err)
	}
	s := src.sink
	s.TimeConv(0, identity(1000))
	s.TimeConv(1, identity(1000))
	s.Trace(0, hit(100, evA, 1, 1))
	s.Trace(0, hit(300, evA, 2, 2))
	s.Round(false) // t=0: seen 1300
	*now = 500 * time.Millisecond
	s.Trace(1, hit(200, evA, 3, 3))
	s.Trace(1, hit(400, evA, 4, 4))
	s.Round(false) // t=0.5s: seen 1400
	if len(*got) != 0 {
		t.Fatalf("released before the latency: %v", times(*got))
	}
	*now = time.Second
	s.Round(false) // watermark 1300
	if want := []uint64{1100, 1200, 1300}; !slices.Equal(times(*got), want) {
		t.Fatalf("at 1s: %v, want %v", times(*got), want)
	}
	// A record stamped before what went out arrives late.
	s.Trace(0, hit(250, evA, 5, 5))
	*now = 1500 * time.Millisecond
	s.Round(false) // watermark 1400
	if want := []uint64{1100, 1200, 1300, 1250, 1400}; !slices.Equal(times(*got), want) {
		t.Fatalf("at 1.5s: %v, want %v", times(*got), want)
	}
	if st := p.Stats(); st.Late != 1 || st.Records != 5 {
		t.Errorf("late %d records %d, want 1 and 5", st.Late, st.Records)
	}
}

func TestPTWPendingBound(t *testing.T) {
	p, src, _, got := newTestPTW(t, PTWOptions{MaxPending: 2})
	if err := p.Add(evA); err != nil {
		t.Fatal(err)
	}
	s := src.sink
	s.TimeConv(0, identity(0))
	for tsc := uint64(1); tsc <= 4; tsc++ {
		s.Trace(0, hit(tsc, evA, tsc, tsc))
	}
	s.Round(false)
	if want := []uint64{1, 2}; !slices.Equal(times(*got), want) {
		t.Fatalf("over the bound: %v, want the oldest %v", times(*got), want)
	}
	s.Round(true)
	if want := []uint64{1, 2, 3, 4}; !slices.Equal(times(*got), want) {
		t.Fatalf("after a flush: %v, want %v", times(*got), want)
	}
}

// TestPTWBadCalls feeds what a broken source could pass: nothing panics,
// everything is counted.
func TestPTWBadCalls(t *testing.T) {
	p, src, _, got := newTestPTW(t, PTWOptions{})
	if err := p.Add(evA); err != nil {
		t.Fatal(err)
	}
	s := src.sink
	s.Trace(-1, hit(1, evA, 1, 1))
	s.Trace(maxCPUs, hit(1, evA, 1, 1))
	s.TimeConv(-5, identity(0))
	s.Side(1<<20, &SideEvent{Kind: SideSwitchIn})
	s.Loss(-1, LossTruncated, 1)
	s.Side(0, &SideEvent{Kind: 99})
	s.Side(0, nil)
	s.Loss(0, NumLossKinds+3, 1)
	s.Trace(0, []byte{0xff, 0xff, 0x02})
	s.Round(true)
	st := p.Stats()
	if len(*got) != 0 || st.Decode.Errors < 6 || st.Side.Other != 2 || st.Losses[LossTruncated] != 1 {
		t.Errorf("records %d, stats %+v", len(*got), st)
	}
}

func TestTimeline(t *testing.T) {
	type op struct {
		add   bool // else lookup
		trace bool
		lost  bool
		time  uint64
		tid   int32 // added, or wanted
	}
	add := func(tm uint64, tid int32) op { return op{add: true, time: tm, tid: tid} }
	at := func(tm uint64, want int32) op { return op{time: tm, tid: want} }
	trace := op{trace: true}
	lost := op{lost: true}
	for _, tc := range []struct {
		name string
		ops  []op
		len  int // entries left
	}{
		{"empty", []op{at(5, -1)}, 0},
		{"before the first entry", []op{add(10, 1), at(9, -1), at(10, 1)}, 1},
		{"switches", []op{add(10, 1), add(20, 2), add(30, 3), at(15, 1), at(20, 2), at(25, 2), at(99, 3)}, 3},
		{"out of order lookup", []op{add(10, 1), add(20, 2), at(25, 2), at(15, 1)}, 2},
		{"out of order add clamps", []op{add(20, 1), add(10, 2), at(15, -1), at(20, 2)}, 2},
		{"prune to the entry current at the previous trace",
			[]op{add(10, 1), add(20, 2), add(25, 5), trace, add(30, 3), trace, at(27, 5), at(35, 3)}, 2},
		{"prune behind the cursor",
			[]op{add(10, 1), add(20, 2), add(30, 3), at(35, 3), trace}, 1},
		{"nothing to prune", []op{trace, add(10, 1), trace, at(10, 1)}, 1},
		{"lost: unknown from the last switch on", []op{add(10, 1), add(20, 2), lost, at(15, 1), at(20, -1), at(99, -1)}, 3},
		{"lost, then a switch", []op{add(10, 1), lost, add(30, 3), at(25, -1), at(30, 3)}, 3},
		{"lost on an empty timeline", []op{lost, at(5, -1)}, 0},
		{"lost twice", []op{add(10, 1), lost, lost, at(10, -1)}, 2},
	} {
		var tl timeline
		for i, o := range tc.ops {
			switch {
			case o.trace:
				tl.trace()
			case o.lost:
				if d := tl.lost(); d != 0 {
					t.Errorf("%s: op %d dropped %d", tc.name, i, d)
				}
			case o.add:
				// Each thread's process is its tid + 1000.
				if d := tl.add(o.time, o.tid+1000, o.tid); d != 0 {
					t.Errorf("%s: op %d dropped %d", tc.name, i, d)
				}
			default:
				wantPID := int32(0)
				if o.tid >= 0 {
					wantPID = o.tid + 1000
				}
				if pid, got := tl.at(o.time); got != o.tid || pid != wantPID {
					t.Errorf("%s: op %d: at(%d) = %d/%d, want %d/%d", tc.name, i, o.time, pid, got, wantPID, o.tid)
				}
			}
		}
		if len(tl.ent) != tc.len {
			t.Errorf("%s: %d entries left, want %d", tc.name, len(tl.ent), tc.len)
		}
	}
}

func TestTimelineBounded(t *testing.T) {
	var tl timeline
	var dropped uint64
	for i := 0; i < 3*maxTimeline; i++ {
		dropped += tl.add(uint64(i), 1, int32(i))
	}
	if len(tl.ent) > maxTimeline || cap(tl.ent) > maxTimeline {
		t.Errorf("len %d cap %d, bound %d", len(tl.ent), cap(tl.ent), maxTimeline)
	}
	if dropped+uint64(len(tl.ent)) != 3*maxTimeline {
		t.Errorf("dropped %d + kept %d != added %d", dropped, len(tl.ent), 3*maxTimeline)
	}
	last := uint64(3*maxTimeline - 1)
	if _, got := tl.at(last); got != int32(last) {
		t.Errorf("newest entry: %d", got)
	}
	if _, got := tl.at(0); got != -1 {
		t.Errorf("dropped time: %d, want -1", got)
	}
}

func TestWatermark(t *testing.T) {
	const lat = time.Second
	var w watermark
	for i, tc := range []struct {
		now  time.Duration
		seen uint64
		want uint64
	}{
		{0, 10, 0},
		{lat / 2, 20, 0},
		{lat - 1, 30, 0},
		{lat, 40, 10},
		{lat + lat/2, 50, 20},
		// Many Rounds within one spacing keep one sample each spacing.
		{lat + lat/2 + 1, 60, 20},
		{2*lat - 1, 70, 30},
		{5 * lat, 80, 70},
	} {
		if got := w.update(tc.now, tc.seen, lat); got != tc.want {
			t.Errorf("step %d: update(%v, %d) = %d, want %d", i, tc.now, tc.seen, got, tc.want)
		}
	}
	// Rounds far more frequent than the spacing keep the history bounded
	// and never release early.
	w = watermark{}
	for i := 0; i < 100000; i++ {
		now := time.Duration(i) * time.Millisecond / 10
		got := w.update(now, uint64(i), lat)
		if now >= lat && got > uint64((now-lat)/(time.Millisecond/10)) {
			t.Fatalf("at %v released %d, seen only after %v", now, got, now-lat)
		}
		if w.n > wmSpacing+2 {
			t.Fatalf("history of %d samples", w.n)
		}
	}
}

// ptwStream returns a PTW-heavy stream and the events it uses.
func ptwStream(size int) ([]byte, []*decode.Event) {
	var evs []*decode.Event
	for n := 1; n <= 8; n++ {
		evs = append(evs, &decode.Event{ID: ptenc.GenEventID(n), Group: "g", Name: "e", Args: make([]decode.Arg, n)})
	}
	return ptenc.Generate(ptenc.PTWHeavy, size, 7), evs
}

// TestPTWNoAllocs checks that the engine allocates nothing per record or
// call once warm. The chunks end at packet boundaries: the assembler's
// packet decoder allocates an error value for each Feed that ends inside a
// packet, which BenchmarkPTW shows per 64 KiB chunk.
func TestPTWNoAllocs(t *testing.T) {
	if testkit.Race {
		t.Skip("the race detector allocates")
	}
	_, evs := ptwStream(0)
	var chunks [][]byte
	for i := 0; i < 64; i++ {
		chunks = append(chunks, ptenc.Generate(ptenc.PTWHeavy, 4096, int64(i)))
	}
	var n int
	src := &stepSource{}
	p, err := NewPTW(src, PTWOptions{Latency: time.Nanosecond}, func(rs []decode.Record) { n += len(rs) })
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, ev := range evs {
		if err := p.Add(ev); err != nil {
			t.Fatal(err)
		}
	}
	s := src.sink
	// One event reused: a fresh one per call escapes through the
	// interface and would count here.
	ev := &SideEvent{Kind: SideSwitchIn}
	pass := func() {
		for i, c := range chunks {
			cpu := i % 2
			s.TimeConv(cpu, identity(0))
			ev.Time, ev.TID = uint64(i), int32(i)
			s.Side(cpu, ev)
			s.Trace(cpu, c)
			s.Round(false)
		}
	}
	pass() // warm up: queues and buffers grow
	if allocs := testing.AllocsPerRun(5, pass); allocs != 0 {
		t.Errorf("%v allocations per pass", allocs)
	}
	if st := p.Stats(); n == 0 || st.Records != uint64(n) || st.Decode.Errors != 0 {
		t.Errorf("%d records, stats %+v", n, st)
	}
}

// decodeNsPerRecord is the decode-only figure of BenchmarkPTW/decode, for
// the ratio that BenchmarkPTW/ptw reports.
var decodeNsPerRecord float64

type countOutput struct{ n int }

func (o *countOutput) Record(*decode.Record) { o.n++ }
func (o *countOutput) Manual(*decode.Manual) {}

// BenchmarkPTW measures the record engine (assembly, thread lookup, hold
// back, merge, sink call) on a PTW-heavy stream fed in 64 KiB chunks to two
// CPUs, against decoding alone (BenchmarkRecords' loop) on the same stream
// in the same run.
func BenchmarkPTW(b *testing.B) {
	buf, evs := ptwStream(16 << 20)
	table := make(map[uint16]*decode.Event)
	for _, ev := range evs {
		table[ev.ID] = ev
	}
	b.Run("decode", func(b *testing.B) {
		var out countOutput
		a := decode.NewAssembler(table, &out)
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			a.Feed(buf)
			a.End()
		}
		b.StopTimer()
		decodeNsPerRecord = float64(b.Elapsed().Nanoseconds()) / float64(out.n)
		b.ReportMetric(decodeNsPerRecord, "ns/record")
	})
	b.Run("ptw", func(b *testing.B) {
		var n int
		src := &stepSource{}
		p, err := NewPTW(src, PTWOptions{Latency: time.Nanosecond}, func(rs []decode.Record) { n += len(rs) })
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		for _, ev := range evs {
			if err := p.Add(ev); err != nil {
				b.Fatal(err)
			}
		}
		s := src.sink
		half := len(buf) / 2
		ev := &SideEvent{Kind: SideITraceStart}
		pass := func() {
			for cpu := 0; cpu < 2; cpu++ {
				s.TimeConv(cpu, identity(uint64(cpu)))
				ev.TID = int32(cpu)
				s.Side(cpu, ev)
			}
			for off := 0; off < half; off += 64 << 10 {
				for cpu := 0; cpu < 2; cpu++ {
					part := buf[cpu*half : (cpu+1)*half]
					s.Trace(cpu, part[off:min(off+64<<10, half)])
				}
				s.Round(false)
			}
			s.Round(true)
		}
		pass() // warm up
		n = 0
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			pass()
		}
		b.StopTimer()
		ns := float64(b.Elapsed().Nanoseconds()) / float64(n)
		b.ReportMetric(ns, "ns/record")
		if decodeNsPerRecord > 0 {
			b.ReportMetric(ns/decodeNsPerRecord, "x-decode")
		}
		if st := p.Stats(); st.Records != st.Decode.Records {
			b.Fatalf("stats %+v", st)
		}
	})
}

// FuzzPTW feeds arbitrary bytes, split between two CPUs in arbitrary
// chunks with losses between them: no panic, every completed record is
// delivered, in time order unless counted late.
func FuzzPTW(f *testing.F) {
	f.Add([]byte{3, 7, 0}, hit(5, evA, 1, 2))
	f.Add([]byte{1, 200, 2}, append(hit(9, evA, 1, 2), hit(3, evB, 7)...))
	e := ptenc.New()
	e.PSB()
	e.TSC(50)
	e.PTW(ptenc.Header(evA.ID, 2), 8, false)
	e.OVF()
	e.PTW(1, 8, false)
	f.Add([]byte{0, 11, 1}, e.Bytes())
	f.Fuzz(fuzzPTW)
}

// fuzzPTW is FuzzPTW's body. Each plan byte c makes one step: CPU c&1,
// then by c>>1&3 nothing, a loss or a side event, then the next c>>3+1
// bytes of data as trace.
func fuzzPTW(t *testing.T, plan, data []byte) {
	var got []decode.Record
	src := &stepSource{}
	p, err := NewPTW(src, PTWOptions{}, func(rs []decode.Record) { got = append(got, rs...) })
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Add(evA); err != nil {
		t.Fatal(err)
	}
	if err := p.Add(evB); err != nil {
		t.Fatal(err)
	}
	s := src.sink
	s.TimeConv(0, identity(0))
	s.TimeConv(1, identity(3))
	for i := 0; len(data) > 0; i++ {
		var c byte = 16
		if len(plan) > 0 {
			c = plan[i%len(plan)]
		}
		cpu := int(c & 1)
		k := min(len(data), int(c>>3)+1)
		switch c >> 1 & 3 {
		case 2:
			s.Loss(cpu, LossKind(c>>3)%NumLossKinds, 1)
		case 3:
			s.Side(cpu, &SideEvent{Kind: SideKind(c>>3) % 8, Time: uint64(i), TID: int32(c)})
		}
		s.Trace(cpu, data[:k])
		data = data[k:]
		if i%3 == 0 {
			s.Round(false)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.Records != uint64(len(got)) || st.Records != st.Decode.Records {
		t.Fatalf("%d delivered, stats %+v", len(got), st)
	}
	// Records without time go out by arrival: order is of the timed ones.
	var late, last, untimed, unattr uint64
	for _, r := range got {
		if r.TID < 0 {
			unattr++
		}
		if r.Time == 0 {
			untimed++
			if r.TID >= 0 {
				t.Fatalf("record without time has tid %d", r.TID)
			}
			continue
		}
		if r.Time < last {
			late++
		}
		last = max(last, r.Time)
	}
	if late > st.Late {
		t.Fatalf("%d records out of order, %d counted late", late, st.Late)
	}
	if untimed != st.Untimed || unattr != st.Unattributed {
		t.Fatalf("%d records without time, %d without tid; stats %+v", untimed, unattr, st)
	}
}

// With PTWOptions.Timing every CPU's records are timed by the MTC packets
// since the last TSC (libipt's tsc-tma-mtc_relative numbers: TSC a0000, then
// a0001 and a0009 after two MTCs with mtc period 4 and ratio 1:2).
func TestPTWTiming(t *testing.T) {
	p, src, _, got := newTestPTW(t, PTWOptions{Timing: decode.Timing{MTCPeriod: 4, ARTNum: 1, ARTDen: 2}})
	if err := p.Add(evB); err != nil {
		t.Fatal(err)
	}
	e := ptenc.New()
	e.PSB()
	e.TSC(0xa0000)
	e.TMA(0xf012, 0x6)
	e.PSBEnd()
	e.Probe(evB.ID, 0x7fff0000, true, 1)
	e.MTC(0x2)
	e.Probe(evB.ID, 0x7fff0000, true, 2)
	e.MTC(0x3)
	e.Probe(evB.ID, 0x7fff0000, true, 3)
	for cpu := range 2 {
		src.sink.TimeConv(cpu, identity(0))
		src.sink.Trace(cpu, e.Bytes())
	}
	src.sink.Round(true)
	want := []uint64{0xa0000, 0xa0000, 0xa0001, 0xa0001, 0xa0009, 0xa0009}
	if !slices.Equal(times(*got), want) {
		t.Errorf("times %x, want %x", times(*got), want)
	}
}
