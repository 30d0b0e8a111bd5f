package probes

import (
	"errors"
	"strings"
	"testing"

	"ptfs/x86insn"
)

func TestVerdict(t *testing.T) {
	tests := []struct {
		name     string
		code     []byte
		addr     uint64
		multiNop bool
		kind     VerdictKind
		text     string // substring of Verdict.String()
	}{
		{"nopl 5", []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}, 0x1170, false, Nop5, "ptw: 5-byte nop (nopl (%rax,%rax))"},
		{"nopw 5", []byte{0x66, 0x0f, 0x1f, 0x40, 0x00}, 0x1170, false, Nop5, "5-byte nop"},
		{"prefixed nop 5", []byte{0x66, 0x66, 0x66, 0x66, 0x90}, 0x1170, false, Nop5, "5-byte nop"},
		{"nopl 4 is a pun", []byte{0x0f, 0x1f, 0x40, 0x00, 0xc3}, 0x1170, false, Pun, "pun of nopl (%rax)"},
		{"nopw 6 is a pun", []byte{0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00}, 0x1170, false, Pun, "pun of nopw"},
		{"one nop is a pun", []byte{0x90, 0x90, 0x90, 0x90, 0x90}, 0x1170, false, Pun, "pun of nop"},
		{"mov", []byte{0x48, 0x89, 0xf8}, 0x1185, false, Pun, "ptw: pun of mov %rdi,%rax (may fail at install time)"},
		{"push", []byte{0x55}, 0x1040, false, Pun, "pun of push %rbp"},
		{"ret", []byte{0xc3}, 0x1040, false, Pun, "pun of ret"},
		{"jmp indirect", []byte{0xff, 0xe0}, 0x1040, false, Pun, "pun of jmp *%rax"},
		{"endbr64", []byte{0xf3, 0x0f, 0x1e, 0xfa}, 0x1040, false, Pun, "pun of endbr64"},
		{"multinop aligned", []byte{0x90, 0x90, 0x90, 0x90, 0x90}, 0x1170, true, MultiNop, "ptw: %multinop"},
		{"multinop unaligned", []byte{0x90, 0x90, 0x90, 0x90, 0x90}, 0x1174, true, Refused, "not 8-byte aligned"},
		{"multinop short", []byte{0x90, 0x90, 0x90, 0x90, 0xc3}, 0x1170, true, Refused, "not five 1-byte nops (90 90 90 90 c3)"},
		{"multinop on nopl", []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}, 0x1170, true, Refused, "not five 1-byte nops"},
		{"multinop at file end", []byte{0x90, 0x90}, 0x1170, true, Refused, "not five 1-byte nops"},
		{"int3", []byte{0xcc}, 0x1040, false, Refused, "ptw: refused: int3 (a trap saves the IP)"},
		{"int1", []byte{0xf1}, 0x1040, false, Refused, "icebp"},
		{"int 0x80", []byte{0xcd, 0x80}, 0x1040, false, Refused, "int $0x80"},
		{"iret", []byte{0xcf}, 0x1040, false, Refused, "iret"},
		{"iretq", []byte{0x48, 0xcf}, 0x1040, false, Refused, "iretq"},
		{"syscall", []byte{0x0f, 0x05}, 0x1040, false, Refused, "syscall (a system instruction"},
		{"sysenter", []byte{0x0f, 0x34}, 0x1040, false, Refused, "sysenter"},
		{"sysexit", []byte{0x0f, 0x35}, 0x1040, false, Refused, "sysexit"},
		{"far jmp", []byte{0xff, 0x2c, 0x24}, 0x1040, false, Refused, "far control flow"},
		{"far call", []byte{0xff, 0x1c, 0x24}, 0x1040, false, Refused, "far control flow"},
		{"jmp rel8", []byte{0xeb, 0x10}, 0x1040, false, Refused, "rel8 (relative branch"},
		{"jmp rel32", []byte{0xe9, 0, 1, 0, 0}, 0x1040, false, Refused, "rel32 (relative branch"},
		{"je rel8", []byte{0x74, 0x02}, 0x1040, false, Refused, "je 0x1044 rel8"},
		{"jne rel32", []byte{0x0f, 0x85, 0, 1, 0, 0}, 0x1040, false, Refused, "rel32"},
		{"loop", []byte{0xe2, 0xfe}, 0x1040, false, Refused, "loop"},
		{"loopne", []byte{0xe0, 0xfe}, 0x1040, false, Refused, "loopne"},
		{"jrcxz", []byte{0xe3, 0xfe}, 0x1040, false, Refused, "jrcxz"},
		{"jecxz", []byte{0x67, 0xe3, 0xfe}, 0x1040, false, Refused, "jecxz"},
		{"call rel32", []byte{0xe8, 0, 0, 0, 0}, 0x1040, false, Refused, "ptw: refused: call rel32 (its return address would point into the stub)"},
		{"call reg", []byte{0xff, 0xd0}, 0x1040, false, Refused, "indirect call"},
		{"call mem", []byte{0xff, 0x10}, 0x1040, false, Refused, "indirect call"},
		{"call rip mem", []byte{0xff, 0x15, 0, 0, 0, 0}, 0x1040, false, Refused, "indirect call"},
		{"nop5 across a page", []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}, 0x1ffc, false, Refused, "crosses a page boundary"},
		{"mov across a page", []byte{0x48, 0x89, 0xf8}, 0x2ffd, false, Refused, "crosses a page boundary"},
		{"pun at last fitting byte", []byte{0x55}, 0x2ffb, false, Pun, "pun"},
		{"pun at page start", []byte{0x55}, 0x3000, false, Pun, "pun"},
	}
	for _, tt := range tests {
		in, err := x86insn.Decode(tt.code, tt.addr)
		if err != nil {
			t.Errorf("%s: decode % x: %v", tt.name, tt.code, err)
			continue
		}
		v := verdict(tt.multiNop, in, tt.code, tt.addr)
		if v.Kind != tt.kind || !strings.Contains(v.String(), tt.text) {
			t.Errorf("%s: verdict %v %q, want %v containing %q", tt.name, v.Kind, v, tt.kind, tt.text)
		}
		if (v.Kind == Refused) != (v.Reason != "") {
			t.Errorf("%s: kind %v with reason %q", tt.name, v.Kind, v.Reason)
		}
		if err := v.Err(); (err != nil) != (v.Kind == Refused) || err != nil && (!errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), v.Reason)) {
			t.Errorf("%s: Err() = %v for %v", tt.name, err, v)
		}
	}
}

func TestVerdictKindString(t *testing.T) {
	for k, want := range map[VerdictKind]string{Nop5: "nop5", MultiNop: "multinop", Pun: "pun", Refused: "refused"} {
		if k.String() != want {
			t.Errorf("%d.String() = %q, want %q", k, k.String(), want)
		}
	}
}
