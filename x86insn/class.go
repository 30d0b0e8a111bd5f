package x86insn

import (
	"strconv"

	"golang.org/x/arch/x86/x86asm"
)

// Class says how an instruction moves the program counter: what a ptwrite
// site check refuses and what a control-flow decoder follows.
type Class uint8

// Classes. The direct branches (CondJump, Jump, Call) are consecutive,
// right after NotBranch: a decoder may test them as a range.
const (
	// NotBranch falls through to the next instruction (also xbegin,
	// whose target is reached only by an abort).
	NotBranch Class = iota
	// CondJump is a conditional relative jump: jcc, loop*, j*cxz.
	CondJump
	// Jump is a direct (relative) jmp.
	Jump
	// Call is a direct (relative) call.
	Call
	// IndirectJump is a jmp through a register or memory.
	IndirectJump
	// IndirectCall is a call through a register or memory.
	IndirectCall
	// Ret is a near return.
	Ret
	// FarTransfer leaves the code or saves the IP for another context:
	// far jmp/call/ret, int/int1/int3/into, iret, syscall/sysret,
	// sysenter/sysexit, vmlaunch/vmresume, FRED eretu/erets, uiret.
	FarTransfer
	// PTWrite writes its operand into the processor trace.
	PTWrite
	// MovCR3 falls through but switches the address space (mov to
	// CR3): a trace's paging event (PIP) binds to it, as to a far
	// transfer.
	MovCR3
)

var classNames = [...]string{
	NotBranch: "not a branch", CondJump: "conditional jump", Jump: "jump", Call: "call",
	IndirectJump: "indirect jump", IndirectCall: "indirect call", Ret: "return",
	FarTransfer: "far transfer", PTWrite: "ptwrite", MovCR3: "mov to cr3",
}

// String names the class.
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

// classify classes op; rel tells whether its operand is a relative
// displacement.
func classify(op x86asm.Op, rel bool) Class {
	switch op {
	case x86asm.JA, x86asm.JAE, x86asm.JB, x86asm.JBE, x86asm.JE, x86asm.JG, x86asm.JGE, x86asm.JL,
		x86asm.JLE, x86asm.JNE, x86asm.JNO, x86asm.JNP, x86asm.JNS, x86asm.JO, x86asm.JP, x86asm.JS,
		x86asm.JCXZ, x86asm.JECXZ, x86asm.JRCXZ, x86asm.LOOP, x86asm.LOOPE, x86asm.LOOPNE:
		return CondJump
	case x86asm.JMP:
		if rel {
			return Jump
		}
		return IndirectJump
	case x86asm.CALL:
		if rel {
			return Call
		}
		return IndirectCall
	case x86asm.RET:
		return Ret
	case x86asm.LJMP, x86asm.LCALL, x86asm.LRET, x86asm.INT, x86asm.ICEBP, x86asm.INTO,
		x86asm.IRET, x86asm.IRETD, x86asm.IRETQ, x86asm.SYSCALL, x86asm.SYSRET,
		x86asm.SYSENTER, x86asm.SYSEXIT:
		return FarTransfer
	}
	return NotBranch
}
