// Package fs presents a ptfs tracing engine as a FUSE file system (DESIGN §2).
//
// It only adapts to FUSE: the engine behind the Tracer and Target
// interfaces (each composed of the small interfaces its nodes use)
// installs probes and produces the text; this package maps file
// operations onto those calls and their errors onto errnos.
package fs

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"

	"ptfs/stream"
)

// The engine is seen through small interfaces, one for what each node
// needs, so that a node depends on no more of the engine than it uses and
// an engine (package session) satisfies them without importing fs.

// Reporter makes the content of a `status` file: the root's or a
// target's.
type Reporter interface {
	// Status returns the content of the `status` file.
	Status() []byte
}

// TargetSet is the set of targets behind the root directory.
type TargetSet interface {
	// Targets returns the targets present at mount time.
	Targets() []Target
	// AddTarget starts tracing the binary at path as directory name
	// (`ln -s PATH MNT/NAME`).
	AddTarget(name, path string) (Target, error)
	// RemoveTarget stops tracing name and removes its probes
	// (`rmdir MNT/NAME`).
	RemoveTarget(name string) error
}

// Tracer is the engine behind a mount: the root `status` and the targets.
type Tracer interface {
	Reporter
	TargetSet
}

// Exe is the binary behind the `exe` symlink.
type Exe interface {
	// Path returns the binary's path, the target of the `exe` symlink.
	Path() string
}

// SymbolTable makes the content of the `symbols` file.
type SymbolTable interface {
	// Symbols returns the content of the `symbols` file.
	Symbols() ([]byte, error)
}

// ProbeSet is a target's probes, the files of probes/.
type ProbeSet interface {
	// Probes returns the names in probes/.
	Probes() []string
	// ProbeText returns the content of probes/NAME: the spec line, then
	// '# ' lines with its state or the reason it was refused; false if
	// there is no such probe.
	ProbeText(name string) ([]byte, bool)
	// CreateProbe creates an empty probe file (open with O_CREAT before
	// any write).
	CreateProbe(name string) error
	// SetProbe checks spec and installs it as probe name. A working probe
	// is replaced only once the new spec is known good. Errors unwrap to
	// a syscall.Errno (EINVAL, ENOENT, EOPNOTSUPP, EEXIST...).
	SetProbe(name, spec string) error
	// StageProbe is SetProbe for a file created with O_EXCL, a temp file
	// to be renamed over a probe (`sed -i`): a spec at the site of
	// another probe is kept, not refused, until that rename.
	StageProbe(name, spec string) error
	// RemoveProbe removes probe name (`rm probes/NAME`).
	RemoveProbe(name string) error
	// RenameProbe renames probe from to `to` (`mv`), replacing `to`
	// unless noReplace (EEXIST then).
	RenameProbe(from, to string, noReplace bool) error
}

// Recorder is the source of the `records` file.
type Recorder interface {
	// Records returns the stream behind the `records` file.
	Records() *stream.Stream
}

// Brancher is the source of the `branches` file.
type Brancher interface {
	// Branches is called for each open of `branches` and returns its
	// stream; without PT the error unwraps to EOPNOTSUPP.
	Branches() (*stream.Stream, error)
}

// Target is one traced binary, a directory of the mount: what each of its
// nodes needs, composed.
type Target interface {
	// Name returns the directory name.
	Name() string
	Exe
	Reporter
	SymbolTable
	ProbeSet
	Recorder
	Brancher
}

// BranchesCloser is implemented by a Brancher that wants to know when an
// open of `branches` ends, because branch tracing runs only while the file
// is open. CloseBranches is called once for every successful Branches call,
// when that open file is released.
type BranchesCloser interface {
	CloseBranches()
}

// Options tune a mount.
type Options struct {
	// AllowOther lets users other than the one who mounted see the files;
	// the kernel checks every access against the owners and modes the
	// nodes report (default_permissions).
	AllowOther bool
	// UID owns every node and controls the mount: the mounting user
	// (zero: root).
	UID uint32
	// GID is the group of every node: the readers group, or the mounting
	// user's group.
	GID uint32
	// GroupReads lets the members of GID read the trace (records,
	// branches) and the probe files (--readers).
	GroupReads bool
	// MayTrace reports whether the process (thread) pid may control the
	// mount although it is not UID: it holds CAP_SYS_ADMIN or CAP_PERFMON
	// (cred.MayTrace). nil: only UID may.
	MayTrace func(pid uint32) (bool, error)
	// Debug logs every FUSE request (go-fuse's debug output).
	Debug bool
}

// Mount mounts t on dir and serves it until the returned server is
// unmounted (server.Unmount, then server.Wait). It mounts with the mount
// syscall directly (no fusermount), so it needs root.
func Mount(dir string, t Tracer, opts Options) (*fuse.Server, error) {
	root := &rootNode{tracer: t, perms: newPerms(opts)}
	server, err := gofs.Mount(dir, root, &gofs.Options{
		MountOptions: MountOptions(opts),
		// Entry and attribute timeouts are left nil here: every node sets
		// its own, zero for what changes (targets, probes, growing files)
		// so that `tail -f` and `ls` see changes at once.
	})
	if err != nil {
		return nil, fmt.Errorf("mount ptfs on %s: %w", dir, err)
	}
	return server, nil
}

// MountOptions are the FUSE mount options Mount uses for opts: also those
// of the benchmarks' FUSE floor, a minimal file system mounted as ptfs is.
func MountOptions(opts Options) fuse.MountOptions {
	return fuse.MountOptions{
		DirectMountStrict: true,
		FsName:            fmt.Sprintf("ptfs:%d", os.Getpid()), // a later mount tells a dead one by its server
		Name:              "ptfs",
		AllowOther:        opts.AllowOther,
		// The kernel checks the callers' credentials, with their
		// supplementary groups, against the modes; the handlers
		// check the callers of changes again (perms.control).
		Options:       []string{"default_permissions"},
		Debug:         opts.Debug,
		DisableXAttrs: true,
		// 1 MiB requests (the kernel's most), so a reader that follows
		// a busy records file needs fewer requests and context switches
		// than with the 128 KiB default.
		MaxWrite:     1 << 20,
		MaxReadAhead: 1 << 20,
	}
}

// toErrno maps an engine error to the errno the FUSE request returns: the
// syscall.Errno it wraps, else EIO.
func toErrno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		logrus.WithError(err).WithField("op", op).Debug("ptfs: request failed")
		return e
	}
	logrus.WithError(err).WithField("op", op).Debug("ptfs: request failed without errno, returning EIO")
	return syscall.EIO
}
