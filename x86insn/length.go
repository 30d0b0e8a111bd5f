package x86insn

import (
	"errors"
	"fmt"
)

// Errors of the length decoder, for errors.Is.
var (
	// ErrTruncated: the bytes end inside the instruction.
	ErrTruncated = errors.New("truncated instruction")
	// ErrInvalid: the encoding is undefined or invalid in 64-bit mode.
	ErrInvalid = errors.New("invalid instruction")
	// ErrTooLong: the instruction would be longer than MaxLen bytes.
	ErrTooLong = errors.New("instruction longer than 15 bytes")
)

// encoding says how an instruction's opcode is encoded.
type encoding uint8

// Encodings.
const (
	// legacy is an opcode in the 1-byte, 0F, 0F38 or 0F3A map behind
	// optional legacy prefixes and REX.
	legacy encoding = iota
	vex             // C4/C5-prefixed (AVX)
	evex            // 62-prefixed (AVX-512, AVX10)
	xop             // 8F-prefixed (AMD XOP)
)

// encodingNames are the placeholder texts of instructions that only the
// length decoder knows.
var encodingNames = [...]string{legacy: "(unknown)", vex: "(vex)", evex: "(evex)", xop: "(xop)"}

// Opcode maps: the 1-byte map and the legacy escapes' maps share numbers
// with the VEX/EVEX map field (0F = 1, 0F38 = 2, 0F3A = 3).
const (
	map1Byte = 0
	map0F    = 1
	map0F38  = 2
	map0F3A  = 3
	map3DNow = 4 // 0F 0F: ModRM, then an imm8 that names the operation
)

// Operand kinds after the opcode, one per opcode of a map.
const (
	opInvalid   uint8 = iota // undefined or invalid in 64-bit mode
	opNone                   // no ModRM, no immediate
	opModRM                  // ModRM (+SIB, displacement)
	opModRMReg               // ModRM whose mod is ignored: always a register (mov cr/dr)
	opModRMI8                // ModRM and imm8
	opModRMIz                // ModRM and imm16/32 (66 gives 16)
	opGroup3I8               // F6: ModRM, with an imm8 for /0 and /1 only
	opGroup3Iz               // F7: ModRM, with an imm16/32 for /0 and /1 only
	opI8                     // imm8 or rel8
	opI16                    // imm16 (ret, lret)
	opIz                     // imm16/32 (66 gives 16)
	opRel32                  // rel32, kept even under 66 (Intel 64; AMD would use rel16)
	opIv                     // imm16/32/64: B8+r mov (REX.W gives 64, else 66 gives 16)
	opMoffs                  // 8-byte offset, 4 with 67
	opEnter                  // imm16, imm8
	opModRMI8I8              // ModRM, imm8, imm8 (extrq, insertq)
	opModRMI32               // ModRM and imm32 whatever the prefixes (XOP map 10)
	opImm64                  // imm64 whatever the prefixes (jmpabs)
	opPrefix                 // a legacy prefix, REX, REX2, or an escape to another map
	numKinds
)

// oneByte is the 1-byte opcode map in 64-bit mode, row by row.
var oneByte = [256]uint8{
	// 00-0F: alu ops; 06 07 0E (push/pop es/cs) invalid; 0F escape.
	opModRM, opModRM, opModRM, opModRM, opI8, opIz, opInvalid, opInvalid,
	opModRM, opModRM, opModRM, opModRM, opI8, opIz, opInvalid, opPrefix,
	// 10-1F: adc, sbb; push/pop ss/ds invalid.
	opModRM, opModRM, opModRM, opModRM, opI8, opIz, opInvalid, opInvalid,
	opModRM, opModRM, opModRM, opModRM, opI8, opIz, opInvalid, opInvalid,
	// 20-2F: and, sub; 26 2E segment prefixes, 27 2F (daa, das) invalid.
	opModRM, opModRM, opModRM, opModRM, opI8, opIz, opPrefix, opInvalid,
	opModRM, opModRM, opModRM, opModRM, opI8, opIz, opPrefix, opInvalid,
	// 30-3F: xor, cmp; 36 3E segment prefixes, 37 3F (aaa, aas) invalid.
	opModRM, opModRM, opModRM, opModRM, opI8, opIz, opPrefix, opInvalid,
	opModRM, opModRM, opModRM, opModRM, opI8, opIz, opPrefix, opInvalid,
	// 40-4F: REX.
	opPrefix, opPrefix, opPrefix, opPrefix, opPrefix, opPrefix, opPrefix, opPrefix,
	opPrefix, opPrefix, opPrefix, opPrefix, opPrefix, opPrefix, opPrefix, opPrefix,
	// 50-5F: push, pop.
	opNone, opNone, opNone, opNone, opNone, opNone, opNone, opNone,
	opNone, opNone, opNone, opNone, opNone, opNone, opNone, opNone,
	// 60-6F: pusha, popa invalid; 62 EVEX; 63 movsxd; 64-67 prefixes;
	// push imm, imul imm, ins/outs.
	opInvalid, opInvalid, opPrefix, opModRM, opPrefix, opPrefix, opPrefix, opPrefix,
	opIz, opModRMIz, opI8, opModRMI8, opNone, opNone, opNone, opNone,
	// 70-7F: jcc rel8.
	opI8, opI8, opI8, opI8, opI8, opI8, opI8, opI8,
	opI8, opI8, opI8, opI8, opI8, opI8, opI8, opI8,
	// 80-8F: group 1 (82 invalid), test, xchg, mov, lea, mov sreg, 8F pop
	// r/m or XOP.
	opModRMI8, opModRMIz, opInvalid, opModRMI8, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opPrefix,
	// 90-9F: xchg, cbw, cwd, 9A (far call) invalid, fwait, pushf, popf,
	// sahf, lahf.
	opNone, opNone, opNone, opNone, opNone, opNone, opNone, opNone,
	opNone, opNone, opInvalid, opNone, opNone, opNone, opNone, opNone,
	// A0-AF: mov moffs, string ops, test imm.
	opMoffs, opMoffs, opMoffs, opMoffs, opNone, opNone, opNone, opNone,
	opI8, opIz, opNone, opNone, opNone, opNone, opNone, opNone,
	// B0-BF: mov imm8, mov imm16/32/64.
	opI8, opI8, opI8, opI8, opI8, opI8, opI8, opI8,
	opIv, opIv, opIv, opIv, opIv, opIv, opIv, opIv,
	// C0-CF: shifts imm8, ret imm16, ret, C4 C5 VEX, mov imm (C6 F8
	// xabort, C7 F8 xbegin fit), enter, leave, lret, int3, int, CE (into)
	// invalid, iret.
	opModRMI8, opModRMI8, opI16, opNone, opPrefix, opPrefix, opModRMI8, opModRMIz,
	opEnter, opNone, opI16, opNone, opNone, opI8, opInvalid, opNone,
	// D0-DF: shifts, D4 D6 (aam, salc) invalid, D5 REX2 (aad in 32-bit
	// code), xlat, x87.
	opModRM, opModRM, opModRM, opModRM, opInvalid, opPrefix, opInvalid, opNone,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	// E0-EF: loop*, jrcxz, in/out imm8, call, jmp rel32, EA (far jmp)
	// invalid, jmp rel8, in/out dx.
	opI8, opI8, opI8, opI8, opI8, opI8, opI8, opI8,
	opRel32, opRel32, opInvalid, opI8, opNone, opNone, opNone, opNone,
	// F0-FF: lock, int1, rep prefixes, hlt, cmc, group 3, flag ops,
	// groups 4 and 5.
	opPrefix, opNone, opPrefix, opPrefix, opNone, opNone, opGroup3I8, opGroup3Iz,
	opNone, opNone, opNone, opNone, opNone, opNone, opModRM, opModRM,
}

// twoByte is the 0F map (legacy or VEX/EVEX map 1: the VEX forms keep
// these shapes, see vexOps). Undefined opcodes are invalid.
var twoByte = [256]uint8{
	// 00-0F: groups 6, 7, lar, lsl, 04 invalid, syscall, clts, sysret,
	// invd, wbinvd, 0A invalid, ud2, 0C invalid, prefetch, femms, 3DNow!.
	opModRM, opModRM, opModRM, opModRM, opInvalid, opNone, opNone, opNone,
	opNone, opNone, opInvalid, opNone, opInvalid, opModRM, opNone, opPrefix,
	// 10-1F: SSE moves, hint nops (endbr, nop r/m).
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	// 20-2F: mov cr/dr, 24-27 invalid, SSE.
	opModRMReg, opModRMReg, opModRMReg, opModRMReg, opInvalid, opInvalid, opInvalid, opInvalid,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	// 30-3F: wrmsr, rdtsc, rdmsr, rdpmc, sysenter, sysexit, 36 invalid,
	// getsec, 38 and 3A escapes, the rest invalid.
	opNone, opNone, opNone, opNone, opNone, opNone, opInvalid, opNone,
	opPrefix, opInvalid, opPrefix, opInvalid, opInvalid, opInvalid, opInvalid, opInvalid,
	// 40-4F: cmovcc.
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	// 50-6F: SSE.
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	// 70-7F: pshuf imm8, shift groups imm8, pcmpeq, emms, vmread (66/F2:
	// extrq/insertq, see length), vmwrite, 7A 7B invalid, SSE.
	opModRMI8, opModRMI8, opModRMI8, opModRMI8, opModRM, opModRM, opModRM, opNone,
	opModRM, opModRM, opInvalid, opInvalid, opModRM, opModRM, opModRM, opModRM,
	// 80-8F: jcc rel32.
	opRel32, opRel32, opRel32, opRel32, opRel32, opRel32, opRel32, opRel32,
	opRel32, opRel32, opRel32, opRel32, opRel32, opRel32, opRel32, opRel32,
	// 90-9F: setcc.
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	// A0-AF: push/pop fs, cpuid, bt, shld, A6 A7 invalid, push/pop gs,
	// rsm, bts, shrd, group 15, imul.
	opNone, opNone, opNone, opModRM, opModRMI8, opModRM, opInvalid, opInvalid,
	opNone, opNone, opNone, opModRM, opModRMI8, opModRM, opModRM, opModRM,
	// B0-BF: cmpxchg, lss, btr, lfs, lgs, movzx, popcnt, ud1, group 8
	// imm8, btc, bsf, bsr, movsx.
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRMI8, opModRM, opModRM, opModRM, opModRM, opModRM,
	// C0-CF: xadd, cmpps imm8, movnti, pinsrw/pextrw/shufps imm8, group 9,
	// bswap.
	opModRM, opModRM, opModRMI8, opModRM, opModRMI8, opModRMI8, opModRMI8, opModRM,
	opNone, opNone, opNone, opNone, opNone, opNone, opNone, opNone,
	// D0-FF: SSE; FF is ud0 with a ModRM.
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
	opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM, opModRM,
}

// prefix flags met while scanning.
const (
	pfx66   = 1 << iota // operand size
	pfx67               // address size
	pfxF2               // repne / mandatory F2
	pfxF3               // rep / mandatory F3
	pfxRexW             // REX.W directly before the opcode
	pfxRexB             // REX.B directly before the opcode
	pfxRex              // any REX directly before the opcode
	pfxLock             // F0
	pfxRex2             // an APX REX2 (D5) before the opcode
	pfxSeg              // a segment prefix (it changes no length)
)

// prefixes tells, per byte, how a legacy prefix or REX changes the prefix
// flags (flags = flags&^clear | set); set is 0 for every other byte. A REX
// counts only directly before the opcode: a legacy prefix or another REX
// after it drops it. Of F2 and F3 the last counts.
var prefixes = func() (t [256]struct{ clear, set uint16 }) {
	const rex = pfxRex | pfxRexW | pfxRexB
	for _, p := range []struct {
		b          byte
		clear, set uint16
	}{
		{0x66, 0, pfx66}, {0x67, 0, pfx67}, {0xf2, pfxF3, pfxF2}, {0xf3, pfxF2, pfxF3}, {0xf0, 0, pfxLock},
		{0x26, 0, pfxSeg}, {0x2e, 0, pfxSeg}, {0x36, 0, pfxSeg}, {0x3e, 0, pfxSeg}, {0x64, 0, pfxSeg}, {0x65, 0, pfxSeg},
	} {
		t[p.b].clear, t[p.b].set = rex|p.clear, p.set
	}
	for b := 0x40; b < 0x50; b++ {
		t[b].clear, t[b].set = pfxRexW|pfxRexB, pfxRex
		if b&8 != 0 {
			t[b].set |= pfxRexW
		}
		if b&1 != 0 {
			t[b].set |= pfxRexB
		}
	}
	return t
}()

// shape is what the length decoder learns of an instruction, its class
// included: Step needs no second decode.
type shape struct {
	n      int      // length
	enc    encoding // how the opcode is encoded
	opmap  uint8    // map1Byte, map0F, ...
	op     byte     // the opcode byte
	modrm  int      // offset of the ModRM byte, -1 when none
	imm    int      // offset of the immediate or relative displacement
	immLen int      // its size
	pfx    uint16   // prefix flags
	class  Class    // how it moves the program counter
	rel    bool     // it has a relative target: a relative branch or xbegin
}

// Length returns the length of the 64-bit instruction at the start of code,
// for every legacy, REX, VEX, EVEX and XOP encoding. It does not check
// that an instruction's operands suit its opcode (a register where only
// memory is allowed): only what decides the length, and the opcodes and
// prefixes that are undefined or invalid in 64-bit mode.
func Length(code []byte) (int, error) {
	var s shape
	if err := s.scan(code); err != nil {
		return 0, err
	}
	return s.n, nil
}

// scan decodes the shape of the instruction at the start of code.
func scan(code []byte) (shape, error) {
	var s shape
	err := s.scan(code)
	return s, err
}

// scan decodes the shape of the instruction at the start of code into s.
// It is Step's hot path: one function over locals and table lookups where
// a switch would mispredict; only the escapes (0F, VEX, EVEX, XOP, REX2)
// call out, to find the opcode and its operand kind.
func (s *shape) scan(code []byte) error {
	// Legacy prefixes in any order, then perhaps a REX.
	var pfx uint16
	var op byte
	i := 0
	for {
		if i >= len(code) {
			return truncated(code)
		}
		op = code[i]
		p := prefixes[op]
		if p.set == 0 {
			break
		}
		pfx = pfx&^p.clear | p.set
		if i++; i >= MaxLen {
			return badBytes(ErrTooLong, code)
		}
	}
	enc, opmap := legacy, uint8(map1Byte)
	kind := oneByte[op]
	i++
	if kind == opPrefix { // an escape: scan took the prefixes
		s.enc, s.opmap, s.op, s.pfx = enc, opmap, op, pfx
		var err error
		if i, kind, err = s.escape(code, i-1); err != nil {
			return err
		}
		enc, opmap, op, pfx = s.enc, s.opmap, s.op, s.pfx
	}
	if kind == opInvalid || kind == opPrefix {
		return badBytes(ErrInvalid, code)
	}
	modrm := -1
	if m := kindModRM[kind]; m != noModRM {
		if i >= len(code) {
			return truncated(code)
		}
		modrm = i
		if m == modrmReg {
			i++
		} else {
			if opmap == map1Byte && invalidGroupMember(op, code[i]) {
				return badBytes(ErrInvalid, code)
			}
			i = modrmEnd(code, i)
		}
	}
	immLen := int(immLens[kind][immSel(pfx)])
	xbegin := false
	if modrm >= 0 && opmap == map1Byte {
		switch {
		case (kind == opGroup3I8 || kind == opGroup3Iz) && (code[modrm]>>3)&7 >= 2:
			immLen = 0 // only test r/m, imm (/0, /1) has one
		case op == 0xc7 && code[modrm] == 0xf8:
			// xbegin: rel32 (rel16 under 66) as C7 /0's imm; not a
			// branch (an abort reaches its target), but relative.
			xbegin, immLen = true, 4
			if pfx&pfx66 != 0 {
				immLen = 2
			}
		}
	}
	n := i + immLen
	if n > MaxLen {
		return badBytes(ErrTooLong, code)
	}
	if n > len(code) {
		return truncated(code)
	}
	// VEX, EVEX and XOP encode no control transfer, nor do the legacy
	// maps but 1-byte and 0F.
	class := NotBranch
	if enc == legacy && opmap <= map0F {
		class = classes[opmap][op]
	}
	// Field by field: a composite literal is built aside and copied.
	s.n, s.enc, s.opmap, s.op, s.modrm, s.imm, s.immLen, s.pfx = n, enc, opmap, op, modrm, i, immLen, pfx
	if class == byOperand {
		class = s.operandClass(code)
	}
	s.class = class
	// CondJump, Jump and Call are the relative branches.
	s.rel = xbegin || class >= CondJump && class <= Call
	return nil
}

// truncated is ErrTruncated with the bytes.
func truncated(code []byte) error { return badBytes(ErrTruncated, code) }

// badBytes is err with the bytes. Kept out of line, the formatting costs
// scan's hot path no stack or registers.
//
//go:noinline
func badBytes(err error, code []byte) error {
	return fmt.Errorf("%w: % x", err, head(code, MaxLen))
}

// escape finds the opcode behind the escape byte code[i] (0F, D5, C4,
// C5, 62, or 8F, which is pop r/m unless XOP): it sets s's encoding, map
// and opcode, and returns the offset after the opcode and its operand
// kind.
func (s *shape) escape(code []byte, i int) (int, uint8, error) {
	switch code[i] {
	case 0x0f:
		return s.map0F(code, i+1)
	case 0xd5:
		return s.rex2(code, i)
	case 0xc4, 0xc5:
		return s.vex(code, i)
	case 0x62:
		return s.evex(code, i)
	case 0x8f:
		// XOP when the map field is 8 or more; pop r/m (8F /0) has
		// ModRM.reg 0, which keeps those bits clear.
		if i+1 < len(code) && code[i+1]&0x1f >= 8 {
			return s.xop(code, i)
		}
		return i + 1, opModRM, nil
	}
	return i + 1, opInvalid, nil
}

// map0F finds a legacy 0F-map (or 0F38, 0F3A, 3DNow!) opcode; code[i]
// follows the 0F.
func (s *shape) map0F(code []byte, i int) (int, uint8, error) {
	if i >= len(code) {
		return 0, 0, truncated(code)
	}
	b := code[i]
	switch b {
	case 0x38, 0x3a:
		if i+1 >= len(code) {
			return 0, 0, truncated(code)
		}
		s.opmap, s.op = map0F38, code[i+1]
		if b == 0x3a {
			s.opmap = map0F3A
			return i + 2, opModRMI8, nil
		}
		return i + 2, opModRM, nil
	case 0x0f:
		s.opmap, s.op = map3DNow, b
		return i + 1, opModRMI8, nil
	}
	s.opmap, s.op = map0F, b
	if b == 0x78 && s.pfx&(pfx66|pfxF2) != 0 {
		// extrq/insertq (SSE4a) take imm8, imm8 where vmread takes none.
		return i + 1, opModRMI8I8, nil
	}
	return i + 1, twoByte[b], nil
}

// rex2 finds the opcode behind APX's REX2 prefix (D5 and a payload whose
// bit 7 selects the 1-byte or the 0F map; bit 3 is W, bit 0 B3); code[i]
// is D5. REX2 is undefined with rows 4, 7, A and E of the 1-byte map and
// rows 3 and 8 of the 0F map, but for A1 with W 0: jmpabs, an absolute
// jump to its imm64.
func (s *shape) rex2(code []byte, i int) (int, uint8, error) {
	if s.pfx&pfxRex != 0 {
		return 0, 0, fmt.Errorf("%w: a REX before REX2: % x", ErrInvalid, head(code, MaxLen))
	}
	if i+2 >= len(code) {
		return 0, 0, truncated(code)
	}
	p, b := code[i+1], code[i+2]
	s.pfx |= pfxRex2
	if p&8 != 0 {
		s.pfx |= pfxRexW
	}
	if p&1 != 0 {
		s.pfx |= pfxRexB
	}
	if p&0x80 != 0 {
		if row := b >> 4; row == 3 || row == 8 || b == 0x0f {
			return 0, 0, badBytes(ErrInvalid, code)
		}
		return s.map0F(code, i+2)
	}
	s.op = b
	if b == 0xa1 && p&8 == 0 && s.pfx&(pfx66|pfx67|pfxF2|pfxF3|pfxLock) == 0 {
		return i + 3, opImm64, nil
	}
	switch row := b >> 4; {
	case row == 4, row == 7, row == 0xa, row == 0xe, b == 0x0f, b == 0x62, b == 0xc4, b == 0xc5, b == 0xd5:
		return 0, 0, badBytes(ErrInvalid, code)
	case b == 0x8f:
		return i + 3, opModRM, nil
	}
	return i + 3, oneByte[b], nil
}

// vex finds a C4/C5 instruction's opcode; code[i] is C4 or C5.
func (s *shape) vex(code []byte, i int) (int, uint8, error) {
	if s.pfx&(pfx66|pfxF2|pfxF3|pfxLock|pfxRex) != 0 {
		return 0, 0, fmt.Errorf("%w: a legacy prefix or REX before VEX: % x", ErrInvalid, head(code, MaxLen))
	}
	s.enc, s.opmap = vex, map0F
	j := i + 2 // the opcode after C5 and one payload byte
	if code[i] == 0xc4 {
		if i+1 >= len(code) {
			return 0, 0, truncated(code)
		}
		s.opmap = code[i+1] & 0x1f
		j = i + 3
	}
	if j >= len(code) {
		return 0, 0, truncated(code)
	}
	s.op = code[j]
	kind, err := vexKind(s.opmap, s.op)
	if err != nil {
		return 0, 0, badBytes(err, code)
	}
	return j + 1, kind, nil
}

// vexKind is the operand kind of a VEX or EVEX opcode in map m.
func vexKind(m, op byte) (uint8, error) {
	switch m {
	case map0F:
		switch {
		case op == 0x77: // vzeroupper, vzeroall
			return opNone, nil
		case op >= 0x70 && op <= 0x73, op == 0xc2, op == 0xc4, op == 0xc5, op == 0xc6:
			return opModRMI8, nil
		}
		return opModRM, nil
	case map0F38, 5, 6: // 5 and 6: EVEX AVX512-FP16, no immediates
		return opModRM, nil
	case map0F3A:
		return opModRMI8, nil
	}
	return opInvalid, fmt.Errorf("%w: opcode map %d", ErrInvalid, m)
}

// evex finds a 62 instruction's opcode; code[i] is 62. Payload bit 10,
// fixed at 1 before APX made it X4, does not change the length: it is not
// checked.
func (s *shape) evex(code []byte, i int) (int, uint8, error) {
	if s.pfx&(pfx66|pfxF2|pfxF3|pfxLock|pfxRex) != 0 {
		return 0, 0, fmt.Errorf("%w: a legacy prefix or REX before EVEX: % x", ErrInvalid, head(code, MaxLen))
	}
	if i+4 >= len(code) {
		return 0, 0, truncated(code)
	}
	s.enc, s.opmap, s.op = evex, code[i+1]&7, code[i+4]
	if s.opmap == map1Byte || s.opmap == 4 || s.opmap == 7 {
		return 0, 0, fmt.Errorf("%w: EVEX opcode map %d: % x", ErrInvalid, s.opmap, head(code, MaxLen))
	}
	kind, err := vexKind(s.opmap, s.op)
	if err != nil {
		return 0, 0, badBytes(err, code)
	}
	if kind == opNone { // no vzeroupper in EVEX: every opcode has ModRM
		kind = opModRM
	}
	return i + 5, kind, nil
}

// xop finds an 8F instruction's opcode whose map is 8 or more; code[i]
// is 8F.
func (s *shape) xop(code []byte, i int) (int, uint8, error) {
	if i+3 >= len(code) {
		return 0, 0, truncated(code)
	}
	s.enc, s.opmap, s.op = xop, code[i+1]&0x1f, code[i+3]
	switch s.opmap {
	case 8:
		return i + 4, opModRMI8, nil
	case 9:
		return i + 4, opModRM, nil
	case 10: // bextr, lwpins, lwpval take an imm32
		return i + 4, opModRMI32, nil
	}
	return 0, 0, fmt.Errorf("%w: XOP opcode map %d: % x", ErrInvalid, s.opmap, head(code, MaxLen))
}

// ModRM forms of the operand kinds.
const (
	noModRM  = iota
	modrmMem // ModRM, SIB and displacement by mod and r/m
	modrmReg // a ModRM whose mod is ignored
)

// kindModRM is the ModRM form of each operand kind.
var kindModRM = [numKinds]uint8{
	opModRM: modrmMem, opModRMI8: modrmMem, opModRMIz: modrmMem, opGroup3I8: modrmMem, opGroup3Iz: modrmMem,
	opModRMI8I8: modrmMem, opModRMI32: modrmMem,
	opModRMReg: modrmReg,
}

// immSel indexes immLens by the prefixes that size immediates: 66, 67 and
// REX.W.
func immSel(pfx uint16) int {
	return int(pfx&(pfx66|pfx67) | pfx&pfxRexW>>2)
}

// immLens is immSize by kind and immSel, so that operands looks the size up
// instead of branching on the kind.
var immLens = func() (t [numKinds][8]uint8) {
	for kind := range t {
		for sel := range t[kind] {
			pfx := uint16(sel&(pfx66|pfx67) | sel&4<<2)
			if immSel(pfx) != sel {
				panic("x86insn: immSel does not invert")
			}
			t[kind][sel] = uint8(immSize(uint8(kind), pfx))
		}
	}
	return t
}()

// immSize is the size of the immediate (or relative displacement) of an
// operand kind under the prefix flags pfx; for group 3 that of test r/m,
// imm.
func immSize(kind uint8, pfx uint16) int {
	switch kind {
	case opModRMI8, opI8, opGroup3I8:
		return 1
	case opI16, opModRMI8I8:
		return 2
	case opEnter:
		return 3
	case opIz, opModRMIz, opGroup3Iz:
		return sizeZ(pfx)
	case opRel32, opModRMI32:
		return 4
	case opImm64:
		return 8
	case opIv:
		if pfx&pfxRexW != 0 {
			return 8
		}
		return sizeZ(pfx)
	case opMoffs:
		if pfx&pfx67 != 0 {
			return 4
		}
		return 8
	}
	return 0
}

// invalidGroupMember tells the undefined members of the 1-byte map's
// groups that decide control flow: FE /2-/7, FF /7, far FF /3 and /5
// from a register, and 8F /4 (the other non-zero /r are XOP).
func invalidGroupMember(op, m byte) bool {
	reg := (m >> 3) & 7
	switch op {
	case 0xfe:
		return reg >= 2
	case 0xff:
		return reg == 7 || (reg == 3 || reg == 5) && m>>6 == 3
	case 0x8f:
		return reg != 0
	}
	return false
}

// sizeZ is the size of an imm16/32: 2 under 66 unless REX.W.
func sizeZ(pfx uint16) int {
	if pfx&pfx66 != 0 && pfx&pfxRexW == 0 {
		return 2
	}
	return 4
}

// modrmEnd returns the offset after the ModRM byte at code[i] and its SIB
// and displacement, from modrmLens. The end may lie beyond code: check says
// so.
func modrmEnd(code []byte, i int) int {
	base5 := 0 // SIB base 5: no base under mod 0 (the table ignores it elsewhere)
	if i+1 < len(code) && code[i+1]&7 == 5 {
		base5 = 1
	}
	return i + int(modrmLens[base5][code[i]])
}

// modrmLens is modrmSize by SIB base 5 (0 or 1) and ModRM byte.
var modrmLens = func() (t [2][256]uint8) {
	for m := range 256 {
		t[0][m] = uint8(modrmSize(byte(m), 0))
		t[1][m] = uint8(modrmSize(byte(m), 5))
	}
	return t
}()

// modrmSize returns the size of the ModRM byte m with its SIB and
// displacement, given the base field of the SIB byte (when m has one). In
// 64-bit mode 67 selects 32-bit addressing, which has the same forms as
// 64-bit: it changes no displacement size.
func modrmSize(m, sibBase byte) int {
	mod, rm := m>>6, m&7
	n := 1
	if mod == 3 {
		return n
	}
	if rm == 4 { // SIB
		if mod == 0 && sibBase == 5 { // no base: disp32
			return n + 5
		}
		n++
	}
	switch {
	case mod == 0 && rm == 5: // RIP-relative disp32
		return n + 4
	case mod == 1:
		return n + 1
	case mod == 2:
		return n + 4
	}
	return n
}
