package probes

import (
	"fmt"

	"golang.org/x/arch/x86/x86asm"
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
	}
	return "refused"
}

// Verdict tells whether and how a ptwrite uprobe can patch a site.
type Verdict struct {
	Kind VerdictKind
	// Insn is the instruction at the site in GNU syntax.
	Insn string
	// Reason says why a site is refused; empty otherwise.
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

// insn is one decoded instruction; x86asm leaves endbr64/endbr32 undecoded,
// so those carry Op 0 and their own text.
type insn struct {
	inst x86asm.Inst
	text string
	len  int
}

// decodeInsn decodes the 64-bit instruction at the start of code, located at
// virtual address pc.
func decodeInsn(code []byte, pc uint64) (insn, error) {
	if len(code) >= 4 && code[0] == 0xf3 && code[1] == 0x0f && code[2] == 0x1e && (code[3] == 0xfa || code[3] == 0xfb) {
		name := "endbr64"
		if code[3] == 0xfb {
			name = "endbr32"
		}
		return insn{text: name, len: 4}, nil
	}
	in, err := x86asm.Decode(code, 64)
	if err != nil {
		return insn{}, fmt.Errorf("undecodable bytes % x", head(code, 4))
	}
	// A bare prefix decodes as Op 0 without an error: it is not an
	// instruction we can reason about.
	if in.Op == 0 || in.Len == 0 {
		return insn{}, fmt.Errorf("unknown instruction % x", head(code, 4))
	}
	return insn{inst: in, text: x86asm.GNUSyntax(in, pc, nil), len: in.Len}, nil
}

func head(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// verdict classifies the site at virtual address addr holding in, with
// code the bytes from the site on (at least five when the file has them).
func verdict(multiNop bool, in insn, code []byte, addr uint64) Verdict {
	v := Verdict{Insn: in.text}
	refuse := func(format string, a ...any) Verdict {
		v.Kind, v.Reason = Refused, fmt.Sprintf(format, a...)
		return v
	}
	if multiNop {
		if len(code) < 5 || code[0] != 0x90 || code[1] != 0x90 || code[2] != 0x90 || code[3] != 0x90 || code[4] != 0x90 {
			return refuse("%%multinop: the bytes at 0x%x are not five 1-byte nops (% x)", addr, head(code, 5))
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
	case in.inst.Op == x86asm.NOP && in.len == 5:
		v.Kind = Nop5
	default:
		v.Kind = Pun
	}
	return v
}

// refusedInsn returns why ptwrite uprobes refuse an instruction, or "".
func refusedInsn(in insn) string {
	i := in.inst
	switch i.Op {
	case x86asm.INT, x86asm.ICEBP, x86asm.INTO, x86asm.IRET, x86asm.IRETD, x86asm.IRETQ:
		return in.text + " (a trap saves the IP)"
	case x86asm.SYSCALL, x86asm.SYSENTER, x86asm.SYSEXIT, x86asm.SYSRET:
		return in.text + " (a system instruction saves the IP)"
	case x86asm.LJMP, x86asm.LCALL:
		return in.text + " (far control flow)"
	}
	if _, rel := i.Args[0].(x86asm.Rel); rel {
		if i.Op == x86asm.CALL {
			return "call rel32 (its return address would point into the stub)"
		}
		size := "rel32"
		if i.PCRel == 1 {
			size = "rel8"
		}
		return fmt.Sprintf("%s %s (relative branch: the stub may not reach its target)", in.text, size)
	}
	if i.Op == x86asm.CALL {
		return in.text + " (indirect call: its return address would point into the stub)"
	}
	return ""
}
