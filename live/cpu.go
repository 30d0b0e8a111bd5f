package live

import (
	"bytes"
	"errors"
	"fmt"
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
	fd       *flow.Decoder // kept across chunk decoders: its block cache
	dec      chunkDecoder
	br       *flow.Branches
	tc       perfdata.TimeConv
}

// chunkDecoder is what the stage needs of a streaming flow decoder, with
// the methods of flow's: one CPU's trace as it comes, cut anywhere, decoded
// into the Handler it was made with as far as the bytes decide the flow
// (Write); a hole where trace was lost (Gap: a gap line, then the flow
// resumes at the next PSB); the end of the trace (Close: a stopped or
// flushed event, whose next trace starts with a PSB+). After Close the
// stage makes a new one (newChunkDecoder) over the same flow.Decoder, so
// the block cache is kept. pieces is the stand-in until the streaming
// decoder of package flow (flow.NewStream), which keeps the flow across
// chunks, takes its place.
type chunkDecoder interface {
	Write(p []byte) (int, error)
	Gap(cause error)
	Close() error
}

// newChunkDecoder makes the chunk decoder of a CPU over d into h; where the
// streaming decoder of package flow goes.
func newChunkDecoder(d *flow.Decoder, h flow.Handler, minPiece, maxHeld int) chunkDecoder {
	return &pieces{d: d, f: endFilter{h: h}, min: minPiece, max: maxHeld}
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
// after exec, an empty one for an unknown process) and drops the names
// cached from other code.
func (c *cpuState) useSpace() {
	sp := c.s.space(c.pid)
	if sp == nil {
		sp = c.s.empty
	}
	if sp != c.mem.space || sp.Generation() != c.symGen {
		c.mem.space, c.symGen = sp, sp.Generation()
		c.br.SetSymbolizer(&c.mem)
	}
}

// write passes trace bytes to the decoder and hands the lines out.
func (c *cpuState) write(data []byte) {
	c.useSpace()
	_, _ = c.dec.Write(data) // a chunkDecoder takes all
	_ = c.br.Flush()         // Write never fails
}

// end ends the CPU's trace (the event stopped or was flushed): what is
// held is decoded to its end, and the next bytes start a new trace.
func (c *cpuState) end() {
	c.useSpace()
	_ = c.dec.Close()
	c.br.Finish()
	_ = c.br.Flush()
	c.dec = newChunkDecoder(c.fd, c.br, c.s.opts.MinPiece, c.s.opts.MaxHeld)
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

// psb is the PSB packet: every piece the stand-in decodes starts at one.
var psb = []byte{2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82}

// errLost is the error of a hole (Gap), as the streaming decoder reports it.
var errLost = errors.New("trace lost")

// pieces is the stand-in for a streaming flow decoder (chunkDecoder): it
// holds a CPU's trace and, once at least min bytes are held, decodes them
// with flow.Decoder.Decode up to the last PSB, so that each piece after the
// first starts at a PSB, where the decoder synchronises. The end of a piece
// that the trace goes on after is not reported (endFilter): the lines run
// on across pieces. What this cannot keep across a cut, unlike a streaming
// decoder: the call stack of return compression (reset at each piece, as
// at a resynchronisation), a direct jump or call in the last bytes before
// the PSB, which no packet of the piece confirms (its line comes after
// lines the next piece gives it, or is missing), and a probe record read
// before it (printed before that branch). More than max bytes without a
// PSB are decoded whole (counted as forced): the next bytes resume at
// their first PSB.
type pieces struct {
	d        *flow.Decoder
	f        endFilter
	held     []byte
	min, max int
	pos      uint64 // stream offset of held[0]
	nForced  uint64
}

func (p *pieces) Write(data []byte) (int, error) {
	p.held = append(p.held, data...)
	if len(p.held) < p.min {
		return len(data), nil
	}
	cut := bytes.LastIndex(p.held, psb)
	switch {
	case cut > 0:
		p.decode(cut, false)
	case len(p.held) > p.max:
		p.nForced++
		p.decode(len(p.held), true)
	}
	return len(data), nil
}

// Gap decodes what is held to its end and reports the hole.
func (p *pieces) Gap(cause error) {
	p.decode(len(p.held), true)
	err := errLost
	if cause != nil {
		err = fmt.Errorf("%w: %w", errLost, cause)
	}
	p.f.h.Event(&flow.Event{Kind: flow.EvError, Offset: p.pos, Err: err})
}

// Close decodes what is held to its end.
func (p *pieces) Close() error {
	p.decode(len(p.held), true)
	return nil
}

// decode decodes held[:cut], reporting its end when whole.
func (p *pieces) decode(cut int, whole bool) {
	if cut == 0 {
		return
	}
	p.f.keepEnd = whole
	p.d.Decode(p.held[:cut], &p.f)
	p.pos += uint64(cut)
	p.held = p.held[:copy(p.held, p.held[cut:])]
}

// endFilter passes the flow on but for the end of a piece that the trace
// goes on after.
type endFilter struct {
	h       flow.Handler
	keepEnd bool
}

func (f *endFilter) Insn(in *flow.Insn) { f.h.Insn(in) }

func (f *endFilter) Branch(from, to uint64, k flow.BranchKind) { f.h.Branch(from, to, k) }

func (f *endFilter) Event(e *flow.Event) {
	if e.Kind == flow.EvEnd && !f.keepEnd {
		return
	}
	f.h.Event(e)
}
