package session

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"ptfs/decode"
	"ptfs/internal/testkit"
	"ptfs/stream"
	"ptfs/tracefs/tracefstest"
)

// TestSwapDrop feeds record sequences of a replacement at one site (old
// event 1, new event 2; hits seen by both give new then old, per thread)
// and checks which records are kept.
func TestSwapDrop(t *testing.T) {
	type rec struct {
		ev  uint16
		tid int32
	}
	old, nu := &decode.Event{ID: 1}, &decode.Event{ID: 2}
	for _, c := range []struct {
		name string
		recs []rec
		keep string // one letter a record: k kept, d dropped
	}{
		{"old only", []rec{{1, 7}, {1, 7}}, "kk"},
		{"new only", []rec{{2, 7}, {2, 7}}, "kk"},
		{"overlap", []rec{{1, 7}, {2, 7}, {1, 7}, {2, 7}, {1, 7}, {2, 7}}, "kkdkdk"},
		{"two threads interleaved", []rec{{2, 7}, {2, 8}, {1, 8}, {1, 7}, {1, 9}}, "kkddk"},
		// The old event is disabled on the CPU of the first hit, not yet on
		// the CPU of the second.
		{"old disabled on one CPU", []rec{{2, 7}, {2, 7}, {1, 7}, {2, 7}}, "kkdk"},
		// The new event is enabled on the CPU of the first hit, not yet on
		// the CPU of the second.
		{"new enabled on one CPU", []rec{{2, 7}, {1, 7}, {1, 7}, {2, 7}, {1, 7}}, "kdkkd"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := &swap{newID: nu.ID, paired: map[int32]bool{}}
			got := ""
			for _, r := range c.recs {
				ev := old
				if r.ev == nu.ID {
					ev = nu
				}
				if w.drop(&decode.Record{Event: ev, TID: r.tid}) {
					got += "d"
				} else {
					got += "k"
				}
			}
			if got != c.keep {
				t.Errorf("%v: kept %s, want %s", fmt.Sprint(c.recs), got, c.keep)
			}
		})
	}
}

// BenchmarkDeliver measures the record path through the routes against
// the emit it ends in, in the same run, per record of batches of 256: the
// routing (and the swap check) should cost nothing beside it.
func BenchmarkDeliver(b *testing.B) {
	s := &Session{opts: Options{Stream: stream.Options{Limit: 1 << 20}}}
	tg := newTarget(s, "t", "/bin/t", "g", nil)
	p := &probe{target: tg, name: "e"}
	s.routes.Store(&map[uint16]*route{5: {p: p}})
	// The records of one event, one thread and process, the time
	// advancing by 10 µs: the benchmark of cmd/ptfs (hot %di %si).
	batch := make([]decode.Record, 256)
	ev := &decode.Event{ID: 5, Group: "ptfs_t", Name: "e", Args: make([]decode.Arg, 2)}
	for i := range batch {
		batch[i] = decode.Record{Event: ev, N: 2, Args: [8]uint64{uint64(i) * 977, 140728356930600 + uint64(i)}, TID: 4711, CPU: 1,
			Time: 8061_235912410 + uint64(i)*10000, PID: 4711, Comm: "t"}
	}
	b.Run("emit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tg.beginEmit()
			for i := range batch {
				tg.emit(&batch[i])
			}
			tg.endEmit()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/record")
	})
	b.Run("deliver", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.deliver(batch)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/record")
	})
}

// emitOne writes one record to t's records, as deliver does.
func emitOne(t *Target, r *decode.Record) {
	t.beginEmit()
	t.emit(r)
	t.endEmit()
}

// TestDeliverBatch delivers batches with a run of one target's records
// longer than emit's buffer (maxEmit) holds, then two targets, an event
// of no route and a renamed probe's event interleaved: each target's records file has its own records, in
// order, numbered on, byte for byte AppendRecord's lines, and nothing of
// the unrouted event.
func TestDeliverBatch(t *testing.T) {
	s := &Session{opts: Options{Stream: stream.Options{Limit: 1 << 20, Dir: t.TempDir()}}}
	t1 := newTarget(s, "t1", "/bin/t1", "g1", nil)
	t2 := newTarget(s, "t2", "/bin/t2", "g2", nil)
	for _, tg := range []*Target{t1, t2} {
		t.Cleanup(func() { tg.recs.Close(); tg.brs.Close() })
	}
	e1 := &decode.Event{ID: 1, Group: "ptfs_t1", Name: "a", Args: []decode.Arg{{Type: decode.U64}}}
	e2 := &decode.Event{ID: 2, Group: "ptfs_t2", Name: "b", Args: []decode.Arg{{Type: decode.U64}}}
	e3 := &decode.Event{ID: 3, Group: "ptfs_x", Name: "c"}
	e4 := &decode.Event{ID: 4, Group: "ptfs_t1", Name: "old", Args: []decode.Arg{{Type: decode.U64}}}
	renamed := &decode.Event{ID: 4, Group: "ptfs_t1", Name: "new", Args: e4.Args}
	s.routes.Store(&map[uint16]*route{
		1: {p: &probe{target: t1, name: "a"}},
		2: {p: &probe{target: t2, name: "b"}},
		4: {p: &probe{target: t1, name: "new"}, ev: renamed},
	})
	var want1, want2 []byte
	var n1, n2 uint64
	// A run of t1's records longer than two emit buffers, then the
	// targets and events interleaved.
	const run, perBatch = 1500, 2000
	for b := range 2 {
		batch := make([]decode.Record, perBatch)
		for i := range batch {
			ev := []*decode.Event{e1, e4}[i%2]
			if i >= run {
				ev = []*decode.Event{e1, e1, e2, e3, e4}[i%5]
			}
			batch[i] = decode.Record{Event: ev, N: len(ev.Args), Args: [8]uint64{uint64(b*perBatch + i)}, TID: int32(i % 7), CPU: 1, Time: uint64(b*perBatch+i) * 1e6, PID: 9, Comm: "p"}
			switch r := batch[i]; ev {
			case e1, e4:
				if ev == e4 {
					r.Event = renamed
				}
				n1++
				want1 = decode.AppendRecord(want1, n1, &r)
			case e2:
				n2++
				want2 = decode.AppendRecord(want2, n2, &r)
			}
		}
		s.deliver(batch)
	}
	if n := len(want1) * run / int(n1); n < 2*maxEmit {
		t.Fatalf("a run of %d bytes, want more than two emit buffers", n)
	}
	for _, c := range []struct {
		tg   *Target
		want []byte
		n    uint64
	}{{t1, want1, n1}, {t2, want2, n2}} {
		if got := readStream(t, c.tg.recs); !bytes.Equal(got, c.want) {
			t.Errorf("%s: %d bytes of records, want %d:\n%.300s\nwant\n%.300s", c.tg.name, len(got), len(c.want), got, c.want)
		}
		if got := c.tg.counters().Records; got != c.n {
			t.Errorf("%s: counted %d records, want %d", c.tg.name, got, c.n)
		}
	}
}

// orderSource is a record source that logs the calls a replacement makes.
type orderSource struct {
	source
	calls []string
	fail  error // what settle returns
}

func (o *orderSource) Add(ev *decode.Event) error {
	o.calls = append(o.calls, fmt.Sprintf("add %d", ev.ID))
	return nil
}

func (o *orderSource) Remove(id uint16) error {
	o.calls = append(o.calls, fmt.Sprintf("remove %d", id))
	return nil
}

func (o *orderSource) settle() error {
	o.calls = append(o.calls, "settle")
	return o.fail
}

// TestSwapSettles: a classic probe replaced at its own site keeps its old
// event until every hit that began before the new event was enabled has
// run all its handlers (the kernel runs the new event's first): removing
// the old event before would leave such a hit recorded by neither. At
// another site the events see distinct hits and nothing waits.
func TestSwapSettles(t *testing.T) {
	k := tracefstest.New(t, tracefstest.Options{})
	s, err := New(Options{Mode: ModeClassic, Tracefs: k.Tracefs, Sysfs: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.src.Close(); err != nil {
		t.Fatal(err)
	}
	src := &orderSource{source: s.src}
	s.src = src
	t.Cleanup(func() { s.Close() })
	tg, err := s.AddTarget("t", testkit.BuildC(t, filepath.Join("..", "testdata", "target.c")))
	if err != nil {
		t.Fatal(err)
	}
	set := func(spec, event string) uint16 {
		t.Helper()
		if err := tg.SetProbe("a", spec); err != nil {
			t.Fatal(err)
		}
		id, err := k.Tracefs.EventID(tg.group, event)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	a := set("target %di", "a")
	a2 := set("target a=%di", "a_2")
	want := []string{fmt.Sprint("add ", a), fmt.Sprint("add ", a2), "settle", fmt.Sprint("remove ", a)}
	if !slices.Equal(src.calls, want) {
		t.Errorf("replacement at the same site: source calls %q, want %q", src.calls, want)
	}
	unsettled := func(n int) {
		t.Helper()
		if want := fmt.Sprintf("unsettled replacements: %d (", n); !bytes.Contains(s.Status(), []byte(want)) {
			t.Errorf("root status without %q:\n%s", want, s.Status())
		}
	}
	unsettled(0)
	// A replacement that could not wait still replaces, and says so.
	src.fail = errors.New("no uprobe pmu")
	set("target %di", "a")
	unsettled(1)
	src.fail = nil
	a2 = set("target a=%di", "a_2")
	unsettled(1)
	src.calls = nil
	a = set("other %di", "a")
	want = []string{fmt.Sprint("add ", a), fmt.Sprint("remove ", a2)}
	if !slices.Equal(src.calls, want) {
		t.Errorf("replacement at another site: source calls %q, want %q", src.calls, want)
	}
}

// TestDeliverLineCount: the records stream counts the lines that emit
// committed in place as emit counted them (stream.Commit's lines, one a
// record, not counted again from the bytes): with no reader and a small
// bound, whole chunks are discarded, and the lines counted discarded and
// the lines still readable add up to the records delivered.
func TestDeliverLineCount(t *testing.T) {
	// Chunks of 64 KiB (the limit's), so that a few MiB of lines fill
	// many.
	s := &Session{opts: Options{Stream: stream.Options{Limit: 64 << 10, Dir: t.TempDir()}}}
	tg := newTarget(s, "t", "/bin/t", "g", nil)
	t.Cleanup(func() { tg.recs.Close(); tg.brs.Close() })
	s.routes.Store(&map[uint16]*route{5: {p: &probe{target: tg, name: "e"}}})
	ev := &decode.Event{ID: 5, Group: "ptfs_t", Name: "e", Args: make([]decode.Arg, 2)}
	const batches, perBatch = 30, 1000
	batch := make([]decode.Record, perBatch)
	for b := range batches {
		for i := range batch {
			// Lengths that vary, so that chunks end at every place in
			// a line and the spare buffer takes some.
			k := uint64(b*perBatch + i)
			batch[i] = decode.Record{Event: ev, N: 2, Args: [8]uint64{k, k * k * k}, TID: 7, CPU: 1, Time: k * 1e3, PID: 7, Comm: "t"}
		}
		s.deliver(batch)
	}
	st := tg.recs.Stats()
	if st.Discarded == 0 {
		t.Fatalf("nothing discarded from %d bytes of lines: %+v", st.Size, st)
	}
	// A reader that opens now reads the window after a gap line that
	// counts what went before it.
	got := readStream(t, tg.recs)
	gap := fmt.Sprintf("lost: records=%d reason=bound\n", st.Discarded)
	if !bytes.HasPrefix(got, []byte(gap)) {
		t.Fatalf("the window starts with %.80q, want %q", got, gap)
	}
	got = got[len(gap):]
	if n := uint64(bytes.Count(got, []byte("\nrecord "))) + 1; n+st.Discarded != batches*perBatch || !bytes.HasPrefix(got, []byte("record ")) {
		t.Errorf("%d record lines readable + %d discarded, want %d records; the window after the gap: %.80q", n, st.Discarded, batches*perBatch, got)
	}
	// The lines kept are AppendRecord's, numbered on from the discarded.
	var want []byte
	for k := st.Discarded; k < batches*perBatch; k++ {
		r := decode.Record{Event: ev, N: 2, Args: [8]uint64{k, k * k * k}, TID: 7, CPU: 1, Time: k * 1e3, PID: 7, Comm: "t"}
		want = decode.AppendRecord(want, k+1, &r)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the window's %d bytes differ from the %d of its records' lines", len(got), len(want))
	}
}

// TestEmitRunCommits: a run formatted at once (emitRun) commits its lines
// where emit, record by record, does: as soon as maxEmit bytes are
// gathered, so that readers see a long run as it goes. The same records
// through both leave the same bytes committed mid-run, and the same
// stream.
func TestEmitRunCommits(t *testing.T) {
	s := &Session{opts: Options{Stream: stream.Options{Dir: t.TempDir()}}}
	ev := &decode.Event{ID: 5, Group: "ptfs_t", Name: "e", Args: make([]decode.Arg, 2)}
	rs := make([]decode.Record, 3000)
	for i := range rs {
		k := uint64(i)
		rs[i] = decode.Record{Event: ev, N: 2, Args: [8]uint64{k, k * k * k}, TID: 7, CPU: 1, Time: k * 1e3, PID: 7, Comm: "t"}
	}
	var (
		committed [2]int64
		content   [2][]byte
	)
	for i, run := range []bool{true, false} {
		tg := newTarget(s, "t", "/bin/t", "g", nil)
		t.Cleanup(func() { tg.recs.Close(); tg.brs.Close() })
		tg.beginEmit()
		if run {
			tg.emitRun(rs)
		} else {
			for k := range rs {
				tg.emit(&rs[k])
			}
		}
		committed[i] = tg.recs.Size()
		tg.endEmit()
		content[i] = readStream(t, tg.recs)
	}
	if committed[0] != committed[1] || committed[1] < maxEmit {
		t.Errorf("mid-run commits of a run: %d bytes, of the records one by one %d (every %d bytes)", committed[0], committed[1], maxEmit)
	}
	if !bytes.Equal(content[0], content[1]) || len(content[0]) == 0 {
		t.Errorf("the run's stream (%d bytes) differs from the records' one by one (%d)", len(content[0]), len(content[1]))
	}
}

// TestDeliverSwapRuns delivers a replacement's records (TestSwapDrop's
// two threads interleaved) as one batch: runs of one event, each record
// still paired through the swap, so that the old event's second records
// of the new one's hits are dropped however the batch runs.
func TestDeliverSwapRuns(t *testing.T) {
	s := &Session{opts: Options{Stream: stream.Options{Dir: t.TempDir()}}}
	tg := newTarget(s, "t", "/bin/t", "g", nil)
	t.Cleanup(func() { tg.recs.Close(); tg.brs.Close() })
	p := &probe{target: tg, name: "e"}
	s.routes.Store(&map[uint16]*route{1: {p: p}})
	s.beginSwap(p, 1, 2)
	old := &decode.Event{ID: 1, Group: "ptfs_t", Name: "e", Args: make([]decode.Arg, 1)}
	nu := &decode.Event{ID: 2, Group: "ptfs_t", Name: "e", Args: make([]decode.Arg, 1)}
	batch := []decode.Record{
		{Event: nu, N: 1, Args: [8]uint64{1}, TID: 7, CPU: 0},
		{Event: nu, N: 1, Args: [8]uint64{2}, TID: 8, CPU: 0},
		{Event: old, N: 1, Args: [8]uint64{3}, TID: 8, CPU: 0},
		{Event: old, N: 1, Args: [8]uint64{4}, TID: 7, CPU: 0},
		{Event: old, N: 1, Args: [8]uint64{5}, TID: 9, CPU: 0},
	}
	s.deliver(batch)
	var want []byte
	for i, k := range []int{0, 1, 4} {
		want = decode.AppendRecord(want, uint64(i+1), &batch[k])
	}
	if got := readStream(t, tg.recs); !bytes.Equal(got, want) || s.dups.Load() != 2 {
		t.Errorf("%d dropped, records:\n%s\nwant\n%s", s.dups.Load(), got, want)
	}
}
