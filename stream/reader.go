package stream

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
)

// Reader is one open of a Stream. It reads whole lines and tells the
// Stream how far it has read, so that nothing it has not read is
// discarded while the window is under the hard bound. Where what it would
// read next was discarded it reads a gap line instead:
//
//	lost: records=N reason=bound
//
// N is the number of lines it missed. If the reader had stopped inside a
// line (a read buffer shorter than the line), the gap line starts with
// '\n' so that no line is spliced.
//
// Offsets: a read at the file offset where the reader's previous read
// ended continues from the stream offset where it ended (gap lines make
// the two differ); any other offset is taken as a stream offset (a seek).
// A new Reader starts at offset 0: if lines were discarded there, its
// first read is the gap line that counts them. The file offset never
// runs ahead of the stream offset: a gap line replaces at least as many
// bytes as it has (it also covers the lines needed for that), so a reader
// comparing its position with the file size (GNU tail -f) never takes a
// gap for a truncation.
type Reader struct {
	s  *Stream
	mu sync.Mutex // serialises reads

	// Guarded by s.mu: the Stream reads them to decide what to discard.
	gen     uint64
	pos     int64  // stream offset of the next byte to read
	line    uint64 // line index at pos
	midLine bool   // the previous read ended inside a line
	// owedNL: a discard took the '\n' that ends the line the reader is
	// inside, and counted the line as read: the next read returns it.
	owedNL bool
	closed bool

	// Guarded by mu.
	filePos int64 // file offset where the previous read ended
	gap     [gapMax]byte
	gapOff  int
	gapLen  int
}

// gapMax bounds a gap line: '\n', the text and a 20-digit count.
const gapMax = 64

// NewReader registers a reader at offset 0. Until it reads, it holds
// back the soft bound's discards.
func (s *Stream) NewReader() *Reader {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &Reader{s: s, gen: s.gen}
	s.readers[r] = struct{}{}
	return r
}

// Close unregisters the reader, which may let the Stream discard what only
// it held.
func (r *Reader) Close() {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	delete(s.readers, r)
	s.trim()
}

// ReadAt reads whole lines at file offset off into p: it ends at the last
// '\n' that fits, unless the line at off is longer than p. At the end it
// returns io.EOF; it never waits for data.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	return r.read(p, off, nil)
}

// ReadSpan is ReadAt, except that a read of a chunk in memory (the one
// being written and the last full one), or of a spilled chunk that runs to
// the chunk's end, as a reader with a buffer of a chunk does, is not
// copied into p: ok reports that span holds its n bytes instead, which the
// caller must Release. A read of a spilled chunk to its end ends at a line
// end by itself, so nothing needs to look at its bytes.
func (r *Reader) ReadSpan(p []byte, off int64) (n int, span Span, ok bool, err error) {
	n, err = r.read(p, off, &span)
	return n, span, span.s != nil, err
}

// read is ReadAt, and ReadSpan when span is not nil.
func (r *Reader) read(p []byte, off int64, span *Span) (int, error) {
	if off < 0 {
		return 0, ErrNegativeOffset
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	s := r.s
	for {
		s.mu.Lock()
		if r.closed || s.closed {
			s.mu.Unlock()
			return 0, ErrClosed
		}
		if r.gen != s.gen {
			// Truncated since the last read: offsets start over.
			r.gen = s.gen
			r.filePos = -1
		}
		if off != r.filePos {
			r.seek(off)
		}
		if r.gapOff == r.gapLen && (r.pos < s.start || r.owedNL) && !r.makeGap() {
			s.mu.Unlock()
			return 0, io.EOF
		}
		if r.gapOff < r.gapLen {
			n := copy(p, r.gap[r.gapOff:r.gapLen])
			r.gapOff += n
			r.filePos = off + int64(n)
			s.mu.Unlock()
			return n, nil
		}
		if r.pos >= s.end() {
			s.mu.Unlock()
			return 0, io.EOF
		}
		if r.pos >= s.curOff {
			n := r.readMem(p, s.cur, s.cur[r.pos-s.curOff:], span)
			r.filePos = off + int64(n)
			s.mu.Unlock()
			return n, nil
		}
		i := s.chunkAt(r.pos)
		c := s.chunks[i]
		if i == len(s.chunks)-1 {
			// The last full chunk, still in memory.
			n := r.readMem(p, s.last, s.last[r.pos-c.off:], span)
			r.filePos = off + int64(n)
			s.mu.Unlock()
			return n, nil
		}
		k := int(min(int64(len(p)), c.end()-r.pos))
		if span != nil && int64(k) == c.end()-r.pos {
			// To the chunk's end, a line end: lent, not copied.
			*span = Span{Fd: s.file.Fd(), Off: s.fileOff(&c, r.pos), N: k,
				s: s, l: s.lend(c.slot), slot: c.slot}
			r.pos, r.line, r.midLine = c.end(), c.line+c.lines, false
			r.trimPast()
			r.filePos = off + int64(k)
			s.mu.Unlock()
			return k, nil
		}
		// An older chunk: pread it without holding up the appender,
		// then make sure it was not discarded (its slot reused) meanwhile.
		at, gen, f := r.pos, s.gen, s.file
		s.mu.Unlock()
		n, err := f.ReadAt(p[:k], s.fileOff(&c, at))
		s.mu.Lock()
		if s.gen != gen || s.start > at || r.closed || s.closed {
			s.mu.Unlock()
			continue // discarded or truncated meanwhile: look again
		}
		if n < k {
			s.mu.Unlock()
			return 0, fmt.Errorf("read stream spill file at %d: %w", at, err)
		}
		n = r.advance(p, k)
		r.filePos = off + int64(n)
		s.mu.Unlock()
		return n, nil
	}
}

// readMem reads src, the bytes from the reader's position on in the chunk
// buffer buf, up to len(p): copied into p, or lent as *span when span is
// not nil (no copy, and no fresh page of a FUSE reply buffer touched: a
// page fault each on the development VM, DESIGN §4). Called with s.mu
// held.
func (r *Reader) readMem(p, buf, src []byte, span *Span) int {
	if span == nil {
		return r.advance(p, copy(p, src))
	}
	n := r.advance(src, min(len(p), len(src)))
	*span = r.s.lendMem(buf, src[:n])
	return n
}

// advance ends a read of n bytes at p's last '\n' (all of them if there is
// none: a line longer than p) and moves the reader past them. Called with
// s.mu held.
func (r *Reader) advance(p []byte, n int) int {
	if i := bytes.LastIndexByte(p[:n], '\n'); i >= 0 {
		n = i + 1
		r.midLine = false
	} else {
		r.midLine = true
	}
	r.pos += int64(n)
	r.line += uint64(bytes.Count(p[:n], newline))
	r.trimPast()
	return n
}

// trimPast trims the window once the reader is past the front chunk: it
// may be discardable now. Called with s.mu held.
func (r *Reader) trimPast() {
	if s := r.s; len(s.chunks) > 0 && r.pos >= s.chunks[0].end() {
		s.trim()
	}
}

// seek places the reader at stream offset off. Below the window the line
// index at off is unknown, so a gap from there counts every line discarded
// since the last truncation (exact for off 0); past the end it is taken as
// the end's. Called with both locks held.
func (r *Reader) seek(off int64) {
	s := r.s
	r.filePos = off
	r.gapOff, r.gapLen = 0, 0
	r.pos, r.owedNL = off, false
	switch {
	case off < s.start:
		r.line, r.midLine = 0, false
	case off >= s.end():
		r.line, r.midLine = s.lines, false
	default:
		r.line, r.midLine = s.lineAt(off)
	}
}

// makeGap moves a reader whose next byte was discarded to the window
// start, or a few lines past it so that the gap line is no longer than
// what it replaces, and formats the gap line, after the '\n' it is owed
// or that ends the fragment it stopped in. It reports false, changing
// nothing, when too few lines follow the gap yet (it then waits for them):
// with the hard bound's minimum, that happens only with a soft bound of a
// few lines or after a spill failure emptied the window. Called with both
// locks held.
func (r *Reader) makeGap() bool {
	s := r.s
	b := r.gap[:0]
	if r.midLine {
		b = append(b, '\n')
	}
	prefix := len(b)
	if r.pos >= s.start {
		// Only the owed line end.
		r.gapOff, r.gapLen = 0, prefix
		r.midLine, r.owedNL = false, false
		return true
	}
	to, line := s.start, s.startLine()
	for {
		b = append(r.gap[:prefix], "lost: records="...)
		b = strconv.AppendUint(b, line-min(r.line, line), 10)
		b = append(b, " reason=bound\n"...)
		if to-r.pos >= int64(len(b)) {
			break
		}
		if to >= s.end() {
			return false
		}
		to = s.lineEnd(to)
		line++
	}
	r.gapOff, r.gapLen = 0, len(b)
	r.pos, r.line = to, line
	r.midLine, r.owedNL = false, false
	return true
}

// end returns the end of the content. Called with mu held.
func (s *Stream) end() int64 { return s.curOff + int64(len(s.cur)) }

// startLine returns the line index at the window start. Called with mu
// held.
func (s *Stream) startLine() uint64 {
	if len(s.chunks) > 0 {
		return s.chunks[0].line
	}
	return s.curLine
}

// chunkAt returns the index of the spilled chunk holding off, which is in
// [start, curOff). Called with mu held.
func (s *Stream) chunkAt(off int64) int {
	i, _ := slices.BinarySearchFunc(s.chunks, off, func(c chunk, off int64) int {
		if c.end() <= off {
			return -1
		}
		if c.off > off {
			return 1
		}
		return 0
	})
	return i
}

// copyAt copies content at off, which is in the window, into p, up to the
// end of its chunk. Called with mu held: seeks and gaps are rare enough to
// pread under it.
func (s *Stream) copyAt(p []byte, off int64) int {
	if off >= s.curOff {
		return copy(p, s.cur[off-s.curOff:])
	}
	c := s.chunks[s.chunkAt(off)]
	k := int(min(int64(len(p)), c.end()-off))
	n, _ := s.file.ReadAt(p[:k], s.fileOff(&c, off))
	return n
}

// lineAt returns the line index at off, in the window, and whether off is
// inside a line, by counting the line ends from the start of its chunk.
// Called with mu held.
func (s *Stream) lineAt(off int64) (line uint64, midLine bool) {
	from, line := s.curOff, s.curLine
	if off < s.curOff {
		c := s.chunks[s.chunkAt(off)]
		from, line = c.off, c.line
	}
	var buf [4096]byte
	last := byte('\n')
	for from < off {
		n := s.copyAt(buf[:min(int64(len(buf)), off-from)], from)
		if n == 0 {
			break // the spill file failed: the count is as far as it got
		}
		line += uint64(bytes.Count(buf[:n], newline))
		last = buf[n-1]
		from += int64(n)
	}
	return line, last != '\n'
}

// lineEnd returns the offset after the end of the line that starts at off,
// in the window. Called with mu held.
func (s *Stream) lineEnd(off int64) int64 {
	var buf [256]byte
	for off < s.end() {
		n := s.copyAt(buf[:], off)
		if n == 0 {
			return s.end()
		}
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			return off + int64(i) + 1
		}
		off += int64(n)
	}
	return off
}
