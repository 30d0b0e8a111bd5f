package flow

import (
	"runtime"
	"testing"
)

// TestBoundedMemory streams the mruby trace through one decoder again and
// again (22 MiB of trace for branches, 3 MiB with every instruction; an
// eighth in -short) and checks that the heap after
// the last pass is what it was after the first: the decoder's memory is the
// images and the block cache, not the trace it went through.
func TestBoundedMemory(t *testing.T) {
	bt := loadBench(t, "mruby")
	for _, opts := range []Options{{NoInsns: true}, {}} {
		passes := 32
		if !opts.NoInsns {
			passes = 4
		}
		if testing.Short() {
			passes = max(passes/8, 2)
		}
		d := New(bt.space, opts)
		var c counter
		heap := func() uint64 {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		d.Decode(bt.trace, &c)
		before := heap()
		for range passes - 1 {
			d.Decode(bt.trace, &c)
		}
		after := heap()
		if c.errors != 0 || c.branches == 0 {
			t.Fatalf("%d branches, %d errors", c.branches, c.errors)
		}
		if after > before+1<<20 {
			t.Errorf("NoInsns %v: heap grew from %d to %d bytes over %d passes of %d bytes", opts.NoInsns, before, after, passes, len(bt.trace))
		}
		if d.cache.insns > maxCached || d.cache.n == 0 {
			t.Errorf("block cache holds %d instructions in %d blocks, bound %d", d.cache.insns, d.cache.n, maxCached)
		}
		runtime.KeepAlive(d)
	}
}

// TestBlockCacheBound fills the block cache past its bound with distinct
// blocks and checks that it is dropped, not grown.
func TestBlockCacheBound(t *testing.T) {
	// 64 KiB of nops ending in a ret: every address starts a distinct
	// block of up to maxBlock instructions, 4 Mi instructions a round.
	code := make([]byte, 1<<16)
	for i := range code {
		code[i] = 0x90
	}
	code[len(code)-1] = 0xc3
	d := New(&blob{base: 0x10000, code: code}, Options{})
	peak, drops := 0, 0
	for round := 0; round < 2; round++ {
		for ip := uint64(0x10000); ip < 0x10000+uint64(len(code)); ip++ {
			before := d.cache.insns
			if b := d.block(ip, Mode64); len(b.insns) == 0 || b.insns[0].ip != ip {
				t.Fatalf("block at %x: %d instructions", ip, len(b.insns))
			}
			if d.cache.insns < before {
				drops++
			}
			peak = max(peak, d.cache.insns)
		}
	}
	if peak > maxCached+maxBlock+1 || drops == 0 {
		t.Errorf("cache peaked at %d instructions with %d drops, bound %d", peak, drops, maxCached)
	}
	if len(d.cache.slots) > 4*maxCached {
		t.Errorf("cache table grew to %d slots", len(d.cache.slots))
	}
}
