package live

import (
	"bytes"
	"strconv"

	"ptfs/flow"
	"ptfs/images"
	"ptfs/perfdata"
)

// cpuState is the decoding of one CPU's trace: the process that runs there
// (its memory and thread), the decoder and the line formatter, whose output
// the stage routes (Write). Its methods run with the stage's mu held.
type cpuState struct {
	s        *Stage
	cpu      int32
	pid, tid int32
	mem      spaceMemory
	symGen   uint64        // mem's generation when the formatter's names were cached
	fd       *flow.Decoder // kept across streams: its block cache
	dec      *flow.Stream  // the trace since the CPU's events last started
	br       *flow.Branches
	tc       perfdata.TimeConv
}

// spaceMemory is the memory of the process a CPU runs, for the decoder
// (code bytes, generation) and the formatter (names). It is switched
// between processes' spaces.
type spaceMemory struct{ space *images.Space }

func (m *spaceMemory) ReadAt(dst []byte, addr uint64) (int, error) { return m.space.ReadAt(dst, addr) }

func (m *spaceMemory) Generation() uint64 { return m.space.Generation() }

func (m *spaceMemory) Symbolize(addr uint64) (string, uint64, string, bool) {
	return m.space.Symbolize(addr)
}

// switchTo makes pid/tid the process and thread of the lines from now on.
func (c *cpuState) switchTo(pid, tid int32) {
	c.pid, c.tid = pid, tid
	c.br.SetContext(tid, c.cpu)
	c.useSpace()
}

// useSpace points the memory at the current process's space (a new one
// after exec, an empty one for an unknown process) and, when it or its
// mappings changed, drops the code and names decoded from other bytes.
func (c *cpuState) useSpace() {
	sp := c.s.space(c.pid)
	if sp == nil {
		sp = c.s.empty
	}
	if sp != c.mem.space || sp.Generation() != c.symGen {
		c.mem.space, c.symGen = sp, sp.Generation()
		c.fd.MemoryChanged()
		c.br.SymbolsChanged()
	}
}

// write passes trace bytes to the decoder and hands the lines out.
func (c *cpuState) write(data []byte) {
	c.useSpace()
	// A Stream takes all bytes until Close, after which end made a new
	// one; the stage's Write never fails.
	_, _ = c.dec.Write(data)
	_ = c.br.Flush()
}

// end ends the CPU's trace (the event stopped or was flushed): what is
// held is decoded to its end, and the next bytes start a new trace.
func (c *cpuState) end() {
	c.useSpace()
	_ = c.dec.Close()
	c.br.Finish()
	_ = c.br.Flush()
	c.dec = flow.NewStream(c.fd, c.br)
}

// gap reports trace lost by cause: a gap line, then the flow resumes at
// the next PSB.
func (c *cpuState) gap(cause error) {
	c.useSpace()
	c.dec.Gap(cause)
	_ = c.br.Flush()
}

// Write takes the formatter's lines (whole lines, as flow.Branches writes
// them) and routes each; a run of lines that go to a target goes to its
// stream in one append, without a copy.
func (c *cpuState) Write(p []byte) (int, error) {
	s := c.s
	s.out = p
	for off := 0; off < len(p); {
		i := bytes.IndexByte(p[off:], '\n')
		if i < 0 {
			i = len(p) - off - 1
		}
		s.route(off, off+i+1)
		off += i + 1
	}
	for _, t := range s.targets {
		t.flush(p)
	}
	s.out = nil
	return len(p), nil
}

// Line kinds, by prefix (DESIGN §5).
var (
	prefixBranch = []byte("branch: ")
	prefixTrace  = []byte("trace: ")
	prefixRecord = []byte("record ")
	prefixManual = []byte("manual ptwrite: ")
)

// route hands the line out[start:end] to the targets it belongs to: a
// branch or trace line to those whose file it names, a record to the
// target of its event (numbered in that stream), anything else (gap lines,
// manual ptwrites) to every target. A line no target takes is counted
// (Outside).
func (s *Stage) route(start, end int) {
	line := s.out[start:end]
	switch {
	case bytes.HasPrefix(line, prefixBranch), bytes.HasPrefix(line, prefixTrace):
		branch := line[0] == 'b'
		sent := false
		for _, t := range s.targets {
			for _, own := range t.owns {
				if bytes.Contains(line, own) {
					t.take(s.out, start, end)
					s.st.Lines++
					sent = true
					break
				}
			}
		}
		switch {
		case !sent:
			s.st.Outside++
		case branch:
			s.st.Branches++
		}
	case bytes.HasPrefix(line, prefixRecord):
		for _, t := range s.targets {
			if bytes.Contains(line, t.event) {
				t.record(s.out, line)
				s.st.Lines++
				return
			}
		}
		s.st.Outside++
	default:
		if bytes.HasPrefix(line, prefixManual) {
			s.st.Manual++
		}
		for _, t := range s.targets {
			t.take(s.out, start, end)
			s.st.Lines++
		}
	}
}

// take adds the line p[start:end] to t's run of lines, which goes to its
// stream when a line breaks it (flush).
func (t *Target) take(p []byte, start, end int) {
	t.lines++
	if t.runEnd != start || t.runEnd == 0 {
		t.flush(p)
		t.runStart = start
	}
	t.runEnd = end
}

// flush appends t's run of lines of p to its stream.
func (t *Target) flush(p []byte) {
	if t.runEnd > t.runStart {
		t.out.Append(p[t.runStart:t.runEnd])
	}
	t.runStart, t.runEnd = 0, 0
}

// record appends a record line of p numbered in t's stream: `record N:`
// counts the records of this stream from 1.
func (t *Target) record(p, line []byte) {
	i := bytes.IndexByte(line, ':')
	if i < 0 {
		return
	}
	t.flush(p)
	t.seq++
	t.buf = append(t.buf[:0], prefixRecord...)
	t.buf = strconv.AppendUint(t.buf, t.seq, 10)
	t.buf = append(t.buf, line[i:]...)
	t.lines++
	t.out.Append(t.buf)
}
