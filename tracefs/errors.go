// Package tracefs is the client of the kernel's tracefs for uprobes: finding
// or mounting tracefs, the uprobe_events lines ptfs writes and the gate they
// pass, adding probes with read-back and the kernel's reasons from
// error_log, removing them, enabling ptwrite probes, reading an event's id
// and format, removing the probes of dead mounts, and detecting ptwrite
// uprobe support.
package tracefs

import "syscall"

// kernelError is a sentinel error that also unwraps to the errno the FUSE
// layer returns for it, so callers can use errors.Is with the sentinel and
// errors.As with syscall.Errno on the same error.
type kernelError struct {
	msg   string
	errno syscall.Errno
}

func (e *kernelError) Error() string { return e.msg }

func (e *kernelError) Unwrap() error { return e.errno }

// Sentinel errors. Each unwraps to the errno named in its comment. Probes
// that the kernel refuses, and sites beyond their file, are reported with
// probes.ErrRefused and probes.ErrBadSite, as the site checks do.
var (
	// ErrExists reports a probe that already exists at that site or under
	// that name (EEXIST).
	ErrExists error = &kernelError{"probe exists", syscall.EEXIST}
	// ErrNoTracefs reports that no usable tracefs with uprobe_events was
	// found or could be mounted (ENODEV).
	ErrNoTracefs error = &kernelError{"no tracefs with uprobe_events", syscall.ENODEV}
	// ErrBadLine reports a tracefs command that is not exactly one line of
	// the grammar ptfs writes (EINVAL); it is never written.
	ErrBadLine error = &kernelError{"refused tracefs command", syscall.EINVAL}
)
