package stream

import (
	"fmt"
	"os"
	"slices"
	"unsafe"
)

// Span is what a read returns instead of a copy (see Reader.ReadSpan): N
// bytes, whole lines unless the line is longer than the read, either in
// memory, Mem (a chunk still in its buffer), or else at Off of the spill
// file whose descriptor is Fd. The caller moves them itself (FUSE writes
// Mem into the reply as it is, or splices the file's pages into it: one
// copy fewer than a copy into a buffer and a write of it) and then calls
// Release once. Until then the bytes do not change: the chunk's buffer or
// slot is not reused and the file stays open, whatever the Stream
// appends, discards, truncates or closes meanwhile.
type Span struct {
	Fd  uintptr
	Off int64
	N   int
	Mem []byte

	s    *Stream
	l    *lent
	slot int
	buf  *byte // Mem's chunk buffer, by its first byte
}

// memLend counts the spans that hold a chunk buffer's bytes.
type memLend struct {
	buf []byte
	n   int
}

// lendMem lends b, bytes of the chunk buffer buf, as a span. Called with
// mu held.
func (s *Stream) lendMem(buf, b []byte) Span {
	base := unsafe.SliceData(buf[:1])
	i := s.memLentAt(base)
	if i < 0 {
		i = len(s.memLent)
		s.memLent = append(s.memLent, memLend{buf: buf[:0]})
	}
	s.memLent[i].n++
	return Span{N: len(b), Mem: b, s: s, buf: base}
}

// memLentAt returns the index in memLent of the buffer whose first byte is
// base, or -1 when no span holds it. Called with mu held.
func (s *Stream) memLentAt(base *byte) int {
	for i := range s.memLent {
		if unsafe.SliceData(s.memLent[i].buf[:1]) == base {
			return i
		}
	}
	return -1
}

// emptied returns buf (nil: none yet) emptied for the next chunk, unless a
// span holds its bytes: then the spare buffer or a new one. A new buffer
// costs a page fault a 4 KiB page at its first lines (11-15 µs each on
// the development VM, DESIGN §4), so one that was lent comes back as the
// spare at its release. Called with mu held.
func (s *Stream) emptied(buf []byte) []byte {
	if buf != nil && s.memLentAt(unsafe.SliceData(buf[:1])) < 0 {
		return buf[:0]
	}
	if b := s.spare; b != nil {
		s.spare = nil
		return b
	}
	return make([]byte, 0, s.chunkSize)
}

// releaseMem ends a span of the chunk buffer whose first byte is base: at
// its last span, a buffer the Stream no longer writes or keeps becomes the
// spare. Called with mu held.
func (s *Stream) releaseMem(base *byte) {
	i := s.memLentAt(base)
	if s.memLent[i].n--; s.memLent[i].n > 0 {
		return
	}
	buf := s.memLent[i].buf
	s.memLent = slices.Delete(s.memLent, i, i+1)
	inUse := func(b []byte) bool { return b != nil && unsafe.SliceData(b[:1]) == base }
	if s.spare == nil && !s.closed && !inUse(s.cur) && !inUse(s.last) {
		s.spare = buf
	}
}

// lent counts the spans of one spill file that are not yet released.
type lent struct {
	file *os.File
	// slots counts the spans of each slot lent; a slot none holds is
	// deleted, so that the spans in all are none when it is empty.
	slots map[int]int
	// held are slots discarded while lent: freed at their last release.
	held []int
	// gone: the Stream let go of the file (Truncate, Close); it is closed
	// at the last release.
	gone bool
}

// lend pins slot of the current spill file for a span. Called with mu
// held.
func (s *Stream) lend(slot int) *lent {
	if s.lent == nil {
		s.lent = &lent{file: s.file, slots: map[int]int{}}
	}
	s.lent.slots[slot]++
	return s.lent
}

// lentSlot reports whether slot of the current spill file is lent, and
// holds it back from reuse if so: its last release frees it. Called with
// mu held.
func (s *Stream) lentSlot(slot int) bool {
	if s.lent == nil || s.lent.slots[slot] == 0 {
		return false
	}
	s.lent.held = append(s.lent.held, slot)
	return true
}

// letGo makes the Stream drop its spill file: when no span holds it, it
// reports true and the caller closes or truncates it as before; otherwise
// it stays open until the last span is released, and the next spill makes
// a new file. Called with mu held.
func (s *Stream) letGo() bool {
	if s.lent == nil || len(s.lent.slots) == 0 {
		s.lent = nil
		return true
	}
	s.lent.gone = true
	s.lent = nil
	s.file = nil
	s.free, s.holes = s.free[:0], 0
	s.slots, s.reserved = 0, 0
	return false
}

// ReadAt copies the span's bytes into p (which holds at least N): for a
// caller that cannot splice them after all.
func (sp *Span) ReadAt(p []byte) (int, error) {
	if sp.Mem != nil {
		return copy(p, sp.Mem), nil
	}
	n, err := sp.l.file.ReadAt(p[:sp.N], sp.Off)
	if n < sp.N {
		return n, fmt.Errorf("read stream spill file at %d: %w", sp.Off, err)
	}
	return n, nil
}

// Release ends the span: its slot may be reused, and a file the Stream
// let go of meanwhile is closed with its last span.
func (sp *Span) Release() {
	s, l := sp.s, sp.l
	if s == nil {
		return
	}
	sp.s, sp.l = nil, nil
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp.Mem != nil {
		s.releaseMem(sp.buf)
		return
	}
	if l.slots[sp.slot]--; l.slots[sp.slot] == 0 {
		delete(l.slots, sp.slot)
		if i := slices.Index(l.held, sp.slot); i >= 0 {
			l.held = slices.Delete(l.held, i, i+1)
			if !l.gone {
				s.freeSlot(sp.slot)
			}
		}
	}
	if l.gone && len(l.slots) == 0 {
		// Only read since the Stream let go of it: nothing to lose.
		_ = l.file.Close()
	}
}
