package flow

import (
	"errors"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"ptfs/images"
	"ptfs/x86insn"
)

// TestBoundedMemory streams the mruby trace through one decoder again and
// again (22 MiB of trace for branches, 3 MiB with every instruction; an
// eighth in -short) and checks that the heap after the last pass is what
// it was after the first (for branches, the first from which packet
// windows are made) but for the packet windows' rooms, which grow over
// the passes to their own bound (wndRoomMax, held by roomBytes): the
// decoder's memory is the images and the block cache, not the trace it
// went through.
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
		for d.fp.bytes < wndWarm && d.fp.bytes > 0 {
			// The packet windows' tables and rooms, made once the
			// fast path took wndWarm.
			d.Decode(bt.trace, &c)
		}
		before, rooms := heap(), roomBytes(t, &d.cache.runs)
		for range passes - 1 {
			d.Decode(bt.trace, &c)
		}
		after := heap()
		if c.errors != 0 || c.branches == 0 {
			t.Fatalf("%d branches, %d errors", c.branches, c.errors)
		}
		if grown := roomBytes(t, &d.cache.runs) - rooms; after > before+grown+1<<20 {
			t.Errorf("NoInsns %v: heap grew from %d to %d bytes over %d passes of %d bytes, the windows' rooms by %d",
				opts.NoInsns, before, after, passes, len(bt.trace), grown)
		}
		if d.cache.insns > maxCached || d.cache.n == 0 {
			t.Errorf("block cache holds %d instructions in %d blocks, bound %d", d.cache.insns, d.cache.n, maxCached)
		}
		runtime.KeepAlive(d)
	}
}

// roomBytes returns the bytes of the packet windows' rooms' chunks, after
// checking them against their bound: chunks are started only while the
// rooms took fewer than wndRoomMax edges, so they hold at most that, the
// last room (wndEdges), the last chunk's free part (tletSlab) and the ends
// that rooms which did not fit left (under wndEdges a chunk).
func roomBytes(t *testing.T, c *runCache) uint64 {
	t.Helper()
	n := 0
	for _, ch := range c.wndSlab.full {
		n += len(ch)
	}
	if most := wndRoomMax + wndEdges + tletSlab + len(c.wndSlab.full)*wndEdges; n > most {
		t.Errorf("the windows' rooms are %d edges in %d chunks, bound %d", n, len(c.wndSlab.full), most)
	}
	return uint64(n) * uint64(unsafe.Sizeof(Edge{}))
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
			if b := d.block(ip, Mode64); b.n == 0 || b.ip != ip {
				t.Fatalf("block at %x: %d instructions", ip, b.n)
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

// TestBlockView decodes blocks through images.Space, whose View the decoder
// steps through in place (a block in a view kept at once, in one Run),
// and through the same bytes behind ReadAt alone: the blocks are the same,
// those that end at a branch and those that end after maxBlock
// instructions, also where instructions straddle adjacent mappings of
// different sources and where the code runs into a gap.
func TestBlockView(t *testing.T) {
	// movabs (10 bytes), a 5-byte nop and a 15-byte one in turns, a jne
	// after every 23rd turn (70 instructions: a block from the first
	// ones ends after maxBlock, a later one at the jne), a ret at the end.
	var code []byte
	for i := 0; len(code) < 3*4096; i++ {
		code = append(code, 0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8)
		code = append(code, 0x0f, 0x1f, 0x44, 0x00, 0x00)
		code = append(code, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0)
		if i%23 == 22 {
			code = append(code, 0x0f, 0x85, 0xe2, 0xff, 0xff, 0xff) // jne back over the turn
		}
	}
	code = append(code, 0xc3)
	const base = 0x400000
	s := images.NewSpace()
	// Three adjacent mappings, each of its own copy, cut inside
	// instructions, then a gap: the last mapping ends inside one.
	cuts := []int{0, 4093, 4101, 9000}
	for i := 0; i+1 < len(cuts); i++ {
		src := images.NewBlob(slices.Clone(code[cuts[i]:cuts[i+1]]))
		if err := s.Map(base+uint64(cuts[i]), uint64(cuts[i+1]-cuts[i]), src, 0, "part"); err != nil {
			t.Fatal(err)
		}
	}
	viewed := New(s, Options{})
	read := New(&blob{base: base, code: code[:cuts[len(cuts)-1]]}, Options{})
	if viewed.view == nil || read.view != nil {
		t.Fatal("a Space must be a Viewer, blob must not")
	}
	gaps, branches, long := 0, 0, 0
	for ip := uint64(base); ip < base+uint64(cuts[len(cuts)-1]); ip++ {
		v, r := viewed.block(ip, Mode64), read.block(ip, Mode64)
		if vi, ri := v.insns(), r.insns(); !slices.Equal(vi, ri) || !errors.Is(v.err(), r.err()) || !errors.Is(r.err(), v.err()) {
			t.Fatalf("block at 0x%x: through View %v %v, through ReadAt %v %v", ip, vi, v.err(), ri, r.err())
		}
		switch {
		case v.err() != nil: // cut short by the gap (in an instruction: ErrBadInsn, as libipt)
			gaps++
		case v.class == x86insn.CondJump:
			branches++
		case v.n == maxBlock:
			long++
		}
	}
	if gaps == 0 || branches == 0 || long == 0 {
		t.Errorf("%d blocks ran into the gap, %d ended at a branch, %d after maxBlock: want each", gaps, branches, long)
	}
}

// insns lists b's instructions.
func (b *block) insns() []insn {
	var ins []insn
	ip := b.ip
	for i := range int(b.n) {
		ins = append(ins, b.at(i, ip))
		ip += uint64(ins[i].len)
	}
	return ins
}

// viewSwap is a Viewer whose first swaps Views change the memory under
// the decoder and still return the old bytes, as a side band applied on a
// read that missed may.
type viewSwap struct {
	d        *Decoder
	old, new []byte
	swaps    int
}

func (m *viewSwap) View(addr uint64) (uint64, []byte, error) {
	code := m.new
	if m.swaps > 0 {
		m.swaps--
		m.d.MemoryChanged()
		code = m.old
	}
	if addr < 0x1000 || addr-0x1000 >= uint64(len(code)) {
		return 0, nil, errors.New("unmapped")
	}
	return 0x1000, code, nil
}

func (m *viewSwap) ReadAt(dst []byte, addr uint64) (int, error) {
	base, v, err := m.View(addr)
	if err != nil {
		return 0, err
	}
	return copy(dst, v[addr-base:]), nil
}

// TestMemoryChangedInView: the bytes of a View under which the memory
// changed are not kept for the next block (the decode is retried on the
// new bytes).
func TestMemoryChangedInView(t *testing.T) {
	// The old bytes hold a whole block (maxBlock nops) well within the
	// View.
	nops := slices.Repeat([]byte{0x90}, 2*maxBlock)
	m := &viewSwap{
		old:   append(slices.Clone(nops), 0xc3),
		new:   append([]byte{0x90, 0x90, 0x90, 0x90, 0x75, 0xfa}, nops...), // jne 0x1000
		swaps: 1,
	}
	m.d = New(m, Options{})
	b := m.d.block(0x1000, Mode64)
	if last := b.last(); b.n != 5 || last.class != x86insn.CondJump || last.target != 0x1000 {
		t.Errorf("block decoded from the old bytes: %d instructions, last %+v", b.n, last)
	}
}

// TestMemoryStillChanging: a block whose memory changes under each of its
// tries is given up (not kept); the cache then works as before: the next
// blocks are decoded once and found again.
func TestMemoryStillChanging(t *testing.T) {
	nops := slices.Repeat([]byte{0x90}, 2*maxBlock)
	m := &viewSwap{
		old:   append(slices.Clone(nops), 0xc3),
		new:   append([]byte{0x90, 0x90, 0x90, 0x90, 0x75, 0xfa, 0xc3}, nops...), // jne 0x1000; ret
		swaps: 3,
	}
	m.d = New(m, Options{})
	if b := m.d.block(0x1000, Mode64); b.stop != stopNoMap || m.d.cache.known(0x1000, Mode64) != nil {
		t.Fatalf("block at 0x1000 under a memory changing at each try: stop %d, kept %v", b.stop, m.d.cache.known(0x1000, Mode64) != nil)
	}
	for _, ip := range []uint64{0x1000, 0x1006} {
		b := m.d.block(ip, Mode64)
		if got := m.d.cache.known(ip, Mode64); got != b {
			t.Fatalf("block at %#x not found again (%d chunks for %d blocks)", ip, len(m.d.cache.chunks), m.d.cache.n)
		}
		if m.d.block(ip, Mode64) != b {
			t.Errorf("block at %#x decoded again", ip)
		}
	}
}

// pagedViews is a Viewer of two regions on different pages, counting its
// Views; code may be replaced (with a MemoryChanged) between blocks.
type pagedViews struct {
	regions map[uint64][]byte // by base
	views   int
}

func (m *pagedViews) View(addr uint64) (uint64, []byte, error) {
	m.views++
	for base, code := range m.regions {
		if addr >= base && addr-base < uint64(len(code)) {
			return base, code, nil
		}
	}
	return 0, nil, errors.New("unmapped")
}

func (m *pagedViews) ReadAt(dst []byte, addr uint64) (int, error) {
	base, v, err := m.View(addr)
	if err != nil {
		return 0, err
	}
	return copy(dst, v[addr-base:]), nil
}

// TestBlockViewsByPage: a block in a mapping viewed before, though another
// was viewed since, is decoded from the kept bytes at its own offset
// without a View, also below the address viewed first (the whole mapping
// is kept) and in the view's own mapping; after MemoryChanged the kept
// bytes are not used.
func TestBlockViewsByPage(t *testing.T) {
	nops := slices.Repeat([]byte{0x90}, 2*maxBlock)
	m := &pagedViews{regions: map[uint64][]byte{
		0x1000:  append([]byte{0x90, 0x90, 0xc3}, nops...),       // ret at 0x1002
		0x10000: append([]byte{0x90, 0x90, 0x90, 0xc3}, nops...), // ret at 0x10003
	}}
	d := New(m, Options{})
	if b := d.block(0x1001, Mode64); b.n != 2 {
		t.Fatalf("block at 0x1001: %d instructions, want 2", b.n)
	}
	if b := d.block(0x10001, Mode64); b.n != 3 {
		t.Fatalf("block at 0x10001: %d instructions, want 3", b.n)
	}
	views := m.views
	if b := d.block(0x10000, Mode64); b.n != 4 {
		t.Fatalf("block at 0x10000 from the view: %d instructions, want 4", b.n)
	}
	if b := d.block(0x1000, Mode64); b.n != 3 || b.last().ip != 0x1002 || b.class != x86insn.Ret {
		t.Fatalf("block at 0x1000 from the kept bytes: %d instructions, last %+v", b.n, b.last())
	}
	if m.views != views {
		t.Errorf("blocks at 0x10000 and 0x1000: %d Views, want none (the mappings are kept)", m.views-views)
	}
	// jne 0x1000 at 0x1000 now.
	m.regions[0x1000] = append([]byte{0x75, 0xfe}, nops...)
	d.MemoryChanged()
	if b := d.block(0x1000, Mode64); b.n != 1 || b.class != x86insn.CondJump || b.last().target != 0x1000 {
		t.Errorf("block at 0x1000 after MemoryChanged: %d instructions, last %+v (the old bytes?)", b.n, b.last())
	}
	if b := d.block(0x1001, Mode64); b.n == 2 && b.class == x86insn.Ret {
		t.Errorf("block at 0x1001 after MemoryChanged decoded from the old bytes")
	}
}

// TestBlockTableTags holds the block cache's table (slots of a hash tag
// and a block index) to finding each block by IP and mode: blocks whose
// hashes share a tag and a home slot, the same IP in another mode, through
// the table's growth (slots put again by their tags alone) and a drop.
func TestBlockTableTags(t *testing.T) {
	var c blockCache
	c.init()
	add := func(ip uint64, mode Mode) *block {
		t.Helper()
		h := c.hash(ip, mode)
		b, i := c.lookup(h, ip, mode)
		if b != nil {
			t.Fatalf("%#x %v found before it was added", ip, mode)
		}
		b = c.next(ip, mode)
		c.insert(i, h, b)
		return b
	}
	// An IP whose hash is h+1: the same tag and home slot as h's.
	inv := uint64(0x9e3779b97f4a7c15)
	for range 6 {
		inv *= 2 - 0x9e3779b97f4a7c15*inv
	}
	ip1 := uint64(0x401000)
	ip2 := (c.hash(ip1, Mode64)+1)*inv ^ uint64(Mode64)<<62
	ip3 := (c.hash(ip1, Mode64)+2)*inv ^ uint64(Mode64)<<62
	if c.hash(ip2, Mode64)>>32 != c.hash(ip1, Mode64)>>32 || c.hash(ip3, Mode64)>>32 != c.hash(ip1, Mode64)>>32 {
		t.Fatal("test IPs do not share a tag")
	}
	want := map[[2]uint64]*block{}
	for _, k := range []struct {
		ip   uint64
		mode Mode
	}{{ip1, Mode64}, {ip2, Mode64}, {ip1, Mode32}} {
		want[[2]uint64{k.ip, uint64(k.mode)}] = add(k.ip, k.mode)
	}
	check := func(when string) {
		t.Helper()
		for k, w := range want {
			if b := c.known(k[0], Mode(k[1])); b != w || b.ip != k[0] || b.mode != Mode(k[1]) {
				t.Fatalf("%s: %#x %v found %p, want %p", when, k[0], Mode(k[1]), b, w)
			}
		}
		if b := c.known(ip3, Mode64); b != nil {
			t.Fatalf("%s: %#x (the same tag) found %#x", when, ip3, b.ip)
		}
	}
	check("first")
	slots := len(c.slots)
	for ip := uint64(0x500000); len(c.slots) == slots; ip += 16 {
		want[[2]uint64{ip, uint64(Mode64)}] = add(ip, Mode64)
	}
	check("grown")
	if c.n != len(want) {
		t.Fatalf("%d blocks held, %d added", c.n, len(want))
	}
	c.drop()
	if b := c.known(ip1, Mode64); b != nil || c.n != 0 {
		t.Fatalf("after the drop %d blocks, %#x found", c.n, ip1)
	}
	old := want[[2]uint64{ip2, uint64(Mode64)}]
	if b := add(ip2, Mode64); b == old || old.ip != ip2 {
		t.Fatal("a block after the drop reuses a block from before it")
	}
}

// readOnly is a Space seen through ReadAt alone (no Viewer): the block
// cache's reference without kept mappings.
type readOnly struct{ s *images.Space }

func (m readOnly) ReadAt(dst []byte, addr uint64) (int, error) { return m.s.ReadAt(dst, addr) }

// TestBlockViewOverlap: a mapping over part of an older one wins, though
// the cache keeps whole mappings. Blocks in the older mapping's parts
// alternate with blocks in the newer one (whose source ends before it
// does: its tail has no known bytes), mapped before the decoder is made
// and, for a second decoder, after it kept the older mapping whole (the
// generation checked, as Decode does): each block is the one decoded
// through ReadAt alone.
func TestBlockViewOverlap(t *testing.T) {
	const base, newAt, newLen = 0x400000, 0x401100, 0x800
	old := slices.Repeat(append(slices.Repeat([]byte{0x90}, 39), 0xc3), 3*4096/40+1) // nops, a ret in every 40 bytes
	jnes := slices.Repeat([]byte{0x75, 0x00}, newLen/4)                              // jne +0, over half the mapping
	s := images.NewSpace()
	mapOld := func() {
		if err := s.Map(base, 3*4096, images.NewBlob(old), 0, "old"); err != nil {
			t.Fatal(err)
		}
	}
	mapNew := func() {
		if err := s.Map(newAt, newLen, images.NewBlob(jnes), 0, "new"); err != nil {
			t.Fatal(err)
		}
	}
	var ref *Decoder // through ReadAt, made anew for each state of s
	check := func(d *Decoder, ip uint64) {
		t.Helper()
		v, r := d.block(ip, Mode64), ref.block(ip, Mode64)
		if vi, ri := v.insns(), r.insns(); !slices.Equal(vi, ri) || !errors.Is(v.err(), r.err()) || !errors.Is(r.err(), v.err()) {
			t.Fatalf("block at 0x%x: through View %v %v, through ReadAt %v %v", ip, vi, v.err(), ri, r.err())
		}
	}
	mapOld()
	mapNew()
	d, ref := New(s, Options{}), New(readOnly{s}, Options{})
	for i := range uint64(newLen + 0x100) {
		check(d, newAt-0x100+i) // below the newer mapping, then into it
		check(d, newAt+i)       // in the newer mapping, then past it
		check(d, base+i)        // the older mapping's first part
	}

	s = images.NewSpace()
	mapOld()
	d, ref = New(s, Options{}), New(readOnly{s}, Options{})
	for ip := uint64(base); ip < base+3*4096; ip += 40 {
		check(d, ip)
	}
	mapNew()
	d.cache.check(s.Generation())
	ref = New(readOnly{s}, Options{})
	for i := range uint64(newLen + 0x100) {
		check(d, newAt-0x100+i)
		check(d, newAt+i)
	}
}

// TestBlockViewModes: a block of 16- or 32-bit code in a kept mapping is
// decoded in its mode, not by the 64-bit length decoder's Run (dec eax
// is a REX there, and 16-bit immediates are shorter).
func TestBlockViewModes(t *testing.T) {
	// dec eax; add eax, 1 (32-bit), add rax, 1 (64-bit), dec ax; add ax,
	// 1; add [bx+si], al (16-bit); a ret after ten; nops past it.
	code := append(slices.Repeat([]byte{0x48, 0x05, 0x01, 0x00, 0x00, 0x00}, 10), 0xc3)
	code = append(code, slices.Repeat([]byte{0x90}, 64)...)
	s := images.NewSpace()
	if err := s.Map(0x1000, uint64(len(code)), images.NewBlob(code), 0, "code"); err != nil {
		t.Fatal(err)
	}
	d, ref := New(s, Options{}), New(readOnly{s}, Options{})
	for _, tt := range []struct {
		mode Mode
		n    uint8
	}{{Mode64, 11}, {Mode32, 21}, {Mode16, 31}} {
		// The mapping is kept from the block before (the first: from
		// Mode64's own).
		if b := d.block(0x1000, tt.mode); b.n != tt.n || b.class != x86insn.Ret || b.err() != nil {
			t.Errorf("%v block: %d instructions, last %+v, %v; want %d to the ret", tt.mode, b.n, b.last(), b.err(), tt.n)
		}
		for ip := uint64(0x1000); ip < 0x1000+uint64(len(code)); ip++ {
			v, r := d.block(ip, tt.mode), ref.block(ip, tt.mode)
			if vi, ri := v.insns(), r.insns(); !slices.Equal(vi, ri) || !errors.Is(v.err(), r.err()) || !errors.Is(r.err(), v.err()) {
				t.Fatalf("%v block at 0x%x: through View %v %v, through ReadAt %v %v", tt.mode, ip, vi, v.err(), ri, r.err())
			}
		}
	}
}
