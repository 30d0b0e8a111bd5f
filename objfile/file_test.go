package objfile

import (
	"debug/elf"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"ptfs/internal/testkit"
)

// builds are the flavours of testdata/sites.c the ELF tests run on.
var builds = []struct {
	name  string
	flags []string
}{
	{"pie-cet", []string{"-fPIE", "-pie", "-fcf-protection=full"}},
	{"nopie", []string{"-fno-PIE", "-no-pie", "-fcf-protection=none"}},
}

func funcByName(t *testing.T, b *File, name string) Symbol {
	t.Helper()
	for _, s := range b.Functions() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no function %q", name)
	return Symbol{}
}

func TestFunctions(t *testing.T) {
	for _, bd := range builds {
		t.Run(bd.name, func(t *testing.T) {
			path := buildC(t, "sites", bd.flags...)
			b := openFile(t, path)
			fns := b.Functions()
			if !sort.SliceIsSorted(fns, func(i, j int) bool { return fns[i].Addr < fns[j].Addr }) {
				t.Error("functions not sorted by address")
			}
			seen := map[string]bool{}
			for _, f := range fns {
				k := f.Raw + "@" + strconv.FormatUint(f.Addr, 16)
				if seen[k] {
					t.Errorf("duplicate %s", k)
				}
				seen[k] = true
			}
			sites := funcByName(t, b, "sites")
			if sites.Size != 45 || sites.Addr%4096 != 0 {
				t.Errorf("sites = %+v, want size 45 at a page start", sites)
			}
			if pc := funcByName(t, b, "pagecross"); pc.Offset != sites.Offset+4093 || pc.Size != 4 {
				t.Errorf("pagecross = %+v, sites at 0x%x", pc, sites.Offset)
			}
			if cxx := funcByName(t, b, "ns::fn(int)"); cxx.Raw != "_ZN2ns2fnEi" {
				t.Errorf("ns::fn(int) raw name %q", cxx.Raw)
			}
			// The file offsets must agree with objdump's.
			want := objdumpFuncOffsets(t, path)
			for _, f := range fns {
				off, ok := want[f.Raw]
				if ok && off != f.Offset {
					t.Errorf("%s: offset 0x%x, objdump says 0x%x", f.Raw, f.Offset, off)
				}
				delete(want, f.Raw)
			}
			for name := range want {
				if !strings.HasPrefix(name, ".") && !strings.Contains(name, "@") {
					t.Errorf("objdump lists function %s, Functions does not", name)
				}
			}
		})
	}
}

// objdumpFuncOffsets returns the file offset of every symbol that heads
// disassembly in objdump -d -F output.
func objdumpFuncOffsets(t *testing.T, path string) map[string]uint64 {
	t.Helper()
	out, err := exec.Command("objdump", "-d", "-F", path).Output()
	if err != nil {
		testkit.Unavailable(t, "objdump not usable for the cross-check: %v", err)
	}
	re := regexp.MustCompile(`^[0-9a-f]+ <([^>]+)> \(File Offset: 0x([0-9a-f]+)\):$`)
	m := map[string]uint64{}
	for _, l := range strings.Split(string(out), "\n") {
		if g := re.FindStringSubmatch(l); g != nil {
			off, _ := strconv.ParseUint(g[2], 16, 64)
			m[g[1]] = off
		}
	}
	if len(m) == 0 {
		t.Fatal("objdump listed no functions")
	}
	return m
}

func TestAppendSymbols(t *testing.T) {
	tests := []struct {
		syms []Symbol
		want string
	}{
		{nil, ""},
		{[]Symbol{{Name: "main", Offset: 0x1040, Size: 37}}, "0x1040 37 main\n"},
		{[]Symbol{{Name: "main", Raw: "main", Offset: 0x1040, Size: 37}}, "0x1040 37 main\n"},
		// A demangled name gets its raw name as a tab-separated column.
		{[]Symbol{{Name: "a", Offset: 0, Size: 0}, {Name: "ns::fn(int, long)", Raw: "_ZN2ns2fnEil", Offset: 0xabc, Size: 5}},
			"0x0 0 a\n0xabc 5 ns::fn(int, long)\t_ZN2ns2fnEil\n"},
	}
	for _, tt := range tests {
		if got := string(AppendSymbols([]byte("x"), tt.syms)); got != "x"+tt.want {
			t.Errorf("AppendSymbols(%v) = %q, want %q", tt.syms, got, "x"+tt.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		AppendSymbols(make([]byte, 0, 256), tests[3].syms)
	}); n > 1 {
		t.Errorf("AppendSymbols allocates %v times into a big enough buffer", n)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bin, err := os.ReadFile(buildC(t, "sites"))
	if err != nil {
		t.Fatal(err)
	}
	i386 := append([]byte(nil), bin...)
	i386[18] = byte(elf.EM_386) // e_machine
	tests := []struct {
		path string
		want error
	}{
		{filepath.Join(dir, "missing"), fs.ErrNotExist},
		{write("text", []byte("#!/bin/sh\necho hi\n")), ErrBadBinary},
		{write("empty", nil), ErrBadBinary},
		{write("truncated", bin[:100]), ErrBadBinary},
		{write("i386", i386), ErrBadBinary},
	}
	for _, tt := range tests {
		b, err := Open(tt.path)
		if !errors.Is(err, tt.want) {
			t.Errorf("Open(%s) = %v, %v; want %v", filepath.Base(tt.path), b, err, tt.want)
		}
		if b != nil {
			b.Close()
		}
	}
}
