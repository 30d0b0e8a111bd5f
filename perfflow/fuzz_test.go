package perfflow

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"ptfs/flow"
	"ptfs/images"
	"ptfs/internal/testkit"
	"ptfs/perfdata"
)

// fuzzLayout turns fuzz bytes into a buffer's layout around trace: its
// chunks (cut anywhere, with holes between them), its AUX records (any
// offsets, sizes, loss flags and times) and side band over time (switches,
// mmaps of the real binary, exec, fork, exit, lost records), 4 bytes an
// item: the low 3 bits of the first say which, its high bits how.
type fuzzLayout struct {
	chunks []perfdata.Chunk
	auxes  []perfdata.Event
	side   []perfdata.Event
	holes  uint64
	// truncated, partial and collision count the AUX records' flags.
	truncated, partial, collision uint64
}

func newFuzzLayout(trace, layout []byte) *fuzzLayout {
	l := &fuzzLayout{}
	var off, auxOff, now uint64
	cut := func(n int) {
		n = min(n, len(trace))
		if n > 0 {
			l.chunks = append(l.chunks, perfdata.Chunk{Offset: off, Data: trace[:n]})
			trace, off = trace[n:], off+uint64(n)
		}
	}
	for ; len(layout) >= 4; layout = layout[4:] {
		op, a, v := layout[0], layout[1], uint64(layout[2])|uint64(layout[3])<<8
		now += uint64(a)
		switch op & 7 {
		case 0:
			cut(int(v))
		case 1:
			if len(l.chunks) > 0 && len(trace) > 0 && v > 0 {
				off += v
				l.holes++
			}
		case 2:
			flags := uint64(op>>3) & (perfdata.AuxTruncated | perfdata.AuxPartial | perfdata.AuxCollision)
			l.auxes = append(l.auxes, perfdata.Event{Kind: perfdata.Aux, AuxOffset: auxOff, AuxSize: v, AuxFlags: flags, Time: now, HasTime: true})
			auxOff += v
			for _, c := range []struct {
				flag uint64
				n    *uint64
			}{{perfdata.AuxTruncated, &l.truncated}, {perfdata.AuxPartial, &l.partial}, {perfdata.AuxCollision, &l.collision}} {
				if flags&c.flag != 0 {
					*c.n++
				}
			}
		case 3:
			pid := int32(1 + op>>7)
			e := perfdata.Event{PID: pid, TID: pid + int32(v&3), Time: now, HasTime: true}
			switch op >> 3 & 7 {
			case 0, 1:
				e.Kind = perfdata.Switch
			case 2:
				e.Kind, e.Addr, e.Len, e.PgOff, e.Name = perfdata.Mmap, 0x401000+v<<12, 0x78000, 0x1000, "flow-static"
			case 3:
				e.Kind, e.Exec = perfdata.Comm, true
			case 4:
				e.Kind, e.PPID = perfdata.Fork, 1
			case 5:
				e.Kind = perfdata.Exit
			default:
				e.Kind, e.Lost = perfdata.Lost, v
			}
			l.side = append(l.side, e)
		default:
			cut(int(a))
		}
	}
	cut(len(trace))
	return l
}

// FuzzDecodeBuffer decodes mutated traces over real code (ptsim's static
// binary) cut into chunks and AUX records of any layout, with side band
// over time: no panic, no hang (each decode ends within 3 s), allocation
// and output bounded by the input, every AUX loss and hole counted once.
func FuzzDecodeBuffer(f *testing.F) {
	corpus := testkit.Corpus(f)
	dir := filepath.Join(corpus, "ptsim")
	trace, err := os.ReadFile(filepath.Join(dir, "run-static", "trace.pt"))
	if err != nil {
		f.Fatal(err)
	}
	vdso, err := images.OpenELF(filepath.Join(dir, "run-static", "vdso-7ffff7ffd000.bin"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { vdso.Close() })
	seed := trace[:min(len(trace), 1<<12)]
	f.Add(seed, []byte{})
	// Two records, the first truncated, a hole, a switch and an mmap.
	f.Add(seed, []byte{2 | 1<<3, 1, 0, 4, 0, 0, 0, 4, 1, 0, 16, 0, 2, 5, 0, 12, 3, 3, 2, 0, 3 | 2<<3, 1, 0, 0})
	f.Add(segment(3), []byte{2 | 8<<3, 1, 8, 0, 2 | 4<<3, 1, 200, 0, 3 | 7<<3, 2, 9, 0})
	f.Fuzz(func(t *testing.T, trace, layout []byte) {
		if len(trace) > 1<<13 || len(layout) > 1<<10 {
			return
		}
		l := newFuzzLayout(trace, layout)
		p := images.NewProcesses(images.Options{VDSO: vdso, Path: func(name string) string { return filepath.Join(dir, filepath.Base(name)) }})
		defer p.Close()
		tl := &perfdata.Timeline{}
		tl.Push(perfdata.Event{Kind: perfdata.Comm, Exec: true, PID: 1, TID: 1})
		for _, m := range []struct{ addr, n, off uint64 }{{0x400000, 0x1000, 0}, {0x401000, 0x78000, 0x1000}, {0x479000, 0x28000, 0x79000}} {
			tl.Push(perfdata.Event{Kind: perfdata.Mmap, PID: 1, TID: 1, Addr: m.addr, Len: m.n, PgOff: m.off, Name: "flow-static"})
		}
		tl.Push(perfdata.Event{Kind: perfdata.Mmap, PID: 1, TID: 1, Addr: 0x7ffff7ffd000, Len: 0x2000, Name: "[vdso]"})
		tl.Push(perfdata.Event{Kind: perfdata.ItraceStart, PID: 1, TID: 1})
		for _, e := range l.side {
			tl.Push(e)
		}
		var out bytes.Buffer
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		d := New(Config{Processes: p, Timeline: tl, CPU: 0, Options: flow.Options{MaxInsns: 1 << 10}}, func(mem flow.Memory, sym flow.Symbolizer) *flow.Branches {
			return flow.NewBranches(&out, mem, sym, nil)
		})
		var err error
		testkit.Bounded(t, 3*time.Second, fmt.Sprintf("DecodeBuffer of %d bytes, %d records", len(trace), len(l.auxes)), func() {
			err = d.DecodeBuffer(&perfdata.Buffer{Chunks: l.chunks}, l.auxes)
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Branches().Flush(); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		items := uint64(len(trace) + len(layout) + 16)
		if n := after.TotalAlloc - before.TotalAlloc; n > 64<<20+items<<10 {
			t.Fatalf("%d bytes allocated for %d bytes of trace and %d of layout", n, len(trace), len(layout))
		}
		if n := uint64(out.Len()); n > items<<10 {
			t.Fatalf("%d bytes of lines for %d bytes of trace and %d of layout", n, len(trace), len(layout))
		}
		c := d.Counters()
		if c.Truncated != l.truncated || c.Partial != l.partial || c.Collision != l.collision || c.Holes != l.holes {
			t.Fatalf("counters %+v, want truncated %d partial %d collision %d holes %d", c, l.truncated, l.partial, l.collision, l.holes)
		}
		for line := range strings.Lines(out.String()) {
			if !strings.HasPrefix(line, "branch: ") && !strings.HasPrefix(line, "trace: ") && !strings.HasPrefix(line, "gap: ") && !strings.HasPrefix(line, "manual ptwrite: ") {
				t.Fatalf("line %q of no format of DESIGN §5", line)
			}
		}
	})
}
