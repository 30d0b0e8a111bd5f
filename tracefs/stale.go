package tracefs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ownerSocket is the abstract unix socket by which a live process claims
// the ptfs<PID>_* groups of its PID.
func ownerSocket(pid int) string { return "@ptfs-owner-" + strconv.Itoa(pid) }

// Claim marks the calling process as the live owner of the probe groups
// that GroupName makes for its PID, so that RemoveStale in other processes
// leaves them alone even when this process is not named ptfs (a test
// binary, a renamed build). The mark is an abstract unix socket, which the
// kernel drops when the process dies, so a crash leaves nothing behind.
type Claim struct {
	l    net.Listener
	done chan struct{}
}

// ClaimProbes claims the probe groups of the calling process until Close.
func ClaimProbes() (*Claim, error) {
	l, err := net.Listen("unix", ownerSocket(os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("claim probe groups: %w", err)
	}
	c := &Claim{l: l, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		// Checkers only connect and hang up; accepting keeps the backlog
		// from filling up.
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	return c, nil
}

// Close gives up the claim.
func (c *Claim) Close() error {
	err := c.l.Close()
	<-c.done
	if err != nil {
		return fmt.Errorf("release probe claim: %w", err)
	}
	return nil
}

// groupPID returns the PID of a ptfs<PID>_* group.
func groupPID(group string) (int, bool) {
	rest, ok := strings.CutPrefix(group, "ptfs")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, "_")
	if !ok || num == "" || num[0] == '0' {
		return 0, false
	}
	pid, err := strconv.Atoi(num)
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}

// OwnerAlive tells whether process pid may still own its groups and
// mounts: it claims them, or it lives and is named ptfs (comm or
// executable).
func OwnerAlive(pid int) bool {
	if c, err := net.Dial("unix", ownerSocket(pid)); err == nil {
		c.Close()
		return true
	}
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	if comm, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil && strings.TrimSpace(string(comm)) == "ptfs" {
		return true
	}
	exe, err := os.Readlink(filepath.Join(dir, "exe"))
	return err == nil && filepath.Base(strings.TrimSuffix(exe, " (deleted)")) == "ptfs"
}

// RemoveStale removes the probes of every ptfs<PID>_* group, and those on
// the trial files of TrialPTW, whose process is gone: PID is dead, or is
// reused by a process that neither claims the groups (ClaimProbes) nor is
// named ptfs. It never touches the probes of self or of a live owner, nor
// any other probe outside a ptfs<PID>_* group. It returns the
// GRP/EVENT names it removed; removals that fail (EBUSY while a perf event
// still holds one) are joined into err and the rest go on.
func (t *Tracefs) RemoveStale(self int) (removed []string, err error) {
	return t.removeStale(self, func(string) bool { return true })
}

// removeStale is RemoveStale limited to the groups that consider accepts.
func (t *Tracefs) removeStale(self int, consider func(group string) bool) (removed []string, err error) {
	lines, err := t.Events()
	if err != nil {
		return nil, err
	}
	alive := map[int]bool{}
	done := map[string]bool{}
	var errs []error
	for _, l := range lines {
		pl, perr := ParseLine(l)
		if perr != nil {
			continue
		}
		pid, ok := groupPID(pl.Group)
		if !ok {
			// A stock kernel's stand-in for a trial ptw: line sits in
			// group uprobes; its file names the PID.
			pid, ok = trialPID(pl.Path)
		}
		name := pl.Group + "/" + pl.Event
		if !ok || pid == self || done[name] || !consider(pl.Group) {
			continue
		}
		live, known := alive[pid]
		if !known {
			live = OwnerAlive(pid)
			alive[pid] = live
		}
		if live {
			continue
		}
		done[name] = true
		if rerr := t.RemoveProbe(pl.Group, pl.Event); rerr != nil {
			errs = append(errs, rerr)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
