// Package x86insn decodes x86-64 instructions for ptfs: the one place that
// wraps golang.org/x/arch/x86/x86asm. A table-driven length decoder of its
// own (Length) steps over every legacy, VEX, EVEX and XOP encoding and is
// the authority on length, which x86asm gets wrong for a few instructions
// (vzeroupper, vzeroall). It adds what x86asm lacks (endbr64, endbr32 and
// ptwrite, which it leaves undecoded or misreads) and classes each
// instruction by how it moves the program counter, the question both the
// ptwrite site checks and control-flow decoding ask. Decode gives text
// through x86asm; Step gives length, class and target without it, for hot
// loops.
package x86insn

import (
	"fmt"
	"strings"

	"golang.org/x/arch/x86/x86asm"
)

// MaxLen is the longest x86 instruction in bytes.
const MaxLen = 15

// Inst is one decoded instruction.
type Inst struct {
	// Op is x86asm's opcode; 0 for the instructions that x86asm does not
	// know (endbr64, endbr32, ptwrite), which Class and Text still name.
	Op x86asm.Op
	// Text is the instruction in GNU (AT&T) syntax.
	Text string
	// Flow is its length, class and relative target.
	Flow
}

// Flow is what control-flow decoding needs of an instruction (Step's
// result): small enough to be returned in registers.
type Flow struct {
	// Len is the length in bytes.
	Len int
	// Class says how the instruction moves the program counter.
	Class Class
	// RelWidth is the width in bytes of a branch's relative displacement
	// (1 for rel8, 2 or 4), 0 when the instruction has none.
	RelWidth int
	// Target is the destination of a relative branch (RelWidth > 0).
	Target uint64
}

// Decode decodes the 64-bit instruction at the start of code, located at
// virtual address pc.
func Decode(code []byte, pc uint64) (Inst, error) {
	// The length decoder is the authority on length: x86asm misreads
	// some (vzeroupper and vzeroall take a ModRM there).
	s, err := scan(code)
	if err != nil {
		return Inst{}, fmt.Errorf("undecodable bytes % x: %w", head(code, 4), err)
	}
	if in, ok := decodeSpecial(code, pc, s); ok {
		return in, nil
	}
	x, err := x86asm.Decode(code, 64)
	// What x86asm does not know, the length decoder still steps over.
	if !x86asmKnows(s, x, err) {
		return Inst{Text: encodingNames[s.enc], Flow: s.flow(code, pc)}, nil
	}
	if x.Len != s.n {
		// x86asm knows the opcode but not its operands' bytes.
		return Inst{Op: x.Op, Text: strings.ToLower(x.Op.String()), Flow: s.flow(code, pc)}, nil
	}
	in := Inst{Op: x.Op, Text: x86asm.GNUSyntax(x, pc, nil), Flow: Flow{Len: x.Len}}
	if rel, ok := x.Args[0].(x86asm.Rel); ok {
		in.RelWidth = x.PCRel
		in.Target = pc + uint64(x.Len) + uint64(int64(rel))
	}
	in.Class = classify(x.Op, in.RelWidth != 0)
	if s.class == MovCR3 {
		// x86asm's op is a plain MOV.
		in.Class = MovCR3
	}
	return in, nil
}

// DecodeMode decodes the instruction at the start of code for a processor
// in mode 16, 32 or 64 (bits): traced code may run in any of them. 64-bit
// code goes through Decode; the length decoder knows 64-bit encodings only,
// so 16- and 32-bit code is x86asm's alone.
func DecodeMode(code []byte, pc uint64, mode int) (Inst, error) {
	if mode == 64 {
		return Decode(code, pc)
	}
	x, err := x86asm.Decode(code, mode)
	if err != nil {
		return Inst{}, fmt.Errorf("undecodable bytes % x: %w", head(code, 4), err)
	}
	// A bare prefix decodes as Op 0 without an error: it is not an
	// instruction we can reason about.
	if x.Op == 0 || x.Len == 0 {
		return Inst{}, fmt.Errorf("unknown instruction % x", head(code, 4))
	}
	in := Inst{Op: x.Op, Text: x86asm.GNUSyntax(x, pc, nil), Flow: Flow{Len: x.Len}}
	if rel, ok := x.Args[0].(x86asm.Rel); ok {
		in.RelWidth = x.PCRel
		in.Target = pc + uint64(x.Len) + uint64(int64(rel))
	}
	in.Class = classify(x.Op, in.RelWidth != 0)
	if x.Op == x86asm.MOV && x.Args[0] == x86asm.CR3 {
		in.Class = MovCR3
	}
	return in, nil
}

// x86asmKnows tells whether x86asm decoded the instruction of shape s as
// x, err. A bare prefix decodes as Op 0 without an error; and x86asm
// reads 2 bits of EVEX's map field, so AVX512-FP16's maps 5 and 6 would be
// maps 1 and 2 to it.
func x86asmKnows(s shape, x x86asm.Inst, err error) bool {
	return err == nil && x.Op != 0 && !(s.enc == evex && s.opmap > map0F3A)
}

// head returns at most the first n bytes of b, for error texts.
func head(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// decodeSpecial decodes what x86asm does not: endbr64/endbr32 (a bare
// prefix with Op 0 to it) and ptwrite (undecoded, or read as "rep xsave"),
// given the length decoder's shape s of code.
func decodeSpecial(code []byte, pc uint64, s shape) (Inst, bool) {
	if len(code) >= 4 && code[0] == 0xf3 && code[1] == 0x0f && code[2] == 0x1e && (code[3] == 0xfa || code[3] == 0xfb) {
		name := "endbr64"
		if code[3] == 0xfb {
			name = "endbr32"
		}
		return Inst{Text: name, Flow: Flow{Len: 4}}, true
	}
	if s.class != PTWrite {
		return Inst{}, false
	}
	return decodePTWrite(code, pc, s), true
}

// gpr32 and gpr64 are the GNU names of the general registers by number.
var (
	gpr32 = [16]string{"eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi",
		"r8d", "r9d", "r10d", "r11d", "r12d", "r13d", "r14d", "r15d"}
	gpr64 = [16]string{"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
		"r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"}
)

// decodePTWrite decodes ptwrite r/m32 (f3 0f ae /4) and ptwrite r/m64
// (f3 REX.W 0f ae /4), whose shape s the length decoder found, printed as
// objdump does: "ptwrite %eax", "ptwriteq 0x8(%rsp)".
func decodePTWrite(code []byte, pc uint64, s shape) Inst {
	in := Inst{Flow: Flow{Class: PTWrite, Len: s.n}}
	modrm := code[s.modrm]
	if s.pfx&pfxRex2 != 0 {
		// APX's registers and REX2 are objdump's to name; the
		// operand stays unnamed.
		in.Text = "ptwrite"
		return in
	}
	if modrm>>6 == 3 {
		reg := modrm & 7
		if s.pfx&pfxRexB != 0 {
			reg |= 8
		}
		names := &gpr32
		if s.pfx&pfxRexW != 0 {
			names = &gpr64
		}
		in.Text = "ptwrite %" + names[reg]
		return in
	}
	suffix := "l"
	if s.pfx&pfxRexW != 0 {
		suffix = "q"
	}
	// The memory form has xsave's encoding with an f3 prefix: x86asm
	// decodes its operand right, under the wrong name.
	in.Text = "ptwrite" + suffix
	if x, err := x86asm.Decode(code, 64); err == nil && x.Len == s.n && (x.Op == x86asm.XSAVE || x.Op == x86asm.XSAVE64) {
		gnu := x86asm.GNUSyntax(x, pc, nil)
		in.Text += " " + gnu[strings.LastIndexByte(gnu, ' ')+1:]
	}
	return in
}

// Prefixes returns the legacy prefix bytes at the start of code, in order,
// and the REX byte directly before the opcode (0 when none): what a
// check of the kernel's uprobe rules (segment and lock prefixes, push
// with REX.B) reads, with the length decoder's own prefix table.
func Prefixes(code []byte) (legacy []byte, rex byte) {
	i := 0
	for i < len(code) && i < MaxLen && prefixes[code[i]].set != 0 {
		i++
	}
	legacy = code[:i]
	if i > 0 && code[i-1]&0xf0 == 0x40 {
		rex = code[i-1]
		legacy = code[:i-1]
	}
	return legacy, rex
}
