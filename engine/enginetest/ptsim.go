package enginetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"ptfs/decode/ptenc"
	"ptfs/engine"
	"ptfs/images"
)

// Ptsim is a ptsim recording (a run directory of ../shared/corpus/ptsim:
// trace.pt, maps.txt, the vDSO dump) as the kernel would show it to a
// live mount: its PT bytes as AUX data of one CPU and a side band made
// from its maps.txt.
type Ptsim struct {
	// Trace is the PT stream.
	Trace []byte
	// Maps are the mappings of every snapshot of maps.txt, in order (a
	// later one wins), with relative file names made absolute under the
	// directory given to LoadPtsim.
	Maps []images.MapsEntry
	// VDSO is the path of the vDSO dump.
	VDSO string
}

// LoadPtsim reads the run directory run; its binaries are in dir.
func LoadPtsim(run, dir string) (*Ptsim, error) {
	trace, err := os.ReadFile(filepath.Join(run, "trace.pt"))
	if err != nil {
		return nil, fmt.Errorf("ptsim run: %w", err)
	}
	text, err := os.ReadFile(filepath.Join(run, "maps.txt"))
	if err != nil {
		return nil, fmt.Errorf("ptsim run: %w", err)
	}
	snaps, err := images.ParseMapsSnapshots(text)
	if err != nil {
		return nil, fmt.Errorf("ptsim run %s: %w", run, err)
	}
	maps := images.AllMaps(snaps)
	for i := range maps {
		if p := maps[i].Path; p != "" && !strings.HasPrefix(p, "[") && !filepath.IsAbs(p) {
			maps[i].Path = filepath.Join(dir, p)
		}
	}
	vdso, _ := filepath.Glob(filepath.Join(run, "vdso-*.bin"))
	if len(vdso) != 1 {
		return nil, fmt.Errorf("ptsim run %s: %d vDSO dumps", run, len(vdso))
	}
	return &Ptsim{Trace: trace, Maps: maps, VDSO: vdso[0]}, nil
}

// MapsText returns Maps as /proc/PID/maps text (for `ptfs decode
// --branches --maps`, which then builds the same memory).
func (p *Ptsim) MapsText() string {
	var b strings.Builder
	for _, m := range p.Maps {
		fmt.Fprintf(&b, "%x-%x %s %08x 00:00 0 %s\n", m.Start, m.End, m.Perms, m.Off, m.Path)
	}
	return b.String()
}

// Batches returns what a reader of cpu finds: a first batch with the
// ITRACE_START of pid/tid and an MMAP2 per mapping, then the trace in
// chunks of chunk bytes (cut anywhere), one batch each.
func (p *Ptsim) Batches(cpu int, pid, tid int32, chunk int) []Batch {
	side := []Step{Side(engine.SideEvent{Kind: engine.SideITraceStart, PID: pid, TID: tid})}
	for _, m := range p.Maps {
		side = append(side, Side(engine.SideEvent{Kind: engine.SideMmap2, PID: pid, TID: tid,
			Addr: m.Start, Len: m.End - m.Start, PgOff: m.Off, Filename: m.Path}))
	}
	out := []Batch{{cpu: side}}
	for off := 0; off < len(p.Trace); off += chunk {
		out = append(out, Batch{cpu: {Trace(p.Trace[off:min(off+chunk, len(p.Trace))])}})
	}
	return out
}

// StartStops returns a PT stream (a PSB+, then for each pair of times a
// TSC and a TIP.PGE at start, a TSC and a TIP.PGD at stop) of a program
// that is traced from start to stop at those times: the smallest trace
// whose lines carry known times, for tests of ordering by time. It also
// returns the stream's length after each pair.
func StartStops(start, stop uint64, tscs ...uint64) (trace []byte, ends []int) {
	var e ptenc.Encoder
	e.PSB()
	e.PSBEnd()
	for i := 0; i+1 < len(tscs); i += 2 {
		e.TSC(tscs[i])
		e.IP(ptenc.TIPPGE, start)
		e.TSC(tscs[i+1])
		e.IP(ptenc.TIPPGD, stop)
		ends = append(ends, len(e.Bytes()))
	}
	return e.Bytes(), ends
}
