package probes

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"ptfs/internal/testkit"
	"ptfs/objfile"
)

// builds are the flavours of testdata/sites.c the ELF tests run on.
var builds = []struct {
	name  string
	flags []string
}{
	{"pie-cet", []string{"-fPIE", "-pie", "-fcf-protection=full"}},
	{"nopie", []string{"-fno-PIE", "-no-pie", "-fcf-protection=none"}},
}

func funcByName(t *testing.T, b *Binary, name string) objfile.Symbol {
	t.Helper()
	for _, s := range b.Functions() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no function %q", name)
	return objfile.Symbol{}
}

func TestResolve(t *testing.T) {
	type want struct {
		rel     int64 // site offset relative to function "sites"; -1: skip
		kind    VerdictKind
		insn    string // substring of the instruction text
		err     error
		errText string
	}
	common := []struct {
		spec string
		want want
	}{
		{"sites", want{0, Nop5, "nopl", nil, ""}},
		{"sites+5", want{5, Pun, "mov %rdi,%rax", nil, ""}},
		{"sites+0x8", want{8, Pun, "nop", nil, ""}},
		{"sites+8%multinop", want{8, MultiNop, "nop", nil, ""}},
		{"sites+13 %multinop", want{13, Refused, "nop", nil, ""}},
		{"sites+5 %multinop", want{5, Refused, "mov", nil, ""}},
		{"sites+18", want{18, Refused, "call", nil, ""}},
		{"sites+23", want{23, Refused, "call *%rax", nil, ""}},
		{"sites+25", want{25, Refused, "je", nil, ""}},
		{"sites+27", want{27, Refused, "syscall", nil, ""}},
		{"sites+29", want{29, Refused, "int3", nil, ""}},
		{"sites+30", want{30, Pun, "endbr64", nil, ""}},
		{"sites+34 %di", want{34, Pun, "mov", nil, ""}},
		{"sites+44", want{44, Pun, "ret", nil, ""}},
		{"sites+35", want{-1, 0, "", ErrBadSite, "inside the 10-byte instruction"}},
		{"sites+1", want{-1, 0, "", ErrBadSite, "inside the 5-byte instruction"}},
		{"sites+45", want{-1, 0, "", ErrBadSite, "past the end of sites"}},
		{"pagecross", want{4093, Refused, "mov", nil, ""}},
		{"ns::fn(int)", want{-1, Pun, "", nil, ""}},
		{"_ZN2ns2fnEi", want{-1, Pun, "", nil, ""}},
		{"nosuch", want{-1, 0, "", ErrNoSymbol, `no function "nosuch"`}},
		{"0x0", want{-1, 0, "", ErrBadSite, "non-executable segment"}},
		{"0x7fffffff", want{-1, 0, "", ErrBadSite, "beyond the end"}},
	}
	for _, bd := range builds {
		t.Run(bd.name, func(t *testing.T) {
			path := buildC(t, "sites", bd.flags...)
			b := openBinary(t, path)
			sites := funcByName(t, b, "sites")
			for _, tt := range common {
				site, err := b.Resolve(mustParse(t, tt.spec))
				if tt.want.err != nil {
					if !errors.Is(err, tt.want.err) || !strings.Contains(err.Error(), tt.want.errText) {
						t.Errorf("Resolve(%q) = %+v, %v; want %v with %q", tt.spec, site, err, tt.want.err, tt.want.errText)
					}
					continue
				}
				if err != nil {
					t.Errorf("Resolve(%q): %v", tt.spec, err)
					continue
				}
				if tt.want.rel >= 0 && site.Offset != sites.Offset+uint64(tt.want.rel) {
					t.Errorf("Resolve(%q).Offset = 0x%x, want sites+%d = 0x%x", tt.spec, site.Offset, tt.want.rel, sites.Offset+uint64(tt.want.rel))
				}
				if site.Addr-site.Offset != sites.Addr-sites.Offset {
					t.Errorf("Resolve(%q): addr 0x%x offset 0x%x disagree with the segment", tt.spec, site.Addr, site.Offset)
				}
				if site.Verdict.Kind != tt.want.kind || !strings.Contains(site.Insn, tt.want.insn) || site.Verdict.Insn != site.Insn {
					t.Errorf("Resolve(%q) = insn %q verdict %v, want %q %v", tt.spec, site.Insn, site.Verdict, tt.want.insn, tt.want.kind)
				}
				// The same site by file offset resolves the same.
				byOff, err := b.Resolve(&Spec{Offset: site.Offset, MultiNop: strings.Contains(tt.spec, "%multinop")})
				if err != nil || !reflect.DeepEqual(byOff, site) {
					t.Errorf("Resolve(0x%x) = %+v, %v; want %+v", site.Offset, byOff, err, site)
				}
			}
			// A non-executable PT_LOAD segment that lies after the text.
			for _, p := range b.Segments() {
				if p.Flags&elf.PF_X == 0 && p.Filesz > 0 && p.Off > sites.Offset {
					_, err := b.Resolve(&Spec{Offset: p.Off + p.Filesz/2})
					if !errors.Is(err, ErrBadSite) || !strings.Contains(err.Error(), "non-executable") {
						t.Errorf("offset in %v segment: %v", p.Flags, err)
					}
				}
			}
		})
	}
}

func TestResolveMultiNopEntry(t *testing.T) {
	// Without CET the patchable entry is at the 16-aligned function start;
	// with it, endbr64 comes first and the nops are not 8-aligned.
	tests := []struct {
		build int
		spec  string
		kind  VerdictKind
		text  string
	}{
		{1, "patched%multinop", MultiNop, "%multinop"},
		{1, "patched+1 %multinop", Refused, "not five 1-byte nops"},
		{0, "patched+4%multinop", Refused, "not 8-byte aligned"},
		{0, "patched %multinop", Refused, "not five 1-byte nops (f3 0f 1e fa 90)"},
		{0, "patched", Pun, "endbr64"},
	}
	bins := map[int]*Binary{}
	for _, tt := range tests {
		b := bins[tt.build]
		if b == nil {
			b = openBinary(t, buildC(t, "sites", builds[tt.build].flags...))
			bins[tt.build] = b
		}
		site, err := b.Resolve(mustParse(t, tt.spec))
		if err != nil {
			t.Errorf("%s: Resolve(%q): %v", builds[tt.build].name, tt.spec, err)
			continue
		}
		if site.Verdict.Kind != tt.kind || !strings.Contains(site.Verdict.String(), tt.text) {
			t.Errorf("%s: Resolve(%q) verdict %q, want %v with %q", builds[tt.build].name, tt.spec, site.Verdict, tt.kind, tt.text)
		}
		if site.Func != "patched" {
			t.Errorf("%s: Resolve(%q).Func = %q", builds[tt.build].name, tt.spec, site.Func)
		}
	}
}

// objdumpInsns returns the file offset and length of every instruction
// objdump -d -F prints for .text.
func objdumpInsns(t *testing.T, path string) (offs []uint64, lens []int) {
	t.Helper()
	out, err := exec.Command("objdump", "-d", "-F", "-j", ".text", "--insn-width=16", path).Output()
	if err != nil {
		testkit.Unavailable(t, "objdump not usable for the cross-check: %v", err)
	}
	head := regexp.MustCompile(`^([0-9a-f]+) <[^>]+> \(File Offset: 0x([0-9a-f]+)\):$`)
	insn := regexp.MustCompile(`^\s+([0-9a-f]+):\t((?:[0-9a-f]{2} )+)\s*\t(.*)$`)
	var delta uint64 // address - file offset
	nops := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if g := head.FindStringSubmatch(sc.Text()); g != nil {
			a, _ := strconv.ParseUint(g[1], 16, 64)
			o, _ := strconv.ParseUint(g[2], 16, 64)
			delta = a - o
			continue
		}
		g := insn.FindStringSubmatch(sc.Text())
		if g == nil || strings.Contains(g[3], "(bad)") {
			continue
		}
		// The 4 KiB run of 1-byte nops before pagecross would make the
		// sweeps quadratic: sample it.
		if g[2] == "90 " {
			nops++
			if nops%64 != 0 {
				continue
			}
		}
		a, _ := strconv.ParseUint(g[1], 16, 64)
		offs = append(offs, a-delta)
		lens = append(lens, len(strings.Fields(g[2])))
	}
	if len(offs) < 50 {
		t.Fatalf("objdump listed only %d instructions", len(offs))
	}
	return offs, lens
}

// TestResolveBoundariesObjdump checks every instruction boundary of .text
// against objdump, with symbols and, by linear sweep, stripped.
func TestResolveBoundariesObjdump(t *testing.T) {
	path := buildC(t, "sites", builds[0].flags...)
	stripped := filepath.Join(t.TempDir(), "stripped")
	if out, err := exec.Command("strip", "-s", "-o", stripped, path).CombinedOutput(); err != nil {
		testkit.Unavailable(t, "strip: %v %s", err, out)
	}
	offs, lens := objdumpInsns(t, path)
	for _, p := range []string{path, stripped} {
		b := openBinary(t, p)
		if p == stripped && len(b.Functions()) != 0 {
			t.Errorf("stripped binary still has %d functions", len(b.Functions()))
		}
		for i, off := range offs {
			site, err := b.Resolve(&Spec{Offset: off})
			if err != nil {
				t.Errorf("%s: instruction at 0x%x: %v", filepath.Base(p), off, err)
				continue
			}
			if site.Len != lens[i] {
				t.Errorf("%s: instruction at 0x%x: length %d, objdump %d (%s)", filepath.Base(p), off, site.Len, lens[i], site.Insn)
			}
			if lens[i] > 1 {
				if _, err := b.Resolve(&Spec{Offset: off + 1}); !errors.Is(err, ErrBadSite) {
					t.Errorf("%s: 0x%x is inside an instruction, Resolve says %v", filepath.Base(p), off+1, err)
				}
			}
		}
	}
}

// FuzzResolve opens mutated ELF files and resolves sites in them: bad input
// must give errors, never a panic or a hang.
func FuzzResolve(f *testing.F) {
	bin, err := os.ReadFile(buildC(f, "sites", "-s"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(bin, "0x1000")
	f.Add(bin[:4096], "main")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte, spec string) {
		s, err := Parse(spec)
		if err != nil {
			return
		}
		p := filepath.Join(dir, "bin")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := Open(p)
		if err != nil {
			return
		}
		defer b.Close()
		objfile.AppendSymbols(nil, b.Functions())
		b.Resolve(s)
		for _, fn := range b.Functions() {
			b.Resolve(&Spec{Offset: fn.Offset})
		}
	})
}

// TestResolveAmbiguous: a name that functions at several addresses carry
// (libc's memcpy: an IFUNC and an old version) is a spec error that names
// two of them and says what to do instead.
func TestResolveAmbiguous(t *testing.T) {
	const libc = "/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(libc); err != nil {
		testkit.Unavailable(t, "no libc: %v", err)
	}
	b := openBinary(t, libc)
	_, err := b.Resolve(mustParse(t, "memcpy"))
	want := regexp.MustCompile(`^bad probe spec: ambiguous symbol: symbol "memcpy" names 2 functions: memcpy at 0x[0-9a-f]+, memcpy at 0x[0-9a-f]+: use a file offset$`)
	var errno syscall.Errno
	if !errors.Is(err, ErrSyntax) || !errors.As(err, &errno) || errno != syscall.EINVAL || !want.MatchString(err.Error()) {
		t.Errorf("Resolve(memcpy) = %v, want ErrSyntax (EINVAL) matching %s", err, want)
	}
	// strlen is an IFUNC: its code is the resolver; the error names the
	// implementations it returns (libc has no .symtab: by file offset).
	_, err = b.Resolve(mustParse(t, "strlen"))
	ifunc := regexp.MustCompile(`^probe refused: strlen is a GNU IFUNC: the code at file offset 0x[0-9a-f]+ is its resolver, which runs once when the program loads; its implementations: 0x[0-9a-f]+(, 0x[0-9a-f]+){2,} \(probe one`)
	if !errors.Is(err, ErrRefused) || !ifunc.MatchString(err.Error()) {
		t.Errorf("Resolve(strlen) = %v, want ErrRefused matching %s", err, ifunc)
	}
}

// TestResolveReturn: a return probe goes at a function's entry, and its
// ptw verdict names the rets that stand in for it, each a ret in the file.
func TestResolveReturn(t *testing.T) {
	path := testkit.BuildC(t, filepath.Join("..", "testdata", "procs.c"), "-O0", "-pthread")
	b := openBinary(t, path)
	site, err := b.Resolve(mustParse(t, "fib%return r=$retval"))
	if err != nil {
		t.Fatal(err)
	}
	if site.Verdict.Kind != Rets || len(site.Rets) == 0 || !strings.Contains(site.Verdict.String(), "ptw: %return emulated by a probe on each ret of fib") {
		t.Fatalf("verdict %v, rets %x", site.Verdict, site.Rets)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range site.Rets {
		if c := data[off]; c != 0xc3 && c != 0xc2 {
			t.Errorf("ret at 0x%x is byte %#x", off, c)
		}
	}
	// The second instruction of fib is no entry.
	if _, err := b.Resolve(mustParse(t, fmt.Sprintf("fib+%d %%return", site.Len))); !errors.Is(err, ErrBadSite) || !strings.Contains(err.Error(), "function's entry") {
		t.Errorf("return probe inside fib: %v, want ErrBadSite", err)
	}
	// An entry probe is not judged as a return probe.
	if site, err := b.Resolve(mustParse(t, "fib")); err != nil || site.Verdict.Kind == Rets || site.Rets != nil {
		t.Errorf("entry probe: %+v, %v", site, err)
	}
}
