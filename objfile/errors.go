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
	"strings"
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

// candidatesError is the error of a lookup that found several functions,
// or none but functions of a similar name: it wraps its sentinel, and its
// text lists every candidate by raw name and file offset, so that the
// user can pick one by either.
type candidatesError struct {
	what  string
	cands []Symbol
	err   error
}

func (e *candidatesError) Error() string {
	var b strings.Builder
	b.WriteString(e.err.Error())
	b.WriteString(": ")
	b.WriteString(e.what)
	b.WriteString(": ")
	for i, s := range e.cands {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s at 0x%x", s.Raw, s.Offset)
		if s.Name != s.Raw {
			fmt.Fprintf(&b, " (%s)", s.Name)
		}
	}
	if rawsDiffer(e.cands) {
		b.WriteString(": use a raw name or a file offset")
	} else {
		b.WriteString(": use a file offset")
	}
	return b.String()
}

func (e *candidatesError) Unwrap() error { return e.err }

// rawsDiffer tells whether every candidate has a raw name of its own, one
// a site can name it by.
func rawsDiffer(cands []Symbol) bool {
	for i := range cands {
		for j := range i {
			if cands[i].Raw == cands[j].Raw {
				return false
			}
		}
	}
	return true
}
