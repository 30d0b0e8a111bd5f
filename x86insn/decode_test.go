package x86insn

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"golang.org/x/arch/x86/x86asm"
)

func TestDecode(t *testing.T) {
	tests := []struct {
		name  string
		code  []byte
		class Class
		op    x86asm.Op
		text  string
		len   int
		rel   int
		tgt   uint64
	}{
		{"endbr64", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x55}, NotBranch, 0, "endbr64", 4, 0, 0},
		{"endbr32", []byte{0xf3, 0x0f, 0x1e, 0xfb}, NotBranch, 0, "endbr32", 4, 0, 0},
		{"nopl", []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}, NotBranch, x86asm.NOP, "nopl (%rax,%rax)", 5, 0, 0},
		{"mov", []byte{0x48, 0x89, 0xf8}, NotBranch, x86asm.MOV, "mov %rdi,%rax", 3, 0, 0},
		{"mov rip", []byte{0x48, 0x8b, 0x05, 0x10, 0, 0, 0}, NotBranch, x86asm.MOV, "mov 0x10(%rip),%rax", 7, 0, 0},
		{"xbegin", []byte{0xc7, 0xf8, 0, 0, 0, 0}, NotBranch, x86asm.XBEGIN, "xbeginq", 6, 4, 0x1006},
		{"je rel8", []byte{0x74, 0x02}, CondJump, x86asm.JE, "je 0x1004", 2, 1, 0x1004},
		{"jne rel32", []byte{0x0f, 0x85, 0x00, 0x01, 0, 0}, CondJump, x86asm.JNE, "jne 0x1106", 6, 4, 0x1106},
		{"jb back", []byte{0x72, 0xfe}, CondJump, x86asm.JB, "jb 0x1000", 2, 1, 0x1000},
		{"loop", []byte{0xe2, 0xfe}, CondJump, x86asm.LOOP, "loop", 2, 1, 0x1000},
		{"loopne", []byte{0xe0, 0xfe}, CondJump, x86asm.LOOPNE, "loopne", 2, 1, 0x1000},
		{"jrcxz", []byte{0xe3, 0xfe}, CondJump, x86asm.JRCXZ, "jrcxz", 2, 1, 0x1000},
		{"jecxz", []byte{0x67, 0xe3, 0xfe}, CondJump, x86asm.JECXZ, "jecxz", 3, 1, 0x1001},
		{"jmp rel8", []byte{0xeb, 0x10}, Jump, x86asm.JMP, "jmp 0x1012", 2, 1, 0x1012},
		{"jmp rel32", []byte{0xe9, 0, 1, 0, 0}, Jump, x86asm.JMP, "jmpq 0x1105", 5, 4, 0x1105},
		{"call rel32", []byte{0xe8, 0xfb, 0xff, 0xff, 0xff}, Call, x86asm.CALL, "callq 0x1000", 5, 4, 0x1000},
		{"jmp reg", []byte{0xff, 0xe0}, IndirectJump, x86asm.JMP, "jmp *%rax", 2, 0, 0},
		{"jmp mem", []byte{0xff, 0x24, 0xc5, 0, 0, 0, 0}, IndirectJump, x86asm.JMP, "jmpq *(,%rax,8)", 7, 0, 0},
		{"notrack jmp", []byte{0x3e, 0xff, 0xe0}, IndirectJump, x86asm.JMP, "ds jmp *%rax", 3, 0, 0},
		{"call reg", []byte{0xff, 0xd0}, IndirectCall, x86asm.CALL, "call *%rax", 2, 0, 0},
		{"call mem", []byte{0xff, 0x10}, IndirectCall, x86asm.CALL, "callq *(%rax)", 2, 0, 0},
		{"call rip", []byte{0xff, 0x15, 0, 0, 0, 0}, IndirectCall, x86asm.CALL, "callq *(%rip)", 6, 0, 0},
		{"ret", []byte{0xc3}, Ret, x86asm.RET, "ret", 1, 0, 0},
		{"ret imm", []byte{0xc2, 0x08, 0x00}, Ret, x86asm.RET, "retq $0x8", 3, 0, 0},
		{"far ret", []byte{0xcb}, FarTransfer, x86asm.LRET, "lret", 1, 0, 0},
		{"far jmp", []byte{0xff, 0x2c, 0x24}, FarTransfer, x86asm.LJMP, "ljmp", 3, 0, 0},
		{"far call", []byte{0xff, 0x1c, 0x24}, FarTransfer, x86asm.LCALL, "lcall", 3, 0, 0},
		{"int3", []byte{0xcc}, FarTransfer, x86asm.INT, "int3", 1, 0, 0},
		{"int1", []byte{0xf1}, FarTransfer, x86asm.ICEBP, "icebp", 1, 0, 0},
		{"int 0x80", []byte{0xcd, 0x80}, FarTransfer, x86asm.INT, "int $0x80", 2, 0, 0},
		{"iretq", []byte{0x48, 0xcf}, FarTransfer, x86asm.IRETQ, "iretq", 2, 0, 0},
		{"syscall", []byte{0x0f, 0x05}, FarTransfer, x86asm.SYSCALL, "syscall", 2, 0, 0},
		{"sysret", []byte{0x0f, 0x07}, FarTransfer, x86asm.SYSRET, "sysret", 2, 0, 0},
		{"sysenter", []byte{0x0f, 0x34}, FarTransfer, x86asm.SYSENTER, "sysenter", 2, 0, 0},
		{"sysexit", []byte{0x0f, 0x35}, FarTransfer, x86asm.SYSEXIT, "sysexit", 2, 0, 0},
		// Near branches keep rel32 under 66, as Intel CPUs do.
		{"66 call", []byte{0x66, 0xe8, 0xfa, 0xff, 0xff, 0xff}, Call, x86asm.CALL, "callw", 6, 4, 0x1000},
		{"66 jcc", []byte{0x66, 0x0f, 0x84, 0, 0, 0, 0}, CondJump, x86asm.JE, "je", 7, 4, 0x1007},
		{"xbeginw", []byte{0x66, 0xc7, 0xf8, 0x10, 0}, NotBranch, x86asm.XBEGIN, "xbegin", 5, 2, 0x1015},
		{"bnd ret", []byte{0xf2, 0xc3}, Ret, x86asm.RET, "bnd ret", 2, 0, 0},
		{"REX.W jmp reg", []byte{0x41, 0xff, 0xe3}, IndirectJump, x86asm.JMP, "jmp *%r11", 3, 0, 0},
		// ptwrite, as objdump prints it; x86asm leaves the register form
		// undecoded and reads the memory form as "rep xsave".
		{"ptwrite r32", []byte{0xf3, 0x0f, 0xae, 0xe0}, PTWrite, 0, "ptwrite %eax", 4, 0, 0},
		{"ptwrite r64", []byte{0xf3, 0x48, 0x0f, 0xae, 0xe0}, PTWrite, 0, "ptwrite %rax", 5, 0, 0},
		{"ptwrite r8d", []byte{0xf3, 0x41, 0x0f, 0xae, 0xe0}, PTWrite, 0, "ptwrite %r8d", 5, 0, 0},
		{"ptwrite r15", []byte{0xf3, 0x49, 0x0f, 0xae, 0xe7}, PTWrite, 0, "ptwrite %r15", 5, 0, 0},
		{"ptwrite m32", []byte{0xf3, 0x0f, 0xae, 0x20}, PTWrite, 0, "ptwritel (%rax)", 4, 0, 0},
		{"ptwrite m64", []byte{0xf3, 0x48, 0x0f, 0xae, 0x64, 0x24, 0x08}, PTWrite, 0, "ptwriteq 0x8(%rsp)", 7, 0, 0},
		{"ptwrite rip", []byte{0xf3, 0x48, 0x0f, 0xae, 0x25, 0x00, 0x01, 0, 0}, PTWrite, 0, "ptwriteq 0x100(%rip)", 9, 0, 0},
		{"ptwrite es:", []byte{0xf3, 0x26, 0x0f, 0xae, 0x61, 0x30}, PTWrite, 0, "ptwritel %es:0x30(%rcx)", 6, 0, 0},
		{"ptwrite cs REX.B", []byte{0x2e, 0xf3, 0x41, 0x0f, 0xae, 0xe0}, PTWrite, 0, "ptwrite %r8d", 6, 0, 0},
		// x86asm reads a ModRM after vzeroupper and vzeroall.
		{"vzeroupper", []byte{0xc5, 0xf8, 0x77, 0x5b, 0xc3}, NotBranch, x86asm.VZEROUPPER, "vzeroupper", 3, 0, 0},
		{"vzeroall", []byte{0xc5, 0xfc, 0x77, 0xc3}, NotBranch, x86asm.VZEROALL, "vzeroall", 3, 0, 0},
		// What x86asm does not know, the length decoder steps over.
		{"rdpkru", []byte{0x0f, 0x01, 0xee}, NotBranch, 0, "(unknown)", 3, 0, 0},
		// The 0F 01 forms that leave the context (libipt's far
		// transfers); without F2/F3, CA is clac.
		{"vmlaunch", []byte{0x0f, 0x01, 0xc2}, FarTransfer, 0, "(unknown)", 3, 0, 0},
		{"vmresume", []byte{0x0f, 0x01, 0xc3}, FarTransfer, 0, "(unknown)", 3, 0, 0},
		{"eretu", []byte{0xf3, 0x0f, 0x01, 0xca}, FarTransfer, 0, "", 4, 0, 0},
		{"erets", []byte{0xf2, 0x0f, 0x01, 0xca}, FarTransfer, 0, "", 4, 0, 0},
		{"uiret", []byte{0xf3, 0x0f, 0x01, 0xec}, FarTransfer, 0, "", 4, 0, 0},
		// APX REX2: jmpabs takes a TIP, like libipt's indirect jump.
		{"jmpabs", []byte{0xd5, 0x00, 0xa1, 0x0d, 0x10, 0, 0, 0, 0, 0, 0}, IndirectJump, 0, "(unknown)", 11, 0, 0},
		{"rex2 mov", []byte{0xd5, 0x19, 0x89, 0xc8}, NotBranch, 0, "(unknown)", 4, 0, 0},
		{"rex2 0f imul", []byte{0xd5, 0x80, 0xaf, 0xc1}, NotBranch, 0, "(unknown)", 4, 0, 0},
		{"rex2 ptwrite", []byte{0xf3, 0xd5, 0x91, 0xae, 0xe0}, PTWrite, 0, "ptwrite", 5, 0, 0},
		{"mov cr3", []byte{0x0f, 0x22, 0xd8}, MovCR3, x86asm.MOV, "mov %rax,%cr3", 3, 0, 0},
		{"mov cr3 mod", []byte{0x41, 0x0f, 0x22, 0x1f}, MovCR3, x86asm.MOV, "mov", 4, 0, 0},
		{"mov cr0", []byte{0x0f, 0x22, 0xc0}, NotBranch, x86asm.MOV, "mov %rax,%cr0", 3, 0, 0},
		{"mov from cr3", []byte{0x0f, 0x20, 0xd8}, NotBranch, x86asm.MOV, "mov %cr3,%rax", 3, 0, 0},
		{"clac", []byte{0x0f, 0x01, 0xca}, NotBranch, 0, "", 3, 0, 0},
		{"evex fp16", []byte{0x62, 0xf5, 0x7c, 0x48, 0x58, 0xc1}, NotBranch, 0, "(evex)", 6, 0, 0},
		{"xop", []byte{0x8f, 0xe8, 0x78, 0xc0, 0xc1, 0x05}, NotBranch, 0, "(xop)", 6, 0, 0},
		{"rdfsbase is not ptwrite", []byte{0xf3, 0x48, 0x0f, 0xae, 0xc0}, NotBranch, x86asm.RDFSBASE, "rdfsbase %rax", 5, 0, 0},
	}
	// Text is x86asm's GNU syntax (its spellings: "callq", "ds jmp").
	for _, tt := range tests {
		in, err := Decode(tt.code, 0x1000)
		if err != nil {
			t.Errorf("%s: Decode(% x): %v", tt.name, tt.code, err)
			continue
		}
		if in.Class != tt.class || in.Op != tt.op || !strings.HasPrefix(in.Text, tt.text) || in.Len != tt.len || in.RelWidth != tt.rel || in.Target != tt.tgt {
			t.Errorf("%s: Decode(% x) = %+v (%v); want %v op %v %q len %d rel %d target 0x%x",
				tt.name, tt.code, in, in.Class, tt.class, tt.op, tt.text, tt.len, tt.rel, tt.tgt)
		}
		// Step gives the same without x86asm.
		st, err := Step(tt.code, 0x1000)
		if err != nil || st.Class != tt.class || st.Len != tt.len || st.RelWidth != tt.rel || st.Target != tt.tgt {
			t.Errorf("%s: Step(% x) = %+v, %v; want %v len %d rel %d target 0x%x", tt.name, tt.code, st, err, tt.class, tt.len, tt.rel, tt.tgt)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, code := range [][]byte{
		{},
		{0xf3},             // a bare prefix: x86asm gives Op 0
		{0xce},             // into: invalid in 64-bit mode
		{0xea, 1, 2, 3, 4}, // far jmp ptr16:32: invalid in 64-bit mode
		{0x0f, 0x1f},       // truncated
		{0xf3, 0x0f, 0x1e}, // truncated endbr
	} {
		if in, err := Decode(code, 0x1000); err == nil {
			t.Errorf("decode % x = %q, want error", code, in.Text)
		}
	}
	for _, tt := range []struct {
		code []byte
		text string
	}{
		{[]byte{0xf3, 0x0f, 0x1e, 0xfa, 0x55}, "endbr64"},
		{[]byte{0xf3, 0x0f, 0x1e, 0xfb}, "endbr32"},
	} {
		in, err := Decode(tt.code, 0x1000)
		if err != nil || in.Text != tt.text || in.Len != 4 {
			t.Errorf("decode % x = %q/%d, %v; want %s/4", tt.code, in.Text, in.Len, err, tt.text)
		}
	}
}

// TestDecodeModeMovCR3: a MOV to CR3 is an event site in 16- and 32-bit
// code as in 64-bit; other control registers are not.
func TestDecodeModeMovCR3(t *testing.T) {
	for _, tt := range []struct {
		mode int
		code []byte
		want Class
	}{
		{32, []byte{0x0f, 0x22, 0xd8}, MovCR3},
		{16, []byte{0x0f, 0x22, 0xd8}, MovCR3},
		{32, []byte{0x0f, 0x22, 0xe0}, NotBranch}, // cr4
		{32, []byte{0x0f, 0x20, 0xd8}, NotBranch}, // from cr3
	} {
		in, err := DecodeMode(tt.code, 0x1000, tt.mode)
		if err != nil || in.Class != tt.want {
			t.Errorf("DecodeMode(% x, %d) = %+v, %v; want %v", tt.code, tt.mode, in, err, tt.want)
		}
	}
}

func TestClassString(t *testing.T) {
	for c, want := range map[Class]string{NotBranch: "not a branch", CondJump: "conditional jump", Jump: "jump",
		Call: "call", IndirectJump: "indirect jump", IndirectCall: "indirect call", Ret: "return",
		FarTransfer: "far transfer", PTWrite: "ptwrite", MovCR3: "mov to cr3", 42: "class(42)"} {
		if c.String() != want {
			t.Errorf("%d.String() = %q, want %q", c, c.String(), want)
		}
	}
}

// checkAgainstX86asm decodes code at pc with Decode, Step, Length and
// x86asm. Decode, Step and Length agree on length, class and target, and
// fail together. Where x86asm decodes an instruction (Op not 0) that is
// not one Decode reads itself, Decode has its op and text when their
// lengths agree; misread reports the instructions where they do not.
func checkAgainstX86asm(t *testing.T, code []byte, pc uint64) (in Inst, ok, misread bool) {
	t.Helper()
	in, err := Decode(code, pc)
	st, serr := Step(code, pc)
	n, lerr := Length(code)
	if (err == nil) != (lerr == nil) || (serr == nil) != (lerr == nil) {
		t.Fatalf("% x: Decode %v, Step %v, Length %v", head(code, MaxLen), err, serr, lerr)
	}
	if err != nil {
		return in, false, false
	}
	if in.Len != n || st.Len != n || st.Class != in.Class || st.RelWidth != in.RelWidth || st.Target != in.Target {
		t.Fatalf("% x: Decode %+v, Step %+v, Length %d", head(code, MaxLen), in, st, n)
	}
	s, _ := scan(code)
	if s.class == PTWrite || in.Text == "endbr64" || in.Text == "endbr32" {
		return in, true, false
	}
	x, xerr := x86asm.Decode(code, 64)
	if !x86asmKnows(s, x, xerr) {
		if in.Op != 0 || in.Text != encodingNames[legacy] && in.Text != encodingNames[vex] &&
			in.Text != encodingNames[evex] && in.Text != encodingNames[xop] {
			t.Fatalf("% x: Decode %+v where x86asm knows nothing", head(code, MaxLen), in)
		}
		return in, true, false
	}
	if x.Len != n {
		return in, true, true
	}
	if in.Op != x.Op || in.Text != x86asm.GNUSyntax(x, pc, nil) {
		t.Fatalf("Decode(% x) = %+v; x86asm %v len %d %q", head(code, MaxLen), in, x.Op, x.Len, x86asm.GNUSyntax(x, pc, nil))
	}
	return in, true, false
}

// TestAgreesWithX86asm sweeps libc's .text and random bytes. In libc,
// x86asm misreads only vzeroupper and vzeroall (it takes a ModRM after
// them), which Decode steps over by the length decoder.
func TestAgreesWithX86asm(t *testing.T) {
	code, addr := libcText(t)
	classes := map[Class]int{}
	n, misreads := 0, 0
	for pc := 0; pc < len(code); {
		in, ok, misread := checkAgainstX86asm(t, code[pc:], addr+uint64(pc))
		if !ok {
			t.Fatalf("libc 0x%x: % x does not decode", addr+uint64(pc), head(code[pc:], MaxLen))
		}
		if misread {
			if in.Op != x86asm.VZEROUPPER && in.Op != x86asm.VZEROALL {
				t.Errorf("libc 0x%x: x86asm misreads %+v", addr+uint64(pc), in)
			}
			misreads++
		}
		classes[in.Class]++
		pc += in.Len
		n++
	}
	for c := NotBranch; c <= FarTransfer; c++ {
		if classes[c] == 0 {
			t.Errorf("no %v in libc's .text", c)
		}
	}
	t.Logf("%d instructions, classes %v, %d vzeroupper/vzeroall x86asm misreads", n, classes, misreads)
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, MaxLen)
	misreads = 0
	for range 50000 {
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		if _, _, misread := checkAgainstX86asm(t, buf, r.Uint64()); misread {
			misreads++
		}
	}
	t.Logf("random: %d x86asm misreads", misreads)
}

// FuzzDecode: any bytes give an instruction no longer than them (and than
// MaxLen) or an error, never a panic; x86asm agrees where it decodes.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{0xf3, 0x0f, 0x1e, 0xfa}, uint64(0x1000))
	f.Add([]byte{0xf3, 0x48, 0x0f, 0xae, 0x64, 0x24, 0x08}, uint64(0x1000))
	f.Add([]byte{0xe8, 0xfb, 0xff, 0xff, 0xff}, uint64(0))
	f.Fuzz(func(t *testing.T, code []byte, pc uint64) {
		in, ok, _ := checkAgainstX86asm(t, code, pc)
		if ok && (in.Len <= 0 || in.Len > len(code) || in.Len > MaxLen || in.Text == "") {
			t.Fatalf("Decode(% x) = %+v", code, in)
		}
		if ok && (in.RelWidth != 0) != (in.Class == CondJump || in.Class == Jump || in.Class == Call || in.Op == x86asm.XBEGIN) {
			t.Fatalf("Decode(% x) = %+v: relative width and class disagree", code, in)
		}
	})
}

func TestPrefixes(t *testing.T) {
	for _, tt := range []struct {
		code   []byte
		legacy []byte
		rex    byte
	}{
		{[]byte{0x55}, []byte{}, 0},
		{[]byte{0x41, 0x54}, []byte{}, 0x41},
		{[]byte{0x66, 0x0f, 0x1f, 0x40, 0x00}, []byte{0x66}, 0},
		{[]byte{0xf0, 0x48, 0x83, 0x04, 0x24, 0x00}, []byte{0xf0}, 0x48},
		{[]byte{0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0}, []byte{0x64}, 0x48},
		{[]byte{0x3e, 0xff, 0xe0}, []byte{0x3e}, 0},
		{[]byte{0x66, 0x66}, []byte{0x66, 0x66}, 0},
		{nil, []byte{}, 0},
	} {
		legacy, rex := Prefixes(tt.code)
		if !bytes.Equal(legacy, tt.legacy) || rex != tt.rex {
			t.Errorf("Prefixes(% x) = % x, %#x; want % x, %#x", tt.code, legacy, rex, tt.legacy, tt.rex)
		}
	}
}
