package x86insn

import "encoding/binary"

// The quick path of Step: nearly all compiled code (99% of the
// instructions a cold decode of mruby meets) is an opcode of the 1-byte or
// 0F map behind at most a REX. For those, one table entry per opcode (by
// REX.W) gives what the general scan works out through the prefix loop and
// the kind tables: whether a ModRM follows, the immediate's size and the
// class. The entries are built from those same tables at init, and an
// opcode whose shape depends on more (a legacy prefix, an escape, a group
// member that is invalid, xbegin, a class by operand) is marked slow: Step
// takes the general scan for it.

// quickEntry packs an opcode's shape: the immediate's size, flags, and the
// class in the high byte.
type quickEntry uint16

const (
	qImm     quickEntry = 0x0f // immediate (or relative displacement) size
	qModRM   quickEntry = 1 << 4
	qSlow    quickEntry = 1 << 5  // the general scan's
	qEscape  quickEntry = 1 << 6  // 0F: the entry is quick0F's
	qByModRM quickEntry = 1 << 7  // immediate and class by ModRM (byModRM)
	qEnd     quickEntry = 1 << 15 // quickRun's: the lengths or the bytes ended
)

// quickTables are the quick path's tables, in one object that quickRun
// addresses from one register (a table of its own is a global whose
// address the compiler makes again at each use: five instructions an
// instruction decoded).
type quickTables struct {
	// quick1 is the entry of each 1-byte opcode, by REX.W: index
	// REX.W<<8 | opcode.
	quick1 [2 * 256]quickEntry
	// rexOf is, by an instruction's first byte, for a REX: 8 (the
	// opcode's offset in bits) | REX.W<<8 (quick1's row); else 0.
	rexOf [256]uint16
	// modrmLen is the size of a ModRM byte with its SIB and
	// displacement, by the base field of the byte after the ModRM (a
	// SIB's: base 5 takes a displacement where mod is 0) and the ModRM
	// byte: index base<<8 | ModRM.
	modrmLen [8 * 256]uint8
	// quick0F is the entry of each 0F opcode (REX.W changes none of
	// them).
	quick0F [256]quickEntry
	// byModRM is, for the group opcodes whose immediate or class depend
	// on the ModRM byte (F6, F7, C7, FF), the entry by ModRM: its
	// immediate size, class and slow flag (xbegin, invalid members).
	byModRM [4][256]quickEntry
}

// qt are the quick path's tables, made at init.
var qt = new(quickTables)

// byModRMOps are the opcodes of byModRM's tables, in order.
var byModRMOps = [len(qt.byModRM)]byte{0xf6, 0xf7, 0xc7, 0xff}

func init() {
	for b := 0x40; b < 0x50; b++ {
		qt.rexOf[b] = 8 | uint16(b>>3&1)<<8
	}
	for base := range 8 {
		for m := range 256 {
			qt.modrmLen[base<<8|m] = uint8(modrmSize(byte(m), byte(base)))
		}
	}
	entry := func(kind uint8, pfx uint16, class Class) quickEntry {
		if kind == opInvalid || kind == opPrefix || kindModRM[kind] == modrmReg || class == byOperand {
			return qSlow
		}
		e := quickEntry(immLens[kind][immSel(pfx)]) | quickEntry(class)<<8
		if kindModRM[kind] == modrmMem {
			e |= qModRM
		}
		return e
	}
	for op := range 256 {
		for w, pfx := range [2]uint16{0, pfxRex | pfxRexW} {
			e := entry(oneByte[op], pfx, classes[map1Byte][op])
			switch op {
			case 0x0f:
				e = qEscape
			case 0xfe, 0x8f:
				e = qSlow // members invalid by ModRM; 8F may be XOP
			}
			qt.quick1[w<<8|op] = e
		}
		qt.quick0F[op] = entry(twoByte[op], 0, classes[map0F][op])
	}
	// The group opcodes by ModRM, as the general scan shapes them
	// (SIB and displacement bytes are zero: only the immediate's size
	// and the class are taken).
	for k, op := range byModRMOps {
		qt.quick1[op], qt.quick1[1<<8|int(op)] = qModRM|qByModRM|quickEntry(k), qModRM|qByModRM|quickEntry(k)
		for m := range 256 {
			var code [MaxLen]byte
			code[0], code[1] = op, byte(m)
			var s shape
			if err := s.scan(code[:]); err != nil || s.rel {
				qt.byModRM[k][m] = qSlow
				continue
			}
			qt.byModRM[k][m] = qModRM | quickEntry(s.immLen) | quickEntry(s.class)<<8
		}
	}
}

// Run decodes the 64-bit instructions from the start of code, located at
// pc, one after another as Step does, their lengths into lens: up to and
// including the first that is not NotBranch, at most len(lens) of them,
// and only while MaxLen bytes are left in code (an instruction nearer its
// end may go on in bytes that code does not hold: Step is for those). It
// returns how many it decoded, the offset after them and the last one's
// Flow; err is the error of the instruction after them, which ends the
// run. A block decoder calls it once where Step would be called per
// instruction.
func Run(code []byte, pc uint64, lens []uint8) (n, end int, last Flow, err error) {
	n, off, e, i := quickRun(code, 0, lens, 0)
	if e&(qEnd|qSlow) != 0 {
		return runSlow(code, pc, lens, n, off, e, i)
	}
	// The common case: plain instructions up to a branch of the tables.
	in := tableBranch(code[off:], pc+uint64(off), e, i)
	lens[n] = uint8(in.Len)
	return n + 1, off + in.Len, in, nil
}

// runSlow is Run past the general scan's instructions, from quickRun's
// result (n, off, e, i).
func runSlow(code []byte, pc uint64, lens []uint8, n, off int, e quickEntry, i int) (int, int, Flow, error) {
	fellN := -1
	var fell Flow // the general scan's last fall-through: xbegin has a target
	for {
		switch {
		case e&qEnd != 0:
			return n, off, prior(lens, n, fell, fellN), nil
		case e&qSlow != 0:
			in, err := stepScan(code[off:], pc+uint64(off))
			if err != nil {
				return n, off, prior(lens, n, fell, fellN), err
			}
			lens[n] = uint8(in.Len)
			if n++; in.Class != NotBranch {
				return n, off + in.Len, in, nil
			}
			off += in.Len
			fell, fellN = in, n-1
		default:
			in := tableBranch(code[off:], pc+uint64(off), e, i)
			lens[n] = uint8(in.Len)
			return n + 1, off + in.Len, in, nil
		}
		n, off, e, i = quickRun(code, off, lens, n)
	}
}

// tableBranch is the Flow of the branch of the tables at the start of
// code, located at pc: e its entry, i its immediate's offset (MaxLen bytes
// follow the instruction's start: its immediate's four bytes are read
// whatever its size). The relative branches (CondJump to Call) take a rel8
// or rel32 (rel16 needs 66); their target and width are chosen by
// conditional moves, not branches: the kinds of the branches that end
// blocks mix too much to predict.
func tableBranch(code []byte, pc uint64, e quickEntry, i int) Flow {
	imm := int(e & qImm)
	in := Flow{Len: i + imm, Class: Class(e >> 8)}
	rel32 := binary.LittleEndian.Uint32(code[i : i+4])
	rel := uint64(int64(int8(rel32)))
	if imm == 4 {
		rel = uint64(int64(int32(rel32)))
	}
	if in.Class-CondJump <= Call-CondJump {
		in.RelWidth = imm
		in.Target = pc + uint64(in.Len) + rel
	}
	return in
}

// quickRun is Run's loop over the instructions of the tables that fall
// through, their lengths into lens from n on: few values live across
// them. It returns the count and offset where it stopped, at an
// instruction that is not one of them (its entry e: a branch, i its
// immediate's offset; or qSlow) or where the lengths or the bytes ended
// (qEnd).
//
// An instruction is one 8-byte load of its first bytes (a REX, a 0F, the
// opcode, ModRM and SIB take at most 5), the REX table's entry of the
// first, then two table loads side by side, the opcode's entry and its
// ModRM's size, indexed from the bytes shifted past the REX. The chain
// from one instruction's offset to the next's is three dependent loads
// where a byte at a time it was five (the first byte, the REX table, the
// opcode, its entry, the ModRM's size), and fewer instructions: the REX
// found by arithmetic instead of rexOf took more (cachegrind: +5% on
// mruby's blocks) and was slower.
func quickRun(code []byte, off int, lens []uint8, n int) (int, int, quickEntry, int) {
	t := qt
	_ = t.quick1[0] // its nil check here, not in the loop
	for end := len(code) - MaxLen; n < len(lens) && off <= end; n++ {
		w := binary.LittleEndian.Uint64(code[off:])
		// Past a REX (a shift, not an if: the compiler makes that
		// a branch, which cachegrind's model mispredicts on 45% of
		// mruby's instructions), its W the opcode's row.
		r := uint64(t.rexOf[uint8(w)])
		x := w >> (r & 63) // from the opcode on (a shift's count: no mask)
		op := uint64(uint8(x)) | r&0x100
		mb := x >> 8 // the bytes after the opcode
		e := t.quick1[op&(2*256-1)]
		i := int(r >> 3 & 1)
		if e&qEscape != 0 {
			i++
			e = t.quick0F[uint8(mb)]
			mb >>= 8
		}
		if e&qByModRM != 0 {
			e = t.byModRM[e&3][uint8(mb)]
		}
		// The ModRM's size, loaded beside the entry, counts when the
		// entry takes one.
		m := int(t.modrmLen[mb&(8*256-1)]) & -int(e>>4&1)
		i += 1 + m // past the opcode and ModRM
		size := i + int(e&qImm)
		if e&(qSlow|0xff00) != 0 {
			return n, off, e, i
		}
		lens[n] = uint8(size)
		off += size
	}
	return n, off, qEnd, 0
}

// prior is the Flow of the last of n instructions, which fell through:
// fell when the general scan decoded it (instruction fellN).
func prior(lens []uint8, n int, fell Flow, fellN int) Flow {
	switch {
	case n == 0:
		return Flow{}
	case fellN == n-1:
		return fell
	}
	return Flow{Len: int(lens[n-1])}
}
