// Package objfile reads object files: the x86-64 ELF images of executables
// and shared libraries that ptfs probes and whose code it decodes. It opens
// them without blocking, turns any panic of debug/elf into an error, maps
// file offsets to addresses through the PT_LOAD segments, merges the
// function symbols of .symtab and .dynsym, finds the function holding an
// address by binary search, and reads code bytes. It knows nothing of
// probes or traces.
package objfile

import (
	"fmt"
	"syscall"

	"ptfs/internal/errno"
)

// Sentinel errors (errno.New). Each unwraps to the errno named in its
// comment, the one the FUSE layer returns for it.
var (
	// ErrNotRegular reports a path that names something other than a
	// regular file: a FIFO, socket, device or directory (EINVAL).
	ErrNotRegular = errno.New("not a regular file", syscall.EINVAL)
	// ErrBadBinary reports a file that is not an x86-64 ELF file or is
	// malformed (ENOEXEC).
	ErrBadBinary = errno.New("not a usable x86-64 ELF file", syscall.ENOEXEC)
	// ErrNoSymbol reports a function name that the file does not define
	// (ENOENT).
	ErrNoSymbol = errno.New("no such symbol", syscall.ENOENT)
	// ErrAmbiguous reports a name that several functions at different
	// addresses carry (EINVAL).
	ErrAmbiguous = errno.New("ambiguous symbol", syscall.EINVAL)
	// ErrNoCode reports an address outside the file image of every
	// PT_LOAD segment (EINVAL).
	ErrNoCode = errno.New("address not in the file", syscall.EINVAL)
	// ErrTooLarge reports a file larger than MaxContent, refused before it
	// is read into memory (EFBIG).
	ErrTooLarge = errno.New("file too large", syscall.EFBIG)
)

// ambiguousError is the error of a lookup by a name that several functions
// carry: it wraps ErrAmbiguous, and its text names two of them by file
// offset.
type ambiguousError struct {
	name string
	a, b uint64
}

func (e *ambiguousError) Error() string {
	return fmt.Sprintf("symbol %q names several functions (at 0x%x and 0x%x)", e.name, e.a, e.b)
}

func (e *ambiguousError) Unwrap() error { return ErrAmbiguous }
