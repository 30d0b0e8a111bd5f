package objfile

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
)

// MaxContent is the largest file ReadRegular and Contents read into
// memory: far above any code image, and a bound on what a hostile path
// can make ptfs allocate.
const MaxContent = 1 << 30

// ntGNUBuildID is the note type of a GNU build id (elf.h NT_GNU_BUILD_ID).
const ntGNUBuildID = 3

// ReadRegular reads the whole regular file at path (OpenRegular: never a
// FIFO or device, never blocking), refusing one larger than MaxContent
// with ErrTooLarge.
func ReadRegular(path string) ([]byte, error) {
	f, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return readAll(f, st.Size(), path)
}

// Contents returns the bytes of the file as it was opened (Size of them),
// read at once; ReadCode is the way to read a few. A file that shrank
// since gives an error, as one larger than MaxContent (ErrTooLarge).
func (f *File) Contents() ([]byte, error) {
	return readAll(f.file, int64(f.size), f.path)
}

// readAll reads size bytes of r from offset 0. Reading them into memory,
// rather than mapping the file, keeps a file truncated under ptfs from
// faulting it (SIGBUS).
func readAll(r io.ReaderAt, size int64, path string) ([]byte, error) {
	if size > MaxContent {
		return nil, fmt.Errorf("%w: %s has %d bytes, more than %d", ErrTooLarge, path, size, MaxContent)
	}
	buf := make([]byte, size)
	if _, err := r.ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return buf, nil
}

// BuildID returns the GNU build id of the file (the descriptor of its
// NT_GNU_BUILD_ID note), nil if it has none. The caller must not change it.
func (f *File) BuildID() []byte { return f.buildID }

// readBuildID finds the build-id note in the SHT_NOTE sections, or without
// section headers in the PT_NOTE segments. A malformed note is no build id.
func readBuildID(ef *elf.File) []byte {
	var readers []io.ReadSeeker
	for _, s := range ef.Sections {
		if s.Type == elf.SHT_NOTE {
			readers = append(readers, s.Open())
		}
	}
	if len(readers) == 0 {
		for _, p := range ef.Progs {
			if p.Type == elf.PT_NOTE {
				readers = append(readers, p.Open())
			}
		}
	}
	for _, r := range readers {
		// Notes are small; a section claiming more is not a note section
		// worth reading.
		data, err := io.ReadAll(io.LimitReader(r, 1<<16))
		if err != nil {
			continue
		}
		if id := NoteBuildID(data); id != nil {
			return id
		}
	}
	return nil
}

// NoteBuildID returns the descriptor of the first NT_GNU_BUILD_ID note of
// owner "GNU" in data, a sequence of ELF notes (namesz, descsz, type, then
// name and descriptor each padded to 4 bytes), nil if there is none or the
// notes are malformed.
func NoteBuildID(data []byte) []byte {
	for len(data) >= 12 {
		namesz := uint64(binary.LittleEndian.Uint32(data))
		descsz := uint64(binary.LittleEndian.Uint32(data[4:]))
		typ := binary.LittleEndian.Uint32(data[8:])
		data = data[12:]
		nameEnd := (namesz + 3) &^ 3
		if nameEnd > uint64(len(data)) || descsz > uint64(len(data))-nameEnd {
			return nil
		}
		name := data[:namesz]
		desc := data[nameEnd : nameEnd+descsz]
		if typ == ntGNUBuildID && bytes.Equal(name, []byte("GNU\x00")) && descsz > 0 {
			return bytes.Clone(desc)
		}
		next := nameEnd + (descsz+3)&^3
		if next > uint64(len(data)) {
			return nil
		}
		data = data[next:]
	}
	return nil
}
