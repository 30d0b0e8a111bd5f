package images

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
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

// TestParseMapsSnapshots parses maps files of snapshots, ptsim's and
// plain /proc/PID/maps text, and refuses malformed ones with the number
// of the line at fault.
func TestParseMapsSnapshots(t *testing.T) {
	const (
		fileMap = "00400000-00401000 r-xp 00001000 fe:00 5316807                            /bin/a b\n"
		anonMap = "7ffff7ffd000-7ffff7fff000 r-xp 00000000 00:00 0 \n"
	)
	file := MapsEntry{0x400000, 0x401000, 0x1000, "r-xp", "/bin/a b"}
	anon := MapsEntry{0x7ffff7ffd000, 0x7ffff7fff000, 0, "r-xp", ""}
	vdso := MapsDump{0x7ffff7ffd000, 0x7ffff7fff000, "vdso-7ffff7ffd000.bin"}
	tests := []struct {
		name, text string
		want       []MapsSnapshot
		errLine    int // the line an error names; 0: no error
	}{
		{"empty", "", nil, 0},
		{"blank and comments", "\n# a comment\n  \n#\n", nil, 0},
		{"ptsim", "# snapshot 0 exec\n" + fileMap + "# snapshot 32106 syscall\n" + fileMap + anonMap +
			"# dump 7ffff7ffd000-7ffff7fff000 vdso-7ffff7ffd000.bin\n",
			[]MapsSnapshot{{Index: 0, Maps: []MapsEntry{file}}, {Index: 32106, Maps: []MapsEntry{file, anon}, Dumps: []MapsDump{vdso}}}, 0},
		{"crlf", "# snapshot 0 exec\r\n" + strings.ReplaceAll(fileMap+anonMap, "\n", "\r\n") +
			"# dump 7ffff7ffd000-7ffff7fff000 vdso-7ffff7ffd000.bin\r\n",
			[]MapsSnapshot{{Maps: []MapsEntry{file, anon}, Dumps: []MapsDump{vdso}}}, 0},
		{"no reason, no final newline, no maps", "# snapshot 7\n#snapshot  8  newcode", []MapsSnapshot{{Index: 7}, {Index: 8}}, 0},
		{"same index twice", "# snapshot 3 a\n# snapshot 3 b\n", []MapsSnapshot{{Index: 3}, {Index: 3}}, 0},
		{"plain maps", fileMap + "\n" + anonMap, []MapsSnapshot{{Maps: []MapsEntry{file, anon}}}, 0},
		{"plain maps, then snapshots", fileMap + "# dump 7ffff7ffd000-7ffff7fff000 vdso-7ffff7ffd000.bin\n# snapshot 5 x\n" + anonMap,
			[]MapsSnapshot{{Maps: []MapsEntry{file}, Dumps: []MapsDump{vdso}}, {Index: 5, Maps: []MapsEntry{anon}}}, 0},
		{"dump outside a snapshot", "# dump 1000-2000 mem/0-1000.bin\n# snapshot 0 exec\n", nil, 1},
		{"snapshot without index", "# snapshot 0 exec\n" + fileMap + "# snapshot\n", nil, 3},
		{"snapshot index not decimal", "# snapshot 0x10 exec\n", nil, 1},
		{"snapshot index negative", "# snapshot -1 exec\n", nil, 1},
		{"snapshot index going back", "# snapshot 10 exec\n# snapshot 9 syscall\n", nil, 2},
		{"dump without file", "# snapshot 0 exec\n# dump 1000-2000\n", nil, 2},
		{"dump without range", "# snapshot 0 exec\n# dump\n", nil, 2},
		{"dump bad hex", "# snapshot 0 exec\n# dump 10g0-2000 f.bin\n", nil, 2},
		{"dump start above end", "# snapshot 0 exec\n# dump 2000-1000 f.bin\n", nil, 2},
		{"dump empty range", "# snapshot 0 exec\n# dump 1000-1000 f.bin\n", nil, 2},
		{"mapping start above end", "# snapshot 0 exec\n00401000-00400000 r-xp 00000000 fe:00 1 /x\n", nil, 2},
		{"mapping bad hex", "# snapshot 0 exec\n\n0040z000-00401000 r-xp 00000000 fe:00 1 /x\n", nil, 3},
		{"mapping bad offset", "0-1000 r-xp 0x10 fe:00 1 /x\n", nil, 1},
		{"mapping missing fields", "# snapshot 0 exec\n00400000-00401000 r-xp 00000000 fe:00\n", nil, 2},
		{"mapping bad permissions", "# snapshot 0 exec\n00400000-00401000 r-x 00000000 fe:00 1 /x\n", nil, 2},
		{"indented comment", "# snapshot 0 exec\n # not a comment\n", nil, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMapsSnapshots([]byte(tt.text))
			if tt.errLine != 0 {
				if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), fmt.Sprintf("maps line %d:", tt.errLine)) {
					t.Errorf("= %+v, %v; want ErrSyntax at line %d", got, err, tt.errLine)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("=\n%+v, %v\nwant\n%+v", got, err, tt.want)
			}
		})
	}
}

// TestAllMaps lists the lines of all snapshots in order, so that the later
// ones win when they are mapped.
func TestAllMaps(t *testing.T) {
	a := MapsEntry{0x1000, 0x2000, 0, "r-xp", "/a"}
	b := MapsEntry{0x1000, 0x2000, 0, "r-xp", "/b"}
	c := MapsEntry{0x3000, 0x4000, 0x1000, "r--p", "/a"}
	for _, tt := range []struct {
		name  string
		snaps []MapsSnapshot
		want  []MapsEntry
	}{
		{"none", nil, nil},
		{"empty snapshots", []MapsSnapshot{{Index: 0}, {Index: 4}}, nil},
		{"in order", []MapsSnapshot{{Maps: []MapsEntry{a, c}}, {Index: 9}, {Index: 10, Maps: []MapsEntry{b}}}, []MapsEntry{a, c, b}},
	} {
		if got := AllMaps(tt.snaps); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: AllMaps = %+v, want %+v", tt.name, got, tt.want)
		}
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

// FuzzParseMapsSnapshots: a maps file is outside input. What parses is
// well formed (ranges not empty, indexes in order, dumps in a snapshot with
// a file) and parses again to itself once written back, with "\r\n" line
// endings so that a path that ends in '\r' keeps it.
func FuzzParseMapsSnapshots(f *testing.F) {
	f.Add([]byte("# snapshot 0 exec\n00400000-00401000 r-xp 00001000 fe:00 5316807   /bin/x\n" +
		"7ffff7ffd000-7ffff7fff000 r-xp 00000000 00:00 0 [vdso]\n# snapshot 12 syscall\n" +
		"# dump 7ffff7ffd000-7ffff7fff000 vdso-7ffff7ffd000.bin\n"))
	f.Add([]byte("0-1 ---- 0 0 0\r\n# dump 0-1 f\n# snapshot 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		snaps, err := ParseMapsSnapshots(data)
		if err != nil {
			return
		}
		var text bytes.Buffer
		for i, s := range snaps {
			if i > 0 && s.Index < snaps[i-1].Index {
				t.Fatalf("snapshot %d: index %d below %d", i, s.Index, snaps[i-1].Index)
			}
			fmt.Fprintf(&text, "# snapshot %d\r\n", s.Index)
			for _, e := range s.Maps {
				if e.End <= e.Start || len(e.Perms) != 4 {
					t.Fatalf("bad entry %+v", e)
				}
				fmt.Fprintf(&text, "%x-%x %s %x 00:00 0 %s\r\n", e.Start, e.End, e.Perms, e.Off, e.Path)
			}
			for _, d := range s.Dumps {
				if d.End <= d.Start || d.File == "" {
					t.Fatalf("bad dump %+v", d)
				}
				fmt.Fprintf(&text, "# dump %x-%x %s\r\n", d.Start, d.End, d.File)
			}
		}
		again, err := ParseMapsSnapshots(text.Bytes())
		if err != nil || !reflect.DeepEqual(again, snaps) {
			t.Fatalf("%+v written back as %q parses as %+v, %v", snaps, text.Bytes(), again, err)
		}
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
			base, v, verr := s.View(a)
			if (verr == nil) != (err == nil) || errors.Is(verr, ErrNotMapped) != errors.Is(err, ErrNotMapped) ||
				err == nil && (a < base || a-base >= uint64(len(v)) || v[a-base] != b[0]) {
				t.Fatalf("0x%x: View %d bytes from 0x%x %v, ReadAt 0x%x %v", a, len(v), base, verr, b[0], err)
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

// BenchmarkParseMaps parses a ptsim maps.txt of the corpus: its maps
// lines alone with ParseMaps, as live parses /proc/PID/maps of each
// process it meets, and the whole file with ParseMapsSnapshots.
func BenchmarkParseMaps(b *testing.B) {
	text, err := os.ReadFile(filepath.Join(testkit.Corpus(b), "ptsim", "run-static", "maps.txt"))
	if err != nil {
		b.Fatal(err)
	}
	var plain []byte
	for l := range bytes.Lines(text) {
		if l[0] != '#' {
			plain = append(plain, l...)
		}
	}
	for _, bb := range []struct {
		name  string
		text  []byte
		parse func([]byte) error
	}{
		{"plain", plain, func(d []byte) error { _, err := ParseMaps(d); return err }},
		{"snapshots", text, func(d []byte) error { _, err := ParseMapsSnapshots(d); return err }},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.SetBytes(int64(len(bb.text)))
			b.ReportAllocs()
			for b.Loop() {
				if err := bb.parse(bb.text); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
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
