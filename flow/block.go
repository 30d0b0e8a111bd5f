package flow

import "ptfs/x86insn"

// maxBlock bounds the instructions of one cached block.
const maxBlock = 64

// maxCached bounds the instructions the cache holds (24 bytes each); it is
// dropped whole when full.
const maxCached = 1 << 20

// insn is one decoded instruction of a block.
type insn struct {
	ip     uint64
	target uint64
	len    uint8
	class  x86insn.Class
}

// block is a run of instructions from its first up to and including the
// first that is not a plain fall-through (a branch or ptwrite), at most
// maxBlock long; err is set when decoding stopped at an undecodable or
// unmapped instruction after the last one.
type block struct {
	insns []insn
	err   error
}

type blockKey struct {
	ip   uint64
	mode Mode
}

// blockCache maps an address and mode to its block, so that a hot loop
// costs a map lookup per block instead of decoding.
type blockCache struct {
	m     map[blockKey]*block
	gen   uint64
	insns int // instructions held
}

func (c *blockCache) init() { c.m = make(map[blockKey]*block) }

// check drops the cache when the memory's generation changed.
func (c *blockCache) check(gen uint64) {
	if gen != c.gen {
		clear(c.m)
		c.gen, c.insns = gen, 0
	}
}

// block returns the block at ip in mode, decoding it on a miss.
func (d *Decoder) block(ip uint64, mode Mode) *block {
	k := blockKey{ip, mode}
	if b, ok := d.cache.m[k]; ok {
		return b
	}
	if d.cache.insns >= maxCached {
		clear(d.cache.m)
		d.cache.insns = 0
	}
	b := &block{}
	pc := ip
	for len(b.insns) < maxBlock {
		n, _ := d.mem.ReadAt(d.buf[:], pc)
		if n <= 0 {
			b.err = ErrNoMap
			break
		}
		// 64-bit code takes the length decoder's tables alone (no text,
		// no allocation, lengths x86asm misreads); 16/32-bit is x86asm's.
		var in x86insn.Inst
		var err error
		if bits := mode.bits(); bits == 64 {
			in, err = x86insn.Step(d.buf[:n], pc)
		} else {
			in, err = x86insn.DecodeMode(d.buf[:n], pc, bits)
		}
		if err != nil {
			b.err = ErrBadInsn
			break
		}
		b.insns = append(b.insns, insn{ip: pc, target: in.Target, len: uint8(in.Len), class: in.Class})
		if in.Class != x86insn.NotBranch {
			break
		}
		pc += uint64(in.Len)
	}
	d.cache.m[k] = b
	d.cache.insns += len(b.insns) + 1
	return b
}
