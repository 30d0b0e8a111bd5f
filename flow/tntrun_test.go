package flow

import (
	"reflect"
	"slices"
	"testing"
	"unsafe"

	"ptfs/decode/ptenc"
)

// TestRunAddKeepsEveryField holds runCache.add, which copies a run field by
// field, to keeping every field: one added to tntRun and not to add fails
// here.
func TestRunAddKeepsEveryField(t *testing.T) {
	var c runCache
	b := &block{ip: 0x1000}
	end := &block{ip: 0x2000}
	r := tntRun{end: end, errIP: 0x1234, insns: 1, pre: 2, post: 3, steps: 4, used: 5, bit: true, pat: 6, nrets: 1}
	// Every field of r set: reflect sees a zero one (but the links add
	// sets, and the padding).
	v := reflect.ValueOf(r)
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		if name != "edges" && name != "next" && name != "_" && v.Field(i).IsZero() {
			t.Fatalf("test run leaves %s zero: set it", name)
		}
	}
	edges := []Edge{{From: 1, To: 2, Kind: BrCond}, {From: 3}}
	kept := c.add(b, &r, edges)
	want := r
	want.edges = edges[:1]
	if !reflect.DeepEqual(*kept, want) {
		t.Errorf("kept %+v, want %+v", *kept, want)
	}
	if got := kept.rets(); len(got) != 1 || got[0].From != 3 {
		t.Errorf("rets %v", got)
	}
	if b.runs != kept {
		t.Error("block does not list the run")
	}
	second := c.add(b, &r, edges)
	if b.runs != second || second.next != kept {
		t.Error("second run not listed first, before the first")
	}
}

// TestRunLongest holds the runs of the most edges and return addresses,
// which tntRun writes into tmp by index, to the slow path's flow and to
// being kept whole: each bit behind runJumps calls that push (102 edges,
// 96 return addresses), and the last bit behind more calls than a run goes
// through without a bit (5 bits, then runJumps+1 calls: 102 and 97).
func TestRunLongest(t *testing.T) {
	for _, tc := range []struct {
		name        string
		calls       [runBits]int // before each bit's je
		edges, rets int
		used        uint8
	}{
		{"bits", [runBits]int{16, 16, 16, 16, 16, 16}, 102, 96, runBits},
		{"jumps", [runBits]int{16, 16, 16, 16, 16, 18}, 102, 97, runBits - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var code []byte
			for _, n := range tc.calls {
				for range n {
					code = append(code, 0xe8, 2, 0, 0, 0, 0x66, 0x90) // call over a nop: pushes
				}
				code = append(code, 0x74, 2, 0x66, 0x90) // je over a nop
			}
			code = append(code, 0xc3) // ret: the flow waits for trace
			mem := &blob{base: 0x1000, code: code}
			e := ptenc.New()
			start(e, 0x1000)
			e.TNT(1<<runBits-1, runBits)
			sameFast(t, mem, e.Bytes(), Options{})
			d := New(mem, Options{NoInsns: true})
			d.Decode(e.Bytes(), &counter{})
			b := d.cache.known(0x1000, Mode64)
			if b == nil || b.runs == nil {
				t.Fatal("no run kept from the first block")
			}
			r := b.runs
			if len(r.edges) != tc.edges || int(r.nrets) != tc.rets || r.used != tc.used {
				t.Errorf("run of %d edges, %d return addresses, %d bits; want %d, %d, %d",
					len(r.edges), r.nrets, r.used, tc.edges, tc.rets, tc.used)
			}
			// Each return address follows its call.
			rets := r.rets()
			for _, e := range r.edges {
				if e.Kind == BrCall {
					if len(rets) == 0 || rets[0].From != e.From+5 {
						t.Fatalf("call at %#x, return addresses %v", e.From, rets)
					}
					rets = rets[1:]
				}
			}
			if len(rets) != 0 {
				t.Errorf("%d return addresses without a call", len(rets))
			}
			// Worked out again over known blocks, the run alone
			// counts toward the cache's bound: 2, and one an edge
			// or a return address.
			b.runs = nil
			before := d.cache.insns
			d.tntRun(b, r.pat, runBits)
			if got, want := d.cache.insns-before, 2+tc.edges+tc.rets; got != want {
				t.Errorf("run counted as %d toward the cache's bound, want %d", got, want)
			}
		})
	}
}

// TestRunMaxInsnsBound holds a run's MaxInsns counts (pre, post),
// which let the fast path take a run whole, to the walk's check at each
// block: with MaxInsns at every count around a run's, the fast path stops
// where the walk stops. A block is a nop and a jump, or a nop and a je,
// both to the next instruction (two instructions: a count off by one
// stops at another block).
func TestRunMaxInsnsBound(t *testing.T) {
	for _, tc := range []struct {
		name      string
		jumps     []int // before each bit's je
		limit     int   // the least MaxInsns without an error
		pre, post uint16
	}{
		{"pre", []int{5, 3, 1}, 12, 12, 8},  // pre 12, post 8 and 4
		{"post", []int{3, 5, 1}, 12, 8, 12}, // pre 8, post 12 and 4
	} {
		t.Run(tc.name, func(t *testing.T) {
			var code []byte
			for _, n := range tc.jumps {
				for range n {
					code = append(code, 0x90, 0xeb, 0) // nop; jmp .+2
				}
				code = append(code, 0x90, 0x74, 0) // nop; je .+2
			}
			code = append(code, 0x90, 0xc3) // nop; ret: the flow waits for trace
			mem := &blob{base: 0x1000, code: code}
			e := ptenc.New()
			start(e, 0x1000)
			e.TNT(0b101, 3)
			// MaxInsns from below the smallest count to past the largest.
			for m := 1; m <= tc.limit+2; m++ {
				c := sameFast(t, mem, e.Bytes(), Options{MaxInsns: m})
				if want := m < tc.limit; (c.Errors == 1) != want {
					t.Errorf("MaxInsns %d: counters %+v, want an error %v", m, c, want)
				}
			}
			// The counts above are a run's, not the walk's alone.
			d := New(mem, Options{MaxInsns: tc.limit, NoInsns: true})
			d.Decode(e.Bytes(), &counter{})
			if b := d.cache.known(0x1000, Mode64); b == nil || b.runs == nil {
				t.Fatal("no run kept from the first block")
			} else if r := b.runs; r.pre != tc.pre || r.post != tc.post || r.used != 3 {
				t.Errorf("run of %d bits, pre %d, post %d; want 3, %d, %d", r.used, r.pre, r.post, tc.pre, tc.post)
			}
		})
	}
}

// TestTNT8Count holds tnt8Count, a word's TNT.8 bytes from the low one on,
// to the kernel's table (onOps), for every value of each of the first two
// bytes and of the last, behind TNT.8 bytes and in front of them.
func TestTNT8Count(t *testing.T) {
	want := func(w uint64) int {
		n := 0
		for n < 8 && onOps[byte(w>>(8*n))] == opTNT8 {
			n++
		}
		return n
	}
	const tnts = 0x0406fe80aa7c1204 // eight TNT.8 bytes
	for c := range uint64(256) {
		for _, w := range []uint64{
			c, c | tnts&^0xff, tnts&^0xff00 | c<<8, tnts&^(0xff<<56) | c<<56, c<<8 | 0x04,
		} {
			if got := tnt8Count(w); got != want(w) {
				t.Fatalf("tnt8Count(%#016x) = %d, want %d", w, got, want(w))
			}
		}
	}
}

// TestTletMruby holds the tracelets a warm mruby decode keeps to their
// keys: each byte's run (from its block's list) takes the byte's bits
// whole and starts where the one before ended, the tracelet's edges and
// return addresses are its runs' in order, in its slot's room, and the
// counts are the runs'.
func TestTletMruby(t *testing.T) {
	bt := loadBench(t, "mruby")
	d := New(bt.space, Options{NoInsns: true})
	d.fp.noWnd = true // the tracelets, not the windows, take the TNT.8 packets
	var c counter
	d.Decode(bt.trace, &c)
	d.Decode(bt.trace, &c)
	multi, pushes := 0, 0
	for i := range d.cache.runs.tlets {
		tl := &d.cache.runs.tlets[i]
		if tl.b == nil || tl.m == 0 {
			continue
		}
		if tl.m >= 2 {
			multi++
		}
		s, insns := tl.b, uint32(0)
		var edges, pushed []Edge
		var last *tntRun
		for j := range int(tl.m) {
			tb := byte(tl.key >> (8 * j))
			nb := tnt8Lens[tb]
			pat := uint8(1<<nb | tnt8Words[tb]>>(64-nb))
			var r *tntRun
			for l := s.runs; l != nil; l = l.next {
				if l.pat == pat {
					r = l
				}
			}
			if r == nil || r.used != nb {
				t.Fatalf("tracelet %#x from %#x: byte %d (%#x) has no run taking its bits whole", tl.key, tl.b.ip, j, tb)
			}
			edges = append(edges, r.edges...)
			pushed = append(pushed, r.rets()...)
			insns += uint32(r.insns)
			s, last = r.end, r
		}
		room := d.cache.runs.tletRoom[i]
		got := room[:min(int(tl.ne), cap(room))]
		var rets []uint64
		for _, r := range pushed {
			rets = append(rets, r.From)
		}
		if !slices.Equal(got, edges) || !slices.Equal(tl.rets[:tl.nrets], rets) || len(edges) > 0 && uintptr(unsafe.Pointer(&room[0])) != tl.e || len(edges) > min(cap(room), tletEdges) {
			t.Fatalf("tracelet %#x from %#x: edges %v and returns %#x, its runs' %v and %#x", tl.key, tl.b.ip, got, tl.rets[:tl.nrets], edges, rets)
		}
		pushes += len(rets)
		if tl.end != s || tl.insns != insns || tl.errIP != last.errIP || last.steps != 0 {
			t.Fatalf("tracelet %#x from %#x: end, counts or last branch not its runs', or steps after its last bit", tl.key, tl.b.ip)
		}
	}
	// mruby has 1,766 keys of 2 to 8 bytes; most are kept, some with
	// calls.
	if multi < recentTlets/2 || pushes == 0 {
		t.Errorf("%d tracelets of 2 bytes or more kept, %d return addresses", multi, pushes)
	}
}
