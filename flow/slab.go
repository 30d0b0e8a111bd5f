package flow

// The caches take their instruction lengths, runs and edges from slabs
// (the blocks are in fixed chunks that the block table's indices address):
// a miss allocates a chunk now and then, not an object each time. The
// first chunk is small, each next one twice the last up to a bound, so
// that a short trace (a cold decoder's first pass) allocates little and a
// long one a few large chunks.

// slab hands out elements of chunks of lo, 2*lo, ... up to hi elements.
// Taking elements moves an index (no slice written: no write barrier).
type slab[T any] struct {
	chunk []T
	off   int // the chunk's elements handed out
	next  int // the next chunk's size; 0 before the first
	// full are the chunks started since the last drop, which Close
	// hands to the next decoder (spare.go); free are a closed decoder's,
	// taken before a new one is made.
	full, free [][]T
}

// fill starts a new chunk of at least need elements: a free one when the
// last is large enough (a slab's chunks are at least its lo, which is at
// least any need), else a new one. It lists the chunk in full.
func (s *slab[T]) fill(need, lo, hi int) {
	n := max(s.next, lo)
	s.next = min(2*n, hi)
	if k := len(s.free) - 1; k >= 0 && len(s.free[k]) >= need {
		s.chunk, s.free = s.free[k], s.free[:k]
	} else {
		s.chunk = make([]T, max(n, need))
	}
	s.off = 0
	s.full = append(s.full, s.chunk)
}

// take returns the next element.
func (s *slab[T]) take(lo, hi int) *T {
	if s.off >= len(s.chunk) {
		s.fill(1, lo, hi)
	}
	s.off++
	return &s.chunk[s.off-1]
}

// copy returns a copy of src in the next elements.
func (s *slab[T]) copy(src []T, lo, hi int) []T {
	out := s.room(len(src), lo, hi)[:len(src):len(src)]
	s.used(copy(out, src))
	return out
}

// room returns the free elements, a new chunk first when fewer than need
// are left; the caller uses some and hands them over with used.
func (s *slab[T]) room(need, lo, hi int) []T {
	if len(s.chunk)-s.off < need {
		s.fill(need, lo, hi)
	}
	return s.chunk[s.off:]
}

// used hands over the first n elements of room.
func (s *slab[T]) used(n int) { s.off += n }

// drop forgets the free elements (those handed out stay valid, so their
// chunks are no longer the slab's to hand to another decoder); the next
// chunk keeps its size: a cache dropped when full is refilled as fast.
func (s *slab[T]) drop() {
	s.chunk, s.off = nil, 0
	clear(s.full)
	s.full = s.full[:0]
}
