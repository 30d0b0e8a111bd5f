package images

import (
	"errors"
	"fmt"

	"ptfs/objfile"
)

// Blob is a Source of bytes held in memory: a raw code image, page dumps,
// a vDSO dump.
type Blob struct {
	data []byte
}

// NewBlob returns a Source of data, which must not change afterwards.
func NewBlob(data []byte) *Blob { return &Blob{data: data} }

// LoadBlob reads the regular file at path into a Blob.
func LoadBlob(path string) (*Blob, error) {
	data, err := objfile.ReadRegular(path)
	if err != nil {
		return nil, fmt.Errorf("load code image: %w", err)
	}
	return &Blob{data: data}, nil
}

// Bytes returns the blob's bytes.
func (b *Blob) Bytes() []byte { return b.data }

// ELF is a Source of an ELF file's bytes by file offset, with the file's
// segments and symbols for mapping and symbolization.
type ELF struct {
	File *objfile.File
	data []byte
}

// OpenELF opens the ELF file at path and reads it into memory.
func OpenELF(path string) (*ELF, error) {
	f, err := objfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load code image: %w", err)
	}
	data, err := f.Contents()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("load code image: %w", err), f.Close())
	}
	return &ELF{File: f, data: data}, nil
}

// Bytes returns the file's bytes.
func (e *ELF) Bytes() []byte { return e.data }

// Close releases the file.
func (e *ELF) Close() error { return e.File.Close() }

// MapELF opens the ELF file at path and maps the file image of each of its
// PT_LOAD segments at loadBias + its virtual address (loadBias is 0 for a
// non-PIE executable, the load address for a PIE or shared library linked
// at 0). The caller closes the returned ELF when the space is done with.
func MapELF(s *Space, path string, loadBias uint64) (*ELF, error) {
	e, err := OpenELF(path)
	if err != nil {
		return nil, err
	}
	for _, seg := range e.File.Segments() {
		if seg.Filesz == 0 {
			continue
		}
		if err := s.Map(loadBias+seg.Vaddr, seg.Filesz, e, seg.Off, path); err != nil {
			return nil, errors.Join(fmt.Errorf("map %s at bias 0x%x: %w", path, loadBias, err), e.Close())
		}
	}
	return e, nil
}

// MapRaw maps the whole file at path at addr: a raw code image (libipt's
// .bin at the org of its .ptt) or a vDSO dump.
func MapRaw(s *Space, path string, addr uint64) error {
	return RawSpec{Path: path, Base: addr}.Map(s)
}

// MapPageDump maps the pages of a libxdc memory dump: addrFile lists
// little-endian u64 page addresses, dumpFile holds the PageSize-byte pages
// in the same order.
func MapPageDump(s *Space, addrFile, dumpFile string) error {
	addrs, err := objfile.ReadRegular(addrFile)
	if err != nil {
		return fmt.Errorf("load page dump: %w", err)
	}
	dump, err := LoadBlob(dumpFile)
	if err != nil {
		return fmt.Errorf("load page dump: %w", err)
	}
	pages, err := ParsePageDump(addrs, dump.Bytes())
	if err != nil {
		return fmt.Errorf("page dump %s: %w", dumpFile, err)
	}
	for i, a := range pages {
		if err := s.Map(a, PageSize, dump, uint64(i)*PageSize, dumpFile); err != nil {
			return fmt.Errorf("page dump %s: page %d: %w", dumpFile, i, err)
		}
	}
	return nil
}
