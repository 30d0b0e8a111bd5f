package x86insn

// Step decodes the length, class and relative target of the 64-bit
// instruction at the start of code, located at pc, from the length
// decoder's tables alone: no x86asm, no text, no allocation. It is the
// control-flow decoder's hot path; Op and Text stay empty (Decode fills
// them). Step classes as Decode does: the tests hold them together.
func Step(code []byte, pc uint64) (Inst, error) {
	s, err := scan(code)
	if err != nil {
		return Inst{}, err
	}
	return s.inst(code, pc), nil
}

// inst builds the Inst of a scanned instruction at pc: class, and the
// target of a relative branch.
func (s *shape) inst(code []byte, pc uint64) Inst {
	in := Inst{Len: s.n, Class: s.class(code)}
	if in.Class == CondJump || in.Class == Jump || in.Class == Call || s.isXbegin(code) {
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

// isXbegin tells xbegin (C7 F8 rel32), which is not a branch (its target
// is reached only by an abort) but has a relative target.
func (s *shape) isXbegin(code []byte) bool {
	return s.enc == legacy && s.opmap == map1Byte && s.op == 0xc7 && code[s.modrm] == 0xf8
}

// class classes a scanned instruction. VEX, EVEX and XOP encode no
// control transfer.
func (s *shape) class(code []byte) Class {
	if s.enc != legacy {
		return NotBranch
	}
	var reg byte
	if s.modrm >= 0 {
		reg = (code[s.modrm] >> 3) & 7
	}
	switch s.opmap {
	case map1Byte:
		switch op := s.op; {
		case op >= 0x70 && op <= 0x7f, op >= 0xe0 && op <= 0xe3:
			return CondJump
		case op == 0xeb, op == 0xe9:
			return Jump
		case op == 0xe8:
			return Call
		case op == 0xa1 && s.pfx&pfxRex2 != 0:
			// jmpabs: libipt and the trace take it as an indirect
			// jump (a TIP gives the target).
			return IndirectJump
		case op == 0xc2, op == 0xc3:
			return Ret
		case op == 0xca, op == 0xcb, op == 0xcc, op == 0xcd, op == 0xcf, op == 0xf1:
			return FarTransfer
		case op == 0xff:
			switch reg {
			case 2:
				return IndirectCall
			case 4:
				return IndirectJump
			case 3, 5:
				return FarTransfer
			}
		}
	case map0F:
		switch op := s.op; {
		case op >= 0x80 && op <= 0x8f:
			return CondJump
		case op == 0x05, op == 0x07, op == 0x34, op == 0x35:
			return FarTransfer
		case op == 0x01 && s.isFar01(code[s.modrm]):
			return FarTransfer
		case op == 0x22 && reg == 3:
			return MovCR3
		case op == 0xae && reg == 4 && s.pfx&pfxF3 != 0 && s.pfx&pfx66 == 0:
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
