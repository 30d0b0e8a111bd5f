package perfflow

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"ptfs/decode/ptenc"
	"ptfs/flow"
	"ptfs/images"
	"ptfs/perfdata"
)

// segment is a stretch of trace that starts tracing at 0x1000 (a PSB+) and
// takes the loop's branch n times: 1000: nop; 1001: jne 1000; 1003: ...
func segment(n int) []byte {
	e := ptenc.New()
	e.PSB()
	e.IP(ptenc.FUP, 0x1000)
	e.ModeExec(true, false)
	e.PSBEnd()
	for range n {
		e.TNT(1, 1)
	}
	e.TNT(0, 1)
	e.IPC(ptenc.TIPPGD, 0, 0)
	return e.Bytes()
}

// TestDecodeBuffer cuts one buffer's trace by its AUX records: a
// COLLISION or PARTIAL record loses trace before its bytes, a TRUNCATED
// one after them (also when it has no bytes), a jump in the chunks'
// offsets is a hole, and each is a gap line counted by its cause.
func TestDecodeBuffer(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte{0x90, 0x75, 0xfd, 0x0f, 0x05}, 0o644); err != nil {
		t.Fatal(err)
	}
	s1, s2 := segment(1), segment(2)
	aux := func(off, size, flags uint64) perfdata.Event {
		return perfdata.Event{Kind: perfdata.Aux, AuxOffset: off, AuxSize: size, AuxFlags: flags}
	}
	n1, n2 := uint64(len(s1)), uint64(len(s2))
	tests := []struct {
		name   string
		chunks []perfdata.Chunk
		auxes  []perfdata.Event
		// want are the lines' first words: s for a sync, b for a
		// branch, the cause for a gap.
		want string
		c    Counters
	}{
		{"clean", []perfdata.Chunk{{Offset: 0, Data: s1}, {Offset: n1, Data: s2}}, []perfdata.Event{aux(0, n1, 0), aux(n1, n2, 0)}, "s b s b b", Counters{}},
		{"hole", []perfdata.Chunk{{Offset: 0, Data: s1}, {Offset: n1 + 8, Data: s2}}, nil, "s b hole s b b", Counters{Holes: 1}},
		{"truncated", []perfdata.Chunk{{Offset: 0, Data: s1}, {Offset: n1, Data: s2}}, []perfdata.Event{aux(0, n1, perfdata.AuxTruncated), aux(n1, n2, 0)}, "s b truncated s b b", Counters{Truncated: 1}},
		{"collision", []perfdata.Chunk{{Offset: 0, Data: s1}, {Offset: n1, Data: s2}}, []perfdata.Event{aux(0, n1, 0), aux(n1, n2, perfdata.AuxCollision)}, "s b collision s b b", Counters{Collision: 1}},
		{"partial first", []perfdata.Chunk{{Offset: 0, Data: s1}}, []perfdata.Event{aux(0, n1, perfdata.AuxPartial)}, "partial s b", Counters{Partial: 1}},
		{"empty truncated record at the end", []perfdata.Chunk{{Offset: 0, Data: s1}}, []perfdata.Event{aux(0, n1, 0), aux(n1, 0, perfdata.AuxTruncated)}, "s b truncated", Counters{Truncated: 1}},
		{"record without its data", []perfdata.Chunk{{Offset: 0, Data: s1}}, []perfdata.Event{aux(0, n1, 0), aux(n1, 64, perfdata.AuxTruncated)}, "s b truncated", Counters{Truncated: 1}},
		{"record across two chunks", []perfdata.Chunk{{Offset: 0, Data: s1[:5]}, {Offset: 5, Data: s1[5:]}}, []perfdata.Event{aux(0, n1, perfdata.AuxTruncated)}, "s b truncated", Counters{Truncated: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := images.NewProcesses(images.Options{Path: func(name string) string { return filepath.Join(dir, name) }})
			defer p.Close()
			tl := &perfdata.Timeline{}
			tl.Push(perfdata.Event{Kind: perfdata.Comm, Exec: true, PID: 1, TID: 1})
			tl.Push(perfdata.Event{Kind: perfdata.Mmap, PID: 1, TID: 1, Addr: 0x1000, Len: 0x1000, Name: "a"})
			tl.Push(perfdata.Event{Kind: perfdata.ItraceStart, PID: 1, TID: 1})
			var out bytes.Buffer
			d := New(Config{Processes: p, Timeline: tl, CPU: 0}, func(mem flow.Memory, sym flow.Symbolizer) *flow.Branches {
				return flow.NewBranches(&out, mem, sym, nil)
			})
			if err := d.DecodeBuffer(&perfdata.Buffer{Chunks: tt.chunks}, tt.auxes); err != nil {
				t.Fatal(err)
			}
			if err := d.Branches().Flush(); err != nil {
				t.Fatal(err)
			}
			var got []string
			for line := range strings.Lines(out.String()) {
				switch {
				case strings.HasPrefix(line, "trace: sync"):
					got = append(got, "s")
				case strings.HasPrefix(line, "branch: "):
					if !strings.Contains(line, "(a) jcc tid=1 cpu=0") {
						t.Errorf("line %q", line)
					}
					got = append(got, "b")
				case strings.HasPrefix(line, "gap: "):
					_, cause, _ := strings.Cut(line, "trace lost: aux ")
					cause, _, _ = strings.Cut(cause, " ")
					got = append(got, cause)
				}
			}
			if g := strings.Join(got, " "); g != tt.want {
				t.Errorf("lines %q, want %q:\n%s", g, tt.want, out.String())
			}
			if c := d.Counters(); c.Truncated != tt.c.Truncated || c.Collision != tt.c.Collision || c.Partial != tt.c.Partial || c.Holes != tt.c.Holes {
				t.Errorf("counters %+v, want %+v", c, tt.c)
			}
		})
	}
}

// TestDecodeBufferPlacesRecordsWithoutData: AUX records whose data never
// came are placed each after the record before it, as records with data
// are: the last one's truncation is told after the side band up to the
// time of the one before it (here a switch to thread 2), not only up to
// the last record with data.
func TestDecodeBufferPlacesRecordsWithoutData(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte{0x90, 0x75, 0xfd, 0x0f, 0x05}, 0o644); err != nil {
		t.Fatal(err)
	}
	s1 := segment(1)
	n1 := uint64(len(s1))
	aux := func(off, size, flags, time uint64) perfdata.Event {
		return perfdata.Event{Kind: perfdata.Aux, AuxOffset: off, AuxSize: size, AuxFlags: flags, Time: time}
	}
	p := images.NewProcesses(images.Options{Path: func(name string) string { return filepath.Join(dir, name) }})
	defer p.Close()
	tl := &perfdata.Timeline{}
	tl.Push(perfdata.Event{Kind: perfdata.Comm, Exec: true, PID: 1, TID: 1, Time: 1})
	tl.Push(perfdata.Event{Kind: perfdata.Mmap, PID: 1, TID: 1, Addr: 0x1000, Len: 0x1000, Name: "a", Time: 1})
	tl.Push(perfdata.Event{Kind: perfdata.ItraceStart, PID: 1, TID: 1, Time: 1})
	tl.Push(perfdata.Event{Kind: perfdata.Switch, PID: 1, TID: 2, Time: 15})
	var out bytes.Buffer
	d := New(Config{Processes: p, Timeline: tl, CPU: 0}, func(mem flow.Memory, sym flow.Symbolizer) *flow.Branches {
		return flow.NewBranches(&out, mem, sym, nil)
	})
	// The first record's data came; the second's and third's did not.
	auxes := []perfdata.Event{aux(0, n1, 0, 10), aux(n1, 64, 0, 20), aux(n1+64, 64, perfdata.AuxTruncated, 30)}
	if err := d.DecodeBuffer(&perfdata.Buffer{Chunks: []perfdata.Chunk{{Offset: 0, Data: s1}}}, auxes); err != nil {
		t.Fatal(err)
	}
	if err := d.Branches().Flush(); err != nil {
		t.Fatal(err)
	}
	var gaps []string
	for line := range strings.Lines(out.String()) {
		if strings.HasPrefix(line, "gap: ") {
			gaps = append(gaps, line)
		}
	}
	if len(gaps) != 1 || !strings.Contains(gaps[0], "aux truncated") || !strings.Contains(gaps[0], " tid=2 ") {
		t.Errorf("gap lines %q, want one aux truncated with tid=2 (placed after the record of time 20):\n%s", gaps, out.String())
	}
	if c := d.Counters(); c.Truncated != 1 || c.Switches != 2 {
		t.Errorf("counters %+v, want 1 truncated, 2 switches", c)
	}
}
