package images

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"ptfs/internal/testkit"
)

func TestParseRawSpec(t *testing.T) {
	tests := []struct {
		spec string
		want RawSpec
		err  bool
	}{
		{"loop.bin:0x100000", RawSpec{Path: "loop.bin", Base: 0x100000}, false},
		{"loop.bin:0x10:0x100000", RawSpec{Path: "loop.bin", From: 0x10, Base: 0x100000}, false},
		{"loop.bin:0x10-0x20:4096", RawSpec{Path: "loop.bin", From: 0x10, To: 0x20, Base: 4096}, false},
		{"a:b.bin:0x1000", RawSpec{Path: "a:b.bin", Base: 0x1000}, false},
		{"dir:1/x.bin:010:0x1000", RawSpec{Path: "dir:1/x.bin", From: 8, Base: 0x1000}, false},
		{"loop.bin", RawSpec{}, true},
		{"loop.bin:", RawSpec{}, true},
		{":0x1000", RawSpec{}, true},
		{"loop.bin:0x1_000", RawSpec{}, true},
		{"loop.bin:0x20-0x10:0x1000", RawSpec{}, true},
		{"loop.bin:0x10-:0x1000", RawSpec{}, true},
		{"loop.bin:0x10000000000000000", RawSpec{}, true},
	}
	for _, tt := range tests {
		got, err := ParseRawSpec(tt.spec)
		if tt.err {
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("ParseRawSpec(%q) = %+v, %v; want ErrSyntax", tt.spec, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseRawSpec(%q) = %+v, %v; want %+v", tt.spec, got, err, tt.want)
		}
	}
}

func TestRawSpecMap(t *testing.T) {
	path := writeFile(t, "img.bin", []byte{0, 1, 2, 3, 4, 5, 6, 7})
	s := NewSpace()
	if err := (RawSpec{Path: path, From: 2, To: 5, Base: 0x1000}).Map(s); err != nil {
		t.Fatal(err)
	}
	checkMappings(t, s, []want{{0x1000, 0x1003, 2, path}})
	buf := make([]byte, 8)
	if n, _ := s.ReadAt(buf, 0x1000); !bytes.Equal(buf[:n], []byte{2, 3, 4}) {
		t.Errorf("read % x, want 02 03 04", buf[:n])
	}
	for _, r := range []RawSpec{{Path: path, From: 8}, {Path: path, From: 2, To: 9}} {
		if err := r.Map(s); !errors.Is(err, ErrBadMapping) {
			t.Errorf("%+v: %v, want ErrBadMapping", r, err)
		}
	}
}

func TestParsePageDump(t *testing.T) {
	addrs := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 0x401000), 0x400000)
	tests := []struct {
		name        string
		addrs, dump []byte
		want        []uint64
	}{
		{"two pages", addrs, make([]byte, 2*PageSize), []uint64{0x401000, 0x400000}},
		{"none", nil, nil, []uint64{}},
		{"short address", addrs[:12], make([]byte, 2*PageSize), nil},
		{"missing page", addrs, make([]byte, PageSize), nil},
		{"extra bytes", addrs, make([]byte, 2*PageSize+1), nil},
		{"past the top", binary.LittleEndian.AppendUint64(nil, ^uint64(0)-0xfff), make([]byte, PageSize), nil},
	}
	for _, tt := range tests {
		got, err := ParsePageDump(tt.addrs, tt.dump)
		if tt.want == nil {
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("%s: %v, %v; want ErrSyntax", tt.name, got, err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: %v, %v; want %v", tt.name, got, err, tt.want)
		}
	}
}

func TestParseMaps(t *testing.T) {
	text := `00400000-00401000 r--p 00000000 fe:00 5316807                            /usr/bin/flow static
7ffff7ffd000-7ffff7fff000 r-xp 00000000 00:00 0                          [vdso]

004a8000-004ad000 rw-p 00000000 00:00 0 
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
`
	got, err := ParseMaps([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	want := []MapsEntry{
		{0x400000, 0x401000, 0, "r--p", "/usr/bin/flow static"},
		{0x7ffff7ffd000, 0x7ffff7fff000, 0, "r-xp", "[vdso]"},
		{0x4a8000, 0x4ad000, 0, "rw-p", ""},
		{0xffffffffff600000, 0xffffffffff601000, 0, "--xp", "[vsyscall]"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseMaps =\n%+v\nwant\n%+v", got, want)
	}
	for _, bad := range []string{
		"00400000 r--p 00000000 fe:00 1 /x",
		"00401000-00400000 r--p 00000000 fe:00 1 /x",
		"00400000-00401000 r--p zz fe:00 1 /x",
		"00400000-00401000 r-p 00000000 fe:00 1 /x",
		"00400000-00401000 r--p 00000000 fe:00",
		"# snapshot 0 exec",
	} {
		if _, err := ParseMaps([]byte(bad)); !errors.Is(err, ErrSyntax) {
			t.Errorf("ParseMaps(%q) = %v, want ErrSyntax", bad, err)
		}
	}
}

// TestParseMapsSnapshots skips the comment lines of a snapshot file only.
func TestParseMapsSnapshots(t *testing.T) {
	got, err := ParseMapsSnapshots([]byte("# snapshot 0 exec\n00400000-00401000 r--p 00000000 fe:00 1 /x\n# dump a b\n" +
		"00401000-00402000 r-xp 00001000 fe:00 1 /x\n"))
	want := []MapsEntry{{0x400000, 0x401000, 0, "r--p", "/x"}, {0x401000, 0x402000, 0x1000, "r-xp", "/x"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("ParseMapsSnapshots = %+v, %v; want %+v", got, err, want)
	}
	if _, err := ParseMapsSnapshots([]byte(" # not a comment\n")); !errors.Is(err, ErrSyntax) {
		t.Errorf("indented #: %v, want ErrSyntax", err)
	}
}

func TestParseBuildIDs(t *testing.T) {
	got, err := ParseBuildIDs([]byte("672679ce [kernel.kallsyms]\n00ff /usr/lib/a b.so\n\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"[kernel.kallsyms]": {0x67, 0x26, 0x79, 0xce}, "/usr/lib/a b.so": {0, 0xff}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseBuildIDs = %x, want %x", got, want)
	}
	for _, bad := range []string{"xyz /a", "0011", "0011 ", "001 /a"} {
		if _, err := ParseBuildIDs([]byte(bad)); !errors.Is(err, ErrSyntax) {
			t.Errorf("ParseBuildIDs(%q) = %v, want ErrSyntax", bad, err)
		}
	}
}

// corpusFile returns the path of a file of the corpus.
func corpusFile(t *testing.T, parts ...string) string {
	t.Helper()
	return filepath.Join(append([]string{testkit.Corpus(t)}, parts...)...)
}

// TestParseBuildIDsCorpus reads the build-id list of the corpus's perf.data.
func TestParseBuildIDsCorpus(t *testing.T) {
	data, err := os.ReadFile(corpusFile(t, "perf", "perf.data.intel_pt-4.14.buildids"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := ParseBuildIDs(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids["[kernel.kallsyms]"]) != 20 || len(ids) < 10 {
		t.Errorf("%d ids, kernel's %x", len(ids), ids["[kernel.kallsyms]"])
	}
}

// FuzzParseMaps: a maps text is outside input; what parses has sane ranges.
func FuzzParseMaps(f *testing.F) {
	f.Add([]byte("00400000-00401000 r-xp 00001000 fe:00 5316807   /bin/x\n7ffff7ffd000-7ffff7fff000 r-xp 00000000 00:00 0 [vdso]\n"))
	f.Add([]byte("0-1 ---- 0 0 0"))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ParseMaps(data)
		if err != nil {
			return
		}
		p := NewProcesses(Options{Path: func(string) string { return "/nonexistent" }})
		for _, e := range entries {
			if e.End <= e.Start || len(e.Perms) != 4 {
				t.Fatalf("bad entry %+v", e)
			}
		}
		// Whatever parses can be applied without a panic.
		_ = p.MapMaps(1, entries)
	})
}

// FuzzParsePageDump: a page dump is outside input; what parses maps.
func FuzzParsePageDump(f *testing.F) {
	f.Add(binary.LittleEndian.AppendUint64(nil, 0x400000), 1)
	f.Add([]byte{1, 2, 3}, 0)
	f.Fuzz(func(t *testing.T, addrs []byte, pages int) {
		pages = min(max(pages, 0), 8)
		dump := make([]byte, pages*PageSize)
		got, err := ParsePageDump(addrs, dump)
		if err != nil {
			return
		}
		if len(got) != pages {
			t.Fatalf("%d addresses for %d pages", len(got), pages)
		}
		s, src := NewSpace(), NewBlob(dump)
		for i, a := range got {
			if err := s.Map(a, PageSize, src, uint64(i)*PageSize, "dump"); err != nil {
				t.Fatalf("page %d at 0x%x: %v", i, a, err)
			}
		}
	})
}

// FuzzParseRawSpec: a raw spec is a user's argument.
func FuzzParseRawSpec(f *testing.F) {
	f.Add("loop.bin:0x10-0x20:0x100000")
	f.Fuzz(func(t *testing.T, spec string) {
		r, err := ParseRawSpec(spec)
		if err == nil && (r.Path == "" || r.To != 0 && r.To <= r.From) {
			t.Fatalf("%q parsed as %+v", spec, r)
		}
	})
}

// FuzzMap checks Map's invariants on random operation sequences: sorted,
// disjoint mappings, and every address reads as the last mapping over it.
func FuzzMap(f *testing.F) {
	f.Add(uint64(1), uint8(20))
	f.Fuzz(func(t *testing.T, seed uint64, ops uint8) {
		rng := rand.New(rand.NewPCG(seed, 0))
		s := NewSpace()
		const span = 256
		var truth [span]int // which op last mapped each address, -1 none
		for i := range truth {
			truth[i] = -1
		}
		src := blob(0, 512)
		var opAddr [64]uint64
		for op := range int(ops % 64) {
			addr, n := rng.Uint64N(span), 1+rng.Uint64N(48)
			n = min(n, span-addr)
			if err := s.Map(addr, n, src, uint64(op), "m"); err != nil {
				t.Fatal(err)
			}
			opAddr[op] = addr
			for a := addr; a < addr+n; a++ {
				truth[a] = op
			}
			ms := s.Mappings()
			for i := 1; i < len(ms); i++ {
				if ms[i-1].End > ms[i].Start || ms[i].Start >= ms[i].End {
					t.Fatalf("mappings overlap or are empty: %+v", ms)
				}
			}
		}
		for a := range uint64(span) {
			op := truth[a]
			var b [1]byte
			_, err := s.ReadAt(b[:], a)
			// View shows the same byte in place, or fails the same way.
			v, verr := s.View(a)
			if (verr == nil) != (err == nil) || errors.Is(verr, ErrNotMapped) != errors.Is(err, ErrNotMapped) ||
				err == nil && (len(v) == 0 || v[0] != b[0]) {
				t.Fatalf("0x%x: View %d bytes %v, ReadAt 0x%x %v", a, len(v), verr, b[0], err)
			}
			if op < 0 {
				if !errors.Is(err, ErrNotMapped) {
					t.Fatalf("0x%x: %v, want ErrNotMapped", a, err)
				}
				continue
			}
			// Op op mapped the source from offset op at opAddr[op].
			if want := byte(uint64(op) + a - opAddr[op]); err != nil || b[0] != want {
				t.Fatalf("0x%x: 0x%x %v, want 0x%x (op %d)", a, b[0], err, want, op)
			}
		}
	})
}

// BenchmarkReadAt reads 16 bytes at random code addresses of libc mapped
// as a shared library, as the flow decoder reads a block's instructions.
func BenchmarkReadAt(b *testing.B) {
	s := NewSpace()
	const bias = 0x7ffff7d80000
	e := mapELF(b, s, libcPath, bias)
	// A process has a few dozen mappings: place the others around libc.
	for i := range uint64(40) {
		if err := s.Map(0x7ff000000000+i*0x10000, 0x1000, NewBlob(make([]byte, 0x1000)), 0, "other"); err != nil {
			b.Fatal(err)
		}
	}
	var addrs []uint64
	for _, f := range e.File.Functions() {
		addrs = append(addrs, bias+f.Addr)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	buf := make([]byte, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := s.ReadAt(buf, addrs[i%len(addrs)]); err != nil {
			b.Fatal(err)
		}
	}
}
