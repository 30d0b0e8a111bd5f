package probes

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"

	"github.com/ianlancetaylor/demangle"
	"golang.org/x/sys/unix"
)

// Binary is an opened x86-64 ELF file with its function symbols. It keeps
// the file open for its life: probes name the file by FDPath, so the kernel
// probes the very inode that was parsed, whatever happens to the path.
type Binary struct {
	path   string
	file   *os.File
	fdPath string
	id     FileID
	f      *elf.File
	size   uint64
	loads  []*elf.Prog
	funcs  []Symbol
}

// Symbol is one function of a binary.
type Symbol struct {
	// Name is the demangled name; Raw the name in the symbol table.
	Name, Raw string
	// Addr is the virtual address, Offset the file offset, Size the size
	// in bytes (0 when the symbol table does not say).
	Addr, Offset, Size uint64
}

// Site is a resolved, checked probe site.
type Site struct {
	// Offset is the file offset and Addr the virtual address of the site.
	Offset, Addr uint64
	// Func is the function holding the site ("" when none does) and
	// FuncOff the site's offset in it.
	Func    string
	FuncOff uint64
	// Insn is the instruction at the site in GNU syntax; Len its length.
	Insn string
	Len  int
	// Verdict says whether and how a ptwrite uprobe can patch the site.
	// Classic probes install on any instruction boundary.
	Verdict Verdict
}

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

// Open opens the ELF file at path (OpenRegular) and reads its function
// symbols.
func Open(path string) (*Binary, error) {
	f, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	return NewBinary(f, path)
}

// NewBinary reads the function symbols of the ELF file f, which it owns
// from then on (Close closes it, also when NewBinary fails); name is the
// path that errors and Path show.
func NewBinary(file *os.File, name string) (*Binary, error) {
	var st unix.Stat_t
	// The content's identity is taken before it is read: a rewrite while
	// it is parsed then shows as a change later.
	if err := unix.Fstat(int(file.Fd()), &st); err != nil {
		file.Close()
		return nil, fmt.Errorf("open binary %s: fstat: %w", name, err)
	}
	f, err := elf.NewFile(file)
	if err != nil {
		file.Close()
		return nil, fmt.Errorf("%w: %s: %v", ErrBadBinary, name, err)
	}
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		file.Close()
		return nil, fmt.Errorf("%w: %s is %v %v, not x86-64", ErrBadBinary, name, f.Class, f.Machine)
	}
	b := &Binary{
		path: name, file: file, f: f, size: uint64(st.Size), id: fileID(&st),
		fdPath: "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.FormatUint(uint64(file.Fd()), 10),
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			b.loads = append(b.loads, p)
		}
	}
	if err := b.readFuncs(); err != nil {
		file.Close()
		return nil, err
	}
	return b, nil
}

// Path returns the path the binary was opened by.
func (b *Binary) Path() string { return b.path }

// FDPath returns "/proc/PID/fd/N", this process's descriptor of the open
// file: the path of every probe line on it. The kernel resolves it to the
// inode that was parsed, and it holds no byte that a user chose.
func (b *Binary) FDPath() string { return b.fdPath }

// ID returns the identity of the file and its content when it was opened.
func (b *Binary) ID() FileID { return b.id }

// Close releases the file.
func (b *Binary) Close() error {
	// elf.NewFile does not own the file: closing it is ours.
	if err := b.file.Close(); err != nil {
		return fmt.Errorf("close binary %s: %w", b.path, err)
	}
	return nil
}

func (b *Binary) readFuncs() error {
	type key struct {
		raw  string
		addr uint64
	}
	seen := map[key]bool{}
	for _, get := range []func() ([]elf.Symbol, error){b.f.Symbols, b.f.DynamicSymbols} {
		syms, err := get()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return fmt.Errorf("%w: %s: symbols: %v", ErrBadBinary, b.path, err)
		}
		for _, s := range syms {
			t := elf.ST_TYPE(s.Info)
			if (t != elf.STT_FUNC && t != elf.STT_GNU_IFUNC) || s.Section == elf.SHN_UNDEF || s.Name == "" {
				continue
			}
			k := key{s.Name, s.Value}
			if seen[k] {
				continue
			}
			off, ok := b.fileOffset(s.Value)
			if !ok {
				continue
			}
			seen[k] = true
			b.funcs = append(b.funcs, Symbol{
				Name: demangle.Filter(s.Name), Raw: s.Name,
				Addr: s.Value, Offset: off, Size: s.Size,
			})
		}
	}
	sort.Slice(b.funcs, func(i, j int) bool {
		x, y := &b.funcs[i], &b.funcs[j]
		if x.Addr != y.Addr {
			return x.Addr < y.Addr
		}
		return x.Raw < y.Raw
	})
	return nil
}

// fileOffset maps a virtual address to its file offset through the PT_LOAD
// segment whose file image holds it.
func (b *Binary) fileOffset(addr uint64) (uint64, bool) {
	for _, p := range b.loads {
		if addr >= p.Vaddr && addr-p.Vaddr < p.Filesz {
			return addr - p.Vaddr + p.Off, true
		}
	}
	return 0, false
}

// Functions returns the defined functions of .symtab and .dynsym, without
// duplicates, sorted by address then raw name. The caller owns the slice.
func (b *Binary) Functions() []Symbol {
	return append([]Symbol(nil), b.funcs...)
}

// AppendSymbols appends the text of the symbols file: one function a line,
// "0xOFFSET SIZE NAME" with the file offset in hex, the size in decimal
// and the demangled name.
func AppendSymbols(dst []byte, syms []Symbol) []byte {
	for i := range syms {
		s := &syms[i]
		dst = append(dst, "0x"...)
		dst = strconv.AppendUint(dst, s.Offset, 16)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, s.Size, 10)
		dst = append(dst, ' ')
		dst = append(dst, s.Name...)
		dst = append(dst, '\n')
	}
	return dst
}

// lookup finds the function a spec names, by demangled or raw name.
func (b *Binary) lookup(name string) (*Symbol, error) {
	var found *Symbol
	for i := range b.funcs {
		s := &b.funcs[i]
		if s.Name != name && s.Raw != name {
			continue
		}
		if found != nil && found.Addr != s.Addr {
			return nil, fmt.Errorf("%w: symbol %q names several functions (at 0x%x and 0x%x): use a file offset",
				ErrSyntax, name, found.Offset, s.Offset)
		}
		if found == nil || s.Size > found.Size {
			found = s
		}
	}
	if found == nil {
		return nil, fmt.Errorf("%w: no function %q in %s", ErrNoSymbol, name, b.path)
	}
	return found, nil
}

// Resolve finds and checks the site of s: a file offset inside an
// executable PT_LOAD segment, on an instruction boundary. The boundary is
// checked by decoding from the start of the function holding the site;
// outside any known function (stripped code) by a linear sweep from the end
// of the previous function, or from the start of the executable section or
// segment, as objdump does. The ptwrite verdict is computed but a refused
// verdict is not an error here: classic probes take such sites.
func (b *Binary) Resolve(s *Spec) (*Site, error) {
	off := s.Offset
	if s.Symbol != "" {
		sym, err := b.lookup(s.Symbol)
		if err != nil {
			return nil, err
		}
		if s.Offset > 0 && s.Offset >= sym.Size {
			return nil, fmt.Errorf("%w: %s+0x%x is past the end of %s (%d bytes)",
				ErrBadSite, s.Symbol, s.Offset, s.Symbol, sym.Size)
		}
		off = sym.Offset + s.Offset
	}
	seg := b.segmentAt(off)
	if seg == nil {
		if off >= b.size {
			return nil, fmt.Errorf("%w: file offset 0x%x is beyond the end of %s (%d bytes)", ErrBadSite, off, b.path, b.size)
		}
		return nil, fmt.Errorf("%w: file offset 0x%x is not in a loaded segment of %s", ErrBadSite, off, b.path)
	}
	if seg.Flags&elf.PF_X == 0 {
		return nil, fmt.Errorf("%w: file offset 0x%x is in a non-executable segment (%v) of %s", ErrBadSite, off, seg.Flags, b.path)
	}
	addr := off - seg.Off + seg.Vaddr
	site := &Site{Offset: off, Addr: addr}
	start := b.sweepStart(addr, seg)
	if fn := b.funcAt(addr); fn != nil && fn.Addr >= seg.Vaddr {
		start = fn.Addr
		site.Func, site.FuncOff = fn.Name, addr-fn.Addr
	}
	in, code, err := b.walk(seg, start, addr)
	if err != nil {
		return nil, err
	}
	site.Insn, site.Len = in.text, in.len
	site.Verdict = verdict(s.MultiNop, in, code, addr)
	return site, nil
}

// segmentAt returns the PT_LOAD segment whose file image holds off,
// preferring an executable one where segments share a page of the file.
func (b *Binary) segmentAt(off uint64) *elf.Prog {
	var found *elf.Prog
	for _, p := range b.loads {
		if off >= p.Off && off-p.Off < p.Filesz {
			if p.Flags&elf.PF_X != 0 {
				return p
			}
			found = p
		}
	}
	return found
}

// funcAt returns the innermost function whose extent holds addr.
func (b *Binary) funcAt(addr uint64) *Symbol {
	var found *Symbol
	for i := range b.funcs {
		f := &b.funcs[i]
		if f.Addr > addr {
			break
		}
		if addr < f.Addr+f.Size || (f.Addr == addr) {
			found = f
		}
	}
	return found
}

// sweepStart is where a linear sweep to addr starts when no function holds
// it: the end of the last function before addr, else the start of the
// executable section or, without section headers, segment holding it.
func (b *Binary) sweepStart(addr uint64, seg *elf.Prog) uint64 {
	start := seg.Vaddr
	for _, sec := range b.f.Sections {
		if sec.Flags&elf.SHF_EXECINSTR != 0 && sec.Type == elf.SHT_PROGBITS && addr >= sec.Addr && addr-sec.Addr < sec.Size {
			start = max(start, sec.Addr)
		}
	}
	for i := range b.funcs {
		f := &b.funcs[i]
		if end := f.Addr + f.Size; f.Addr < addr && end <= addr && end > start {
			start = end
		}
	}
	return start
}

// maxInsn is the longest x86 instruction.
const maxInsn = 15

// walk decodes from start to addr, both in seg, and returns the instruction
// at addr with the bytes from addr on.
func (b *Binary) walk(seg *elf.Prog, start, addr uint64) (insn, []byte, error) {
	end := min(addr+maxInsn, seg.Vaddr+seg.Filesz)
	if end-start > b.size {
		return insn{}, nil, fmt.Errorf("%w: %s: segment at file offset 0x%x is larger than the file", ErrBadBinary, b.path, seg.Off)
	}
	buf := make([]byte, end-start)
	if _, err := seg.ReadAt(buf, int64(start-seg.Vaddr)); err != nil {
		return insn{}, nil, fmt.Errorf("%w: read code at 0x%x of %s: %v", ErrBadBinary, start, b.path, err)
	}
	pc := start
	for {
		in, err := decodeInsn(buf[pc-start:], pc)
		if err != nil {
			return insn{}, nil, fmt.Errorf("%w: cannot decode the instruction at file offset 0x%x (%v) on the way to the site",
				ErrBadSite, pc-seg.Vaddr+seg.Off, err)
		}
		if pc == addr {
			return in, buf[pc-start:], nil
		}
		if pc+uint64(in.len) > addr {
			return insn{}, nil, fmt.Errorf("%w: file offset 0x%x is inside the %d-byte instruction at file offset 0x%x (%s)",
				ErrBadSite, addr-seg.Vaddr+seg.Off, in.len, pc-seg.Vaddr+seg.Off, in.text)
		}
		pc += uint64(in.len)
	}
}
