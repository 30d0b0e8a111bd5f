// Package probes turns probe specs into probe sites: the spec grammar, the
// ELF symbols and site checks of the probed binary, and the ptwrite verdict
// of a site. Package tracefs writes the resulting lines to the kernel.
package probes

import "syscall"

// probeError is a sentinel error that also unwraps to the errno the FUSE
// layer returns for it, so callers can use errors.Is with the sentinel and
// errors.As with syscall.Errno on the same error.
type probeError struct {
	msg   string
	errno syscall.Errno
}

func (e *probeError) Error() string { return e.msg }

func (e *probeError) Unwrap() error { return e.errno }

// Sentinel errors. Each unwraps to the errno named in its comment.
var (
	// ErrSyntax reports a malformed spec (EINVAL).
	ErrSyntax error = &probeError{"bad probe spec", syscall.EINVAL}
	// ErrBadSite reports a site outside an executable segment, inside an
	// instruction or beyond the file (EINVAL).
	ErrBadSite error = &probeError{"bad probe site", syscall.EINVAL}
	// ErrNoSymbol reports a symbol that the binary does not define (ENOENT).
	ErrNoSymbol error = &probeError{"no such symbol", syscall.ENOENT}
	// ErrRefused reports a site or probe that the kernel or the ptwrite site
	// rules refuse (EOPNOTSUPP).
	ErrRefused error = &probeError{"probe refused", syscall.EOPNOTSUPP}
	// ErrNotRegular reports a binary path that names something other than
	// a regular file: a FIFO, socket, device or directory (EINVAL).
	ErrNotRegular error = &probeError{"not a regular file", syscall.EINVAL}
	// ErrBadBinary reports a file that is not an x86-64 ELF file or is
	// malformed (ENOEXEC).
	ErrBadBinary error = &probeError{"not a usable x86-64 ELF file", syscall.ENOEXEC}
)
