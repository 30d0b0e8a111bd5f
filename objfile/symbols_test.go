package objfile

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"ptfs/internal/testkit"
)

// TestSymbolAtTable checks SymbolAt on hand-made tables: nested functions,
// aliases, functions of unknown size, gaps, and a size that wraps.
func TestSymbolAtTable(t *testing.T) {
	syms := []Symbol{
		{Raw: "zero", Addr: 0x10},                  // size unknown: holds 0x10 only
		{Raw: "outer", Addr: 0x100, Size: 0x100},   // [0x100, 0x200)
		{Raw: "inner", Addr: 0x140, Size: 0x20},    // [0x140, 0x160) inside outer
		{Raw: "innermost", Addr: 0x150, Size: 0x4}, // [0x150, 0x154) inside inner
		{Raw: "alias_a", Addr: 0x300, Size: 0x10},  // two names of one function
		{Raw: "alias_b", Addr: 0x300, Size: 0x10},
		{Raw: "short", Addr: 0x400, Size: 0x8},
		{Raw: "mark", Addr: 0x404},                   // zero size inside short
		{Raw: "wrap", Addr: 0x500, Size: ^uint64(0)}, // end wraps to 0x4ff
	}
	f := &File{syms: syms}
	f.linkOuter()
	tests := []struct {
		addr uint64
		want string // "" for none
		off  uint64
	}{
		{0x0, "", 0}, {0x10, "zero", 0}, {0x11, "", 0},
		{0xff, "", 0}, {0x100, "outer", 0}, {0x13f, "outer", 0x3f},
		{0x140, "inner", 0}, {0x14f, "inner", 0xf}, {0x150, "innermost", 0}, {0x153, "innermost", 3},
		{0x154, "inner", 0x14}, {0x15f, "inner", 0x1f}, {0x160, "outer", 0x60}, {0x1ff, "outer", 0xff},
		{0x200, "", 0}, {0x2ff, "", 0},
		{0x300, "alias_b", 0}, {0x30f, "alias_b", 0xf}, {0x310, "", 0},
		{0x400, "short", 0}, {0x404, "mark", 0}, {0x405, "short", 5}, {0x408, "", 0},
		{0x500, "wrap", 0}, {0x501, "", 0}, {^uint64(0), "", 0},
	}
	for _, tt := range tests {
		s, off, ok := f.SymbolAt(tt.addr)
		if got := map[bool]string{true: s.Raw}[ok]; got != tt.want || ok && off != tt.off {
			t.Errorf("SymbolAt(0x%x) = %q+0x%x, %v; want %q+0x%x", tt.addr, s.Raw, off, ok, tt.want, tt.off)
		}
		if i := linearSymbolAt(syms, tt.addr); i != f.symbolAt(tt.addr) {
			t.Errorf("SymbolAt(0x%x): index %d, the linear scan says %d", tt.addr, f.symbolAt(tt.addr), i)
		}
	}
}

// TestSymbolAtFiles checks SymbolAt on real files against the linear scan
// at each function's start, middle, last byte and end, and the gaps.
func TestSymbolAtFiles(t *testing.T) {
	forEachFile(t, func(t *testing.T, name, path string, f *File) {
		if len(f.syms) < 10 {
			t.Fatalf("only %d functions", len(f.syms))
		}
		n := 0
		for _, s := range f.syms {
			for _, a := range []uint64{s.Addr - 1, s.Addr, s.Addr + s.Size/2, s.Addr + s.Size - 1, s.Addr + s.Size} {
				want := linearSymbolAt(f.syms, a)
				got, off, ok := f.SymbolAt(a)
				if ok != (want >= 0) || ok && (got != f.syms[want] || off != a-got.Addr) {
					t.Fatalf("SymbolAt(0x%x) = %+v+0x%x, %v; the linear scan says %d", a, got, off, ok, want)
				}
				n++
			}
		}
		if name == "libc" {
			return
		}
		sites := funcByName(t, f, "sites")
		for _, tt := range []struct {
			rel  uint64
			want string
		}{{0, "sites"}, {44, "sites"}, {45, ""}, {4092, ""}, {4093, "pagecross"}, {4096, "pagecross"}} {
			s, off, ok := f.SymbolAt(sites.Addr + tt.rel)
			if ok && (s.Name != tt.want || s.Addr+off != sites.Addr+tt.rel) || !ok && tt.want != "" {
				t.Errorf("SymbolAt(sites+%d) = %q+%d, %v; want %q", tt.rel, s.Name, off, ok, tt.want)
			}
		}
	})
}

// TestLibcSymbols checks the symbols of libc against readelf's .dynsym:
// the count of defined functions, sizes, and the IFUNC flag.
func TestLibcSymbols(t *testing.T) {
	f := openLibc(t)
	out, err := exec.Command("readelf", "--dyn-syms", "-W", libcPath).Output()
	if err != nil {
		testkit.Unavailable(t, "readelf not usable for the cross-check: %v", err)
	}
	type entry struct {
		size  uint64
		ifunc bool
	}
	want := map[string]entry{} // "name@addr"
	for _, l := range strings.Split(string(out), "\n") {
		fl := strings.Fields(l)
		if len(fl) < 8 || (fl[3] != "FUNC" && fl[3] != "IFUNC") || fl[6] == "UND" {
			continue
		}
		addr, err1 := strconv.ParseUint(fl[1], 16, 64)
		size, err2 := strconv.ParseUint(fl[2], 0, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("readelf line %q", l)
		}
		name, _, _ := strings.Cut(fl[7], "@")
		want[name+"@"+strconv.FormatUint(addr, 16)] = entry{size, fl[3] == "IFUNC"}
	}
	if len(want) < 1000 {
		t.Fatalf("readelf lists only %d functions", len(want))
	}
	fns := f.Functions()
	if len(fns) != len(want) {
		t.Errorf("%d functions, readelf's .dynsym has %d", len(fns), len(want))
	}
	for _, s := range fns {
		k := s.Raw + "@" + strconv.FormatUint(s.Addr, 16)
		if w, ok := want[k]; !ok || w.size != s.Size || w.ifunc != s.IFunc {
			t.Errorf("%s: size %d ifunc %v; readelf: %+v (listed %v)", k, s.Size, s.IFunc, w, ok)
		}
	}
	// strlen is an IFUNC; memcpy has an IFUNC (GLIBC_2.14) and an old
	// plain version (GLIBC_2.2.5) at another address.
	if s, err := f.Lookup("strlen"); err != nil || !s.IFunc {
		t.Errorf("Lookup(strlen) = %+v, %v; want an IFUNC", s, err)
	}
	ifuncs := 0
	for _, s := range fns {
		if s.Raw == "memcpy" && s.IFunc {
			ifuncs++
		}
	}
	if ifuncs != 1 {
		t.Errorf("%d memcpy IFUNCs, want 1", ifuncs)
	}
	_, err = f.Lookup("memcpy")
	if !errors.Is(err, ErrAmbiguous) || !errors.Is(err, syscall.EINVAL) || !regexp.MustCompile(`^ambiguous symbol: symbol "memcpy" names 2 functions: memcpy at 0x[0-9a-f]+, memcpy at 0x[0-9a-f]+: use a file offset$`).MatchString(err.Error()) {
		t.Errorf("Lookup(memcpy) = %v, want ErrAmbiguous", err)
	}
	// libc imports from ld.so (versioned): the hint names it.
	if _, err := f.Lookup("_dl_find_dso_for_object"); !errors.Is(err, ErrNoSymbol) || !strings.HasSuffix(err.Error(), "_dl_find_dso_for_object is in ld-linux-x86-64.so.2: add it as a target") {
		t.Errorf("Lookup(_dl_find_dso_for_object) = %v, want the library hint", err)
	}
	if s, err := f.Lookup("malloc"); err != nil || s.Size == 0 || s.IFunc {
		t.Errorf("Lookup(malloc) = %+v, %v", s, err)
	}
	_, err = f.Lookup("no_such_function")
	if !errors.Is(err, ErrNoSymbol) || !errors.Is(err, syscall.ENOENT) || !strings.HasSuffix(err.Error(), `no function "no_such_function" in `+libcPath+": no symbol table: use a file offset from `objdump -d`") {
		t.Errorf("Lookup(no_such_function) = %v, want ErrNoSymbol", err)
	}
}

// TestSegments checks the PT_LOAD segments against readelf -l and the
// address/offset mapping both ways at the start, middle and last byte of
// every segment's file image, and just past it.
func TestSegments(t *testing.T) {
	forEachFile(t, func(t *testing.T, name, path string, f *File) {
		out, err := exec.Command("readelf", "-lW", path).Output()
		if err != nil {
			testkit.Unavailable(t, "readelf not usable for the cross-check: %v", err)
		}
		var want []Segment
		for _, l := range strings.Split(string(out), "\n") {
			fl := strings.Fields(l)
			if len(fl) < 7 || fl[0] != "LOAD" {
				continue
			}
			var v [5]uint64
			for i := range v {
				v[i], err = strconv.ParseUint(fl[1+i], 0, 64)
				if err != nil {
					t.Fatalf("readelf line %q", l)
				}
			}
			want = append(want, Segment{Off: v[0], Vaddr: v[1], Filesz: v[3], Memsz: v[4]})
		}
		segs := f.Segments()
		if len(segs) != len(want) || len(segs) < 2 {
			t.Fatalf("%d segments, readelf lists %d", len(segs), len(want))
		}
		execs := 0
		for i, s := range segs {
			w := want[i]
			w.Flags = s.Flags
			if s != w {
				t.Errorf("segment %d = %+v, readelf %+v", i, s, w)
			}
			if s.Exec() {
				execs++
			}
			for _, a := range []uint64{s.Vaddr, s.Vaddr + s.Filesz/2, s.Vaddr + s.Filesz - 1} {
				off, ok := f.Offset(a)
				if !ok || off != a-s.Vaddr+s.Off {
					t.Errorf("Offset(0x%x) = 0x%x, %v; want 0x%x", a, off, ok, a-s.Vaddr+s.Off)
					continue
				}
				if back, ok := f.Addr(off); !ok || back != a {
					t.Errorf("Addr(Offset(0x%x) = 0x%x) = 0x%x, %v", a, off, back, ok)
				}
			}
			if a := s.Vaddr + s.Filesz; a < s.Vaddr+s.Memsz {
				if off, ok := f.Offset(a); ok {
					t.Errorf("Offset(0x%x), past the file image of %+v, = 0x%x", a, s, off)
				}
			}
		}
		if execs != 1 {
			t.Errorf("%d executable segments, want 1", execs)
		}
	})
}

// TestReadCode reads a function's bytes by address and compares them with
// the file's; a read stops at the end of the segment's file image.
func TestReadCode(t *testing.T) {
	path := buildC(t, "sites", builds[0].flags...)
	f := openFile(t, path)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sites := funcByName(t, f, "sites")
	code, err := f.ReadCode(sites.Addr, sites.Size)
	if err != nil || string(code) != string(raw[sites.Offset:sites.Offset+sites.Size]) || code[0] != 0x0f || code[44] != 0xc3 {
		t.Errorf("ReadCode(sites) = % x, %v", code, err)
	}
	seg, _ := f.SegmentAt(sites.Addr)
	last := seg.Vaddr + seg.Filesz - 2
	if code, err := f.ReadCode(last, 15); err != nil || len(code) != 2 {
		t.Errorf("ReadCode at 2 bytes before the segment's end = % x, %v; want 2 bytes", code, err)
	}
	if _, err := f.ReadCode(1<<60, 4); !errors.Is(err, ErrNoCode) {
		t.Errorf("ReadCode outside every segment: %v, want ErrNoCode", err)
	}
}

func TestSafely(t *testing.T) {
	err := safely(func() error { panic("index out of range") })
	if err == nil || !strings.Contains(err.Error(), "index out of range") {
		t.Errorf("safely(panic) = %v", err)
	}
	want := errors.New("plain")
	if err := safely(func() error { return want }); err != want {
		t.Errorf("safely(error) = %v", err)
	}
}

// FuzzOpen opens mutated ELF files and exercises every query: bad input
// must give errors, never a panic or a hang.
func FuzzOpen(f *testing.F) {
	bin, err := os.ReadFile(buildC(f, "sites"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(bin, uint64(0x1000))
	f.Add(bin[:4096], uint64(0))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte, addr uint64) {
		p := filepath.Join(dir, "bin")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := Open(p)
		if err != nil {
			if !errors.Is(err, ErrBadBinary) {
				t.Fatalf("Open: %v, not ErrBadBinary", err)
			}
			return
		}
		defer b.Close()
		AppendSymbols(nil, b.Functions())
		for _, s := range b.Functions() {
			if got := b.symbolAt(s.Addr); got < 0 || got != linearSymbolAt(b.syms, s.Addr) {
				t.Fatalf("SymbolAt(0x%x) = %d, the linear scan says %d", s.Addr, got, linearSymbolAt(b.syms, s.Addr))
			}
			b.Lookup(s.Name)
		}
		if got, want := b.symbolAt(addr), linearSymbolAt(b.syms, addr); got != want {
			t.Fatalf("SymbolAt(0x%x) = %d, the linear scan says %d", addr, got, want)
		}
		b.ReadCode(addr, 15)
		if off, ok := b.Offset(addr); ok {
			b.Addr(off)
		}
		for _, s := range b.Segments() {
			b.SweepStart(s.Vaddr+s.Filesz/2, s)
		}
	})
}

// BenchmarkSymbolAt looks up the function of an address in libc: at every
// function's start and middle and just past its end, by binary search
// (SymbolAt) and by the linear scan it replaced, in the same run.
func BenchmarkSymbolAt(b *testing.B) {
	f := openLibc(b)
	var addrs []uint64
	for _, s := range f.syms {
		addrs = append(addrs, s.Addr, s.Addr+s.Size/2, s.Addr+s.Size)
	}
	for _, bm := range []struct {
		name string
		at   func(uint64) int
	}{
		{"binary", f.symbolAt},
		{"linear", func(a uint64) int { return linearSymbolAt(f.syms, a) }},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				for _, a := range addrs {
					if bm.at(a) >= 0 {
						n++
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(addrs)), "ns/lookup")
			if n == 0 {
				b.Fatal("no address found")
			}
		})
	}
}
