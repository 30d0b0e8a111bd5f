package flow

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"ptfs/decode/ptenc"
)

// dispatchCode is an interpreter's dispatch in small: an indirect jump to
// one of three handlers, each calling f and jumping back, f's return going
// to the caller's next instruction (the same code in 32-bit and 64-bit
// mode):
//
//	0x1000: f: ret
//	0x1010: jmp *%rax
//	0x1020: call 0x1000; 0x1025: jmp 0x1010   (and at 0x1030, 0x1040)
var dispatchCode = []byte{
	0x00: 0xc3,
	0x10: 0xff, 0xe0,
	0x20: 0xe8, 0xdb, 0xff, 0xff, 0xff, 0xeb, 0xe9,
	0x30: 0xe8, 0xcb, 0xff, 0xff, 0xff, 0xeb, 0xd9,
	0x40: 0xe8, 0xbb, 0xff, 0xff, 0xff, 0xeb, 0xc9,
}

// dispatchTrace returns a trace of dispatchCode from the dispatch: each
// round a TIP to a handler, f's return by a TIP (as kAFL's traces, return
// compression off) or now and then a compressed one, the handler the last
// round's or another (the return's and the jump's last target met or
// missed); with modes set, tracing goes off at a dispatch now and then
// and on again at the handler after a MODE.Exec of the other mode (the
// slow path's).
func dispatchTrace(r *rand.Rand, rounds int, repeat int, modes bool) []byte {
	e := ptenc.New()
	start(e, 0x1010)
	h, m64 := 0, true
	for range rounds {
		if r.IntN(repeat) == 0 {
			h = r.IntN(3)
		}
		to := 0x1020 + 0x10*uint64(h)
		if modes && r.IntN(16) == 0 {
			e.IP(ptenc.TIPPGD, to)
			m64 = !m64
			e.ModeExec(m64, !m64)
			e.IP(ptenc.TIPPGE, to)
		} else {
			e.IP(ptenc.TIP, to)
		}
		if r.IntN(4) == 0 {
			e.TNT(1, 1)
		} else {
			e.IP(ptenc.TIP, to+5)
		}
	}
	for range 32 {
		e.Pad()
	}
	return e.Bytes()
}

// TestFastReturnTargets holds the flow through returns and indirect jumps
// whose targets the kernel finds among the recent IP blocks to the slow
// path's: the same target as last time and another, compressed returns
// between, mode changes (the same addresses' blocks in the other mode), a
// Handler that drops the block cache in every call (the kernel goes on in
// old blocks), and the deep recursion of recurseTrace (returns past the
// return stack's depth by TIP).
func TestFastReturnTargets(t *testing.T) {
	mem := &blob{base: 0x1000, code: dispatchCode}
	r := rand.New(rand.NewPCG(5, 9))
	for i, tc := range []struct {
		repeat int
		modes  bool
	}{{1, false}, {4, false}, {64, false}, {4, true}} {
		trace := dispatchTrace(r, 1000, tc.repeat, tc.modes)
		t.Run(fmt.Sprintf("%d/repeat%d/modes%v", i, tc.repeat, tc.modes), func(t *testing.T) {
			for _, opts := range []Options{{}, {MaxInsns: 3}, {ResyncOnError: true}} {
				if c := sameFast(t, mem, trace, opts); c.Errors != 0 || c.Insns < 2000 {
					t.Fatalf("%+v: counters %+v: the trace is not the code's", opts, c)
				}
			}
			var mc modeCounter
			New(mem, Options{NoInsns: true}).Decode(trace, &mc)
			if tc.modes != (mc.m32 > 0) {
				t.Fatalf("%d changes to 32-bit mode, modes %v", mc.m32, tc.modes)
			}
			for pass, calls := range sameWithDrops(t, mem, trace) {
				if calls < 10 {
					t.Fatalf("pass %d: %d batches handed over: the drops went untested", pass, calls)
				}
			}
		})
	}
	t.Run("recursion", func(t *testing.T) {
		mem := &blob{base: 0x1000, code: recurseCode}
		trace := recurseTrace(r, 100, 200, false)
		if c := sameFast(t, mem, trace, Options{}); c.Errors != 0 {
			t.Fatalf("counters %+v: the trace is not the code's", c)
		}
	})
}

// modeCounter counts changes to 32-bit mode.
type modeCounter struct {
	counter
	m32 int
}

func (c *modeCounter) Event(e *Event) {
	if e.Kind == EvExecMode && e.Mode == Mode32 {
		c.m32++
	}
	c.counter.Event(e)
}

// TestBlockLines holds each block of a chunk to one cache line: the fast
// path's reads of a block (its IP, then its header) load one line.
func TestBlockLines(t *testing.T) {
	if s := unsafe.Sizeof(block{}); s != 64 {
		t.Fatalf("a block is %d bytes, want 64", s)
	}
	d := New(&blob{base: 0x1000, code: dispatchCode}, Options{NoInsns: true})
	for _, ip := range []uint64{0x1000, 0x1010, 0x1020} {
		if p := uintptr(unsafe.Pointer(d.block(ip, Mode64))); p%64 != 0 {
			t.Errorf("the block at %#x is at %#x, not at a line's start", ip, p)
		}
	}
}
