package flow

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"unsafe"
)

// drainSpares empties the kept caches: the next New makes a new cache.
func drainSpares() {
	spares.Lock()
	defer spares.Unlock()
	clear(spares.c[:])
	spares.n = 0
}

// spareBytes counts the memory a kept cache holds, as the bound counts it:
// all but the packet windows' tables.
func spareBytes(c *blockCache) int {
	n := len(c.slots)*8 + len(c.views)*int(unsafe.Sizeof(viewRef{})) + len(c.free)*int(unsafe.Sizeof([blockChunk]block{}))
	r := &c.runs
	if r.tips != nil {
		n += int(unsafe.Sizeof(*r.tips))
	}
	if r.recent != nil {
		n += int(unsafe.Sizeof(*r.recent) + unsafe.Sizeof(*r.pgds) + unsafe.Sizeof(*r.tlets) +
			unsafe.Sizeof(*r.tletSeen) + unsafe.Sizeof(*r.tletRoom))
	}
	for _, ch := range c.lens.free {
		n += len(ch)
	}
	for _, ch := range r.runs.free {
		n += len(ch) * int(unsafe.Sizeof(tntRun{}))
	}
	for _, ch := range slices.Concat(r.edges.free, r.tletSlab.free, r.wndSlab.free) {
		n += len(ch) * int(unsafe.Sizeof(Edge{}))
	}
	return n
}

// TestSpareSameFlow holds a decoder made over a closed decoder's memory to
// a new one: the same branches, events and counters on every corpus trace,
// whole and damaged, with and without ResyncOnError and the instructions,
// in a first pass and a second (warm). The memory is each time the last
// such decoder's, dirty with the trace before (at first mruby's, decoded
// twice: every table and slab in use).
func TestSpareSameFlow(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 1))
	mr := loadBench(t, "mruby")
	prev := New(mr.space, Options{NoInsns: true})
	for range 2 {
		prev.Decode(mr.trace, &counter{})
	}
	defer drainSpares()
	for _, ct := range fastCorpus(t) {
		for k, trace := range [][]byte{ct.trace, mutate(r, ct.trace), mutate(r, ct.trace)} {
			for _, opts := range []Options{{NoInsns: true}, {NoInsns: true, ResyncOnError: true}, {}} {
				drainSpares()
				fresh := New(ct.mem, opts)
				table := &prev.cache.slots[0]
				prev.Close()
				d := New(ct.mem, opts)
				if &d.cache.slots[0] != table {
					t.Fatalf("%s: the decoder is not made over the closed one's memory", ct.name)
				}
				for pass := range 2 {
					want, got := edgeLog{t: t}, edgeLog{t: t}
					fresh.c, d.c = Counters{}, Counters{}
					fresh.Decode(trace, &want)
					d.Decode(trace, &got)
					if fresh.Counters() != d.Counters() || !slices.Equal(want.items, got.items) || !slices.Equal(want.events, got.events) {
						t.Fatalf("%s (variant %d, %+v) pass %d: counters %+v over a closed decoder's memory, %+v new; first difference %s",
							ct.name, k, opts, pass, d.Counters(), fresh.Counters(), firstDiff(&got.fullLog, &want.fullLog))
					}
				}
				prev = d
			}
		}
	}
}

// TestSpareBound holds what Close keeps to its bounds: at most maxSpares
// caches, each at most spareMax bytes, when more decoders than that close
// with caches larger than that (a block at each byte of 128 KiB of
// returns: 8 MiB of blocks, a 2 MiB table); and a decoder made over such
// a cache (whose table was too large to keep) decodes as a new one.
func TestSpareBound(t *testing.T) {
	drainSpares()
	defer drainSpares()
	bt := loadBench(t, "ptsim")
	var want counter
	New(bt.space, Options{NoInsns: true}).Decode(bt.trace, &want)
	const base, size = 0x1000, 1 << 17
	mem := &blob{base: base, code: bytes.Repeat([]byte{0xc3}, size)}
	// All open at once: a New takes what a Close kept.
	var ds [maxSpares + 2]*Decoder
	for i := range ds {
		d := New(mem, Options{})
		d.runCaches()
		for ip := uint64(base); ip < base+size; ip++ {
			d.block(ip, Mode64)
		}
		if d.cache.n != size {
			t.Fatalf("%d blocks cached, want %d", d.cache.n, size)
		}
		ds[i] = d
	}
	for _, d := range ds {
		d.Close()
	}
	if spares.n != maxSpares {
		t.Fatalf("%d caches kept, want %d", spares.n, maxSpares)
	}
	for i := range spares.n {
		if n := spareBytes(&spares.c[i]); n > spareMax || n < spareMax/2 {
			t.Errorf("cache %d keeps %d bytes, want %d to %d", i, n, spareMax/2, spareMax)
		}
	}
	var got counter
	d := New(bt.space, Options{NoInsns: true})
	if spares.n != maxSpares-1 {
		t.Fatalf("New took no kept cache")
	}
	d.Decode(bt.trace, &got)
	if got != want {
		t.Errorf("over a kept cache: %+v, new: %+v", got, want)
	}
}

// TestSpareWindowsApart holds the packet windows' tables apart from
// spareMax: a closed mruby decoder that took windows hands on, besides its
// tables (zero), at least half of spareMax of the rest, as one that took
// none does (what a cold decoder takes; counted in the bound, the tables
// left 64 KiB of it); a cold decoder made over them carries them to the
// next unused (wndUsed), and a warm one takes them.
func TestSpareWindowsApart(t *testing.T) {
	drainSpares()
	defer drainSpares()
	bt := loadBench(t, "mruby")
	kept := func(wndAt uint64) (int, *blockCache) {
		t.Helper()
		drainSpares()
		d := New(bt.space, Options{NoInsns: true})
		d.fp.wndAt = wndAt
		for range 2 {
			d.Decode(bt.trace, &counter{})
		}
		if used := d.cache.runs.wndUsed; used != (wndAt == 0) {
			t.Fatalf("windows from %d bytes: tables used %v", wndAt, used)
		}
		d.Close()
		if spares.n != 1 {
			t.Fatalf("%d caches kept, want 1", spares.n)
		}
		return spareBytes(&spares.c[0]), &spares.c[0]
	}
	without, _ := kept(^uint64(0))
	with, k := kept(0)
	if without < spareMax/2 {
		t.Fatalf("without windows %d bytes kept: the bound went untested", without)
	}
	r := &k.runs
	if r.wnds == nil || r.wndUsed || !isZero(reflect.ValueOf(r.wnds)) || !isZero(reflect.ValueOf(r.wndKeys)) {
		t.Fatalf("the windows' tables are not handed on zero and unused")
	}
	if with < spareMax/2 || with > spareMax {
		t.Errorf("with windows %d bytes kept besides their tables (without %d): want %d to %d", with, without, spareMax/2, spareMax)
	}
	tables := r.wnds
	cold := New(bt.space, Options{NoInsns: true})
	cold.Decode(bt.trace, &counter{})
	if cold.fp.wndOn || cold.cache.runs.wndUsed || cold.cache.runs.wnds != tables {
		t.Fatalf("a cold decoder took the windows' tables: on %v, used %v", cold.fp.wndOn, cold.cache.runs.wndUsed)
	}
	cold.MemoryChanged()
	cold.Close()
	warm := New(bt.space, Options{NoInsns: true})
	for warm.fp.bytes < wndWarm {
		warm.Decode(bt.trace, &counter{})
	}
	warm.Decode(bt.trace, &counter{})
	if warm.cache.runs.wnds != tables || !warm.cache.runs.wndUsed {
		t.Errorf("a warm decoder did not take the tables a cold one carried")
	}
}

// TestDecoderClosed holds a closed decoder to its contract: Close with a
// Stream open panics (and closes nothing), a decode after Close panics,
// Close again does nothing, Counters still answer.
func TestDecoderClosed(t *testing.T) {
	defer drainSpares()
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", what)
			}
		}()
		f()
	}
	bt := loadBench(t, "ptsim")
	d := New(bt.space, Options{NoInsns: true})
	s := NewStream(d, &counter{})
	if _, err := s.Write(bt.trace[:len(bt.trace)/2]); err != nil {
		t.Fatal(err)
	}
	mustPanic("Close with a Stream open", d.Close)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	c := d.Counters()
	if c.Insns == 0 {
		t.Fatal("the Stream decoded nothing")
	}
	d.Close()
	d.Close()
	if d.Counters() != c {
		t.Errorf("counters after Close %+v, before %+v", d.Counters(), c)
	}
	mustPanic("Decode after Close", func() { d.Decode(bt.trace, &counter{}) })
	mustPanic("a Stream's Write after Close", func() { _, _ = NewStream(d, &counter{}).Write(bt.trace) })
}

// TestSpareConcurrent decodes with decoders made and closed on several
// goroutines at once (run with -race): each pass decodes as a new decoder.
func TestSpareConcurrent(t *testing.T) {
	defer drainSpares()
	const workers, passes = 4, 4
	var spaces [workers]benchTrace
	for i := range spaces {
		spaces[i] = loadBench(t, "ptsim")
	}
	var want counter
	New(spaces[0].space, Options{NoInsns: true}).Decode(spaces[0].trace, &want)
	var wg sync.WaitGroup
	errs := make(chan string, workers*passes)
	for _, bt := range spaces {
		wg.Go(func() {
			for range passes {
				d := New(bt.space, Options{NoInsns: true})
				var got counter
				d.Decode(bt.trace, &got)
				d.Close()
				if got != want {
					errs <- "a decoder decoded differently"
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestSpareCleared holds what Close keeps to a new cache's state at once
// (where TestSpareSameFlow sees a stale block only when the flow reaches
// it, a stale block chunk made it loop until the time-out): after a
// decoder dirtied every table and chunk (mruby, decoded twice, its memory
// changed between), the kept cache's tables, views, free block chunks
// and runs are zero, and nothing else of the decoder's is kept (no block,
// no count, no chunk in use, no slab position).
func TestSpareCleared(t *testing.T) {
	drainSpares()
	defer drainSpares()
	bt := loadBench(t, "mruby")
	d := New(bt.space, Options{NoInsns: true})
	d.fp.wndAt = 0 // the windows' tables too
	d.Decode(bt.trace, &counter{})
	c := &d.cache
	r := &c.runs
	d.MemoryChanged()
	// A drop forgets the chunks in use: a block or run that the flow
	// still holds is not handed on, and a decoder whose memory keeps
	// changing does not keep every chunk it filled.
	if len(c.chunks)+len(c.lens.full)+len(r.runs.full)+len(r.edges.full) != 0 {
		t.Fatalf("a drop kept chunks in use: blocks %d, lengths %d, runs %d, edges %d",
			len(c.chunks), len(c.lens.full), len(r.runs.full), len(r.edges.full))
	}
	d.Decode(bt.trace, &counter{})
	dirty := map[string]any{"slots": c.slots, "views": c.views, "tips": r.tips, "recent": r.recent,
		"pgds": r.pgds, "tlets": r.tlets, "tletSeen": r.tletSeen, "tletRoom": r.tletRoom,
		"wndKeys": r.wndKeys, "wnds": r.wnds, "wndSeen": r.wndSeen, "wndRoom": r.wndRoom,
		"block chunk": c.chunks[0], "runs": r.runs.full[0]}
	for what, v := range dirty {
		if isZero(reflect.ValueOf(v)) {
			t.Fatalf("mruby's decode left the %s zero: the test sees no clear", what)
		}
	}
	d.Close()
	if spares.n != 1 {
		t.Fatalf("%d caches kept, want 1", spares.n)
	}
	k := spares.c[0]
	kr := &k.runs
	if len(k.free) == 0 || len(kr.runs.free) == 0 || len(kr.edges.free) == 0 || len(kr.tletSlab.free) == 0 || len(kr.wndSlab.free) == 0 || len(k.lens.free) == 0 {
		t.Fatalf("a list of chunks kept is empty: blocks %d, runs %d, edges %d, tracelet edges %d, window edges %d, lengths %d",
			len(k.free), len(kr.runs.free), len(kr.edges.free), len(kr.tletSlab.free), len(kr.wndSlab.free), len(k.lens.free))
	}
	zero := map[string]any{"slots": k.slots, "views": k.views, "tips": kr.tips, "recent": kr.recent,
		"pgds": kr.pgds, "tlets": kr.tlets, "tletSeen": kr.tletSeen, "tletRoom": kr.tletRoom,
		"wndKeys": kr.wndKeys, "wnds": kr.wnds, "wndSeen": kr.wndSeen, "wndRoom": kr.wndRoom}
	for i, ch := range k.free {
		zero[fmt.Sprint("block chunk ", i)] = ch
	}
	for i, ch := range kr.runs.free {
		zero[fmt.Sprint("runs chunk ", i)] = ch
	}
	for what, v := range zero {
		if v := reflect.ValueOf(v); v.IsNil() || !isZero(v) {
			t.Errorf("the kept %s is not a new cache's: nil or not zero", what)
		}
	}
	if len(k.chunks) != 0 || len(k.lens.full) != 0 || len(kr.runs.full) != 0 || len(kr.edges.full) != 0 || len(kr.tletSlab.full) != 0 || len(kr.wndSlab.full) != 0 {
		t.Errorf("chunks in use kept as in use: blocks %d, lengths %d, runs %d, edges %d, tracelet edges %d",
			len(k.chunks), len(k.lens.full), len(kr.runs.full), len(kr.edges.full), len(kr.tletSlab.full))
	}
	// The rest is a new cache's: zero.
	k.slots, k.views, k.free, k.chunks = nil, nil, nil, nil
	kr.tips, kr.recent, kr.pgds, kr.tlets, kr.tletSeen, kr.tletRoom = nil, nil, nil, nil, nil, nil
	kr.wndKeys, kr.wnds, kr.wndSeen, kr.wndRoom, kr.wndSlab.free, kr.wndSlab.full = nil, nil, nil, nil, nil, nil
	k.lens.free, k.lens.full = nil, nil
	kr.runs.free, kr.runs.full, kr.edges.free, kr.edges.full, kr.tletSlab.free, kr.tletSlab.full = nil, nil, nil, nil, nil, nil
	if !reflect.ValueOf(k).IsZero() {
		t.Errorf("the kept cache keeps the decoder's state")
	}
}

// isZero reports whether v, a slice or a pointer to an array, holds only
// zero elements.
func isZero(v reflect.Value) bool {
	if v.Kind() == reflect.Pointer {
		return v.Elem().IsZero()
	}
	for i := range v.Len() {
		if !v.Index(i).IsZero() {
			return false
		}
	}
	return true
}

// TestSpareShared holds decoders open at once to memory of their own: one
// made over a kept cache shares none with the closed decoder it came from
// (whose cache a MemoryChanged may still clear), nor with one made after
// another decoder closed into the place it was taken from (with a table
// too large to keep, and no fast path's tables); Close again keeps
// nothing more.
func TestSpareShared(t *testing.T) {
	drainSpares()
	defer drainSpares()
	bt := loadBench(t, "ptsim")
	d1 := New(bt.space, Options{NoInsns: true})
	d1.Decode(bt.trace, &counter{})
	d1.Close()
	d1.Close()
	if spares.n != 1 {
		t.Fatalf("%d caches kept after Close twice, want 1", spares.n)
	}
	d2 := New(bt.space, Options{NoInsns: true})
	d2.Decode(bt.trace, &counter{})
	const base, size = 0x1000, 1 << 17
	d3 := New(&blob{base: base, code: bytes.Repeat([]byte{0xc3}, size)}, Options{})
	for ip := uint64(base); ip < base+size; ip++ {
		d3.block(ip, Mode64)
	}
	d3.Close()
	d4 := New(bt.space, Options{NoInsns: true})
	d4.Decode(bt.trace, &counter{})
	for _, p := range []struct {
		a, b *Decoder
		what string
	}{{d1, d2, "the closed decoder and the one made over its memory"}, {d2, d4, "two open decoders"}} {
		a := cacheMemory(&p.a.cache)
		for ptr, what := range cacheMemory(&p.b.cache) {
			if a[ptr] != "" {
				t.Errorf("%s share a %s", p.what, what)
			}
		}
	}
}

// cacheMemory returns the tables and chunks cache c holds, by address.
func cacheMemory(c *blockCache) map[unsafe.Pointer]string {
	m := map[unsafe.Pointer]string{}
	add := func(p unsafe.Pointer, what string) {
		if p != nil {
			m[p] = what
		}
	}
	r := &c.runs
	add(unsafe.Pointer(unsafe.SliceData(c.slots)), "table")
	add(unsafe.Pointer(unsafe.SliceData(c.views)), "views table")
	add(unsafe.Pointer(r.tips), "tips table")
	add(unsafe.Pointer(r.recent), "recent runs table")
	add(unsafe.Pointer(r.pgds), "walks table")
	add(unsafe.Pointer(r.tlets), "tracelets table")
	add(unsafe.Pointer(r.tletSeen), "tracelet marks")
	add(unsafe.Pointer(r.tletRoom), "tracelet rooms")
	add(unsafe.Pointer(r.wndKeys), "window keys")
	add(unsafe.Pointer(r.wnds), "windows table")
	add(unsafe.Pointer(r.wndSeen), "window marks")
	add(unsafe.Pointer(r.wndRoom), "window rooms")
	for _, ch := range slices.Concat(c.chunks, c.free) {
		add(unsafe.Pointer(ch), "block chunk")
	}
	for _, ch := range slices.Concat(c.lens.full, c.lens.free) {
		add(unsafe.Pointer(unsafe.SliceData(ch)), "lengths chunk")
	}
	for _, ch := range slices.Concat(r.runs.full, r.runs.free) {
		add(unsafe.Pointer(unsafe.SliceData(ch)), "runs chunk")
	}
	for _, ch := range slices.Concat(r.edges.full, r.edges.free, r.tletSlab.full, r.tletSlab.free) {
		add(unsafe.Pointer(unsafe.SliceData(ch)), "edges chunk")
	}
	return m
}
