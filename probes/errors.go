// Package probes turns probe specs into probe sites: the spec grammar, the
// resolution and check of a site in the probed binary (on objfile and
// x86insn), and the ptwrite verdict of a site. Package tracefs writes the
// resulting lines to the kernel.
package probes

import (
	"syscall"

	"ptfs/internal/errno"
	"ptfs/objfile"
)

// Sentinel errors (errno.New). Each unwraps to the errno named in its
// comment, the one the FUSE layer returns for it.
var (
	// ErrSyntax reports a malformed spec (EINVAL).
	ErrSyntax = errno.New("bad probe spec", syscall.EINVAL)
	// ErrBadSite reports a site outside an executable segment, inside an
	// instruction or beyond the file (EINVAL).
	ErrBadSite = errno.New("bad probe site", syscall.EINVAL)
	// ErrNoSymbol reports a symbol that the binary does not define
	// (ENOENT); it is objfile's.
	ErrNoSymbol = objfile.ErrNoSymbol
	// ErrRefused reports a site or probe that the kernel or the ptwrite site
	// rules refuse (EOPNOTSUPP).
	ErrRefused = errno.New("probe refused", syscall.EOPNOTSUPP)
	// ErrNotRegular reports a binary path that names something other than
	// a regular file: a FIFO, socket, device or directory (EINVAL); it is
	// objfile's.
	ErrNotRegular = objfile.ErrNotRegular
	// ErrBadBinary reports a file that is not an x86-64 ELF file or is
	// malformed (ENOEXEC); it is objfile's.
	ErrBadBinary = objfile.ErrBadBinary
)
