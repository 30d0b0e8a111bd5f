package probes

import (
	"fmt"

	"golang.org/x/arch/x86/x86asm"

	"ptfs/objfile"
	"ptfs/x86insn"
)

// CostClass says how the kernel runs a classic uprobe's hit at a site, the
// rules of arch/x86/kernel/uprobes.c (6.18): what a hit costs the traced
// program.
type CostClass uint8

// Cost classes, from cheapest to dearest.
const (
	// Optimized is a 5-byte NOP (nop or nopl with prefixes, as
	// 0f 1f 44 00 00) in 64-bit code whose 5 bytes stay in one page
	// (can_optimize): after its first hit the kernel rewrites it into a
	// call to a trampoline page that enters with the uprobe syscall, no
	// trap. (The first 6.18 rule took x86_nops[5] only; this machine's
	// kernel takes any, TestProbeCostKernel checks it.)
	Optimized CostClass = iota
	// Emulated is an instruction that the int3 handler carries out itself
	// (branch_setup_xol_ops: any nop, jmp/jcc/call with a rel8/rel32
	// target; push_setup_xol_ops: push of a register, with no prefix
	// or REX 41): one trap a hit.
	Emulated
	// SingleStepped is every other instruction: a copy of it runs out of
	// line under the trap flag, a second trap a hit.
	SingleStepped
	// KernelRefused is an instruction that uprobe_init_insn refuses (a
	// segment or lock prefix, an opcode of its bad list, mov to ss), or
	// a branch with an operand-size prefix: the probe write fails.
	KernelRefused
)

// Cost is how the kernel runs a classic uprobe at a site, and where a
// cheaper site of the same function gives the same arguments.
type Cost struct {
	Class CostClass
	// Insn is the instruction at the site in GNU syntax.
	Insn string
	// Reason names the kernel's rule that applies.
	Reason string
	// Cheaper is a cheaper site with the same registers and memory
	// ("FUNC+0xOFF (INSN, CLASS)"), empty when none is known.
	Cheaper string
}

// String names the class with what a hit costs: the figures per class on
// one machine are in README "Performance" (BenchmarkProbeCost).
func (c CostClass) String() string {
	switch c {
	case Optimized:
		return "optimized (no trap: a call and a syscall a hit)"
	case Emulated:
		return "emulated (one trap a hit)"
	case SingleStepped:
		return "single-stepped (two traps a hit, the dearest)"
	}
	return "refused by the kernel"
}

// String renders the cost for the probe file of a classic probe, such as
// "classic: single-stepped (two traps a hit, the dearest): endbr64 is run
// out of line under the trap flag; cheaper with the same arguments: f+0x4
// (push %rbp, emulated (one trap a hit))".
func (c Cost) String() string {
	s := "classic: " + c.Class.String() + ": " + c.Reason
	if c.Cheaper != "" {
		s += "; cheaper with the same arguments: " + c.Cheaper
	}
	return s
}

// Err returns nil for a site that classic uprobes take, and for one the
// kernel refuses an error that wraps ErrRefused with the reason: the
// kernel accepts such a probe's tracefs line and then never installs it
// (it checks the instruction when a process maps the file), so its hits
// would be lost without a word.
func (c Cost) Err() error {
	if c.Class != KernelRefused {
		return nil
	}
	return fmt.Errorf("%w: classic: %s", ErrRefused, c.Reason)
}

// goodOneByte64 is the kernel's good_insns_64 as its rows read: column c of
// row r is 1 when a 64-bit uprobe may be placed on one-byte opcode r<<4|c.
var goodOneByte64 = [16]string{
	"1111110011111101", "1111110011111100", "1111111011111110", "1111111011111110", // 00-30
	"1111111111111111", "1111111111111111", "0001111111110000", "1111111111111111", // 40-70
	"1101111111111111", "1111111111011111", "1111111111111111", "1111111111111111", // 80-b0
	"1111111111110000", "1111000111111111", "1111000011010000", "1011011111001111", // c0-f0
}

// classicCost classifies the site at virtual address addr holding in, with
// code the bytes from the site on.
func classicCost(in x86insn.Inst, code []byte, addr uint64) Cost {
	c := Cost{Insn: in.Text}
	legacy, rex := x86insn.Prefixes(code)
	has66 := false
	for _, p := range legacy {
		switch p {
		case 0x26, 0x2e, 0x36, 0x3e, 0xf0:
			c.Class, c.Reason = KernelRefused, fmt.Sprintf("%s has prefix %02x (es/cs/ss/ds or lock), which uprobes refuse", in.Text, p)
			return c
		case 0x66:
			has66 = true
		}
	}
	opAt := len(legacy)
	if rex != 0 {
		opAt++
	}
	op := code[opAt]
	vex := op == 0xc4 || op == 0xc5 || op == 0x62 || op == 0xd5
	// The kernel tests the first opcode byte of a legacy encoding
	// against its table; 0f (two-byte opcodes) is in it.
	// Its decoder reads the opcode of a VEX, EVEX or REX2 encoding
	// behind those bytes: such instructions are left to the install.
	if !vex && goodOneByte64[op>>4][op&15] != '1' {
		c.Class, c.Reason = KernelRefused, fmt.Sprintf("%s (opcode %02x) is on the kernel's list of instructions uprobes refuse", in.Text, op)
		return c
	}
	if op == 0x8e && opAt+1 < len(code) && code[opAt+1]>>3&7 == 2 {
		c.Class, c.Reason = KernelRefused, in.Text+" masks exceptions (mov to ss): uprobes refuse it"
		return c
	}
	switch {
	case in.Len == 5 && in.Op == x86asm.NOP && addr%pageSize <= pageSize-5:
		c.Class, c.Reason = Optimized, in.Text+" is a 5-byte nop: patched into a call to the uprobe trampoline after its first hit"
	case in.Op == x86asm.NOP:
		c.Class, c.Reason = Emulated, in.Text+" is a nop: the trap handler skips it"
	case in.RelWidth != 0 && (in.Class == x86insn.CondJump && op != 0xe0 && op != 0xe1 && op != 0xe2 && op != 0xe3 || in.Class == x86insn.Jump || in.Class == x86insn.Call):
		if has66 {
			c.Class, c.Reason = KernelRefused, in.Text+" is a branch with an operand-size prefix (66), which uprobes refuse"
			return c
		}
		c.Class, c.Reason = Emulated, in.Text+" is a relative branch: the trap handler emulates it"
	case op >= 0x50 && op <= 0x57 && len(legacy) == 0 && (rex == 0 || rex == 0x41):
		c.Class, c.Reason = Emulated, in.Text+" is a push of a register: the trap handler emulates it"
	default:
		c.Class, c.Reason = SingleStepped, in.Text+" is run out of line under the trap flag"
	}
	return c
}

// transparent tells whether an instruction changes no register, flag or
// memory that a fetcharg reads: a probe before it and one after it see the
// same arguments.
func transparent(in x86insn.Inst) bool {
	return in.Op == x86asm.NOP || in.Text == "endbr64" || in.Text == "endbr32"
}

// maxEntryScan bounds the walk over a function's first transparent
// instructions (endbr64, a patchable-entry NOP pad).
const maxEntryScan = 256

// cheaperSite finds, among the instructions of fn from its entry up to
// and including the first one that is not transparent, the cheapest
// classic site when the site at addr (of class class) lies among them:
// every point of that run sees the same registers and memory. It
// returns "" when none is cheaper or the site lies past the run.
func (b *Binary) cheaperSite(seg objfile.Segment, fn objfile.Symbol, addr uint64, class CostClass) string {
	end := min(fn.Addr+maxEntryScan, seg.Vaddr+seg.Filesz)
	if fn.Size > 0 {
		end = min(end, fn.Addr+fn.Size)
	}
	if end <= fn.Addr {
		return ""
	}
	code, err := b.ReadCode(fn.Addr, end-fn.Addr)
	if err != nil {
		return ""
	}
	best, bestPC := Cost{Class: class}, uint64(0)
	for pc := fn.Addr; pc < end; {
		in, err := x86insn.Decode(code[pc-fn.Addr:], pc)
		if err != nil {
			return ""
		}
		if c := classicCost(in, code[pc-fn.Addr:], pc); c.Class < best.Class {
			best, bestPC = c, pc
		}
		if !transparent(in) {
			if addr > pc || best.Class == class {
				return ""
			}
			return fmt.Sprintf("%s+0x%x (%s, %s)", fn.Name, bestPC-fn.Addr, best.Insn, best.Class)
		}
		pc += uint64(in.Len)
	}
	return ""
}
