package objfile

import (
	"debug/elf"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// File is an opened x86-64 ELF file: its PT_LOAD segments and its function
// symbols. It keeps the file open for its life: a probe names the file by
// FDPath, so the kernel probes the very inode that was parsed, whatever
// happens to the path.
type File struct {
	path   string
	file   *os.File
	fdPath string
	id     FileID
	size   uint64
	segs   []Segment
	// exec holds the executable PROGBITS sections, for SweepStart.
	exec []Segment
	// buildID is the descriptor of the NT_GNU_BUILD_ID note, nil if none.
	buildID []byte
	syms    []Symbol
	// symtab is whether the file has a .symtab (a stripped one has only
	// .dynsym, its exported functions): a lookup's hint.
	symtab bool
	// imports maps each function the file imports to the library its
	// symbol version names ("" when unversioned), and needed lists the
	// DT_NEEDED libraries: a lookup's hint.
	imports map[string]string
	needed  []string
	// outer[i] is the last symbol before i whose end is past i's end (-1
	// for none): the only candidates that can hold an address that symbol
	// i does not, so SymbolAt walks a short chain instead of the table.
	outer []int32
}

// Segment is one PT_LOAD segment: its file image of Filesz bytes at file
// offset Off is mapped at virtual address Vaddr.
type Segment struct {
	Off, Vaddr, Filesz, Memsz uint64
	Flags                     elf.ProgFlag
}

// Exec reports whether the segment is executable.
func (s Segment) Exec() bool { return s.Flags&elf.PF_X != 0 }

// HoldsOffset reports whether the segment's file image holds file offset off.
func (s Segment) HoldsOffset(off uint64) bool { return off >= s.Off && off-s.Off < s.Filesz }

// HoldsAddr reports whether the segment's file image holds address addr.
func (s Segment) HoldsAddr(addr uint64) bool { return addr >= s.Vaddr && addr-s.Vaddr < s.Filesz }

// FileID identifies a file and the state of its content: device and
// inode, size, modification and change times. Two equal FileIDs of one
// path mean that the path names the same file with (as far as the kernel's
// time stamps tell) the same content.
type FileID struct {
	Dev, Ino     uint64
	Size         int64
	Mtime, Ctime unix.Timespec
}

func fileID(st *unix.Stat_t) FileID {
	return FileID{Dev: st.Dev, Ino: st.Ino, Size: st.Size, Mtime: st.Mtim, Ctime: st.Ctim}
}

// StatID returns the FileID of the file path names, following symlinks.
func StatID(path string) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return FileID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return fileID(&st), nil
}

// SameFile tells whether a and b are the same inode (whatever its content).
func (a FileID) SameFile(b FileID) bool { return a.Dev == b.Dev && a.Ino == b.Ino }

// String describes the inode as "dev MAJOR:MINOR, inode N".
func (a FileID) String() string {
	return fmt.Sprintf("dev %d:%d, inode %d", unix.Major(a.Dev), unix.Minor(a.Dev), a.Ino)
}

// OpenRegular opens path for reading if it names a regular file, and
// refuses anything else with ErrNotRegular. It never blocks: the type is
// checked before the open, and the open itself does not wait (O_NONBLOCK,
// for a FIFO swapped in between) nor take a terminal (O_NOCTTY); the
// opened file is checked again with fstat.
func OpenRegular(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open binary: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is a %s", ErrNotRegular, path, fileKind(st.Mode()))
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open binary: %w", err)
	}
	if st, err = f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("open binary: %w", err)
		}
		return nil, fmt.Errorf("%w: %s is a %s", ErrNotRegular, path, fileKind(st.Mode()))
	}
	return f, nil
}

// fileKind names the type of a file that is not regular.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "FIFO"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeCharDevice != 0:
		return "character device"
	case m&os.ModeDevice != 0:
		return "block device"
	}
	return "special file"
}

// Open opens the ELF file at path, refusing (with ErrNotRegular, and
// without blocking) anything but a regular file, and reads it (NewFile).
func Open(path string) (*File, error) {
	f, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	return NewFile(f, path)
}

// NewFile reads the segments and function symbols of the ELF file f, which
// it owns from then on (Close closes it, also when NewFile fails); name is
// the path that errors and Path show. A malformed file gives an error that
// wraps ErrBadBinary, also where debug/elf would panic.
func NewFile(file *os.File, name string) (*File, error) {
	var st unix.Stat_t
	// The content's identity is taken before it is read: a rewrite while
	// it is parsed then shows as a change later.
	if err := unix.Fstat(int(file.Fd()), &st); err != nil {
		file.Close()
		return nil, fmt.Errorf("open binary %s: fstat: %w", name, err)
	}
	f := &File{
		path: name, file: file, size: uint64(st.Size), id: fileID(&st),
		fdPath: "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.FormatUint(uint64(file.Fd()), 10),
	}
	if err := f.load(); err != nil {
		file.Close()
		return nil, err
	}
	return f, nil
}

// load parses the ELF headers and symbols.
func (f *File) load() error {
	ef, err := safeNewELF(f.file)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadBinary, f.path, err)
	}
	if ef.Class != elf.ELFCLASS64 || ef.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%w: %s is %v %v, not x86-64", ErrBadBinary, f.path, ef.Class, ef.Machine)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			f.segs = append(f.segs, Segment{Off: p.Off, Vaddr: p.Vaddr, Filesz: p.Filesz, Memsz: p.Memsz, Flags: p.Flags})
		}
	}
	for _, s := range ef.Sections {
		if s.Flags&elf.SHF_EXECINSTR != 0 && s.Type == elf.SHT_PROGBITS {
			f.exec = append(f.exec, Segment{Off: s.Offset, Vaddr: s.Addr, Filesz: s.Size, Flags: elf.PF_X | elf.PF_R})
		}
	}
	f.buildID = readBuildID(ef)
	return f.readSymbols(ef)
}

// safeNewELF is elf.NewFile with its panics on malformed input (it has had
// several) turned into errors.
func safeNewELF(file *os.File) (ef *elf.File, err error) {
	err = safely(func() error {
		ef, err = elf.NewFile(file)
		return err
	})
	return ef, err
}

// safely runs fn and returns its error, or the panic it raised as one.
func safely(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("debug/elf failed on malformed input: %v", p)
		}
	}()
	return fn()
}

// Path returns the path the file was opened by.
func (f *File) Path() string { return f.path }

// FDPath returns "/proc/PID/fd/N", this process's descriptor of the open
// file: the path of every probe line on it. The kernel resolves it to the
// inode that was parsed, and it holds no byte that a user chose.
func (f *File) FDPath() string { return f.fdPath }

// ID returns the identity of the file and its content when it was opened.
func (f *File) ID() FileID { return f.id }

// Size returns the size of the file when it was opened.
func (f *File) Size() uint64 { return f.size }

// Close releases the file.
func (f *File) Close() error {
	// elf.NewFile does not own the file: closing it is ours.
	if err := f.file.Close(); err != nil {
		return fmt.Errorf("close binary %s: %w", f.path, err)
	}
	return nil
}

// Segments returns the PT_LOAD segments in file order. The caller owns
// the slice.
func (f *File) Segments() []Segment { return append([]Segment(nil), f.segs...) }

// SegmentAtOffset returns the PT_LOAD segment whose file image holds file
// offset off, preferring an executable one where segments share a page of
// the file.
func (f *File) SegmentAtOffset(off uint64) (Segment, bool) {
	var found Segment
	ok := false
	for _, s := range f.segs {
		if s.HoldsOffset(off) {
			if s.Exec() {
				return s, true
			}
			found, ok = s, true
		}
	}
	return found, ok
}

// SegmentAt returns the first PT_LOAD segment whose file image holds the
// virtual address addr.
func (f *File) SegmentAt(addr uint64) (Segment, bool) {
	for _, s := range f.segs {
		if s.HoldsAddr(addr) {
			return s, true
		}
	}
	return Segment{}, false
}

// Offset maps a virtual address to its file offset through the PT_LOAD
// segment whose file image holds it.
func (f *File) Offset(addr uint64) (uint64, bool) {
	s, ok := f.SegmentAt(addr)
	if !ok {
		return 0, false
	}
	return addr - s.Vaddr + s.Off, true
}

// Addr maps a file offset to its virtual address through the PT_LOAD
// segment that SegmentAtOffset picks.
func (f *File) Addr(off uint64) (uint64, bool) {
	s, ok := f.SegmentAtOffset(off)
	if !ok {
		return 0, false
	}
	return off - s.Off + s.Vaddr, true
}

// ReadCode returns the bytes of the file image from address addr on: n,
// or fewer where the PT_LOAD segment holding addr ends in the file.
func (f *File) ReadCode(addr, n uint64) ([]byte, error) {
	s, ok := f.SegmentAt(addr)
	if !ok {
		return nil, fmt.Errorf("%w: address 0x%x is not in a loaded segment of %s", ErrNoCode, addr, f.path)
	}
	n = min(n, s.Vaddr+s.Filesz-addr)
	// A header may claim more than the file holds: refuse before
	// allocating what it claims.
	if n > f.size {
		return nil, fmt.Errorf("%w: %s: segment at file offset 0x%x is larger than the file", ErrBadBinary, f.path, s.Off)
	}
	buf := make([]byte, n)
	if _, err := f.file.ReadAt(buf, int64(addr-s.Vaddr+s.Off)); err != nil {
		return nil, fmt.Errorf("%w: read code at 0x%x of %s: %w", ErrBadBinary, addr, f.path, err)
	}
	return buf, nil
}
