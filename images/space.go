// Package images is the memory model of traced processes: which code bytes
// sit at which virtual address. A Space is one address space: mappings of
// Sources (ELF files by file offset, raw blobs, page dumps, a vDSO dump),
// sorted and without overlaps, where a later mapping wins. Processes keeps
// one Space per pid from the side band (exec replaces it, fork copies it,
// mmap adds). The flow decoder reads code through Space.ReadAt; Symbolize
// names an address through the ELF symbols that objfile reads.
package images

import (
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"

	"ptfs/internal/errno"
)

// Sentinel errors (errno.New).
var (
	// ErrNotMapped reports an address that no mapping holds (EFAULT).
	ErrNotMapped = errno.New("address not mapped", syscall.EFAULT)
	// ErrNoBytes reports an address that a mapping holds without known
	// bytes: anonymous memory, a file that could not be read, or past the
	// end of its source (EFAULT).
	ErrNoBytes = errno.New("no code bytes at address", syscall.EFAULT)
	// ErrBadMapping reports a mapping that cannot be placed: empty, past
	// the end of the address space, or at an offset past its source's end
	// (EINVAL).
	ErrBadMapping = errno.New("bad mapping", syscall.EINVAL)
)

// Source is what a mapping shows: bytes by offset, held in memory and never
// changed while mapped.
type Source interface {
	Bytes() []byte
}

// Mapping is one mapped range [Start, End): the bytes of Src from offset
// Off on, under the name Name (a path, "[vdso]", a dump file). Src is nil
// for memory whose bytes are unknown (anonymous, unreadable).
type Mapping struct {
	Start, End, Off uint64
	Name            string
	Src             Source
	// data is Src's bytes from Off, at most End-Start of them.
	data []byte
}

// Space is the memory of one address space: the code bytes at each
// virtual address. Its mappings are sorted by address and never overlap.
// A Space is not safe for a Map concurrent with other calls.
type Space struct {
	maps []Mapping
	// shared marks maps as shared with a Clone: Map copies it first.
	shared bool
	gen    uint64
}

// generations numbers every Map of every Space, so that a generation
// identifies one state of one Space even across spaces a cache switches
// between.
var generations atomic.Uint64

// NewSpace returns an empty address space.
func NewSpace() *Space { return &Space{gen: generations.Add(1)} }

// Clone returns a copy of s that shares its mappings until either changes
// (fork).
func (s *Space) Clone() *Space {
	s.shared = true
	return &Space{maps: s.maps, shared: true, gen: generations.Add(1)}
}

// Generation changes on every Map, so a block cache keyed by address can
// be invalidated.
func (s *Space) Generation() uint64 { return s.gen }

// Mappings returns the mappings in address order. The caller owns the
// slice.
func (s *Space) Mappings() []Mapping { return slices.Clone(s.maps) }

// Map places n bytes of src at virtual address addr, from src's offset
// off; a later mapping wins over an earlier overlapping one, which keeps
// the parts outside the new range. Bytes past the end of src are mapped
// but unknown. A nil src maps memory whose bytes are unknown.
func (s *Space) Map(addr, n uint64, src Source, off uint64, name string) error {
	if n == 0 || addr > ^uint64(0)-n {
		return fmt.Errorf("%w: %s: %d bytes at 0x%x", ErrBadMapping, name, n, addr)
	}
	m := Mapping{Start: addr, End: addr + n, Off: off, Name: name, Src: src}
	if src != nil {
		b := src.Bytes()
		if off > uint64(len(b)) {
			return fmt.Errorf("%w: %s: offset 0x%x past the end of its %d bytes", ErrBadMapping, name, off, len(b))
		}
		m.data = b[off : off+min(n, uint64(len(b))-off)]
	}
	// maps[i:j] are the mappings that overlap [addr, End).
	i := s.after(addr)
	j := i
	for j < len(s.maps) && s.maps[j].Start < m.End {
		j++
	}
	pieces := make([]Mapping, 0, 3)
	if i < j && s.maps[i].Start < addr {
		pieces = append(pieces, s.maps[i].cut(s.maps[i].Start, addr))
	}
	pieces = append(pieces, m)
	if i < j && s.maps[j-1].End > m.End {
		pieces = append(pieces, s.maps[j-1].cut(m.End, s.maps[j-1].End))
	}
	if s.shared {
		s.maps = slices.Clone(s.maps)
		s.shared = false
	}
	s.maps = slices.Replace(s.maps, i, j, pieces...)
	s.gen = generations.Add(1)
	return nil
}

// cut returns the part [start, end) of m, which holds it.
func (m *Mapping) cut(start, end uint64) Mapping {
	c := *m
	c.Start, c.End, c.Off = start, end, m.Off+(start-m.Start)
	lo := min(start-m.Start, uint64(len(m.data)))
	hi := min(end-m.Start, uint64(len(m.data)))
	c.data = m.data[lo:hi:hi]
	return c
}

// after returns the index of the first mapping that ends after addr
// (len(maps) for none). The binary search is written out rather than
// through sort.Search: ReadAt runs it for every block the flow decoder
// decodes.
func (s *Space) after(addr uint64) int {
	lo, hi := 0, len(s.maps)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.maps[mid].End <= addr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// find returns the index of the mapping that holds addr, -1 for none.
func (s *Space) find(addr uint64) int {
	if i := s.after(addr); i < len(s.maps) && s.maps[i].Start <= addr {
		return i
	}
	return -1
}

// ReadAt copies into dst the bytes from addr on and returns how many: all
// of dst, or fewer where the known bytes end. A read continues into an
// adjacent mapping (an instruction may cross a page or mapping boundary).
// It fails only when no byte is known at addr: ErrNotMapped or ErrNoBytes.
// It does not allocate, but on error.
func (s *Space) ReadAt(dst []byte, addr uint64) (int, error) {
	i, v, err := s.view(addr)
	if err != nil {
		return 0, err
	}
	n := copy(dst, v)
	addr += uint64(n)
	for n < len(dst) && addr == s.maps[i].End && i+1 < len(s.maps) && s.maps[i+1].Start == addr {
		i++
		c := copy(dst[n:], s.maps[i].data)
		if c == 0 {
			break
		}
		n += c
		addr += uint64(c)
	}
	return n, nil
}

// View returns the known bytes of the mapping that holds addr without
// copying them, from the mapping's start base on (addr-base < len(b)): a
// caller keeps them for every address of the mapping, below addr too. They
// stop at the mapping's end, where an adjacent mapping's bytes lie
// elsewhere in memory: ReadAt reads across. The caller must not change the
// bytes. It fails as ReadAt does, and does not allocate but on error.
func (s *Space) View(addr uint64) (base uint64, b []byte, err error) {
	i, _, err := s.view(addr)
	if err != nil {
		return 0, nil, err
	}
	m := &s.maps[i]
	return m.Start, m.data[:len(m.data):len(m.data)], nil
}

// view returns the index of the mapping that holds addr and its known
// bytes from addr on (at least one).
func (s *Space) view(addr uint64) (int, []byte, error) {
	i := s.find(addr)
	if i < 0 {
		return 0, nil, fmt.Errorf("%w: 0x%x", ErrNotMapped, addr)
	}
	m := &s.maps[i]
	rel := addr - m.Start
	if rel >= uint64(len(m.data)) {
		return 0, nil, fmt.Errorf("%w: 0x%x (in %s)", ErrNoBytes, addr, m.Name)
	}
	return i, m.data[rel:len(m.data):len(m.data)], nil
}

// Lookup returns the mapping holding addr.
func (s *Space) Lookup(addr uint64) (Mapping, bool) {
	if i := s.find(addr); i >= 0 {
		return s.maps[i], true
	}
	return Mapping{}, false
}

// Symbolize names addr as a function of an ELF file and an offset in it
// (SYM+0xOFF), through the symbols of the file mapped there: the address
// becomes a file offset by the mapping, then the file's own address by its
// PT_LOAD segments. dso is the mapping's name wherever addr is mapped; ok
// says whether a function holds addr ("[unknown]" is the caller's to
// print).
func (s *Space) Symbolize(addr uint64) (sym string, off uint64, dso string, ok bool) {
	m, mapped := s.Lookup(addr)
	if !mapped {
		return "", 0, "", false
	}
	e, isELF := m.Src.(*ELF)
	if !isELF {
		return "", 0, m.Name, false
	}
	vaddr, inFile := e.File.Addr(addr - m.Start + m.Off)
	if !inFile {
		return "", 0, m.Name, false
	}
	fn, off, found := e.File.SymbolAt(vaddr)
	if !found {
		return "", 0, m.Name, false
	}
	return fn.Name, off, m.Name, true
}
