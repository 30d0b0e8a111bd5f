package flow

import (
	"bytes"
	"math/rand/v2"
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

// spareBytes counts the memory a kept cache holds, as the bound counts it.
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
	for _, ch := range slices.Concat(r.edges.free, r.tletSlab.free) {
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
