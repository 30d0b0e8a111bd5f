package flow

import "ptfs/x86insn"

// maxBlock bounds the instructions of one cached block.
const maxBlock = 64

// maxCached bounds the instructions the cache holds (a byte each, and a
// block for each run of them); it is dropped whole when full.
const maxCached = 1 << 20

// insn is one instruction of a block, as the walk executes it: the block
// keeps only the lengths of the instructions before its last (which are
// plain fall-throughs) and the last one's class and target (block.at,
// block.last).
type insn struct {
	ip     uint64
	target uint64
	len    uint8
	class  x86insn.Class
}

// block is a run of instructions from its first up to and including the
// first that is not a plain fall-through (a branch or ptwrite), at most
// maxBlock long, decoded in mode. It is a cache line (56 bytes padded to
// 64, no interface, no instruction records: a length byte per instruction):
// the fast path finds in it what the next step needs (the start to check a
// varying successor by, the last instruction's class, offset, length and
// target, the runs) with no other load.
type block struct {
	// lens are the instructions' lengths, n of them, in the cache's
	// length slab.
	lens *[maxBlock]uint8
	ip   uint64 // the first instruction's
	// target is the last instruction's relative target (a direct
	// branch's).
	target uint64
	// taken and fall are the blocks the branch at the end leads to
	// (taken: a direct jump, call or taken conditional branch), once
	// chain went there; nil until then. For a return or an indirect
	// branch, the last target's and the one's before (fast.go).
	taken, fall *block
	// runs are the TNT runs from the block (tntrun.go), a list.
	runs *tntRun
	n    uint8 // instructions
	mode Mode
	// class is the last instruction's (none for no instruction).
	class x86insn.Class
	// lastLen and lastOff are the last instruction's length and offset
	// from ip (a block spans less than 64 KiB).
	lastLen uint8
	lastOff uint16
	// stop is why decoding stopped after the last instruction: an
	// index in blockErrs.
	stop uint8
	// A block is a cache line (its chunk is aligned: blockChunk), where
	// 56-byte blocks straddled two 7 times in 8: the kernel's reads of
	// one (its IP, then its class and the rest) two misses.
	_ [8]byte
}

// count returns the number of the block's instructions.
func (b *block) count() int { return int(b.n) }

// last returns the block's last instruction (n > 0).
func (b *block) last() insn {
	return insn{ip: b.ip + uint64(b.lastOff), target: b.target, len: b.lastLen, class: b.class}
}

// at returns the block's instruction i, located at ip.
func (b *block) at(i int, ip uint64) insn {
	if i == int(b.n)-1 {
		return b.last()
	}
	return insn{ip: ip, len: b.lens[i]}
}

// blockErrs are a block's errors (block.err), by block.stop.
var blockErrs = [...]error{nil, stopNoMap: ErrNoMap, stopBadInsn: ErrBadInsn}

const (
	stopNoMap = 1 + iota
	stopBadInsn
)

// err is the error decoding stopped at after the last instruction (an
// undecodable or unmapped instruction), or nil.
func (b *block) err() error { return blockErrs[b.stop] }

// blockCache maps an address and mode to its block, so that a hot loop
// costs a lookup per block instead of decoding: an open-addressing table
// (linear probing, a multiplicative hash of the address) over blocks in
// chunks and instruction lengths from a slab, so that neither a lookup nor
// a miss allocates per block.
type blockCache struct {
	// slots are the table, a power of two long, at most half full: 0
	// for none, else a block's hash tag and index (tableSlot). No
	// pointer: the collector does not scan the table, an insert has no
	// write barrier, and a slot is half an IP and a pointer.
	slots []uint64
	n     int // blocks held: the next block's index
	gen   uint64
	insns int // instructions held, plus one per block
	// drops counts drops: a Memory may change (and drop the cache) while
	// a block is read from it.
	drops uint64

	// chunks hold the blocks by index, blockChunk each: a table slot's
	// block is a load of its chunk (a small array, in the L1 cache) and
	// of the block.
	chunks []*[blockChunk]block
	cur    *[blockChunk]block // the last chunk, next's
	// pinned is set while the fast path runs: its batch refers to runs'
	// edges by words the collector does not see (edgeRef), and the
	// kernel may go on from blocks a drop forgot. A drop then keeps the
	// chunks it forgets in old (their blocks hold the runs, which hold
	// the edges) until unpin.
	pinned bool
	old    [][]*[blockChunk]block
	// free are a closed decoder's chunks, zeroed, taken before a new
	// one is made (spare.go).
	free []*[blockChunk]block
	lens slab[uint8] // the next blocks' instruction lengths

	// vi is the views entry of the last block's mapping: the next block
	// is often in the same mapping, above or below. An index, not the
	// bytes: keeping it costs the common path no write barrier.
	vi uint32
	// views keeps the Viewer's mappings by page of the address they were
	// asked for: a block in another mapping than the last block's is
	// found without a View (a binary search over the mappings, a few
	// mispredicted branches). Allocated on the first View, dropped with
	// the blocks.
	views []viewRef
	runs  runCache
}

// A table slot holds the high 32 bits of the block's hash (hash; its
// index in the table is their low bits, so that the table grows without a
// look at the blocks) above the block's index plus one: a probe past
// another block compares the tags in the slots, not the IP in the block,
// which is a cache miss more; equal tags (a probe past a block with the
// same home slot in 2^(32-b), b the table's bits: a million at first)
// cost a look at the block.
func tableSlot(h uint64, k int) uint64 { return h>>32<<32 | uint64(k+1) }

// viewRef is a views entry: the Viewer's bytes of a mapping, from pc on.
type viewRef struct {
	pc uint64
	v  []byte
}

// numViews is the size of blockCache.views (32 bytes an entry).
const numViews = 1 << 8

// Chunk, slab (first and largest chunk) and table sizes: a first decode
// allocates little, a long one a few large pieces. The table starts at
// 32 KiB: growing it (a new table and every block put again) cost a short
// trace's cold pass more than clearing it. A block chunk is 32 KiB: the
// collector's large object, page-aligned with no header before it (a
// smaller one with pointers has 8 bytes of header), so that each block is
// a line.
const (
	minSlots   = 1 << 12
	blockChunk = 1 << 9
	lenSlabLo  = 1 << 11
	lenSlab    = 1 << 14
)

// init makes the table, unless the cache has a closed decoder's (spare.go).
func (c *blockCache) init() {
	if c.slots == nil {
		c.slots = make([]uint64, minSlots)
	}
}

// check drops the cache when the memory's generation changed.
func (c *blockCache) check(gen uint64) {
	if gen != c.gen {
		c.drop()
		c.gen = gen
	}
}

// drop forgets every block; the table keeps its size, the chunks and
// slabs are left to the collector (a block in use stays valid).
func (c *blockCache) drop() {
	clear(c.slots)
	c.n, c.insns = 0, 0
	if c.pinned {
		// Only lists with chunks: a Handler may drop the cache in
		// every call while the kernel goes on in the old blocks,
		// decoding none.
		if len(c.chunks) > 0 {
			c.old = append(c.old, c.chunks)
			c.chunks = nil
		}
	} else {
		clear(c.chunks)
		c.chunks = c.chunks[:0]
	}
	c.cur = nil
	c.lens.drop()
	clear(c.views)
	c.runs.drop()
	c.drops++
}

// unpin lets the collector have the chunks drops forgot while pinned,
// when no batch entry or kernel state can refer to them.
func (c *blockCache) unpin() {
	clear(c.old)
	c.old = c.old[:0]
}

func (c *blockCache) hash(ip uint64, mode Mode) uint64 {
	return (ip ^ uint64(mode)<<62) * 0x9e3779b97f4a7c15
}

// at returns the block of a table slot.
func (c *blockCache) at(s uint64) *block {
	k := uint32(s) - 1
	return &c.chunks[k/blockChunk][k%blockChunk]
}

// lookup returns the block at ip in mode, whose hash is h, or nil and the
// empty slot where the probe ended: insert puts the block there unless the
// table changed. The caller hashes once for the lookup and the insert.
func (c *blockCache) lookup(h, ip uint64, mode Mode) (*block, uint64) {
	mask := uint64(len(c.slots) - 1)
	tag := h >> 32 << 32
	for i := h >> 32 & mask; ; i = (i + 1) & mask {
		s := c.slots[i]
		if s == 0 {
			return nil, i
		}
		if s&^(1<<32-1) == tag {
			if b := c.at(s); b.ip == ip && b.mode == mode {
				return b, i
			}
		}
	}
}

// next returns the block the next insert holds, at ip in mode, with room
// for its lengths: the block decodes into it in place, each field written
// once into the zeroed chunk (a whole block written at once is copied
// with a bulk write barrier while the GC marks).
func (c *blockCache) next(ip uint64, mode Mode) *block {
	k := uint(c.n) % blockChunk
	if k == 0 || len(c.lens.chunk)-c.lens.off < maxBlock {
		c.refill(k)
	}
	b := &c.cur[k]
	b.lens, b.ip, b.mode = (*[maxBlock]uint8)(c.lens.chunk[c.lens.off:]), ip, mode
	return b
}

// refill is next's rare work: a new block chunk for block k of it (a
// free one, zero, else a new one) unless a next with no insert after it
// started it already, room for the lengths. It is a call on next's rare
// path: the spills around it stay there (next's common path has none).
func (c *blockCache) refill(k uint) {
	if k == 0 && len(c.chunks) == c.n/blockChunk {
		if n := len(c.free) - 1; n >= 0 {
			c.cur, c.free = c.free[n], c.free[:n]
		} else {
			c.cur = new([blockChunk]block)
		}
		c.chunks = append(c.chunks, c.cur)
	}
	c.lens.room(maxBlock, lenSlabLo, lenSlab)
}

// insert holds b, the block next returned last (its n lengths taken from
// the slab), at slot i, where its lookup ended in the table as it is,
// growing the table first to keep it at most half full; h is its hash.
func (c *blockCache) insert(i, h uint64, b *block) {
	s := tableSlot(h, c.n)
	if 2*(c.n+1) > len(c.slots) {
		old := c.slots
		c.slots = make([]uint64, 2*len(old))
		for _, o := range old {
			if o != 0 {
				c.put(o)
			}
		}
		c.put(s)
	} else {
		c.slots[i] = s
	}
	c.n++
	c.insns += int(b.n) + 1
	c.lens.used(int(b.n))
}

// put adds slot s to the table (not held yet, with room): where its tag
// says, no block read.
func (c *blockCache) put(s uint64) {
	mask := uint64(len(c.slots) - 1)
	i := s >> 32 & mask
	for c.slots[i] != 0 {
		i = (i + 1) & mask
	}
	c.slots[i] = s
}

// viewHit returns the Viewer's bytes at pc, at least MaxLen of them, from
// the last block's mapping or the views by page, or nil.
func (c *blockCache) viewHit(pc uint64) []byte {
	if c.views == nil {
		return nil
	}
	r := &c.views[c.vi%numViews]
	if off := pc - r.pc; off < uint64(len(r.v)) && uint64(len(r.v))-off >= x86insn.MaxLen {
		return r.v[off:]
	}
	k := pc >> 12 % numViews
	r = &c.views[k]
	if off := pc - r.pc; off < uint64(len(r.v)) && uint64(len(r.v))-off >= x86insn.MaxLen {
		c.vi = uint32(k)
		return r.v[off:]
	}
	return nil
}

// viewAt returns the Viewer's bytes at pc (none and no error without a
// Viewer) and keeps their mapping as the view for the next blocks, unless
// the Memory changed under the View (the bytes may be the old ones).
func (d *Decoder) viewAt(pc uint64) ([]byte, error) {
	if d.view == nil {
		return nil, nil
	}
	c := &d.cache
	if c.views == nil {
		c.views = make([]viewRef, numViews)
	}
	if v := c.viewHit(pc); v != nil {
		return v, nil
	}
	drops := c.drops
	base, v, err := d.view.View(pc)
	if err != nil {
		return nil, err
	}
	if c.drops == drops {
		k := pc >> 12 % numViews
		c.views[k] = viewRef{base, v}
		c.vi = uint32(k)
	}
	return v[pc-base:], nil
}

// known returns the block at ip in mode when the cache holds it, else nil:
// it reads no memory.
func (c *blockCache) known(ip uint64, mode Mode) *block {
	b, _ := c.lookup(c.hash(ip, mode), ip, mode)
	return b
}

// block returns the block at ip in mode, decoding it on a miss.
func (d *Decoder) block(ip uint64, mode Mode) *block {
	c := &d.cache
	h := c.hash(ip, mode)
	b, slot := c.lookup(h, ip, mode)
	if b != nil {
		return b
	}
	if c.insns >= maxCached {
		c.drop()
		_, slot = c.lookup(h, ip, mode)
	}
	b = c.next(ip, mode)
	if mode == Mode64 {
		// The common case at once: 64-bit code in place in a view
		// kept, up to the branch in one Run, with no call of the
		// Memory (nothing can drop the cache). A Run that ends
		// before a branch (64 instructions, within MaxLen of the
		// view's end, an undecodable instruction: rare) is done
		// again from ip by decodeBlock, which goes on from there;
		// the chunk's block is zeroed, so stop is already 0.
		if v := c.viewHit(ip); v != nil {
			n, end, in, err := x86insn.Run(v, ip, b.lens[:])
			if err == nil && in.Class != x86insn.NotBranch {
				b.n, b.class, b.lastLen, b.lastOff, b.target = uint8(n), in.Class, uint8(in.Len), uint16(end-in.Len), in.Target
				c.insert(slot, h, b)
				return b
			}
		}
	}
	for range 3 {
		drops := c.drops
		d.decodeBlock(b)
		if c.drops == drops {
			c.insert(slot, h, b)
			return b
		}
		// The Memory changed under the decode (a side band applied
		// when a read missed): the bytes read may be the old ones;
		// the table was emptied (b is in a chunk it dropped).
		_, slot = c.lookup(h, ip, mode)
		b = c.next(ip, mode)
	}
	// Still changing: the block is not known, and not kept.
	return &block{ip: ip, mode: mode, stop: stopNoMap}
}

// decodeBlock decodes block b from next (its ip, mode and lengths' room)
// from the view, a read or x86asm: the instructions' lengths, how many,
// the last one's class, offset, length and target, and why decoding
// stopped after it.
func (d *Decoder) decodeBlock(b *block) {
	ip := b.ip
	n, last, lastIP, stop := d.decodeInsns(b.lens[:], ip, b.mode)
	b.n, b.stop = uint8(n), stop
	if n > 0 {
		b.class, b.lastLen, b.lastOff, b.target = last.Class, uint8(last.Len), uint16(lastIP-ip), last.Target
	}
}

// decodeInsns decodes the block at ip in mode from the view, a read or
// x86asm, a Run or an instruction at a time: the instructions' lengths into
// lens (maxBlock long), how many, the last one and where it is, and why
// decoding stopped after it.
func (d *Decoder) decodeInsns(lens []uint8, ip uint64, mode Mode) (n int, last x86insn.Flow, lastIP uint64, stop uint8) {
	pc := ip
	bits := mode.bits()
	for n < maxBlock {
		// The instructions' bytes: in place in the Viewer's bytes, kept
		// from block to block, but within MaxLen of their end, where
		// ReadAt goes on into an adjacent mapping.
		var code, view []byte
		if v, err := d.viewAt(pc); len(v) >= x86insn.MaxLen {
			view = v
		} else if err != nil { // no byte known at pc
			return n, last, lastIP, stopNoMap
		} else {
			k, _ := d.mem.ReadAt(d.buf[:], pc)
			if k <= 0 {
				return n, last, lastIP, stopNoMap
			}
			code = d.buf[:k]
		}
		if code == nil && bits == 64 {
			// 64-bit code in place: the length decoder's tables
			// alone (no text, no allocation, lengths x86asm
			// misreads), the instructions up to the branch at once.
			k, end, in, err := x86insn.Run(view, pc, lens[n:])
			if k > 0 {
				last, pc, n = in, pc+uint64(end), n+k
				lastIP = pc - uint64(in.Len)
				if in.Class != x86insn.NotBranch {
					return n, last, lastIP, 0
				}
			}
			if err != nil {
				return n, last, lastIP, stopBadInsn
			}
			continue
		}
		if code == nil {
			code = view[:x86insn.MaxLen]
		}
		// One instruction: near the end of the bytes (Step), or
		// 16/32-bit code (x86asm's).
		var in x86insn.Flow
		var err error
		if bits == 64 {
			in, err = x86insn.Step(code, pc)
		} else {
			var x x86insn.Inst
			x, err = x86insn.DecodeMode(code, pc, bits)
			in = x.Flow
		}
		if err != nil {
			return n, last, lastIP, stopBadInsn
		}
		lens[n], last, lastIP = uint8(in.Len), in, pc
		n++
		if in.Class != x86insn.NotBranch {
			break
		}
		pc += uint64(in.Len)
	}
	return n, last, lastIP, 0
}
