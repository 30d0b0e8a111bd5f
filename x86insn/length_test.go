package x86insn

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/hex"
	"errors"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/arch/x86/x86asm"

	"ptfs/internal/testkit"
)

// hexBytes parses "66 0f 1f" into bytes.
func hexBytes(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// TestLength: tricky encodings, each checked once against objdump -D -b
// binary (which splits off an ignored REX, and takes rel16 under 66 as AMD
// CPUs do).
func TestLength(t *testing.T) {
	tests := []struct{ name, code string }{
		{"cs nopw", "66 2e 0f 1f 84 00 00 00 00 00"},
		{"15-byte prefix soup", "66 66 66 66 66 66 2e 0f 1f 84 00 00 00 00 00"},
		{"lock rep segment soup", "f0 f3 65 67 66 0f b1 0c 24"},
		{"67 moffs", "67 a1 01 02 03 04"},
		{"moffs", "a1 01 02 03 04 05 06 07 08"},
		{"REX.W moffs store", "48 a3 01 02 03 04 05 06 07 08"},
		{"66 moffs", "66 a1 01 02 03 04 05 06 07 08"},
		{"REX before 66 is ignored", "48 66 b8 01 02"},
		{"66 then REX.W movabs", "66 48 b8 01 02 03 04 05 06 07 08"},
		{"movabs", "48 b8 01 02 03 04 05 06 07 08"},
		{"mov imm32", "b8 01 02 03 04"},
		{"66 mov imm16", "66 b8 01 02"},
		{"last REX counts", "41 48 b8 01 02 03 04 05 06 07 08"},
		{"first REX dropped", "48 41 b8 01 02 03 04"},
		{"c7 imm32", "c7 00 01 02 03 04"},
		{"66 c7 imm16", "66 c7 00 01 02"},
		{"REX.W c7 imm32", "48 c7 c0 01 02 03 04"},
		{"81 imm32", "81 c1 01 02 03 04"},
		{"66 81 imm16", "66 81 c1 01 02"},
		{"83 imm8", "83 c1 01"},
		{"69 imm32", "69 c0 01 02 03 04"},
		{"6b imm8", "6b c0 01"},
		{"f6 test imm8", "f6 c0 01"},
		{"f6 not", "f6 d0"},
		{"f7 test imm32 sib", "f7 04 24 01 02 03 04"},
		{"66 f7 test imm16", "66 f7 c0 01 02"},
		{"REX.W f7 neg", "48 f7 d8"},
		{"enter", "c8 10 00 00"},
		{"ret imm16", "c2 08 00"},
		{"push imm32", "68 01 02 03 04"},
		{"call rel32", "e8 01 02 03 04"},
		{"66 call keeps rel32", "66 e8 01 02 03 04"},
		{"jcc rel32", "0f 84 01 02 03 04"},
		{"jcc rel8", "74 fe"},
		{"loop", "e2 fe"},
		{"jecxz", "67 e3 fe"},
		{"rip-relative", "48 8b 05 01 02 03 04"},
		{"sib no base", "8b 04 25 01 02 03 04"},
		{"sib disp8", "8b 44 24 08"},
		{"sib disp32", "8b 84 24 01 02 03 04"},
		{"rbp disp8", "8b 45 00"},
		{"67 sib", "67 8b 04 24"},
		{"register", "8b c0"},
		{"x87", "dd 04 24"},
		{"endbr64", "f3 0f 1e fa"},
		{"ptwrite m64", "f3 48 0f ae 64 24 08"},
		{"xbegin", "c7 f8 01 02 03 04"},
		{"66 xbegin rel16", "66 c7 f8 01 02"},
		{"xabort", "c6 f8 01"},
		{"extrq imm8 imm8", "66 0f 78 c0 01 02"},
		{"insertq imm8 imm8", "f2 0f 78 c1 01 02"},
		{"vmread", "0f 78 c0"},
		{"ud1", "0f b9 c0"},
		{"ud0", "0f ff c0"},
		{"rdpkru", "0f 01 ee"},
		{"3DNow! reg", "0f 0f c1 b4"},
		{"3DNow! mem", "0f 0f 44 24 08 9e"},
		{"movdir64b", "66 0f 38 f8 01"},
		{"movdiri", "0f 38 f9 01"},
		{"palignr", "66 0f 3a 0f c1 08"},
		{"vex2 vmovdqu disp8", "c5 fe 6f 44 24 20"},
		{"vex3 map3 imm8", "c4 e3 7d 18 c1 01"},
		{"vex3 map2", "c4 e2 7d 58 c0"},
		{"vzeroupper", "c5 f8 77"},
		{"vzeroall", "c5 fc 77"},
		{"vex W1 L1 vpermq", "c4 e3 fd 00 c0 1b"},
		{"vex map1 imm8 shift", "c5 f1 73 d8 04"},
		{"vex map1 imm8 cmp", "c5 f8 c2 c1 00"},
		{"vex W1 vmovq", "c4 e1 f9 7e c0"},
		{"vex andn", "c4 e2 78 f2 c1"},
		{"vex rorx", "c4 e3 fb f0 c0 05"},
		{"vex rip", "c4 e2 7d 18 05 01 02 03 04"},
		{"evex disp8*N", "62 f1 fd 48 6f 44 24 01"},
		{"evex disp32", "62 f1 7d 48 6f 84 24 00 01 00 00"},
		{"evex map3 imm8", "62 f3 7d 48 3f c1 00"},
		{"evex map1 imm8", "62 f1 7c 28 c6 c1 1b"},
		{"evex map2 gpr", "62 f2 fd 28 7c c0"},
		{"evex map5 fp16", "62 f5 7c 48 58 c1"},
		{"evex map6 fp16", "62 f6 7d 48 2c 44 24 01"},
		{"xop map8 imm8", "8f e8 78 c0 c1 05"},
		{"xop map9", "8f e9 78 81 c1"},
		{"xop map10 imm32", "8f ea 78 10 c0 04 00 00 00"},
		{"pop r/m", "8f 00"},
		{"mov from cr ignores mod", "0f 20 00"},
		{"mov to dr ignores mod", "0f 23 80"},
	}
	for _, tt := range tests {
		code := hexBytes(t, tt.code)
		// Trailing bytes must not change the length.
		n, err := Length(append(code, 0x90, 0x90, 0x90))
		if err != nil || n != len(code) {
			t.Errorf("%s: Length(% x) = %d, %v; want %d", tt.name, code, n, err, len(code))
		}
		// Every strict prefix of the instruction is truncated.
		for i := range len(code) {
			if _, err := Length(code[:i]); !errors.Is(err, ErrTruncated) {
				t.Errorf("%s: Length(% x) = %v, want ErrTruncated", tt.name, code[:i], err)
			}
		}
	}
}

func TestLengthErrors(t *testing.T) {
	tests := []struct {
		code string
		want error
	}{
		{"", ErrTruncated},
		{"f3", ErrTruncated},
		{"48", ErrTruncated},
		{"66 48", ErrTruncated},
		{"8b 04 25 00", ErrTruncated},
		{"c4 e2", ErrTruncated},
		{"62 f1 fd 48", ErrTruncated},
		{"8f e8 78", ErrTruncated},
		{"66 66 66 66 66 66 66 66 66 66 66 66 66 66 66 90", ErrTooLong},
		{"f0 66 2e 67 48 81 84 24 01 02 03 04 01 02 03 04", ErrTooLong},
		{"06", ErrInvalid},                                  // push es
		{"27", ErrInvalid},                                  // daa
		{"60", ErrInvalid},                                  // pusha
		{"82 c0 01", ErrInvalid},                            // 82 alias of 80
		{"9a 01 02 03 04 05 06", ErrInvalid},                // far call ptr
		{"ce", ErrInvalid},                                  // into
		{"d4 0a", ErrInvalid},                               // aam
		{"d6", ErrInvalid},                                  // salc
		{"d5 00", ErrTruncated},                             // REX2 without an opcode
		{"d5 00 a1 01 02", ErrTruncated},                    // jmpabs cut short
		{"48 d5 00 a1 01 02 03 04 05 06 07 08", ErrInvalid}, // REX before REX2
		{"d5 00 74 00", ErrInvalid},                         // REX2 jcc
		{"d5 08 a1 01 02 03 04 05 06 07 08", ErrInvalid},    // REX2.W A1: no moffs
		{"d5 80 85 00 00 00 00", ErrInvalid},                // REX2 0F jcc
		{"d5 80 38 00 c0", ErrInvalid},                      // REX2 0F 38
		{"d5 00 66 90", ErrInvalid},                         // a prefix after REX2
		{"ea 01 02 03 04 05 06", ErrInvalid},                // far jmp ptr
		{"0f 04", ErrInvalid},
		{"0f 0a", ErrInvalid},
		{"0f 24 c0", ErrInvalid}, // mov from a test register
		{"0f 36", ErrInvalid},
		{"0f 39", ErrInvalid},
		{"0f a6", ErrInvalid},
		{"fe d0", ErrInvalid}, // FE /2
		{"ff f8", ErrInvalid}, // FF /7
		{"ff d8", ErrInvalid}, // far call from a register
		{"8f e0", ErrInvalid}, // 8F /4
		{"66 c5 f8 77", ErrInvalid},
		{"48 c5 f8 77", ErrInvalid},
		{"f0 62 f1 fd 48 6f c0", ErrInvalid},
		{"c4 e4 78 00 c0", ErrInvalid},    // VEX map 4
		{"c4 e0 78 00 c0", ErrInvalid},    // VEX map 0
		{"62 f0 7c 48 00 c0", ErrInvalid}, // EVEX map 0
		{"62 f4 7c 48 00 c0", ErrInvalid}, // EVEX map 4 (APX)
		{"62 f7 7c 48 00 c0", ErrInvalid}, // EVEX map 7
		{"8f eb 78 00 c0", ErrInvalid},    // XOP map 11
	}
	for _, tt := range tests {
		code := hexBytes(t, tt.code)
		if n, err := Length(code); !errors.Is(err, tt.want) {
			t.Errorf("Length(% x) = %d, %v; want %v", code, n, err, tt.want)
		}
		if _, err := Step(code, 0); !errors.Is(err, tt.want) {
			t.Errorf("Step(% x) = %v; want %v", code, err, tt.want)
		}
	}
}

// objdumpLine is an instruction as objdump -d -w prints it.
var objdumpLine = regexp.MustCompile(`^ *([0-9a-f]+):\t([0-9a-f]{2}(?: [0-9a-f]{2})*) *\t(.*)$`)

// objdumpAddr is the start of any line of objdump's that shows an
// instruction: objdumpLine must match them all.
var objdumpAddr = regexp.MustCompile(`^ *[0-9a-f]+:\t`)

// objdumpPrefixes are the words objdump prints before a mnemonic.
var objdumpPrefixes = map[string]bool{"bnd": true, "notrack": true, "lock": true, "rep": true, "repz": true,
	"repnz": true, "repe": true, "repne": true, "data16": true, "addr32": true, "cs": true, "ds": true,
	"es": true, "ss": true, "fs": true, "gs": true, "xacquire": true, "xrelease": true}

// objdumpClass classes an instruction by objdump's text, e.g. "bnd jmp
// *%rax", and returns a direct branch's target ("jmp 26000 <f+0x10>").
func objdumpClass(text string) (Class, uint64, bool) {
	f := strings.Fields(text)
	for len(f) > 0 && (objdumpPrefixes[f[0]] || strings.HasPrefix(f[0], "rex")) {
		f = f[1:]
	}
	if len(f) == 0 {
		return NotBranch, 0, false
	}
	op, arg := f[0], ""
	if len(f) > 1 {
		arg = f[1]
	}
	direct := func(c Class) (Class, uint64, bool) {
		tgt, err := strconv.ParseUint(arg, 16, 64)
		return c, tgt, err == nil
	}
	switch {
	case op == "jmp" || op == "jmpq" || op == "jmpw":
		if strings.HasPrefix(arg, "*") {
			return IndirectJump, 0, false
		}
		return direct(Jump)
	case op == "call" || op == "callq" || op == "callw":
		if strings.HasPrefix(arg, "*") {
			return IndirectCall, 0, false
		}
		return direct(Call)
	case strings.HasPrefix(op, "loop") || op == "jrcxz" || op == "jecxz" || op[0] == 'j':
		return direct(CondJump)
	case op == "ret" || op == "retq" || op == "retw":
		return Ret, 0, false
	case strings.HasPrefix(op, "ljmp"), strings.HasPrefix(op, "lcall"), strings.HasPrefix(op, "lret"),
		strings.HasPrefix(op, "int"), strings.HasPrefix(op, "iret"), op == "icebp",
		op == "syscall", strings.HasPrefix(op, "sysret"), op == "sysenter", strings.HasPrefix(op, "sysexit"):
		return FarTransfer, 0, false
	case strings.HasPrefix(op, "ptwrite"):
		return PTWrite, 0, false
	}
	return NotBranch, 0, false
}

// TestObjdump holds Length and Step to objdump -d on every instruction of
// this machine's libc and ld.so: length, class, and the target of direct
// branches. (TestAgreesWithX86asm holds Decode to Step.)
func TestObjdump(t *testing.T) {
	objdump, err := exec.LookPath("objdump")
	if err != nil {
		testkit.Unavailable(t, "no objdump: %v", err)
	}
	for _, file := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"} {
		t.Run(file, func(t *testing.T) { checkObjdump(t, objdump, file) })
	}
}

func checkObjdump(t *testing.T, objdump, file string) {
	f, err := elf.Open(file)
	if err != nil {
		testkit.Unavailable(t, "%v", err)
	}
	defer f.Close()
	var secs []*elf.Section
	var datas [][]byte
	for _, s := range f.Sections {
		if s.Type == elf.SHT_PROGBITS && s.Flags&elf.SHF_EXECINSTR != 0 {
			d, err := s.Data()
			if err != nil {
				t.Fatalf("%s %s: %v", file, s.Name, err)
			}
			secs, datas = append(secs, s), append(datas, d)
		}
	}
	codeAt := func(addr uint64) []byte {
		for i, s := range secs {
			if addr >= s.Addr && addr < s.Addr+uint64(len(datas[i])) {
				return datas[i][addr-s.Addr:]
			}
		}
		return nil
	}
	out, err := exec.Command(objdump, "-d", "-w", "-z", file).Output()
	if err != nil {
		t.Fatalf("objdump %s: %v", file, err)
	}
	n, bad, mismatches := 0, 0, 0
	classes := map[Class]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	encodings := map[string]int{}
	for sc.Scan() {
		m := objdumpLine.FindStringSubmatch(sc.Text())
		if m == nil {
			if objdumpAddr.MatchString(sc.Text()) {
				t.Errorf("%s: unparsed objdump line %q", file, sc.Text())
			}
			continue
		}
		addr, _ := strconv.ParseUint(m[1], 16, 64)
		want := hexBytes(t, m[2])
		code := codeAt(addr)
		if !bytes.HasPrefix(code, want) {
			t.Fatalf("%s 0x%x: objdump shows % x, the file holds % x", file, addr, want, head(code, len(want)))
		}
		n++
		length, lerr := Length(code)
		st, serr := Step(code, addr)
		if strings.Contains(m[3], "(bad)") {
			// objdump refuses: so must the length decoder.
			bad++
			if lerr == nil {
				t.Errorf("%s 0x%x: objdump: (bad) % x; Length %d", file, addr, want, length)
			}
			continue
		}
		if s, err := scan(code); err == nil {
			encodings[[...]string{legacy: "legacy", vex: "vex", evex: "evex", xop: "xop"}[s.enc]]++
		}
		class, target, direct := objdumpClass(m[3])
		classes[class]++
		if lerr != nil || serr != nil || length != len(want) || st.Len != len(want) ||
			st.Class != class || direct && st.Target != target {
			mismatches++
			if mismatches <= 20 {
				t.Errorf("%s 0x%x: objdump % x %q (%v 0x%x); Length %d %v, Step %+v %v",
					file, addr, want, m[3], class, target, length, lerr, st, serr)
			}
		}
	}
	if n == 0 {
		t.Fatalf("%s: no instructions in objdump's output", file)
	}
	if mismatches != 0 {
		t.Errorf("%s: %d of %d instructions disagree with objdump", file, mismatches, n)
	}
	t.Logf("%s: %d instructions agree with objdump (%d (bad), all refused), classes %v, encodings %v",
		file, n-bad, bad, classes, encodings)
}

// FuzzLength: any bytes give a length in 1..min(15, len) or an error,
// never a panic; Step agrees, and its tables with the general scan; where x86asm decodes an instruction that it
// does not misread, its length agrees.
func FuzzLength(f *testing.F) {
	for _, s := range []string{"c5 f8 77", "62 f1 fd 48 6f 44 24 01", "8f ea 78 10 c0 04 00 00 00",
		"66 66 66 66 66 66 2e 0f 1f 84 00 00 00 00 00", "48 66 b8 01 02", "0f 0f 44 24 08 9e"} {
		f.Add(hexBytes(f, s))
	}
	f.Fuzz(func(t *testing.T, code []byte) {
		n, err := Length(code)
		st, serr := Step(code, 0x1000)
		if (err == nil) != (serr == nil) || err == nil && st.Len != n {
			t.Fatalf("% x: Length %d %v, Step %+v %v", code, n, err, st, serr)
		}
		// Step's tables (Run) give what the general scan gives.
		if sc, _ := stepScan(code, 0x1000); err == nil && st != sc {
			t.Fatalf("% x: Step %+v, scan %+v", code, st, sc)
		}
		if err != nil {
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLong) {
				t.Fatalf("% x: error without a sentinel: %v", code, err)
			}
			if x, xerr := x86asm.Decode(code, 64); xerr == nil && x.Op != 0 && !x86asmOnly(code, x, err) {
				t.Fatalf("% x: Length %v, x86asm %v", code, err, x86asm.GNUSyntax(x, 0, nil))
			}
			return
		}
		if n < 1 || n > MaxLen || n > len(code) {
			t.Fatalf("Length(% x) = %d", code, n)
		}
		s, _ := scan(code)
		x, xerr := x86asm.Decode(code, 64)
		if x86asmKnows(s, x, xerr) && !x86asmMisreads(x) && x.Len != n {
			t.Fatalf("Length(% x) = %d, x86asm %v len %d", code, n, x86asm.GNUSyntax(x, 0, nil), x.Len)
		}
	})
}

// x86asmMisreads tells the instructions whose length x86asm gets wrong:
// vzeroupper and vzeroall (it reads a ModRM after them), and mov to or from
// a control or debug register, whose ModRM mod it does not always ignore.
func x86asmMisreads(x x86asm.Inst) bool {
	if x.Op == x86asm.VZEROUPPER || x.Op == x86asm.VZEROALL {
		return true
	}
	for _, a := range x.Args {
		if r, ok := a.(x86asm.Reg); ok && r >= x86asm.CR0 && r <= x86asm.DR15 {
			return true
		}
	}
	return false
}

// x86asmOnly tells the instructions x86asm decodes where Length errs
// rightly: those invalid in 64-bit mode (mov to or from a test register,
// 0F 24 and 0F 26; EVEX maps 0, 4 and 7, read by x86asm as maps 0 to 3),
// what goes past 15 bytes, and truncated instructions (x86asm decodes
// some truncated EVEX ones).
func x86asmOnly(code []byte, x x86asm.Inst, err error) bool {
	if x.Len > MaxLen {
		return true
	}
	if errors.Is(err, ErrTruncated) {
		n, err := Length(append(code[:len(code):len(code)], make([]byte, MaxLen)...))
		if err == nil && n > len(code) {
			return true
		}
	}
	for _, a := range x.Args {
		if r, ok := a.(x86asm.Reg); ok && r >= x86asm.TR0 && r <= x86asm.TR7 {
			return true
		}
	}
	i := 0
	for i < len(code) && (isPrefix(code[i])) {
		i++
	}
	return i+1 < len(code) && code[i] == 0x62 && code[i+1]&7 != 1 && code[i+1]&7 != 2 && code[i+1]&7 != 3
}

// isPrefix tells legacy prefixes and REX.
func isPrefix(b byte) bool {
	switch b {
	case 0x66, 0x67, 0xf2, 0xf3, 0xf0, 0x26, 0x2e, 0x36, 0x3e, 0x64, 0x65:
		return true
	}
	return b&0xf0 == 0x40
}

// libcText returns libc's .text and its address.
func libcText(t testing.TB) ([]byte, uint64) {
	t.Helper()
	f, err := elf.Open("/lib/x86_64-linux-gnu/libc.so.6")
	if err != nil {
		testkit.Unavailable(t, "no libc: %v", err)
	}
	defer f.Close()
	text := f.Section(".text")
	if text == nil {
		t.Fatal("libc has no .text")
	}
	code, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	return code, text.Addr
}

// BenchmarkWalk walks libc's .text instruction by instruction, reporting
// ns (wall and CPU) per instruction: Step (the flow decoder's path),
// Length, Decode, and x86asm.Decode alone (without GNU text), the reference
// in the same run.
func BenchmarkWalk(b *testing.B) {
	code, addr := libcText(b)
	// walkN steps over the code with step, which returns the size and
	// number of the instructions it decoded.
	walkN := func(b *testing.B, step func(code []byte, pc uint64) (size, n int, err error)) {
		b.ReportAllocs()
		insns := 0
		cpu0 := testkit.CPUTime()
		for b.Loop() {
			for pc := 0; pc < len(code); {
				size, n, err := step(code[pc:], addr+uint64(pc))
				if err != nil {
					b.Fatalf("0x%x: %v", addr+uint64(pc), err)
				}
				pc += size
				insns += n
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(insns), "ns/insn")
		// CPU time: on a shared machine, wall time measures the load too.
		b.ReportMetric(float64((testkit.CPUTime()-cpu0).Nanoseconds())/float64(insns), "cpu-ns/insn")
	}
	walk := func(b *testing.B, step func(code []byte, pc uint64) (int, error)) {
		walkN(b, func(code []byte, pc uint64) (int, int, error) {
			n, err := step(code, pc)
			return n, 1, err
		})
	}
	b.Run("Step", func(b *testing.B) {
		walk(b, func(code []byte, pc uint64) (int, error) {
			in, err := Step(code, pc)
			return in.Len, err
		})
	})
	b.Run("Run", func(b *testing.B) {
		// As a block decoder: up to each branch at once (64 at most),
		// the instructions near the end one by one.
		var lens [64]uint8
		walkN(b, func(code []byte, pc uint64) (int, int, error) {
			n, end, _, _ := Run(code, pc, lens[:])
			if n == 0 {
				in, err := Step(code, pc)
				return in.Len, 1, err
			}
			return end, n, nil
		})
	})
	b.Run("Length", func(b *testing.B) {
		walk(b, func(code []byte, _ uint64) (int, error) { return Length(code) })
	})
	b.Run("x86asm.Decode", func(b *testing.B) {
		walk(b, func(code []byte, _ uint64) (int, error) {
			x, err := x86asm.Decode(code, 64)
			if err != nil || x.Op == 0 {
				n, lerr := Length(code) // endbr64, ptwrite, rdpkru...: step over them
				return n, lerr
			}
			if x.Op == x86asm.VZEROUPPER || x.Op == x86asm.VZEROALL {
				return 3, nil // x86asm's length is wrong
			}
			return x.Len, err
		})
	})
	b.Run("Decode", func(b *testing.B) {
		walk(b, func(code []byte, pc uint64) (int, error) {
			in, err := Decode(code, pc)
			return in.Len, err
		})
	})
}
