package flow

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"ptfs/decode"
	"ptfs/decode/ptenc"
)

// recurseCode is f, which calls itself while its je is not taken, and
// main, which calls f while its jne is taken:
//
//	0x1000: je 0x1007; call 0x1000; 0x1007: ret
//	0x1010: call 0x1000; 0x1015: jne 0x1010; ret
var recurseCode = []byte{
	0x74, 0x05, 0xe8, 0xf9, 0xff, 0xff, 0xff, 0xc3, 0x10: 0xe8, 0xeb, 0xff, 0xff, 0xff, 0x75, 0xf9, 0xc3,
}

// recurseTrace returns a trace of recurseCode from main, f recursing to a
// depth up to maxDepth each time round: runs of TNT.8 packets (1 to 6
// bits each, a TNT.64 now and then) whose bits take calls, returns
// compressed while the return stack holds them and TIPs past its depth,
// with PADs, 1-byte CYCs, TRIGs, and MTCs and TSCs whose payload bytes are
// TNT.8 values between them when odd is set.
func recurseTrace(r *rand.Rand, rounds, maxDepth int, odd bool) []byte {
	e := ptenc.New()
	start(e, 0x1010)
	var bits uint64 // pending, the oldest in the top of the n
	n := 0
	between := func() {
		if !odd || r.IntN(4) != 0 {
			return
		}
		switch r.IntN(5) {
		case 4:
			// A TRIG, its instruction count from the last IP
			// reference (a bit the tracelet took).
			e.Raw(0xd9, 0x40, 0x01, byte(r.IntN(4)), 0x00)
		case 0:
			e.Pad()
		case 1:
			e.CYC(uint64(r.IntN(32)))
		case 2:
			e.MTC([]byte{0x04, 0x06, 0xfe, 0x80}[r.IntN(4)])
		default:
			e.TSC(0x0406fe800c0604)
		}
	}
	flush := func(all bool) {
		for n > 0 && (all || n >= 6) {
			k := min(n, 1+r.IntN(6))
			if odd && n >= 8 && r.IntN(8) == 0 {
				k = min(n, 7+r.IntN(40))
			}
			e.TNT(bits>>(n-k), k)
			n -= k
			bits &= 1<<n - 1
			between()
		}
	}
	bit := func(b uint64) {
		bits, n = bits<<1|b, n+1
		if n >= 47 {
			flush(false)
		}
	}
	sp := 0
	ret := func(to uint64) {
		if sp > 0 {
			sp--
			bit(1)
			return
		}
		flush(true)
		e.IP(ptenc.TIP, to)
	}
	for range rounds {
		sp = min(sp+1, retStackSize) // main's call
		depth := r.IntN(maxDepth + 1)
		for range depth {
			bit(0)
			sp = min(sp+1, retStackSize)
		}
		bit(1)
		for range depth {
			ret(0x1007)
		}
		ret(0x1015)
		bit(1) // main's jne
	}
	flush(true)
	for range 32 {
		e.Pad()
	}
	return e.Bytes()
}

// TestTletSameFlow holds the flow through tracelets to the slow path's on
// traces made to meet their edges: compressed returns between TNT.8
// packets, return stacks past their depth, other 1-byte and multi-byte
// packets (with TNT.8 values in them) between them, batches that fill
// anywhere, a MaxInsns at and below tletBudget, a clock, a Handler that drops the
// block cache in every call; and each trace cut at every length, a
// sub-slice with TNT.8 packets in its spare capacity.
func TestTletSameFlow(t *testing.T) {
	mem := &blob{base: 0x1000, code: recurseCode}
	r := rand.New(rand.NewPCG(17, 11))
	for i, tc := range []struct {
		maxDepth int
		odd      bool
	}{{3, false}, {12, false}, {12, true}, {100, true}} {
		trace := recurseTrace(r, 200, tc.maxDepth, tc.odd)
		t.Run(fmt.Sprintf("%d/depth%d/odd%v", i, tc.maxDepth, tc.odd), func(t *testing.T) {
			for _, opts := range []Options{{}, {MaxInsns: tletBudget}, {MaxInsns: tletBudget - 1}, {ResyncOnError: true}, {Time: &decode.ClockConfig{CPUID15EAX: 1, CPUID15EBX: 2}}} {
				if c := sameFast(t, mem, trace, opts); c.Errors != 0 {
					t.Fatalf("%+v: counters %+v: the trace is not the code's", opts, c)
				}
			}
			d := New(mem, Options{NoInsns: true})
			d.fp.noWnd = true // the tracelets, not the windows, take the TNT.8 packets
			d.Decode(trace, &counter{})
			d.Decode(trace, &counter{})
			if tletsKept(d) == 0 {
				t.Fatal("no tracelet of 2 bytes or more kept: they went untested")
			}
			// Drops in every Handler call: the kernel goes on in the
			// old blocks, with tracelets made anew.
			sameWithDrops(t, mem, trace)
			if tc.maxDepth > 12 || testing.Short() {
				return
			}
			for n := range len(trace) {
				buf := make([]byte, n, n+16)
				copy(buf, trace)
				for j := n; j < cap(buf); j++ {
					buf[:cap(buf)][j] = 0x04 << (j % 5) // TNT.8 bytes
				}
				sameFast(t, mem, buf, Options{})
			}
		})
	}
}

// tletsKept is how many of d's tracelets take 2 bytes or more.
func tletsKept(d *Decoder) int {
	n := 0
	for i := range d.cache.runs.tlets {
		if d.cache.runs.tlets[i].m >= 2 {
			n++
		}
	}
	return n
}

// TestTletDropClears: a drop of the block cache leaves no tracelet (nor a
// miss mark), so that none keeps the dropped blocks and runs alive.
func TestTletDropClears(t *testing.T) {
	mem := &blob{base: 0x1000, code: recurseCode}
	trace := recurseTrace(rand.New(rand.NewPCG(1, 2)), 200, 12, false)
	d := New(mem, Options{NoInsns: true})
	d.fp.noWnd = true // the tracelets, not the windows, take the TNT.8 packets
	d.Decode(trace, &counter{})
	d.Decode(trace, &counter{})
	if tletsKept(d) == 0 {
		t.Fatal("no tracelet of 2 bytes or more kept: the drop went untested")
	}
	d.MemoryChanged()
	for i := range d.cache.runs.tlets {
		if d.cache.runs.tlets[i] != (tlet{}) || d.cache.runs.tletSeen[i/2] != 0 {
			t.Fatalf("slot %d kept after a drop", i)
		}
	}
}

// TestTletBudget holds a tracelet's MaxInsns bound to the walk's: two
// TNT.8 packets of a bit each, each bit's je behind runJumps jumps through
// blocks of maxBlock instructions, then a jmp . that ends in the MaxInsns
// error before a TIP, with MaxInsns around a run's count (the tracelet not taken) and
// around tletBudget (taken: the budget after it is MaxInsns less its last
// run's steps, as the error's instruction count tells).
func TestTletBudget(t *testing.T) {
	var code []byte
	for range 2 {
		for i := range runJumps + 1 {
			code = append(code, bytes.Repeat([]byte{0x90}, maxBlock-1)...)
			if i < runJumps {
				code = append(code, 0xeb, 0) // jmp .+2
			} else {
				code = append(code, 0x74, 0) // je .+2
			}
		}
	}
	code = append(code, 0xeb, 0xfe) // jmp .
	mem := &blob{base: 0x1000, code: code}
	e := ptenc.New()
	start(e, 0x1000)
	e.TNT(1, 1)
	e.TNT(0, 1)
	e.IP(ptenc.TIP, 0x1000) // for an indirect branch the jmp . never reaches
	for range 32 {
		e.Pad()
	}
	const most = (runJumps + 1) * maxBlock
	for _, maxInsns := range []int{most - 1, most, most + 1, tletBudget - 1, tletBudget, tletBudget + 1} {
		c := sameFast(t, mem, e.Bytes(), Options{MaxInsns: maxInsns})
		if c.Errors != 1 {
			t.Errorf("MaxInsns %d: counters %+v, want the MaxInsns error", maxInsns, c)
		}
	}
	d := New(mem, Options{MaxInsns: tletBudget, NoInsns: true})
	d.fp.noWnd = true // the tracelets, not the windows, take the TNT.8 packets
	d.Decode(e.Bytes(), &counter{})
	d.Decode(e.Bytes(), &counter{})
	if tletsKept(d) != 1 {
		t.Errorf("%d tracelets of 2 bytes kept, want 1", tletsKept(d))
	}
}

// TestTletNoEdges: tracelets whose runs take no branch (every bit a je not
// taken) hand no edges over and push nothing, between tracelets and
// single branches that do.
func TestTletNoEdges(t *testing.T) {
	// 64 je .+2, then jmp rax back to the first.
	code := bytes.Repeat([]byte{0x74, 0x00}, 64)
	code = append(code, 0xff, 0xe0)
	mem := &blob{base: 0x1000, code: code}
	e := ptenc.New()
	start(e, 0x1000)
	for round := range 40 {
		// A taken je now and then: tracelets with edges too.
		for i := range 10 {
			bits := uint64(0)
			if round%3 == 0 && i == 4 {
				bits = 1
			}
			e.TNT(bits, 6)
		}
		e.TNT(0, 4)
		e.IP(ptenc.TIP, 0x1000)
	}
	for range 32 {
		e.Pad()
	}
	if c := sameFast(t, mem, e.Bytes(), Options{}); c.Errors != 0 {
		t.Fatalf("counters %+v: the trace is not the code's", c)
	}
	d := New(mem, Options{NoInsns: true})
	d.fp.noWnd = true // the tracelets, not the windows, take the TNT.8 packets
	d.Decode(e.Bytes(), &counter{})
	d.Decode(e.Bytes(), &counter{})
	none, some := 0, 0
	for i := range d.cache.runs.tlets {
		switch tl := &d.cache.runs.tlets[i]; {
		case tl.m >= 2 && tl.ne == 0:
			none++
		case tl.m >= 2:
			some++
		}
	}
	if none == 0 || some == 0 {
		t.Errorf("%d tracelets without edges kept, %d with: one kind went untested", none, some)
	}
}

// TestTletRoomBound: past tletRoomMax no slot's room grows, and a tracelet
// takes the runs its room has room for (none with edges where its set has
// no room); the flow is the slow path's.
func TestTletRoomBound(t *testing.T) {
	mem := &blob{base: 0x1000, code: recurseCode}
	trace := recurseTrace(rand.New(rand.NewPCG(5, 6)), 200, 12, false)
	ds, df := New(mem, Options{NoInsns: true}), New(mem, Options{NoInsns: true})
	ds.fp.noWnd, df.fp.noWnd = true, true
	ds.fp.off = true
	// Rooms of 4 edges in every other set, none in the rest, then the
	// bound reached and the tracelets dropped: they are made again in
	// the rooms there are.
	df.Decode(trace, &counter{})
	rooms := df.cache.runs.tletRoom
	for i := range rooms {
		rooms[i] = nil
		if i/2%2 == 1 {
			rooms[i] = make([]Edge, 4)
		}
	}
	was := *rooms
	df.cache.runs.tletRoomed = tletRoomMax
	df.MemoryChanged()
	for pass := range 2 {
		var slow fullLog
		fast := edgeLog{t: t}
		ds.c, df.c = Counters{}, Counters{}
		ds.Decode(trace, &slow)
		df.Decode(trace, &fast)
		sameLogs(t, pass, ds, df, &slow, &fast.fullLog)
	}
	roomed := 0
	for i, room := range rooms {
		// A set's two rooms may have changed places.
		j := i
		if len(room) > 0 && &room[0] != &was[i][0] {
			j = i ^ 1
		}
		if cap(room) != cap(was[j]) || len(room) > 0 && &room[0] != &was[j][0] {
			t.Fatalf("slot %d: a room of %d edges after the bound, none such in its set before", i, cap(room))
		}
		tl := &df.cache.runs.tlets[i]
		if int(tl.ne) > cap(room) {
			t.Fatalf("slot %d: a tracelet of %d edges in a room of %d", i, tl.ne, cap(room))
		}
		if tl.m > 0 && tl.ne > 0 {
			roomed++
		}
	}
	if roomed == 0 {
		t.Error("no tracelet with edges kept past the bound: it went untested")
	}
}

// jeCode is n je .+2 from 0x1000, then jmp rax: a TNT bit per je, a taken
// one an edge, and a TIP back to any je.
func jeCode(n int) []byte {
	code := bytes.Repeat([]byte{0x74, 0x00}, n)
	return append(code, 0xff, 0xe0)
}

// jeGroup is a tracelet's bytes in jeCode: from the je at start, a TNT.8
// of 6 bits per byte of bits (the first je's bit the top one of its byte).
type jeGroup struct {
	start int
	bits  []byte
}

// key is the group's TNT.8 bytes as the kernel reads them.
func (g jeGroup) key() uint64 {
	var k uint64
	for i, b := range g.bits {
		k |= uint64(1<<7|b<<1) << (8 * i)
	}
	return k
}

// set is the tracelet set the group falls in.
func (g jeGroup) set() uint64 {
	return tletSet(tletHash(&block{ip: 0x1000 + 2*uint64(g.start)}, g.key()))
}

// jeTrace is a trace of jeCode(n) that goes through groups in order: each
// group's TNT.8 bytes together, then a PAD and the rest of the je's bits
// in TNT.64s (no other tracelet), then the TIP to the next group's je.
func jeTrace(r *rand.Rand, n int, groups []jeGroup) []byte {
	e := ptenc.New()
	start(e, 0x1000+2*uint64(groups[0].start))
	for i, g := range groups {
		for _, b := range g.bits {
			e.TNT(uint64(b&0x3f), 6)
		}
		e.Pad()
		for rest := n - g.start - 6*len(g.bits); rest > 0; rest -= 40 {
			e.TNT(r.Uint64(), min(rest, 40))
		}
		next := 0
		if i+1 < len(groups) {
			next = groups[i+1].start
		}
		e.IP(ptenc.TIP, 0x1000+2*uint64(next))
	}
	for range 32 {
		e.Pad()
	}
	return e.Bytes()
}

// TestTletTwoWays holds a set's two ways to DESIGN §4: in one set, groups
// A and C of one key from two blocks and B of another key, A and B made
// (each missed twice in a row), then C (a miss: neither way is its block's)
// and A (found in the second way, its edges moved there with its room; not
// made again). The flow is the slow path's with and without drops in the
// Handler, and the set holds B first, A second.
func TestTletTwoWays(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	randBits := func() []byte {
		bits := make([]byte, 2+r.IntN(5))
		for i := range bits {
			bits[i] = byte(r.IntN(64))
		}
		return bits
	}
	// More blocks than sets: two of them share one for any key (blocks
	// near each other are in sets apart, a Fibonacci hash's spread).
	const n = recentTlets/2 + 6*8
	var a, b, c jeGroup
	for c.bits == nil {
		bits := randBits()
		by := map[uint64]int{}
		for s := 0; s+6*len(bits) <= n; s++ {
			set := jeGroup{s, bits}.set()
			if o, ok := by[set]; ok {
				a, c = jeGroup{o, bits}, jeGroup{s, bits}
				break
			}
			by[set] = s
		}
	}
	for try := 0; b.bits == nil || b.set() != a.set(); try++ {
		if try == 1e6 {
			t.Fatal("no other key in the set")
		}
		if bits := randBits(); len(bits) != len(a.bits) || (jeGroup{0, bits}).key() != a.key() {
			b = jeGroup{r.IntN(n - 6*len(bits) + 1), bits}
		}
	}
	trace := jeTrace(r, n, []jeGroup{a, a, b, b, c, a, a})
	mem := &blob{base: 0x1000, code: jeCode(n)}
	if cs := sameFast(t, mem, trace, Options{}); cs.Errors != 0 {
		t.Fatalf("counters %+v: the trace is not the code's", cs)
	}
	sameWithDrops(t, mem, trace)
	d := New(mem, Options{NoInsns: true})
	d.fp.noWnd = true // the tracelets, not the windows, take the TNT.8 packets
	d.Decode(trace, &counter{})
	set := 2 * a.set()
	for i, want := range []jeGroup{b, a} {
		tl := &d.cache.runs.tlets[set+uint64(i)]
		var ip uint64 // none: an empty way
		if tl.b != nil {
			ip = tl.b.ip
		}
		if ip != 0x1000+2*uint64(want.start) || tl.key != want.key() || int(tl.m) != len(want.bits) {
			t.Errorf("way %d: a tracelet of %d bytes from %#x, key %#x; want %d from %#x, key %#x",
				i, tl.m, ip, tl.key, len(want.bits), 0x1000+2*want.start, want.key())
		}
	}
}

// TestTletRoomsBounded: a trace whose tracelets keep changing (random
// groups, each made) has the rooms stop growing at tletRoomMax, however
// long it goes on and through drops, with every room counted; the flow
// is the slow path's.
func TestTletRoomsBounded(t *testing.T) {
	roomsBounded(t, rand.New(rand.NewPCG(7, 8)), true, func(c *runCache) ([][]Edge, int, int, int) {
		return c.tletRoom[:], c.tletRoomed, tletRoomMax, tletEdges
	})
}

// roomsBounded decodes traces of random groups of TNT.8 packets, each
// made, in rounds with a drop after each, and fails t unless the rooms
// that rooms returns (with the count they took, their bound and the most
// one takes) are counted and stop growing at the bound; noWnd holds the
// windows off (the tracelets take the packets).
func roomsBounded(t *testing.T, r *rand.Rand, noWnd bool, rooms func(*runCache) (all [][]Edge, roomed, most, one int)) {
	t.Helper()
	const n = 128
	mem := &blob{base: 0x1000, code: jeCode(n)}
	d := New(mem, Options{NoInsns: true})
	d.fp.noWnd, d.fp.wndAt = noWnd, 0
	for round := range 3 {
		var groups []jeGroup
		for range 3000 {
			bits := make([]byte, 2+r.IntN(7))
			for i := range bits {
				bits[i] = byte(r.IntN(64))
			}
			g := jeGroup{r.IntN(n - 6*len(bits) + 1), bits}
			groups = append(groups, g, g)
		}
		trace := jeTrace(r, n, groups)
		if round == 0 {
			if cs := sameFast(t, mem, trace, Options{}); cs.Errors != 0 {
				t.Fatalf("counters %+v: the trace is not the code's", cs)
			}
		}
		d.Decode(trace, &counter{})
		all, roomed, most, one := rooms(&d.cache.runs)
		live := 0
		for _, room := range all {
			live += cap(room)
		}
		if live == 0 || live > roomed || roomed > most+one {
			t.Fatalf("round %d: rooms of %d edges, %d counted, bound %d", round, live, roomed, most)
		}
		d.MemoryChanged()
	}
	if _, roomed, most, _ := rooms(&d.cache.runs); roomed < most {
		t.Errorf("rooms of %d edges: the bound went untested", roomed)
	}
}
