// Package x86insn decodes x86-64 instructions for ptfs: the one place that
// wraps golang.org/x/arch/x86/x86asm. It adds what x86asm lacks (endbr64,
// endbr32 and ptwrite, which it leaves undecoded or misreads) and classes
// each instruction by how it moves the program counter, the question both
// the ptwrite site checks and control-flow decoding ask. Decoding goes
// through recognisers tried before x86asm (decodeSpecial), which is where
// a length decoder for what x86asm does not know (VEX, EVEX) slots in.
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
	// Len is the length in bytes.
	Len int
	// Text is the instruction in GNU (AT&T) syntax.
	Text string
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
func Decode(code []byte, pc uint64) (Inst, error) { return DecodeMode(code, pc, 64) }

// DecodeMode decodes the instruction at the start of code for a processor
// in mode 16, 32 or 64 (bits): traced code may run in any of them.
func DecodeMode(code []byte, pc uint64, mode int) (Inst, error) {
	if in, ok := decodeSpecial(code, pc); ok {
		return in, nil
	}
	x, err := x86asm.Decode(code, mode)
	if err != nil {
		return Inst{}, fmt.Errorf("undecodable bytes % x", head(code, 4))
	}
	// A bare prefix decodes as Op 0 without an error: it is not an
	// instruction we can reason about.
	if x.Op == 0 || x.Len == 0 {
		return Inst{}, fmt.Errorf("unknown instruction % x", head(code, 4))
	}
	in := Inst{Op: x.Op, Len: x.Len, Text: x86asm.GNUSyntax(x, pc, nil)}
	if rel, ok := x.Args[0].(x86asm.Rel); ok {
		in.RelWidth = x.PCRel
		in.Target = pc + uint64(x.Len) + uint64(int64(rel))
	}
	in.Class = classify(x.Op, in.RelWidth != 0)
	return in, nil
}

// head returns at most the first n bytes of b, for error texts.
func head(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// decodeSpecial decodes what x86asm does not: endbr64/endbr32 (a bare
// prefix with Op 0 to it) and ptwrite (undecoded, or read as "rep xsave").
func decodeSpecial(code []byte, pc uint64) (Inst, bool) {
	if len(code) < 4 || code[0] != 0xf3 {
		return Inst{}, false
	}
	if code[1] == 0x0f && code[2] == 0x1e && (code[3] == 0xfa || code[3] == 0xfb) {
		name := "endbr64"
		if code[3] == 0xfb {
			name = "endbr32"
		}
		return Inst{Text: name, Len: 4}, true
	}
	return decodePTWrite(code, pc)
}

// gpr32 and gpr64 are the GNU names of the general registers by number.
var (
	gpr32 = [16]string{"eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi",
		"r8d", "r9d", "r10d", "r11d", "r12d", "r13d", "r14d", "r15d"}
	gpr64 = [16]string{"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
		"r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"}
)

// decodePTWrite decodes ptwrite r/m32 (f3 0f ae /4) and ptwrite r/m64
// (f3 REX.W 0f ae /4), printed as objdump does: "ptwrite %eax",
// "ptwriteq 0x8(%rsp)".
func decodePTWrite(code []byte, pc uint64) (Inst, bool) {
	i, rex := 1, byte(0)
	if code[i]&0xf0 == 0x40 {
		rex, i = code[i], i+1
	}
	if len(code) < i+3 || code[i] != 0x0f || code[i+1] != 0xae || (code[i+2]>>3)&7 != 4 {
		return Inst{}, false
	}
	modrm := code[i+2]
	in := Inst{Class: PTWrite}
	if modrm>>6 == 3 {
		reg := modrm&7 | (rex&1)<<3
		names := &gpr32
		if rex&8 != 0 {
			names = &gpr64
		}
		in.Len, in.Text = i+3, "ptwrite %"+names[reg]
		return in, true
	}
	// The memory form has xsave's encoding with an f3 prefix: x86asm
	// decodes its operand and length right, under the wrong name.
	x, err := x86asm.Decode(code, 64)
	if err != nil || (x.Op != x86asm.XSAVE && x.Op != x86asm.XSAVE64) {
		return Inst{}, false
	}
	gnu := x86asm.GNUSyntax(x, pc, nil)
	suffix := "l"
	if rex&8 != 0 {
		suffix = "q"
	}
	in.Len, in.Text = x.Len, "ptwrite"+suffix+" "+gnu[strings.LastIndexByte(gnu, ' ')+1:]
	return in, true
}
