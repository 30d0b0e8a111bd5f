package flow

import (
	"sync"
	"unsafe"
)

// A cold decoder's cost beyond decoding is its memory: a cold pass over
// mruby's trace made 1.44 MB of tables and chunks, a page fault for each
// fresh page (18-27 us on a PVM guest) and the collector's cycles for
// them (with GOGC=400 the pass was 1.4 times as fast). Close hands a
// decoder's cache memory to the next New instead: its table, block chunks,
// slabs' chunks and the fast path's tables, cleared where a new cache's
// are zero. The cache is empty (cold stays cold: every block is decoded
// again) and the output is a new decoder's.

// maxSpares bounds the closed decoders' caches kept, spareMax the bytes
// each keeps of what a cold decoder takes (a cold mruby pass takes 1.4
// MB): what is past them is left to the collector. The packet windows'
// tables (1.94 MiB) are kept apart from spareMax, whole: they are of one
// size, made once a decoder took wndWarm, and a cold decoder carries them
// to the next untouched (wndUsed); counted in it they left nothing of it
// for the rest. The windows' rooms, kept last, are mostly left out: no new
// decoder takes windows before wndWarm.
const (
	maxSpares = 2
	spareMax  = 2 << 20
)

// spares are the caches Close kept for New: c[:n], empty caches over a
// closed decoder's memory.
var spares struct {
	sync.Mutex
	c [maxSpares]blockCache
	n int
}

// Close hands the decoder's cache memory to the next New (up to a bound),
// so that a new decoder allocates little. After Close the decoder must not
// decode: Decode, and a Stream's Write over it, panic; Counters and TSC
// still answer. It must not be called from a Handler, nor while a Stream
// over the decoder is open (close the Stream first: Close panics); Close
// again does nothing.
func (d *Decoder) Close() {
	if d.src != nil {
		panic("flow: Decoder.Close while a Stream over it is open")
	}
	if d.closed {
		return
	}
	d.closed = true
	spares.Lock()
	if spares.n < maxSpares {
		d.cache.spare(&spares.c[spares.n])
		spares.n++
	}
	spares.Unlock()
	d.cache = blockCache{}
}

// takeSpare makes c, a zero cache, a kept one if there is one.
func takeSpare(c *blockCache) {
	spares.Lock()
	if spares.n > 0 {
		spares.n--
		*c = spares.c[spares.n]
		spares.c[spares.n] = blockCache{}
	}
	spares.Unlock()
}

// spare makes s, a zero cache, an empty cache over c's memory: the packet
// windows' tables, cleared if used, then up to spareMax bytes of the rest:
// the fast path's tables (which a cold pass takes whole) and the views,
// then the table, block chunks and slabs' chunks. Free chunks come first
// (they are zero); a used chunk with pointers is cleared.
func (c *blockCache) spare(s *blockCache) {
	left := spareMax
	r, sr := &c.runs, &s.runs
	if r.tips != nil {
		clear(r.tips[:])
		sr.tips = r.tips
		left -= int(unsafe.Sizeof(*r.tips))
	}
	if r.recent != nil {
		// runCaches made them together.
		clear(r.recent[:])
		clear(r.pgds[:])
		clear(r.tlets[:])
		clear(r.tletSeen[:])
		clear(r.tletRoom[:])
		sr.recent, sr.pgds, sr.tlets, sr.tletSeen, sr.tletRoom = r.recent, r.pgds, r.tlets, r.tletSeen, r.tletRoom
		left -= int(unsafe.Sizeof(*r.recent) + unsafe.Sizeof(*r.pgds) + unsafe.Sizeof(*r.tlets) +
			unsafe.Sizeof(*r.tletSeen) + unsafe.Sizeof(*r.tletRoom))
	}
	if r.wndUsed {
		clear(r.wndKeys[:])
		clear(r.wnds[:])
		clear(r.wndSeen[:])
		clear(r.wndRoom[:])
	}
	// wndCaches made them together; not counted in left.
	sr.wndKeys, sr.wnds, sr.wndSeen, sr.wndRoom = r.wndKeys, r.wnds, r.wndSeen, r.wndRoom
	if c.views != nil {
		clear(c.views)
		s.views = c.views
		left -= len(c.views) * int(unsafe.Sizeof(viewRef{}))
	}
	if n := len(c.slots) * 8; n <= left {
		clear(c.slots)
		s.slots = c.slots
		left -= n
	}
	s.free = spareChunks(c.free, c.chunks, &left,
		func(*[blockChunk]block) int { return int(unsafe.Sizeof([blockChunk]block{})) },
		func(k *[blockChunk]block) { clear(k[:]) })
	clear(c.chunks)
	s.chunks = c.chunks[:0]
	c.lens.spare(&s.lens, &left, false)
	r.runs.spare(&sr.runs, &left, true)
	r.edges.spare(&sr.edges, &left, false)
	r.tletSlab.spare(&sr.tletSlab, &left, false)
	r.wndSlab.spare(&sr.wndSlab, &left, false)
}

// spare makes o, a zero slab, an empty slab over s's chunks, as many as
// fit in left bytes (taking them); zero clears the used ones (their
// elements hold pointers).
func (s *slab[T]) spare(o *slab[T], left *int, zero bool) {
	var clr func([]T)
	if zero {
		clr = func(ch []T) { clear(ch) }
	}
	o.free = spareChunks(s.free, s.full, left, func(ch []T) int { return len(ch) * int(unsafe.Sizeof(*new(T))) }, clr)
	clear(s.full)
	o.full = s.full[:0]
}

// spareChunks returns the chunks of free, then of used (each cleared by
// zero unless it is nil), that fit in left bytes (taking them), in free's
// array; size is a chunk's bytes.
func spareChunks[C any](free, used []C, left *int, size func(C) int, zero func(C)) []C {
	all := append(free, used...)
	kept := all[:0]
	for i, ch := range all {
		n := size(ch)
		if n > *left {
			continue
		}
		*left -= n
		if zero != nil && i >= len(free) {
			zero(ch)
		}
		kept = append(kept, ch)
	}
	clear(all[len(kept):])
	return kept
}
