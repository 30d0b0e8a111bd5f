package live

import (
	"testing"

	"ptfs/engine/enginetest"
	"ptfs/perfdata"
	"ptfs/stream"
)

// TestStageRecordsByTime replays a trace beside classic records (another
// source's, given by Record while the replay runs, some before their trace
// arrives, some after) and holds the target's branches to the exact
// interleaving by time: each record before the first line of its CPU that
// is later than it, after the lines at its time; one that arrives after
// its CPU's lines passed it, one without a time and one of a CPU without
// a TSC conversion at once; the rest at the end of the run.
func TestStageRecordsByTime(t *testing.T) {
	run, bin := ptsimRun(t, "run-static")
	// _start's call goes to __libc_start_main.
	trace, ends := enginetest.StartStops(0x4016d0, 0x402aa0, 1000, 3000, 5000, 6000)
	first := ends[0]

	s := newStage(t, run)
	out := stream.New(stream.Options{})
	if err := s.Attach("t", []string{bin}, out); err != nil {
		t.Fatal(err)
	}
	if s.Record("nobody", 0, 1, []byte("record 1: x\n")) {
		t.Error("a record of a target not attached was taken")
	}
	side := run.Batches(0, 7, 42, 1<<20)[:1]
	side[0][0] = append([]enginetest.Step{enginetest.TimeConv(perfdata.TimeConv{Mult: 1})}, side[0][0]...)
	r, err := enginetest.NewReplay(side...)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	sync := func() {
		t.Helper()
		if err := r.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	rec := func(cpu int, tm uint64, text string) {
		t.Helper()
		if !s.Record("t", cpu, tm, []byte(text+"\n")) {
			t.Fatalf("record %q not taken", text)
		}
	}
	sync()
	rec(0, 500, "record 1: before")
	rec(0, 2000, "record 2: between")
	rec(0, 3000, "record 3: at the stop")
	rec(0, 5500, "record 4: between runs")
	rec(0, 9000, "record 5: after")
	rec(1, 100, "record 6: cpu without time")
	rec(0, 0, "record 7: no time")
	if err := r.Queue(enginetest.Batch{0: {enginetest.Trace(trace[:first])}}); err != nil {
		t.Fatal(err)
	}
	sync()
	rec(0, 2500, "record 8: late")
	if err := r.Queue(enginetest.Batch{0: {enginetest.Trace(trace[first:])}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	want := "record 6: cpu without time\n" +
		"record 7: no time\n" +
		"record 1: before\n" +
		"trace: start at 0x4016d0 _start+0x0 (" + bin + ") tid=42 cpu=0 time=0.000001000\n" +
		"record 2: between\n" +
		"trace: stop at 0x402aa0 __libc_start_main_impl+0x0 (" + bin + ") tid=42 cpu=0 time=0.000003000\n" +
		"record 8: late\n" +
		"record 3: at the stop\n" +
		"trace: start at 0x4016d0 _start+0x0 (" + bin + ") tid=42 cpu=0 time=0.000005000\n" +
		"record 4: between runs\n" +
		"trace: stop at 0x402aa0 __libc_start_main_impl+0x0 (" + bin + ") tid=42 cpu=0 time=0.000006000\n" +
		"record 5: after\n"
	if got := streamText(t, out); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if st := s.Stats(); st.Lines != 12 {
		t.Errorf("stats %+v, want 12 lines", st)
	}
}

// TestLineTime reads the time of a line's context.
func TestLineTime(t *testing.T) {
	for _, tc := range []struct {
		line string
		want uint64
		ok   bool
	}{
		{"branch: x tid=1 cpu=0 time=12.000000345", 12000000345, true},
		{"trace: x time=0.000001000", 1000, true},
		{"gap: overflow", 0, false},
		{"branch: x tid=1 cpu=0", 0, false},
		{"branch: x time=1.23", 0, false},
		{"branch: x time=1.0000000001", 0, false},
		{"branch: x time=1.00000000x", 0, false},
		{"branch: x time=", 0, false},
		{"branch: (/a time=1.000000000) tid=1 cpu=0", 0, false},
	} {
		got, ok := lineTime([]byte(tc.line))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}
