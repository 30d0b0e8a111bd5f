package tracefs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// ownerSocket is the abstract unix socket by which a live process claims
// the ptfs<PID>_* groups of its PID.
func ownerSocket(pid int) string { return "@ptfs-owner-" + strconv.Itoa(pid) }

// Claim marks the calling process as the live owner of the probe groups
// that GroupName makes for its PID, so that RemoveStale in other processes
// leaves them alone even when this process is not named ptfs (a test
// binary, a renamed build). The mark is an abstract unix socket, which the
// kernel drops when the process dies, so a crash leaves nothing behind.
// Claims are per process: the first opens the socket, the last Close
// shuts it, so that several sessions of one process can live at once.
type Claim struct {
	once sync.Once
	held bool // made by ClaimProbes: a zero Claim holds nothing
}

// claim is the process's one owner socket and the Claims that hold it.
var claim struct {
	sync.Mutex
	n    int
	l    net.Listener
	done chan struct{}
}

// ClaimProbes claims the probe groups of the calling process until Close.
func ClaimProbes() (*Claim, error) {
	claim.Lock()
	defer claim.Unlock()
	if claim.n == 0 {
		l, err := net.Listen("unix", ownerSocket(os.Getpid()))
		if err != nil {
			return nil, fmt.Errorf("claim probe groups: %w", err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Checkers only connect and hang up; accepting keeps the
			// backlog from filling up.
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				conn.Close()
			}
		}()
		claim.l, claim.done = l, done
	}
	claim.n++
	return &Claim{held: true}, nil
}

// Close gives up the claim; the socket goes with the process's last one.
// A second Close does nothing.
func (c *Claim) Close() (err error) {
	if !c.held {
		return nil
	}
	c.once.Do(func() {
		claim.Lock()
		defer claim.Unlock()
		if claim.n--; claim.n > 0 {
			return
		}
		err = claim.l.Close()
		<-claim.done
		claim.l, claim.done = nil, nil
	})
	if err != nil {
		return fmt.Errorf("release probe claim: %w", err)
	}
	return nil
}

// own is what this process made, in each tracefs (by Dir): the
// ptfs<PID>_* groups of its PID that it wrote a line in, and the trial
// files of TrialPTW in progress. A line of its PID that is in neither was
// left by a dead process that had the same PID before (PIDs are reused):
// the PID alone cannot tell the two apart, and no other live process has
// that PID.
var own struct {
	mu     sync.Mutex
	groups map[ownGroup]bool
	trials map[string]bool
	// adopt serialises adoptions, so that a group's lines are removed
	// before any of this process's are written in it.
	adopt sync.Mutex
}

type ownGroup struct{ dir, group string }

// made tells whether this process made group in t, or, for a stand-in in
// the default group, the trial file at path.
func (t *Tracefs) made(group, path string) bool {
	own.mu.Lock()
	defer own.mu.Unlock()
	if group == defaultGroup {
		return own.trials[path]
	}
	return own.groups[ownGroup{t.Dir, group}]
}

// adopt makes group this process's before its first line is written in
// it, when the group is of this process's PID: the lines the group holds
// then are a dead same-PID process's, and are removed first, so that they
// never clash with, or count as, this process's probes. It fails, leaving
// the group unadopted, when one of them cannot be removed.
func (t *Tracefs) adopt(group string) error {
	self := os.Getpid()
	if pid, ok := groupPID(group); !ok || pid != self || t.made(group, "") {
		return nil
	}
	own.adopt.Lock()
	defer own.adopt.Unlock()
	if t.made(group, "") {
		return nil // adopted meanwhile
	}
	if _, err := t.removeStale(self, func(g string) bool { return g == group }); err != nil {
		return fmt.Errorf("group %s holds probes of a dead process with this PID: %w", group, err)
	}
	own.mu.Lock()
	if own.groups == nil {
		own.groups = map[ownGroup]bool{}
	}
	own.groups[ownGroup{t.Dir, group}] = true
	own.mu.Unlock()
	return nil
}

// trial marks path, a trial file of this process, as its own (on true) or
// no longer (on false): what is left on it then is garbage.
func trial(path string, on bool) {
	own.mu.Lock()
	defer own.mu.Unlock()
	if !on {
		delete(own.trials, path)
		return
	}
	if own.trials == nil {
		own.trials = map[string]bool{}
	}
	own.trials[path] = true
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
// named ptfs, or is self (the caller's PID, os.Getpid()) and this process
// did not make them (a dead process had the PID before). It never touches
// the probes that this process made, those of a live owner, nor any other
// probe outside a ptfs<PID>_* group. It returns the GRP/EVENT names it
// removed; removals that fail (EBUSY while a perf event still holds one)
// are joined into err and the rest go on; a probe that is gone by the time
// it is removed is neither.
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
		if !ok || done[name] || !consider(pl.Group) {
			continue
		}
		// Only this process has its PID: what it did not make is a dead
		// predecessor's, whatever OwnerAlive says of the PID.
		live, known := alive[pid]
		switch {
		case pid == self:
			live = t.made(pl.Group, pl.Path)
		case !known:
			live = OwnerAlive(pid)
			alive[pid] = live
		}
		if live {
			continue
		}
		done[name] = true
		if rerr := t.RemoveProbe(pl.Group, pl.Event); errors.Is(rerr, syscall.ENOENT) {
			continue // removed meanwhile by another remover
		} else if rerr != nil {
			errs = append(errs, rerr)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
