package probes

import (
	"fmt"

	"golang.org/x/arch/x86/x86asm"

	"ptfs/x86insn"
)

// VerdictKind classifies a site for ptwrite uprobes.
type VerdictKind uint8

// Verdict kinds, from best to worst.
const (
	// Nop5 is a single 5-byte NOP: always patchable.
	Nop5 VerdictKind = iota
	// MultiNop is five 1-byte NOPs at an 8-byte aligned address, probed
	// with %multinop.
	MultiNop
	// Pun is any other allowed instruction: only byte 0 is patched, which
	// may fail at install time.
	Pun
	// Rets is a return probe (%return) that ptw mode emulates with a
	// probe on each ret of the function (Site.Rets), none refused.
	Rets
	// Refused is a site that ptwrite uprobes never take.
	Refused
)

// String names the kind.
func (k VerdictKind) String() string {
	switch k {
	case Nop5:
		return "nop5"
	case MultiNop:
		return "multinop"
	case Pun:
		return "pun"
	case Rets:
		return "rets"
	}
	return "refused"
}

// Verdict tells whether and how a ptwrite uprobe can patch a site.
type Verdict struct {
	Kind VerdictKind
	// Insn is the instruction at the site in GNU syntax.
	Insn string
	// Reason says why a site is refused, or for Rets where the rets are;
	// empty otherwise.
	Reason string
}

// String renders the verdict for the probe file, such as
// "ptw: 5-byte nop (nopl (%rax,%rax))".
func (v Verdict) String() string {
	switch v.Kind {
	case Nop5:
		return "ptw: 5-byte nop (" + v.Insn + ")"
	case MultiNop:
		return "ptw: %multinop (five 1-byte nops at an 8-byte aligned address)"
	case Pun:
		return "ptw: pun of " + v.Insn + " (may fail at install time)"
	case Rets:
		return "ptw: " + v.Reason
	}
	return "ptw: refused: " + v.Reason
}

// Err returns nil for a site that ptwrite uprobes take, and for a refused
// one an error that wraps ErrRefused with the reason: what ptw mode reports.
func (v Verdict) Err() error {
	if v.Kind != Refused {
		return nil
	}
	return fmt.Errorf("%w: ptw: %s", ErrRefused, v.Reason)
}

// pageSize is the granule that a 5-byte patch window must not cross.
const pageSize = 4096

// verdict classifies the site at virtual address addr holding in, with
// code the bytes from the site on (at least five when the file has them).
func verdict(multiNop bool, in x86insn.Inst, code []byte, addr uint64) Verdict {
	v := Verdict{Insn: in.Text}
	refuse := func(format string, a ...any) Verdict {
		v.Kind, v.Reason = Refused, fmt.Sprintf(format, a...)
		return v
	}
	if multiNop {
		if len(code) < 5 || code[0] != 0x90 || code[1] != 0x90 || code[2] != 0x90 || code[3] != 0x90 || code[4] != 0x90 {
			return refuse("%%multinop: the bytes at 0x%x are not five 1-byte nops (% x)", addr, code[:min(len(code), 5)])
		}
		if addr%8 != 0 {
			return refuse("%%multinop: address 0x%x is not 8-byte aligned (the site is patched with one 8-byte store)", addr)
		}
	} else if r := refusedInsn(in); r != "" {
		return refuse("%s", r)
	}
	if addr%pageSize > pageSize-5 {
		return refuse("the 5-byte window at 0x%x crosses a page boundary", addr)
	}
	switch {
	case multiNop:
		v.Kind = MultiNop
	case in.Op == x86asm.NOP && in.Len == 5:
		v.Kind = Nop5
	default:
		v.Kind = Pun
	}
	return v
}

// refusedInsn returns why ptwrite uprobes refuse an instruction, or "".
func refusedInsn(in x86insn.Inst) string {
	switch in.Op {
	case x86asm.INT, x86asm.ICEBP, x86asm.INTO, x86asm.IRET, x86asm.IRETD, x86asm.IRETQ:
		return in.Text + " (a trap saves the IP)"
	case x86asm.SYSCALL, x86asm.SYSENTER, x86asm.SYSEXIT, x86asm.SYSRET:
		return in.Text + " (a system instruction saves the IP)"
	case x86asm.LJMP, x86asm.LCALL:
		return in.Text + " (far control flow)"
	}
	switch {
	case in.Class == x86insn.Call:
		return "call rel32 (its return address would point into the stub)"
	case in.RelWidth != 0:
		size := "rel32"
		if in.RelWidth == 1 {
			size = "rel8"
		}
		return fmt.Sprintf("%s %s (relative branch: the stub may not reach its target)", in.Text, size)
	case in.Class == x86insn.IndirectCall:
		return in.Text + " (indirect call: its return address would point into the stub)"
	}
	return ""
}
