package x86insn

// Step decodes the length, class and relative target of the 64-bit
// instruction at the start of code, located at pc, from the length
// decoder's tables alone: no x86asm, no text, no allocation. It is the
// control-flow decoder's hot path; Decode adds Op and Text. Step classes
// as Decode does: the tests hold them together.
func Step(code []byte, pc uint64) (Flow, error) {
	if len(code) >= MaxLen {
		var l [1]uint8
		_, _, in, err := Run(code, pc, l[:])
		return in, err
	}
	return stepScan(code, pc)
}

// stepScan is Step through the general scan.
func stepScan(code []byte, pc uint64) (Flow, error) {
	var s shape
	if err := s.scan(code); err != nil {
		return Flow{}, err
	}
	return s.flow(code, pc), nil
}

// flow builds the Flow of a scanned instruction at pc: class, and the
// target of a relative branch.
func (s *shape) flow(code []byte, pc uint64) Flow {
	in := Flow{Len: s.n, Class: s.class}
	if s.rel {
		in.RelWidth = s.immLen
		var rel int64
		switch s.immLen {
		case 1:
			rel = int64(int8(code[s.imm]))
		case 2:
			rel = int64(int16(uint16(code[s.imm]) | uint16(code[s.imm+1])<<8))
		case 4:
			rel = int64(int32(uint32(code[s.imm]) | uint32(code[s.imm+1])<<8 |
				uint32(code[s.imm+2])<<16 | uint32(code[s.imm+3])<<24))
		}
		in.Target = pc + uint64(s.n) + uint64(rel)
	}
	return in
}

// byOperand marks the opcodes of classes whose class depends on their
// ModRM or prefixes (operandClass).
const byOperand Class = 0xff

// classes classes the legacy 1-byte and 0F maps' opcodes (the other maps
// hold no control transfer), a lookup instead of a chain of compares.
var classes = func() (t [map0F + 1][256]Class) {
	for op := 0x70; op <= 0x7f; op++ {
		t[map1Byte][op] = CondJump   // jcc rel8
		t[map0F][op+0x10] = CondJump // jcc rel32
	}
	for _, op := range []byte{0xe0, 0xe1, 0xe2, 0xe3} { // loop*, jrcxz
		t[map1Byte][op] = CondJump
	}
	t[map1Byte][0xeb], t[map1Byte][0xe9], t[map1Byte][0xe8] = Jump, Jump, Call
	t[map1Byte][0xc2], t[map1Byte][0xc3] = Ret, Ret
	// lret imm16, lret, int3, int, iret, int1.
	for _, op := range []byte{0xca, 0xcb, 0xcc, 0xcd, 0xcf, 0xf1} {
		t[map1Byte][op] = FarTransfer
	}
	// syscall, sysret, sysenter, sysexit.
	for _, op := range []byte{0x05, 0x07, 0x34, 0x35} {
		t[map0F][op] = FarTransfer
	}
	// jmpabs (A1 behind REX2), group 5 (FF), group 7 (0F 01), mov to a
	// control register (0F 22), group 15 (0F AE).
	t[map1Byte][0xa1], t[map1Byte][0xff] = byOperand, byOperand
	t[map0F][0x01], t[map0F][0x22], t[map0F][0xae] = byOperand, byOperand, byOperand
	return t
}()

// operandClass classes the opcodes that classes marks byOperand.
func (s *shape) operandClass(code []byte) Class {
	var reg byte
	if s.modrm >= 0 {
		reg = (code[s.modrm] >> 3) & 7
	}
	switch {
	case s.opmap == map1Byte && s.op == 0xa1:
		if s.pfx&pfxRex2 != 0 {
			// jmpabs: libipt and the trace take it as an indirect
			// jump (a TIP gives the target).
			return IndirectJump
		}
	case s.opmap == map1Byte && s.op == 0xff:
		switch reg {
		case 2:
			return IndirectCall
		case 4:
			return IndirectJump
		case 3, 5:
			return FarTransfer
		}
	case s.op == 0x01:
		if s.isFar01(code[s.modrm]) {
			return FarTransfer
		}
	case s.op == 0x22:
		if reg == 3 {
			return MovCR3
		}
	case s.op == 0xae:
		if reg == 4 && s.pfx&pfxF3 != 0 && s.pfx&pfx66 == 0 {
			return PTWrite
		}
	}
	return NotBranch
}

// isFar01 tells the 0F 01 forms that leave the context: vmlaunch (C2),
// vmresume (C3), FRED erets (F2 CA) and eretu (F3 CA), uiret (F3 EC).
// Without the prefix, CA is clac and EC is not a branch.
func (s *shape) isFar01(modrm byte) bool {
	switch modrm {
	case 0xc2, 0xc3:
		return s.pfx&(pfx66|pfxF2|pfxF3) == 0
	case 0xca:
		return s.pfx&(pfxF2|pfxF3) != 0 && s.pfx&pfx66 == 0
	case 0xec:
		return s.pfx&pfxF3 != 0 && s.pfx&(pfx66|pfxF2) == 0
	}
	return false
}
