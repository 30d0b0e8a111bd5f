package images

import (
	"bytes"
	"errors"
	"testing"
)

// blob returns a Blob of n bytes, byte i being seed+i.
func blob(seed byte, n int) *Blob {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i)
	}
	return NewBlob(b)
}

// want is a mapping as a test expects it.
type want struct {
	start, end, off uint64
	name            string
}

func mustMap(t *testing.T, s *Space, addr, n uint64, src Source, off uint64, name string) {
	t.Helper()
	if err := s.Map(addr, n, src, off, name); err != nil {
		t.Fatalf("Map(0x%x, %d, %s): %v", addr, n, name, err)
	}
}

func checkMappings(t *testing.T, s *Space, wants []want) {
	t.Helper()
	got := s.Mappings()
	if len(got) != len(wants) {
		t.Fatalf("%d mappings %+v, want %+v", len(got), got, wants)
	}
	for i, m := range got {
		w := wants[i]
		if m.Start != w.start || m.End != w.end || m.Off != w.off || m.Name != w.name {
			t.Errorf("mapping %d = [0x%x,0x%x) off 0x%x %s, want [0x%x,0x%x) off 0x%x %s",
				i, m.Start, m.End, m.Off, m.Name, w.start, w.end, w.off, w.name)
		}
	}
}

type mapOp struct {
	addr, n, off uint64
	name         string
}

func TestMapOverlap(t *testing.T) {
	tests := []struct {
		name string
		ops  []mapOp
		want []want
	}{
		{"disjoint, out of order", []mapOp{{0x3000, 0x1000, 0, "b"}, {0x1000, 0x1000, 0, "a"}},
			[]want{{0x1000, 0x2000, 0, "a"}, {0x3000, 0x4000, 0, "b"}}},
		{"adjacent", []mapOp{{0x1000, 0x1000, 0, "a"}, {0x2000, 0x1000, 0x10, "b"}},
			[]want{{0x1000, 0x2000, 0, "a"}, {0x2000, 0x3000, 0x10, "b"}}},
		{"same range: later wins", []mapOp{{0x1000, 0x1000, 0, "a"}, {0x1000, 0x1000, 0x20, "b"}},
			[]want{{0x1000, 0x2000, 0x20, "b"}}},
		{"covers several", []mapOp{{0x1000, 0x100, 0, "a"}, {0x1200, 0x100, 0, "b"}, {0x1000, 0x1000, 0, "c"}},
			[]want{{0x1000, 0x2000, 0, "c"}}},
		{"middle splits", []mapOp{{0x1000, 0x3000, 0x100, "a"}, {0x2000, 0x800, 0, "b"}},
			[]want{{0x1000, 0x2000, 0x100, "a"}, {0x2000, 0x2800, 0, "b"}, {0x2800, 0x4000, 0x1900, "a"}}},
		{"overlaps head", []mapOp{{0x2000, 0x2000, 0, "a"}, {0x1800, 0x1000, 0, "b"}},
			[]want{{0x1800, 0x2800, 0, "b"}, {0x2800, 0x4000, 0x800, "a"}}},
		{"overlaps tail", []mapOp{{0x1000, 0x2000, 0, "a"}, {0x2800, 0x1000, 0, "b"}},
			[]want{{0x1000, 0x2800, 0, "a"}, {0x2800, 0x3800, 0, "b"}}},
		{"bridges two", []mapOp{{0x1000, 0x1000, 0, "a"}, {0x3000, 0x1000, 0, "b"}, {0x1800, 0x2000, 0, "c"}},
			[]want{{0x1000, 0x1800, 0, "a"}, {0x1800, 0x3800, 0, "c"}, {0x3800, 0x4000, 0x800, "b"}}},
		{"inside then over", []mapOp{{0x1000, 0x1000, 0, "a"}, {0x1400, 0x100, 0, "b"}, {0x1450, 0x10, 0, "c"}},
			[]want{{0x1000, 0x1400, 0, "a"}, {0x1400, 0x1450, 0, "b"}, {0x1450, 0x1460, 0, "c"}, {0x1460, 0x1500, 0x60, "b"}, {0x1500, 0x2000, 0x500, "a"}}},
		{"top of the address space", []mapOp{{0xffffffffff600000, 0x1000, 0, "vsyscall"}, {0xffffffffff600800, 0x800, 0, "b"}},
			[]want{{0xffffffffff600000, 0xffffffffff600800, 0, "vsyscall"}, {0xffffffffff600800, 0xffffffffff601000, 0, "b"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSpace()
			src := blob(0, 0x10000)
			for _, op := range tt.ops {
				mustMap(t, s, op.addr, op.n, src, op.off, op.name)
			}
			checkMappings(t, s, tt.want)
			// Every byte reads as its mapping's source byte at its offset.
			for _, w := range tt.want {
				for _, a := range []uint64{w.start, w.end - 1, w.start + (w.end-w.start)/2} {
					var b [1]byte
					if n, err := s.ReadAt(b[:], a); n != 1 || err != nil || b[0] != byte(w.off+a-w.start) {
						t.Errorf("ReadAt(0x%x) = %d %v 0x%x, want 0x%x", a, n, err, b[0], byte(w.off+a-w.start))
					}
				}
			}
		})
	}
}

func TestReadAt(t *testing.T) {
	s := NewSpace()
	a, b, c := blob(0x10, 0x100), blob(0x80, 0x100), blob(0xc0, 0x20)
	mustMap(t, s, 0x1000, 0x100, a, 0, "a")
	mustMap(t, s, 0x1100, 0x80, b, 0x10, "b") // adjacent to a
	mustMap(t, s, 0x1200, 0x100, c, 0, "c")   // after a gap; source shorter than the mapping
	mustMap(t, s, 0x1300, 0x100, nil, 0, "anon")
	mustMap(t, s, 0x1400, 0x10, a, 0, "after-anon")

	tests := []struct {
		name string
		addr uint64
		size int
		want []byte
		view int // View's length: to the end of the mapping's bytes
		err  error
	}{
		{"inside", 0x1010, 4, []byte{0x20, 0x21, 0x22, 0x23}, 0xf0, nil},
		{"across adjacent", 0x10fe, 4, []byte{0x0e, 0x0f, 0x90, 0x91}, 2, nil},
		{"to a gap", 0x117e, 15, []byte{0x0e, 0x0f}, 2, nil},
		{"source ends before mapping", 0x121e, 15, []byte{0xde, 0xdf}, 2, nil},
		{"past source end", 0x1250, 4, nil, 0, ErrNoBytes},
		{"source end then anon", 0x12ff, 4, nil, 0, ErrNoBytes},
		{"anon", 0x1300, 4, nil, 0, ErrNoBytes},
		{"gap", 0x1180, 4, nil, 0, ErrNotMapped},
		{"below all", 0x10, 4, nil, 0, ErrNotMapped},
		{"above all", 0x2000, 4, nil, 0, ErrNotMapped},
		{"empty dst", 0x1000, 0, []byte{}, 0x100, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := make([]byte, tt.size)
			n, err := s.ReadAt(dst, tt.addr)
			if !errors.Is(err, tt.err) {
				t.Fatalf("ReadAt(0x%x) error %v, want %v", tt.addr, err, tt.err)
			}
			if tt.err == nil && !bytes.Equal(dst[:n], tt.want) {
				t.Errorf("ReadAt(0x%x) = % x, want % x", tt.addr, dst[:n], tt.want)
			}
			// View shows the same bytes in place, the whole mapping's up
			// to its end, and fails as ReadAt does.
			base, all, err := s.View(tt.addr)
			if err == nil && (tt.addr < base || tt.addr-base >= uint64(len(all))) {
				t.Fatalf("View(0x%x) = %d bytes from 0x%x", tt.addr, len(all), base)
			}
			var v []byte
			if err == nil {
				v = all[tt.addr-base:]
			}
			if !errors.Is(err, tt.err) || len(v) != tt.view || cap(v) != len(v) {
				t.Fatalf("View(0x%x) = %d bytes (cap %d), %v; want %d, %v", tt.addr, len(v), cap(v), err, tt.view, tt.err)
			}
			if k := min(n, len(v)); !bytes.Equal(v[:k], dst[:k]) {
				t.Errorf("View(0x%x) = % x..., ReadAt % x", tt.addr, v[:k], dst[:k])
			}
		})
	}
}

// TestReadAtPages reads every 15-byte window across a run of adjacent
// one-page mappings of one source, as the flow decoder reads instructions
// that cross pages.
func TestReadAtPages(t *testing.T) {
	src := blob(7, 8*PageSize)
	s := NewSpace()
	for i := 7; i >= 0; i-- {
		mustMap(t, s, 0x400000+uint64(i)*PageSize, PageSize, src, uint64(i)*PageSize, "page")
	}
	buf := make([]byte, 15)
	for a := uint64(0x400000); a < 0x400000+8*PageSize; a += 13 {
		n, err := s.ReadAt(buf, a)
		want := src.Bytes()[a-0x400000:]
		want = want[:min(15, len(want))]
		if err != nil || !bytes.Equal(buf[:n], want) {
			t.Fatalf("ReadAt(0x%x) = % x, %v, want % x", a, buf[:n], err, want)
		}
		// View is the page, from its start to its end: the next page is
		// another mapping.
		base, v, err := s.View(a)
		page := a &^ (PageSize - 1)
		if err != nil || base != page || !bytes.Equal(v, src.Bytes()[page-0x400000:][:PageSize]) {
			t.Fatalf("View(0x%x) = %d bytes from 0x%x, %v; want the page at 0x%x", a, len(v), base, err, page)
		}
	}
}

func TestMapRefuses(t *testing.T) {
	s := NewSpace()
	src := blob(0, 16)
	for _, tt := range []struct {
		name         string
		addr, n, off uint64
	}{
		{"empty", 0x1000, 0, 0},
		{"past the address space", ^uint64(0) - 0xf, 0x20, 0},
		{"offset past source", 0x1000, 0x10, 17},
	} {
		if err := s.Map(tt.addr, tt.n, src, tt.off, tt.name); !errors.Is(err, ErrBadMapping) {
			t.Errorf("%s: Map = %v, want ErrBadMapping", tt.name, err)
		}
	}
	if len(s.Mappings()) != 0 {
		t.Errorf("refused maps left mappings: %+v", s.Mappings())
	}
	// The offset at the very end is a mapping of unknown bytes.
	mustMap(t, s, 0x1000, 0x10, src, 16, "end")
	if _, err := s.ReadAt(make([]byte, 1), 0x1000); !errors.Is(err, ErrNoBytes) {
		t.Errorf("read past source: %v, want ErrNoBytes", err)
	}
}

func TestGenerationAndClone(t *testing.T) {
	s := NewSpace()
	g0 := s.Generation()
	mustMap(t, s, 0x1000, 0x100, blob(1, 0x100), 0, "a")
	g1 := s.Generation()
	if g1 == g0 {
		t.Error("Generation did not change on Map")
	}
	c := s.Clone()
	if c.Generation() == g1 {
		t.Error("a clone has its parent's generation")
	}
	mustMap(t, c, 0x1000, 0x10, blob(0x50, 0x10), 0, "child")
	mustMap(t, s, 0x2000, 0x10, blob(0x60, 0x10), 0, "parent")
	checkMappings(t, s, []want{{0x1000, 0x1100, 0, "a"}, {0x2000, 0x2010, 0, "parent"}})
	checkMappings(t, c, []want{{0x1000, 0x1010, 0, "child"}, {0x1010, 0x1100, 0x10, "a"}})
	if s.Generation() == g1 {
		t.Error("Generation did not change on Map after Clone")
	}
}

// TestLookup finds the mapping of an address and none in gaps.
func TestLookup(t *testing.T) {
	s := NewSpace()
	mustMap(t, s, 0x1000, 0x100, blob(1, 0x100), 0x10, "a")
	if m, ok := s.Lookup(0x10ff); !ok || m.Name != "a" || m.Off != 0x10 {
		t.Errorf("Lookup(0x10ff) = %+v, %v", m, ok)
	}
	if _, ok := s.Lookup(0x1100); ok {
		t.Error("Lookup past the end found a mapping")
	}
	if sym, _, dso, ok := s.Symbolize(0x1000); ok || sym != "" || dso != "a" {
		t.Errorf("Symbolize of a blob = %q %q %v, want no symbol in a", sym, dso, ok)
	}
}
