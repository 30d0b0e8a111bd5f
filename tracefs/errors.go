// Package tracefs is the client of the kernel's tracefs for uprobes: finding
// or mounting tracefs, the uprobe_events lines ptfs writes and the gate they
// pass, adding probes with read-back and the kernel's reasons from
// error_log, removing them, enabling ptwrite probes, reading an event's id
// and format, removing the probes of dead mounts, and detecting ptwrite
// uprobe support.
package tracefs

import (
	"syscall"

	"ptfs/internal/errno"
)

// Sentinel errors (errno.New). Each unwraps to the errno named in its
// comment, the one the FUSE layer returns for it. Probes that the kernel
// refuses, and sites beyond their file, are reported with
// probes.ErrRefused and probes.ErrBadSite, as the site checks do.
var (
	// ErrExists reports a probe that already exists at that site or under
	// that name (EEXIST).
	ErrExists = errno.New("probe exists", syscall.EEXIST)
	// ErrNoTracefs reports that no usable tracefs with uprobe_events was
	// found or could be mounted (ENODEV).
	ErrNoTracefs = errno.New("no tracefs with uprobe_events", syscall.ENODEV)
	// ErrBadLine reports a tracefs command that is not exactly one line of
	// the grammar ptfs writes (EINVAL); it is never written.
	ErrBadLine = errno.New("refused tracefs command", syscall.EINVAL)
)
