package stream

import (
	"fmt"
	"os"
	"slices"
)

// Span is what a read of a spilled chunk returns instead of a copy (see
// Reader.ReadSpan): N bytes, whole lines, at Off of the spill file whose
// descriptor is Fd. The caller moves them out of the page cache itself
// (FUSE splices them into the reply: one copy fewer than a pread into a
// buffer and a write of it) and then calls Release once. Until then the
// chunk's slot is not reused and the file stays open, whatever the
// Stream discards, truncates or closes meanwhile.
type Span struct {
	Fd  uintptr
	Off int64
	N   int

	s    *Stream
	l    *lent
	slot int
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
	s.free = s.free[:0]
	s.slots, s.reserved = 0, 0
	return false
}

// ReadAt copies the span's bytes into p (which holds at least N): for a
// caller that cannot splice them after all.
func (sp *Span) ReadAt(p []byte) (int, error) {
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
	if l == nil {
		return
	}
	sp.l = nil
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.slots[sp.slot]--; l.slots[sp.slot] == 0 {
		delete(l.slots, sp.slot)
		if i := slices.Index(l.held, sp.slot); i >= 0 {
			l.held = slices.Delete(l.held, i, i+1)
			if !l.gone {
				s.free = append(s.free, sp.slot)
			}
		}
	}
	if l.gone && len(l.slots) == 0 {
		// Only read since the Stream let go of it: nothing to lose.
		_ = l.file.Close()
	}
}
