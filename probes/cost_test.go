package probes

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"ptfs/internal/testkit"
	"ptfs/x86insn"
)

// TestClassicCost checks the kernel's rules (arch/x86/kernel/uprobes.c)
// instruction by instruction; cmd/ptfs TestProbeCostKernel checks a site
// of each class against this machine's kernel.
func TestClassicCost(t *testing.T) {
	tests := []struct {
		name  string
		code  []byte
		addr  uint64
		class CostClass
		text  string // substring of Cost.String()
	}{
		{"nopl 5", []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}, 0x1170, Optimized, "classic: optimized (no trap: a call and a syscall a hit): nopl (%rax,%rax) is a 5-byte nop"},
		{"nopw 5", []byte{0x66, 0x0f, 0x1f, 0x40, 0x00}, 0x1170, Optimized, "5-byte nop"},
		{"prefixed nop 5", []byte{0x66, 0x66, 0x66, 0x66, 0x90}, 0x1170, Optimized, "5-byte nop"},
		{"nop5 across a page", []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}, 0x1ffd, Emulated, "is a nop"},
		{"nopl 4", []byte{0x0f, 0x1f, 0x40, 0x00}, 0x1170, Emulated, "emulated (one trap a hit): nopl (%rax) is a nop"},
		{"nopw 6", []byte{0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00}, 0x1170, Emulated, "is a nop"},
		{"nop", []byte{0x90}, 0x1170, Emulated, "is a nop"},
		{"pause", []byte{0xf3, 0x90}, 0x1170, SingleStepped, "pause"},
		{"push", []byte{0x55}, 0x1040, Emulated, "push %rbp is a push of a register"},
		{"push r12", []byte{0x41, 0x54}, 0x1040, Emulated, "push of a register"},
		{"push rex.w", []byte{0x48, 0x55}, 0x1040, SingleStepped, "out of line"},
		{"push imm", []byte{0x6a, 0x01}, 0x1040, SingleStepped, "out of line"},
		{"jmp rel8", []byte{0xeb, 0x10}, 0x1040, Emulated, "relative branch"},
		{"jmp rel32", []byte{0xe9, 0, 1, 0, 0}, 0x1040, Emulated, "relative branch"},
		{"call rel32", []byte{0xe8, 0, 1, 0, 0}, 0x1040, Emulated, "relative branch"},
		{"jne rel8", []byte{0x75, 0x10}, 0x1040, Emulated, "relative branch"},
		{"jne rel32", []byte{0x0f, 0x85, 0, 1, 0, 0}, 0x1040, Emulated, "relative branch"},
		{"bnd jmp", []byte{0xf2, 0xe9, 0, 1, 0, 0}, 0x1040, Emulated, "relative branch"},
		{"loop", []byte{0xe2, 0x10}, 0x1040, SingleStepped, "out of line"},
		{"jrcxz", []byte{0xe3, 0x10}, 0x1040, SingleStepped, "out of line"},
		{"mov", []byte{0x48, 0x89, 0xf8}, 0x1185, SingleStepped, "classic: single-stepped (two traps a hit, the dearest): mov %rdi,%rax is run out of line"},
		{"endbr64", []byte{0xf3, 0x0f, 0x1e, 0xfa}, 0x1040, SingleStepped, "endbr64"},
		{"ret", []byte{0xc3}, 0x1040, SingleStepped, "ret"},
		{"jmp indirect", []byte{0xff, 0xe0}, 0x1040, SingleStepped, "jmp *%rax"},
		{"vzeroupper", []byte{0xc5, 0xf8, 0x77}, 0x1040, SingleStepped, "out of line"},
		{"lock add", []byte{0xf0, 0x83, 0x04, 0x24, 0x00}, 0x1040, KernelRefused, "prefix f0"},
		{"ds prefix", []byte{0x3e, 0xff, 0xe0}, 0x1040, KernelRefused, "prefix 3e"},
		{"fs prefix", []byte{0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0}, 0x1040, SingleStepped, "out of line"},
		{"int3", []byte{0xcc}, 0x1040, KernelRefused, "opcode cc"},
		{"hlt", []byte{0xf4}, 0x1040, KernelRefused, "opcode f4"},
		{"in", []byte{0xec}, 0x1040, KernelRefused, "opcode ec"},
		{"mov to ss", []byte{0x8e, 0xd0}, 0x1040, KernelRefused, "mov to ss"},
		{"mov to ds", []byte{0x8e, 0xd8}, 0x1040, SingleStepped, "out of line"},
		{"jmp rel32 with 66", []byte{0x66, 0xe9, 0, 1, 0, 0}, 0x1040, KernelRefused, "operand-size prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, err := x86insn.Decode(tt.code, tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			c := classicCost(in, tt.code, tt.addr)
			if c.Class != tt.class || !strings.Contains(c.String(), tt.text) {
				t.Errorf("%s: %v %q, want %v containing %q", in.Text, c.Class, c, tt.class, tt.text)
			}
			if err := c.Err(); (err != nil) != (tt.class == KernelRefused) || err != nil && !errors.Is(err, ErrRefused) {
				t.Errorf("%s: Err() = %v", in.Text, err)
			}
		})
	}
}

// TestCheaperSite checks the cheaper site that Resolve names on
// testdata/cost.c: only within a function's run of transparent
// instructions from its entry, never for a return probe.
func TestCheaperSite(t *testing.T) {
	b := openBinary(t, testkit.BuildC(t, filepath.Join("..", "testdata", "cost.c"), "-O2", "-no-pie"))
	emulated := Emulated.String()
	for _, tt := range []struct {
		spec    string
		class   CostClass
		cheaper string
	}{
		{"site_endbr", SingleStepped, "site_endbr+0x4 (push %rbp, " + emulated + ")"},
		{"site_endbr%return", SingleStepped, ""},
		{"site_endbr+4", Emulated, ""},
		{"site_endbr+5", SingleStepped, ""}, // pop %rbp: after the push
		{"site_nop1+1", SingleStepped, "site_nop1+0x0 (nop, " + emulated + ")"},
		{"site_mov", SingleStepped, ""},
		{"site_nop5", Optimized, ""},
		{"site_nop5+5", SingleStepped, "site_nop5+0x0 (nopl (%rax,%rax), " + Optimized.String() + ")"},
	} {
		site, err := b.Resolve(mustParse(t, tt.spec))
		if err != nil {
			t.Fatalf("%s: %v", tt.spec, err)
		}
		if site.Cost.Class != tt.class || site.Cost.Cheaper != tt.cheaper {
			t.Errorf("%s (%s): %v, cheaper %q; want %v, cheaper %q", tt.spec, site.Insn, site.Cost.Class, site.Cost.Cheaper, tt.class, tt.cheaper)
		}
	}
}

// FuzzClassicCost: the bytes of a probed file are outside input; every
// instruction gets a class and a reason, never a panic.
func FuzzClassicCost(f *testing.F) {
	f.Add([]byte{0x0f, 0x1f, 0x44, 0x00, 0x00}, uint64(0x1170))
	f.Add([]byte{0x66, 0xe9, 0, 1}, uint64(0x1040))
	f.Add([]byte{0x8e, 0xd0}, uint64(0x1ffe))
	f.Fuzz(func(t *testing.T, code []byte, addr uint64) {
		in, err := x86insn.Decode(code, addr)
		if err != nil {
			return
		}
		c := classicCost(in, code, addr)
		if c.Class > KernelRefused || c.Reason == "" {
			t.Fatalf("classicCost(% x) = %+v", code, c)
		}
	})
}
