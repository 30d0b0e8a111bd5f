// Package probes turns probe specs into kernel uprobes: the spec grammar, the
// resolution and check of a site in the probed binary (on objfile and
// x86insn), the ptwrite verdict of a site, the tracefs lines of classic and
// ptwrite uprobes, and the tracefs client that installs and removes them.
package probes

import (
	"syscall"

	"ptfs/objfile"
)

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
	// ErrNoSymbol reports a symbol that the binary does not define
	// (ENOENT); it is objfile's.
	ErrNoSymbol = objfile.ErrNoSymbol
	// ErrRefused reports a site or probe that the kernel or the ptwrite site
	// rules refuse (EOPNOTSUPP).
	ErrRefused error = &probeError{"probe refused", syscall.EOPNOTSUPP}
	// ErrExists reports a probe that already exists at that site or under
	// that name (EEXIST).
	ErrExists error = &probeError{"probe exists", syscall.EEXIST}
	// ErrNoTracefs reports that no usable tracefs with uprobe_events was
	// found or could be mounted (ENODEV).
	ErrNoTracefs error = &probeError{"no tracefs with uprobe_events", syscall.ENODEV}
	// ErrBadLine reports a tracefs command that is not exactly one line of
	// the grammar ptfs writes (EINVAL); it is never written.
	ErrBadLine error = &probeError{"refused tracefs command", syscall.EINVAL}
	// ErrNotRegular reports a binary path that names something other than
	// a regular file: a FIFO, socket, device or directory (EINVAL); it is
	// objfile's.
	ErrNotRegular = objfile.ErrNotRegular
	// ErrBadBinary reports a file that is not an x86-64 ELF file or is
	// malformed (ENOEXEC); it is objfile's.
	ErrBadBinary = objfile.ErrBadBinary
)
