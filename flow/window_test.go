package flow

import (
	"math/rand/v2"
	"testing"

	"ptfs/decode/ptenc"
)

// lastIPCode is two ways to block B (0x2000, jmp rax) by a taken je, from
// 0x1000 and from 0x11000 (the last IP's upper bits differ), and a jmp rax
// at each of B's two targets of the same low 16 bits (0x3000, 0x13000).
func lastIPCode() []byte {
	code := make([]byte, 0x13010-0x1000)
	put := func(ip uint64, b ...byte) { copy(code[ip-0x1000:], b) }
	put(0x1000, 0x0f, 0x84, 0xfa, 0x0f, 0x00, 0x00)  // je 0x2000
	put(0x11000, 0x0f, 0x84, 0xfa, 0x0f, 0xff, 0xff) // je 0x2000
	put(0x2000, 0xff, 0xe0)                          // jmp rax
	put(0x3000, 0xff, 0xe0)
	put(0x13000, 0xff, 0xe0)
	return code
}

// lastIPTrace returns a trace of lastIPCode: rounds times from 0x1000 and
// 0x11000 in turn, the je's bit, 16 PADs (B's window starts at B), B's TIP
// of 16 bits (0x3000 below the last IP's upper bits) followed by 13 PADs,
// so that the window at B has the same block and bytes each time and the
// flow goes to 0x3000 or 0x13000 by the last IP alone; the TIP at either
// back is a full one, to the other start.
func lastIPTrace(rounds int) []byte {
	e := ptenc.New()
	start(e, 0x1000)
	for i := range 2 * rounds {
		e.TNT(1, 1)
		for range 16 {
			e.Pad()
		}
		e.Raw(0x2d, 0x00, 0x30) // TIP, 16 bits: 0x3000
		for range 13 {
			e.Pad()
		}
		next := []uint64{0x11000, 0x1000}[i%2]
		e.Raw(0xcd, byte(next), byte(next>>8), byte(next>>16), 0, 0, 0, 0, 0) // TIP, 64 bits
	}
	for range 32 {
		e.Pad()
	}
	return e.Bytes()
}

// wndsAt counts d's kept windows from the block at ip that take bytes, and
// the distinct last IP bits they are for.
func wndsAt(d *Decoder, ip uint64) (n int, lastIns map[uint64]bool) {
	lastIns = map[uint64]bool{}
	for i := range d.cache.runs.wnds {
		if k := &d.cache.runs.wndKeys[i/2][i%2]; k.b != nil && k.b.ip == ip && d.cache.runs.wnds[i].m > 0 {
			n++
			lastIns[k.last] = true
		}
	}
	return n, lastIns
}

// TestWndLastIP: a window whose first TIP keeps the last IP's upper bits is
// replayed only for the same bits: the same block and bytes with other
// bits take their own window (the set's other way), and the flow is the
// slow path's, with and without the budget windows need, and with a
// Handler that drops the block cache in every call.
func TestWndLastIP(t *testing.T) {
	mem := &blob{base: 0x1000, code: lastIPCode()}
	trace := lastIPTrace(50)
	for _, opts := range []Options{{}, {MaxInsns: tletBudget}, {MaxInsns: tletBudget - 1}} {
		if c := sameFast(t, mem, trace, opts); c.Errors != 0 || c.Insns == 0 {
			t.Fatalf("%+v: counters %+v: the trace is not the code's", opts, c)
		}
	}
	sameWithDrops(t, mem, trace)
	d := New(mem, Options{NoInsns: true})
	d.fp.wndAt = 0
	d.Decode(trace, &counter{})
	if n, lastIns := wndsAt(d, 0x2000); n != 2 || len(lastIns) != 2 {
		t.Errorf("%d windows kept from 0x2000 for %d last IPs, want 2 for 2", n, len(lastIns))
	}
}

// TestWndBudget: below tletBudget no window is taken (nor made).
func TestWndBudget(t *testing.T) {
	mem := &blob{base: 0x1000, code: lastIPCode()}
	trace := lastIPTrace(50)
	for _, c := range []struct {
		maxInsns int
		want     bool
	}{{tletBudget - 1, false}, {tletBudget, true}} {
		d := New(mem, Options{NoInsns: true, MaxInsns: c.maxInsns})
		d.fp.wndAt = 0
		d.Decode(trace, &counter{})
		if n, _ := wndsAt(d, 0x2000); n > 0 != c.want {
			t.Errorf("MaxInsns %d: %d windows kept, want some: %v", c.maxInsns, n, c.want)
		}
	}
}

// TestWndDropClears: a drop of the block cache leaves no window (nor a miss
// mark), so that none keeps the dropped blocks alive.
func TestWndDropClears(t *testing.T) {
	mem := &blob{base: 0x1000, code: lastIPCode()}
	d := New(mem, Options{NoInsns: true})
	d.fp.wndAt = 0
	d.Decode(lastIPTrace(50), &counter{})
	if n, _ := wndsAt(d, 0x2000); n == 0 {
		t.Fatal("no window kept: the drop went untested")
	}
	d.MemoryChanged()
	for i := range d.cache.runs.wnds {
		if d.cache.runs.wnds[i] != (wnd{}) || d.cache.runs.wndKeys[i/2] != (wndKeys{}) || d.cache.runs.wndSeen[i/2] != 0 {
			t.Fatalf("slot %d kept after a drop", i)
		}
	}
}

// TestWndMruby: mruby's windows give the flow the tracelets and packets
// give (warm, the windows kept from a first pass), and take most of it:
// 3,000 windows or more kept after two passes (4,079 in 16,384 entries).
func TestWndMruby(t *testing.T) {
	bt := loadBench(t, "mruby")
	dw, dt := New(bt.space, Options{NoInsns: true}), New(bt.space, Options{NoInsns: true})
	dw.fp.wndAt, dt.fp.noWnd = 0, true
	for pass := range 2 {
		w, tl := edgeLog{t: t}, edgeLog{t: t}
		dw.c, dt.c = Counters{}, Counters{}
		dw.Decode(bt.trace, &w)
		dt.Decode(bt.trace, &tl)
		sameLogs(t, pass, dt, dw, &tl.fullLog, &w.fullLog)
	}
	kept := 0
	for i := range dw.cache.runs.wnds {
		if dw.cache.runs.wnds[i].m > 0 {
			kept++
		}
	}
	if kept < 3000 {
		t.Errorf("%d windows kept of %d, want 3,000 or more", kept, recentWnds)
	}
}

// TestWndMrubyFits: warm mruby's windows fit the rooms' bound: over ten
// passes with windows it keeps 2,000 or more and their rooms stay below
// wndRoomMax (at 32 k edges they reached it in mruby's second pass, and
// windows made after it were cut short: DESIGN §7's fifteenth and
// sixteenth passes).
func TestWndMrubyFits(t *testing.T) {
	bt := loadBench(t, "mruby")
	d := New(bt.space, Options{NoInsns: true})
	d.fp.wndAt = 0
	for range 10 {
		d.Decode(bt.trace, &counter{})
	}
	rc := &d.cache.runs
	kept := 0
	for i := range rc.wnds {
		if rc.wnds[i].m > 0 {
			kept++
		}
	}
	t.Logf("%d windows kept of %d, their rooms %d edges of %d", kept, recentWnds, rc.wndRoomed, wndRoomMax)
	if kept < 2000 || rc.wndRoomed >= wndRoomMax {
		t.Errorf("%d windows kept of %d, their rooms %d edges of %d: want 2,000 or more, below the bound", kept, recentWnds, rc.wndRoomed, wndRoomMax)
	}
}

// TestWndRoomsBounded: a trace whose windows keep changing (random TNT.8
// groups, each made) has the rooms stop growing at wndRoomMax, however
// long it goes on and through drops, with every room counted; the flow
// is the slow path's.
func TestWndRoomsBounded(t *testing.T) {
	roomsBounded(t, rand.New(rand.NewPCG(9, 10)), false, func(c *runCache) ([][]Edge, int, int, int) {
		return c.wndRoom[:], c.wndRoomed, wndRoomMax, wndEdges
	})
}

// TestWndWarm: a decoder's kernel looks no window up (nor makes one) before
// its fast path took wndWarm bytes, and does after.
func TestWndWarm(t *testing.T) {
	bt := loadBench(t, "mruby")
	d := New(bt.space, Options{NoInsns: true})
	kept := func() (n int) {
		if d.cache.runs.wnds == nil {
			return 0
		}
		for i := range d.cache.runs.wnds {
			if d.cache.runs.wndKeys[i/2][i%2].b != nil {
				n++
			}
		}
		return n
	}
	for d.fp.bytes < wndWarm {
		if d.Decode(bt.trace, &counter{}); d.fp.bytes < wndWarm && kept() != 0 {
			t.Fatalf("%d windows made after %d bytes", kept(), d.fp.bytes)
		}
	}
	if d.Decode(bt.trace, &counter{}); kept() == 0 {
		t.Errorf("no window made after %d bytes", d.fp.bytes)
	}
}

// TestWndSinceRef: windows of TIPs alone (a call and a jmp before each
// jmp rax, which count for a TRIG) add their count to the one before them,
// windows that take a bit (a je now and then) count from it, and TRIGs
// whose icnt falls before, at and past the count find the flow's IP as the
// slow path's do.
func TestWndSinceRef(t *testing.T) {
	// 0x1000: je 0x1002; 0x1002: call 0x1010; 0x1007: jmp rax; 0x1010: jmp 0x1007
	code := []byte{0x74, 0x00, 0xe8, 0x09, 0, 0, 0, 0xff, 0xe0, 0x10: 0xeb, 0xf5}
	mem := &blob{base: 0x1000, code: code}
	e := ptenc.New()
	start(e, 0x1002)
	for i := range 400 {
		if i%3 == 0 {
			e.IP(ptenc.TIP, 0x1000)
			e.TNT(0, 1)
		} else {
			e.IP(ptenc.TIP, 0x1002)
		}
		if i%7 == 6 {
			e.Raw(0xd9, 0x40, 0x01, byte(1+i%40), 0x00) // TRIG, icnt 1 to 40
		}
	}
	for range 32 {
		e.Pad()
	}
	for _, opts := range []Options{{}, {MaxInsns: tletBudget}} {
		if c := sameFast(t, mem, e.Bytes(), opts); c.Errors != 0 || c.Events < 50 {
			t.Fatalf("%+v: counters %+v: the trace is not the code's", opts, c)
		}
	}
}

// TestWndKeyBytes: what a window replays depends on its key alone. A TIP
// whose IP ends past the key's 16 bytes is not the window's (the byte
// after the key, the TIP's upper IP byte, sends the flow to 0x3000 or
// 0x4000 in turn); a window whose first TIP keeps the last IP's upper
// bits is keyed by them even when a later TIP keeps none (a full one to
// 0x5000 after the flow went to 0x3000 or 0x13000 by the last IP).
func TestWndKeyBytes(t *testing.T) {
	code := lastIPCode()
	copy(code[0x4000-0x1000:], []byte{0xff, 0xe0}) // jmp rax
	copy(code[0x5000-0x1000:], []byte{0xff, 0xe0})
	mem := &blob{base: 0x1000, code: code}
	full := func(e *ptenc.Encoder, ip uint64) {
		e.Raw(0xcd, byte(ip), byte(ip>>8), byte(ip>>16), 0, 0, 0, 0, 0) // TIP, 64 bits
	}
	for _, c := range []struct {
		name  string
		at    uint64 // the windows' block
		trace func(e *ptenc.Encoder, i int)
	}{{
		// From 0x1000: the je's bit and 13 PADs, then a TIP of 16
		// bits whose second IP byte is the 17th.
		name: "past the key", at: 0x1000,
		trace: func(e *ptenc.Encoder, i int) {
			e.TNT(1, 1)
			for range 13 {
				e.Pad()
			}
			e.Raw(0x2d, 0x00, []byte{0x30, 0x40}[i%2]) // TIP, 16 bits
			for range 16 {
				e.Pad()
			}
			full(e, 0x1000)
		},
	}, {
		// From 0x1000 and 0x11000 in turn: at B (0x2000) a TIP of 16
		// bits, a full one to 0x5000 and 4 PADs.
		name: "a later full TIP", at: 0x2000,
		trace: func(e *ptenc.Encoder, i int) {
			e.TNT(1, 1)
			for range 16 {
				e.Pad()
			}
			e.Raw(0x2d, 0x00, 0x30) // TIP, 16 bits: 0x3000 below the last IP's upper bits
			full(e, 0x5000)
			for range 4 {
				e.Pad()
			}
			full(e, []uint64{0x11000, 0x1000}[i%2])
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			e := ptenc.New()
			start(e, 0x1000)
			for i := range 100 {
				c.trace(e, i)
			}
			for range 32 {
				e.Pad()
			}
			sameWnds(t, mem, e.Bytes(), c.at)
		})
	}
}

// TestWndCallNext: a call to the next instruction (call; pop) pushes no
// return address in a window either: the compressed return after the
// window's TIP goes to the outer call's.
func TestWndCallNext(t *testing.T) {
	code := make([]byte, 0x2001)
	put := func(ip uint64, b ...byte) { copy(code[ip-0x1000:], b) }
	put(0x1000, 0xe8, 0xfb, 0x0f, 0x00, 0x00) // call 0x2000
	put(0x1005, 0xeb, 0xf9)                   // jmp 0x1000
	put(0x2000, 0xe8, 0x00, 0x00, 0x00, 0x00) // call 0x2005
	put(0x2005, 0xff, 0xe0)                   // jmp rax
	put(0x3000, 0xc3)                         // ret
	mem := &blob{base: 0x1000, code: code}
	e := ptenc.New()
	start(e, 0x1000)
	for range 100 {
		e.Raw(0x2d, 0x00, 0x30) // TIP, 16 bits: 0x3000
		e.TNT(1, 1)             // the ret, compressed
	}
	for range 32 {
		e.Pad()
	}
	sameWnds(t, mem, e.Bytes(), 0x1005)
}

// sameWnds fails t unless trace is mem's code (no errors) and its flow is
// the slow path's (sameFast) with windows kept from the block at ip: the
// case under test was taken by a window.
func sameWnds(t *testing.T, mem Memory, trace []byte, ip uint64) {
	t.Helper()
	if c := sameFast(t, mem, trace, Options{}); c.Errors != 0 || c.Insns == 0 {
		t.Fatalf("counters %+v: the trace is not the code's", c)
	}
	d := New(mem, Options{NoInsns: true})
	d.fp.wndAt = 0
	d.Decode(trace, &counter{})
	if n, _ := wndsAt(d, ip); n == 0 {
		t.Errorf("no window kept from %#x: the case went untested", ip)
	}
}
