// Package stream holds a growing text file with bounded memory: the content
// behind ptfs's `records` and `branches` files.
package stream

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"sync/atomic"
)

// ErrNegativeOffset is returned by ReadAt for an offset below zero.
var ErrNegativeOffset = errors.New("stream: negative offset")

// DefaultLimit is the bound New uses when it is given no positive limit.
const DefaultLimit = 64 << 20

// Stream is a growing text file kept in memory.
//
// Memory is bounded by the limit given to New. When appending a line would
// make the content exceed the limit, the content is first emptied and the
// file starts over at size 0, like logrotate's copytruncate: a reader that
// polls the size (GNU tail -f) sees it shrink, reports "file truncated" and
// keeps following from offset 0. Nothing else changes; Rotations counts how
// often this happened. (tail infers truncation from a smaller size, so a
// reader that polls less often than the content takes to grow past its old
// size again misses the restart; with a limit of megabytes that needs
// megabytes of trace between two polls.) A single line longer than the limit can never be
// kept: it is dropped and counted by DroppedLines.
//
// One goroutine may Append while any number read; all methods are safe for
// concurrent use. Reads never block.
type Stream struct {
	mu sync.RWMutex
	// The content is chunks laid end to end, every chunk but the last
	// full: appending never moves what is there, and a reader copies out
	// of stable memory.
	chunks [][]byte
	n      int      // content length
	free   [][]byte // emptied chunks, reused before allocating
	chunk  int      // chunk capacity
	limit  int

	// size and resets are written under mu and read without it, so that
	// polling the size (every stat of the file) never waits for a writer.
	size      atomic.Int64
	resets    atomic.Uint64
	rotations atomic.Uint64
	dropped   atomic.Uint64
}

// maxChunk is the largest chunk: big enough that a FUSE read (128 KiB)
// rarely spans two, small enough that a short stream stays small.
const maxChunk = 1 << 20

// New returns an empty Stream holding at most limit bytes; limit <= 0
// selects DefaultLimit.
func New(limit int) *Stream {
	if limit <= 0 {
		limit = DefaultLimit
	}
	return &Stream{limit: limit, chunk: min(limit, maxChunk)}
}

// Limit returns the bound on the content size.
func (s *Stream) Limit() int { return s.limit }

// Append adds p, which should be whole lines, at the end of the content.
// A final line without '\n' is treated as a line. Append does not keep p.
func (s *Stream) Append(p []byte) {
	if len(p) == 0 {
		return
	}
	s.mu.Lock()
	if s.n+len(p) <= s.limit {
		// Common case: everything fits, no need to look for line ends.
		s.put(p)
	} else {
		s.appendLines(p)
	}
	s.size.Store(int64(s.n))
	s.mu.Unlock()
}

// appendLines adds p line by line, starting over whenever the next line
// does not fit. Called with mu held.
func (s *Stream) appendLines(p []byte) {
	for len(p) > 0 {
		n := bytes.IndexByte(p, '\n') + 1
		if n == 0 {
			n = len(p)
		}
		line := p[:n]
		p = p[n:]
		if len(line) > s.limit {
			s.dropped.Add(1)
			continue
		}
		if s.n+len(line) > s.limit {
			s.empty()
			s.rotations.Add(1)
		}
		s.put(line)
	}
}

// put appends p, which fits under the limit, filling the last chunk and
// taking new ones from the free list or, until the limit is reached once,
// from the allocator. Called with mu held.
func (s *Stream) put(p []byte) {
	for len(p) > 0 {
		last := len(s.chunks) - 1
		if last < 0 || len(s.chunks[last]) == cap(s.chunks[last]) {
			var c []byte
			if k := len(s.free); k > 0 {
				c, s.free = s.free[k-1], s.free[:k-1]
			} else {
				c = make([]byte, 0, s.chunk)
			}
			s.chunks = append(s.chunks, c)
			last++
		}
		c := s.chunks[last]
		k := min(len(p), cap(c)-len(c))
		s.chunks[last] = append(c, p[:k]...)
		s.n += k
		p = p[k:]
	}
}

// empty drops the content, keeping the chunks for reuse. Called with mu
// held.
func (s *Stream) empty() {
	for _, c := range s.chunks {
		s.free = append(s.free, c[:0])
	}
	clear(s.chunks)
	s.chunks = s.chunks[:0]
	s.n = 0
	s.size.Store(0)
	s.resets.Add(1)
}

// Size returns the current size of the file as readers see it.
func (s *Stream) Size() int64 { return s.size.Load() }

// ReadAt copies content at off into p. At or past the end it returns
// io.EOF; a read that reaches the end returns the bytes it got and nil.
// It never blocks waiting for data.
func (s *Stream) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, ErrNegativeOffset
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if off >= int64(s.n) {
		return 0, io.EOF
	}
	got := 0
	for i, o := int(off)/s.chunk, int(off)%s.chunk; got < len(p) && i < len(s.chunks); i, o = i+1, 0 {
		got += copy(p[got:], s.chunks[i][o:])
	}
	return got, nil
}

// Truncate empties the content (`: > records`). The chunks are kept for
// reuse, so the next appends do not allocate.
func (s *Stream) Truncate() {
	s.mu.Lock()
	s.empty()
	s.mu.Unlock()
}

// Rotations returns how often the content was emptied because the limit
// was reached.
func (s *Stream) Rotations() uint64 { return s.rotations.Load() }

// Resets returns how often the content started over at size 0, by
// Truncate or by rotation. A reader that sees the same size but a
// different Resets knows the content changed.
func (s *Stream) Resets() uint64 { return s.resets.Load() }

// DroppedLines returns how many lines were dropped because each alone was
// longer than the limit.
func (s *Stream) DroppedLines() uint64 { return s.dropped.Load() }
