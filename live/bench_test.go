package live

import (
	"bytes"
	"io"
	"testing"
	"time"

	"ptfs/engine"
	"ptfs/flow"
	"ptfs/images"
	"ptfs/internal/testkit"
	"ptfs/stream"
)

// benchCopies is how many times the ptsim trace is repeated (each copy
// starts with a PSB): 100 copies are 1.2 MiB of trace, 2 million lines.
const benchCopies = 100

// BenchmarkLive compares the live path with the bare offline decoder in
// the same run, on ptsim's run-static repeated benchCopies times, pass by
// pass in turn (so that a loaded machine slows both alike):
//
//   - offline: flow.Decoder over the process's images, formatting with
//     flow.Branches into a line counter (`ptfs decode --branches`), the
//     decoder kept across passes (warm, as a live mount decodes);
//   - live: the stage fed as perfio.PT feeds a busy CPU (64 KiB Trace
//     calls, a Round after each, one run across the passes), routing every
//     line into an attached target's stream (default bounds: it spills to
//     disk).
//
// It reports the CPU time (getrusage, user+system) per pass of each, MB/s
// of trace and lines/s per CPU second, and live/offline, the ratio the
// issue bounds (1.3).
func BenchmarkLive(b *testing.B) {
	run, bin := ptsimRun(b, "run-static")
	trace := bytes.Repeat(run.Trace, benchCopies)
	vdso, err := images.LoadBlob(run.VDSO)
	if err != nil {
		b.Fatal(err)
	}
	p := images.NewProcesses(images.Options{VDSO: vdso})
	defer p.Close()
	p.Exec(1)
	if err := p.MapMaps(1, run.Maps); err != nil {
		b.Fatal(err)
	}
	space, _ := p.Space(1)
	d := flow.New(space, flow.Options{})
	var lines lineCounter
	br := flow.NewBranches(&lines, space, space, nil)
	br.SetContext(42, 0)
	offline := func() {
		d.Decode(trace, br)
		br.Finish()
		_ = br.Flush()
	}

	st := New(Options{VDSO: vdso, Maps: func(int32) ([]images.MapsEntry, error) { return nil, nil }})
	defer st.Close()
	out := stream.New(stream.Options{})
	defer out.Close()
	if err := st.Attach("t", []string{bin}, out); err != nil {
		b.Fatal(err)
	}
	st.Side(0, &engine.SideEvent{Kind: engine.SideITraceStart, PID: 7, TID: 42})
	for _, m := range run.Maps {
		st.Side(0, &engine.SideEvent{Kind: engine.SideMmap2, PID: 7, TID: 42, Addr: m.Start, Len: m.End - m.Start, PgOff: m.Off, Filename: m.Path})
	}
	// One run across the passes, as a busy CPU's (a flush ends a run and
	// its decoder's block cache): the passes continue one stream.
	live := func() {
		for off := 0; off < len(trace); off += 64 << 10 {
			st.Trace(0, trace[off:min(off+64<<10, len(trace))])
			st.Round(false)
		}
	}
	offline() // both warm
	live()
	lines.n = 0
	startLines := st.Stats().Lines + st.Stats().Outside
	var offCPU, liveCPU time.Duration
	b.SetBytes(int64(len(trace)))
	b.ResetTimer()
	for range b.N {
		t0 := testkit.CPUTime()
		offline()
		t1 := testkit.CPUTime()
		live()
		t2 := testkit.CPUTime()
		offCPU += t1 - t0
		liveCPU += t2 - t1
	}
	n := float64(b.N)
	mb := float64(len(trace)) / 1e6
	liveLines := float64(st.Stats().Lines + st.Stats().Outside - startLines)
	b.StopTimer()
	st.Round(true)
	b.ReportMetric(offCPU.Seconds()/n*1e3, "offline-cpu-ms/pass")
	b.ReportMetric(liveCPU.Seconds()/n*1e3, "live-cpu-ms/pass")
	b.ReportMetric(mb*n/offCPU.Seconds(), "offline-MB/cpu-s")
	b.ReportMetric(mb*n/liveCPU.Seconds(), "live-MB/cpu-s")
	b.ReportMetric(float64(lines.n)/offCPU.Seconds(), "offline-lines/cpu-s")
	b.ReportMetric(liveLines/liveCPU.Seconds(), "live-lines/cpu-s")
	b.ReportMetric(liveCPU.Seconds()/offCPU.Seconds(), "live/offline")
}

// lineCounter counts the lines written to it.
type lineCounter struct{ n int }

func (c *lineCounter) Write(p []byte) (int, error) {
	c.n += bytes.Count(p, []byte{'\n'})
	return len(p), nil
}

var _ io.Writer = (*lineCounter)(nil)

// BenchmarkRoute times the routing of formatted lines alone (cpuState.Write
// into one attached target's stream, spilling as it fills): the part of
// the live path's cost after the formatter, per line.
func BenchmarkRoute(b *testing.B) {
	run, bin := ptsimRun(b, "run-static")
	text := []byte(offline(b, run, nil, 42, 0))
	st := New(Options{Maps: func(int32) ([]images.MapsEntry, error) { return nil, nil }})
	defer st.Close()
	out := stream.New(stream.Options{})
	defer out.Close()
	if err := st.Attach("t", []string{bin}, out); err != nil {
		b.Fatal(err)
	}
	c := newCPU(st, 0)
	// The formatter's writes: up to 64 KiB of whole lines.
	var pieces [][]byte
	for rest := text; len(rest) > 0; {
		n := min(len(rest), 64<<10)
		if n < len(rest) {
			n = bytes.LastIndexByte(rest[:n], '\n') + 1
		}
		pieces, rest = append(pieces, rest[:n]), rest[n:]
	}
	lines := bytes.Count(text, []byte{'\n'})
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for range b.N {
		st.mu.Lock()
		for _, p := range pieces {
			_, _ = c.Write(p)
		}
		st.mu.Unlock()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(lines), "ns/line")
}
