package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"ptfs/decode"
	"ptfs/decode/ptenc"
	"ptfs/engine"
	"ptfs/engine/enginetest"
	"ptfs/images"
	"ptfs/internal/testkit"
	"ptfs/live"
	"ptfs/perfdata"
	"ptfs/perfio"
	"ptfs/stream"
	"ptfs/tracefs/tracefstest"
)

// newClassicBranches starts a classic session on a simulated tracefs and
// the sysfs of a PT machine, whose branch tracing is a replay.
func newClassicBranches(t *testing.T) (*Session, *enginetest.Replay) {
	t.Helper()
	k := tracefstest.New(t, tracefstest.Options{})
	rep, err := enginetest.NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Mode: ModeClassic, Tracefs: k.Tracefs, Sysfs: testkit.PTSysfs(t), BranchTrace: rep,
		Branches: live.Options{Maps: func(int32) ([]images.MapsEntry, error) { return nil, nil }}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if rep.Running() {
			t.Error("branch tracing runs after the session closed")
		}
	})
	return s, rep
}

// execFilter is the filter item of bin's executable segments.
func execFilter(t *testing.T, tg *Target) []string {
	t.Helper()
	tg.mu.Lock()
	bin := tg.bin
	tg.mu.Unlock()
	var out []string
	for _, seg := range bin.Segments() {
		if seg.Exec() {
			out = append(out, fmt.Sprintf("filter 0x%x/0x%x@%s", seg.Off, seg.Filesz, bin.FDPath()))
		}
	}
	if len(out) != 1 {
		t.Fatalf("%s: %d executable segments", tg.path, len(out))
	}
	return out
}

// TestBranchesClassic opens and closes the branches of three targets of a
// classic-mode session: the first open starts branch tracing with the
// address filter of its target's code, another target's open adds its
// range, a third is one range more than the PMU has (no filter, status
// says why), rmdir of a target with branches open takes its readers away,
// the last close stops branch tracing; classic records go into branches
// while it is read, and status shows the state.
func TestBranchesClassic(t *testing.T) {
	s, rep := newClassicBranches(t)
	src := filepath.Join("..", "testdata", "target.c")
	var tgs []*Target
	for i, flags := range [][]string{nil, {"-no-pie"}, {"-O1"}} {
		tg, err := s.AddTarget(fmt.Sprintf("t%d", i+1), testkit.BuildC(t, src, flags...))
		if err != nil {
			t.Fatal(err)
		}
		tgs = append(tgs, tg)
	}
	t1, t2, t3 := tgs[0], tgs[1], tgs[2]
	if st := string(t1.Status()); !strings.Contains(st, "branches: off (no reader; opening branches starts branch tracing)\n") {
		t.Errorf("status before open:\n%s", st)
	}
	open := func(tg *Target) {
		t.Helper()
		out, err := tg.Branches()
		if err != nil || out != tg.brs {
			t.Fatalf("open branches of %s: %v", tg.name, err)
		}
	}
	lastConfig := func(want enginetest.Config) {
		t.Helper()
		c := rep.Configs()
		if len(c) == 0 || c[len(c)-1] != want {
			t.Errorf("configs %+v, want last %+v", c, want)
		}
	}
	f1, f2 := execFilter(t, t1)[0], execFilter(t, t2)[0]
	two := f1 + "," + f2
	if t2.bin.FDPath() < t1.bin.FDPath() { // no follow runs: their files stay
		two = f2 + "," + f1
	}

	open(t1)
	lastConfig(enginetest.Config{Branch: true, Filter: f1})
	if !rep.Running() {
		t.Fatal("branch tracing not started")
	}
	open(t1) // a second reader changes nothing
	open(t2)
	lastConfig(enginetest.Config{Branch: true, Filter: two, Running: true})
	st := string(t1.Status())
	for _, want := range []string{"branches: on (2 readers of this target, 2 targets read; branch-only Intel PT events)\n",
		"branches filter: " + two + "\n", "branches losses: aux truncated=0 ", "branches file: size=0 "} {
		if !strings.Contains(st, want) {
			t.Errorf("status lacks %q:\n%s", want, st)
		}
	}
	open(t3)
	lastConfig(enginetest.Config{Branch: true, Filter: "", Running: true})
	if st := string(t3.Status()); !strings.Contains(st, "branches filter: none (bad address filter: 3 ranges, the PMU has 2 address filters): all user code is traced") {
		t.Errorf("status with 3 ranges:\n%s", st)
	}

	// A classic record goes to records and, while read, to branches.
	ev := &decode.Event{ID: 1, Group: "ptfs_t1", Name: "e"}
	emitOne(t1, &decode.Record{Event: ev, N: 0, TID: 5, CPU: 1})
	if n := t1.brs.Stats().Size; n == 0 {
		t.Errorf("the record did not reach branches")
	}

	// rmdir of t3 with its branches open: its range goes.
	if err := s.RemoveTarget("t3"); err != nil {
		t.Fatal(err)
	}
	lastConfig(enginetest.Config{Branch: true, Filter: two, Running: true})
	t3.CloseBranches() // the open ends after the target went: nothing happens
	if _, err := t3.Branches(); !errors.Is(err, ErrClosed) {
		t.Errorf("open of a removed target's branches: %v", err)
	}
	t1.CloseBranches()
	t1.CloseBranches()
	lastConfig(enginetest.Config{Branch: true, Filter: f2, Running: true})
	t2.CloseBranches()
	if rep.Running() {
		t.Error("branch tracing runs after the last close")
	}
	if starts, stops, _ := rep.Counts(); starts != 1 || stops != 1 {
		t.Errorf("starts %d stops %d, want 1 and 1", starts, stops)
	}
	emitOne(t1, &decode.Record{Event: ev, N: 0, TID: 5, CPU: 1})
	if n := t1.brs.Stats().Size; n != int64(len("record 1: event=ptfs_t1/e id=0x1 args=[] tid=5 cpu=1\n")) {
		t.Errorf("branches size %d after a record while unread", n)
	}
	// Closing the session with a reader stops branch tracing (checked at
	// cleanup).
	open(t2)
}

// TestBranchesFollow: when the path of a target whose branches are read
// names another file (replaced by rename), the address filter follows it.
func TestBranchesFollow(t *testing.T) {
	s, rep := newClassicBranches(t)
	src := filepath.Join("..", "testdata", "target.c")
	path := filepath.Join(t.TempDir(), "t")
	if err := os.Rename(testkit.BuildC(t, src), path); err != nil {
		t.Fatal(err)
	}
	tg, err := s.AddTarget("t", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tg.Branches(); err != nil {
		t.Fatal(err)
	}
	first := execFilter(t, tg)[0]
	if c := rep.Configs(); len(c) != 1 || c[0].Filter != first {
		t.Fatalf("configs %+v", c)
	}
	if err := os.Rename(testkit.BuildC(t, src, "-no-pie"), path); err != nil {
		t.Fatal(err)
	}
	// The watcher follows the path; a probe write would too.
	waitFor(t, "the filter of the new file", func() (string, bool) {
		c := rep.Configs()
		last := c[len(c)-1]
		return fmt.Sprint(c), last.Filter != first && strings.HasPrefix(last.Filter, "filter 0x") && last.Running
	})
	tg.mu.Lock()
	bin := tg.bin
	tg.mu.Unlock()
	if c := rep.Configs(); !strings.HasSuffix(c[len(c)-1].Filter, "@"+bin.FDPath()) {
		t.Errorf("filter %q does not name the new file %s", c[len(c)-1].Filter, bin.FDPath())
	}
	tg.CloseBranches()
}

// TestBranchesNoPT: without Intel PT, opening branches fails with
// EOPNOTSUPP and the reason, which status shows.
func TestBranchesNoPT(t *testing.T) {
	k := tracefstest.New(t, tracefstest.Options{})
	s, err := New(Options{Mode: ModeClassic, Tracefs: k.Tracefs, Sysfs: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	tg, err := s.AddTarget("t", testkit.BuildC(t, filepath.Join("..", "testdata", "target.c")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tg.Branches(); !errors.Is(err, syscall.EOPNOTSUPP) || !errors.Is(err, ErrNoBranches) || !errors.Is(err, perfio.ErrNoPT) {
		t.Errorf("open: %v", err)
	}
	if st := string(tg.Status()); !strings.Contains(st, "branches: unavailable: branches need Intel PT: ") {
		t.Errorf("status:\n%s", st)
	}
}

// TestBranchesPTWToggle opens and closes branches in ptw mode while a
// probe records: the PT events are reopened with branch tracing and
// without (the replay sees each Reconfigure, a flush loss per CPU), and
// records keep coming before, between and after; without a probe, the
// first open starts the source and the last close stops it.
func TestBranchesPTWToggle(t *testing.T) {
	s, tg, k, rep := newPTWSession(t, tracefstest.Options{PTW: true})
	if err := tg.SetProbe("a", "target a=%di"); err != nil {
		t.Fatal(err)
	}
	id, err := k.Tracefs.EventID(tg.group, "a")
	if err != nil {
		t.Fatal(err)
	}
	hit := func(v uint64) {
		t.Helper()
		var e ptenc.Encoder
		e.PSB()
		e.PSBEnd()
		e.Probe(id, 0x7f0000001000, true, v)
		if err := rep.Queue(enginetest.Batch{0: {enginetest.Trace(e.Bytes()), enginetest.Loss(engine.LossFlush, 1)}}); err != nil {
			t.Fatal(err)
		}
		if err := rep.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	records := func(want int) {
		t.Helper()
		if got := strings.Count(string(readStream(t, tg.recs)), "\n"); got != want {
			t.Errorf("%d records, want %d", got, want)
		}
	}
	hit(1)
	records(1)
	if _, err := tg.Branches(); err != nil {
		t.Fatal(err)
	}
	if c := rep.Configs(); len(c) != 1 || c[0] != (enginetest.Config{Branch: true, Running: true}) {
		t.Errorf("configs %+v after open", c)
	}
	hit(2)
	records(2)
	if br := string(readStream(t, tg.brs)); !strings.Contains(br, "record 1: event=ptfs_t/a id=") || !strings.Contains(br, "args=[a=2]") {
		t.Errorf("branches:\n%s\nwant the record of the hit", br)
	}
	st := string(tg.Status())
	for _, want := range []string{"branches: on (1 readers of this target, 1 targets read; ptw mode's Intel PT events, reopened with branch tracing)\n",
		"branches filter: none in ptw mode: "} {
		if !strings.Contains(st, want) {
			t.Errorf("status lacks %q:\n%s", want, st)
		}
	}
	tg.CloseBranches()
	if c := rep.Configs(); len(c) != 2 || c[1] != (enginetest.Config{Branch: false, Running: true}) {
		t.Errorf("configs %+v after close", c)
	}
	hit(3)
	records(3)
	if starts, stops, _ := rep.Counts(); starts != 1 || stops != 0 {
		t.Errorf("starts %d stops %d: the records' source must run on", starts, stops)
	}
	if err := tg.RemoveProbe("a"); err != nil {
		t.Fatal(err)
	}
	if rep.Running() {
		t.Fatal("source runs without probe and reader")
	}
	// Without a probe, branches alone keep the source running.
	if _, err := tg.Branches(); err != nil {
		t.Fatal(err)
	}
	if !rep.Running() {
		t.Error("branches without a probe: source not started")
	}
	tg.CloseBranches()
	waitFor(t, "the source to stop", func() (string, bool) { return "running", !rep.Running() })
	_ = s
}

// readStream reads all of a stream.
func readStream(t *testing.T, s *stream.Stream) []byte {
	t.Helper()
	r := s.NewReader()
	defer r.Close()
	return testkit.ReadStream(t, r)
}

// TestBranchesClassicRecordsByTime: a classic session on a simulated
// kernel whose branch tracing replays a hand-made trace of ptsim's
// flow-static (side band of its recording) while the target's classic
// records come from the record path (deliver, one batch): in branches each record
// stands among the branch lines by time (converted from CLOCK_MONOTONIC by
// the measured offset), the one later than all trace after the flush.
func TestBranchesClassicRecordsByTime(t *testing.T) {
	root := filepath.Join(testkit.Corpus(t), "ptsim")
	run, err := enginetest.LoadPtsim(filepath.Join(root, "run-static"), root)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "flow-static")
	vdso, err := images.LoadBlob(run.VDSO)
	if err != nil {
		t.Fatal(err)
	}
	k := tracefstest.New(t, tracefstest.Options{})
	rep, err := enginetest.NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	const offset = -1_000_000 // perf time is CLOCK_MONOTONIC - 1 ms
	s, err := New(Options{Mode: ModeClassic, Tracefs: k.Tracefs, Sysfs: testkit.PTSysfs(t), BranchTrace: rep,
		Branches:    live.Options{VDSO: vdso, Maps: func(int32) ([]images.MapsEntry, error) { return nil, nil }},
		ClockOffset: func() (int64, error) { return offset, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	tg, err := s.AddTarget("t", bin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tg.Branches(); err != nil {
		t.Fatal(err)
	}
	defer tg.CloseBranches()
	side := run.Batches(0, 7, 42, 1<<20)[:1]
	side[0][0] = append([]enginetest.Step{enginetest.TimeConv(perfdata.TimeConv{Mult: 1})}, side[0][0]...)
	if err := rep.Queue(side...); err != nil {
		t.Fatal(err)
	}
	if err := rep.Sync(); err != nil {
		t.Fatal(err)
	}
	// One batch through the routes: a run of one event's records, which
	// emitRun leaves to emit while the branches are read.
	ev := &decode.Event{ID: 1, Group: "ptfs_t", Name: "e"}
	s.setRoute(ev.ID, &probe{target: tg, name: "e"})
	var batch []decode.Record
	for _, perf := range []uint64{500, 2000, 9000} {
		batch = append(batch, decode.Record{Event: ev, TID: 42, CPU: 0, Time: perf + 1_000_000})
	}
	s.deliver(batch)
	trace, _ := enginetest.StartStops(0x4016d0, 0x402aa0, 1000, 3000)
	if err := rep.Queue(enginetest.Batch{0: {enginetest.Trace(trace)}}); err != nil {
		t.Fatal(err)
	}
	if err := rep.Flush(); err != nil {
		t.Fatal(err)
	}
	recs := strings.SplitAfter(string(readStream(t, tg.recs)), "\n")
	if len(recs) != 4 || recs[0] != "record 1: event=ptfs_t/e id=0x1 args=[] tid=42 cpu=0 time=0.001000500\n" {
		t.Fatalf("records:\n%s", strings.Join(recs, ""))
	}
	want := recs[0] +
		"trace: start at 0x4016d0 _start+0x0 (" + bin + ") tid=42 cpu=0 time=0.000001000\n" +
		recs[1] +
		"trace: stop at 0x402aa0 __libc_start_main_impl+0x0 (" + bin + ") tid=42 cpu=0 time=0.000003000\n" +
		recs[2]
	if got := string(readStream(t, tg.brs)); got != want {
		t.Errorf("branches:\n%s\nwant\n%s", got, want)
	}
}
