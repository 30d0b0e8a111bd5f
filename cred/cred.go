// Package cred finds out what a FUSE request does not say about its caller,
// and resolves the group that `ptfs mount --readers` names (DESIGN §2,
// "Who may do what").
//
// A FUSE request carries the caller's uid, gid and pid, but not its
// capabilities; those are read from /proc/PID/status.
package cred

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"os/user"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrMalformed is returned for a /proc status file without a readable
// CapEff line.
var ErrMalformed = errors.New("malformed process status")

// ErrNoPid is returned for pid 0: the kernel sends it when the caller is
// not visible in the pid namespace of the mount.
var ErrNoPid = errors.New("caller has no pid in this pid namespace")

// ErrBadGroup is returned for a --readers value that names no group.
var ErrBadGroup = errors.New("bad group")

// tracingCaps are the capabilities that grant the power of a uprobe:
// reading any process's memory at any instruction.
const tracingCaps = 1<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_PERFMON

// CapEff returns the effective capability set from the content of a
// /proc/PID/status file (its `CapEff:` line, 16 hex digits).
func CapEff(status []byte) (uint64, error) {
	for line := range bytes.Lines(status) {
		v, ok := bytes.CutPrefix(line, []byte("CapEff:"))
		if !ok {
			continue
		}
		caps, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 16, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: CapEff %q: %w", ErrMalformed, bytes.TrimSpace(v), err)
		}
		return caps, nil
	}
	return 0, fmt.Errorf("%w: no CapEff line", ErrMalformed)
}

// MayTrace reports whether process (or thread) pid holds CAP_SYS_ADMIN or
// CAP_PERFMON in its effective set, in this process's user namespace.
// FUSE gives the thread id of the caller, and capabilities are per thread,
// so /proc/TID/status is the right file. Capabilities count only in the
// same user namespace: any user may make one of its own (unshare -U) and
// hold every capability there, over nothing of this machine's.
func MayTrace(pid uint32) (bool, error) {
	if pid == 0 {
		return false, ErrNoPid
	}
	if same, err := sameUserNS(pid); err != nil || !same {
		return false, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false, fmt.Errorf("capabilities of pid %d: %w", pid, err)
	}
	caps, err := CapEff(status)
	if err != nil {
		return false, fmt.Errorf("capabilities of pid %d: %w", pid, err)
	}
	return caps&tracingCaps != 0, nil
}

// sameUserNS reports whether pid lives in this process's user namespace:
// the namespace files name the same nsfs inode.
func sameUserNS(pid uint32) (bool, error) {
	var mine, theirs unix.Stat_t
	if err := unix.Stat("/proc/self/ns/user", &mine); err != nil {
		return false, fmt.Errorf("user namespace of ptfs: %w", err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", pid), &theirs); err != nil {
		return false, fmt.Errorf("user namespace of pid %d: %w", pid, err)
	}
	return mine.Dev == theirs.Dev && mine.Ino == theirs.Ino, nil
}

// Group resolves a group name or a numeric gid. A number is taken as it is,
// whether or not /etc/group names it, as chgrp does.
func Group(s string) (uint32, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: empty name", ErrBadGroup)
	}
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		// (gid_t)-1 means "no change" to chown and cannot own a file.
		if n == math.MaxUint32 {
			return 0, fmt.Errorf("%w: gid %s is reserved", ErrBadGroup, s)
		}
		return uint32(n), nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: %w", ErrBadGroup, s, err)
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %q has gid %q: %w", ErrBadGroup, s, g.Gid, err)
	}
	return uint32(n), nil
}
