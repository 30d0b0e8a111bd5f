package tracefs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"ptfs/probes"
)

// trialSeq numbers the trial probes of this process, so that concurrent
// trials never share an event name.
var trialSeq atomic.Uint64

// trialPrefix starts the base name of every trial file: "ptfs<PID>_trial".
// A stock kernel names its stand-in for a ptw: line after the base name
// (p_ptfs<PID>_0x0, in group uprobes), so RemoveStale finds trial leftovers
// of a dead process by their path.
const trialPrefix = "_trial"

// nop5 is the 5-byte NOP (nopl 0x0(%rax,%rax,1)) that every ptwrite kernel
// can patch.
var nop5 = []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}

// TrialPTW tells whether the kernel has ptwrite uprobes, with why as one
// line that explains the verdict. When the tracefs README documents ptw
// probes, that settles it. Otherwise it writes a trial ptw: probe with one
// fetcharg (%di) on a 5-byte NOP in a new file in os.TempDir() that nobody
// maps, in group GroupName(pid, "check"), reads uprobe_events back (the
// probe counts when listed under its name, as ptw: or p:; AddProbe), and
// removes whatever the kernel created (a stock kernel makes a classic
// stand-in) and the file before it returns. A kernel that refuses the line or creates
// something else gives ok false and a nil err; err reports what kept the
// trial from finishing (tracefs not writable, a probe that would not go).
func (t *Tracefs) TrialPTW() (ok bool, why string, err error) {
	doc, err := t.ReadmeMentionsPTW()
	if err != nil {
		return false, "", fmt.Errorf("ptw trial: %w", err)
	}
	if doc {
		return true, "the tracefs README documents ptw probes", nil
	}
	pid := os.Getpid()
	f, err := os.CreateTemp("", "ptfs"+strconv.Itoa(pid)+trialPrefix+"*")
	if err != nil {
		return false, "", fmt.Errorf("ptw trial: %w", err)
	}
	path := f.Name()
	// Ours until the trial is over, so that RemoveStale in a concurrent
	// session of this process leaves its stand-in alone.
	trial(path, true)
	defer trial(path, false)
	_, werr := f.Write(nop5)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	defer os.Remove(path)
	if werr != nil {
		return false, "", fmt.Errorf("ptw trial: write %s: %w", path, werr)
	}
	group := GroupName(pid, "check")
	event := "trial_" + strconv.FormatUint(trialSeq.Add(1), 10)
	// One fetcharg: the RFC takes 1 to 8, and a kernel that refuses a
	// line without any must not read as one without ptwrite uprobes.
	line := "ptw:" + group + "/" + event + " " + path + ":0x0 %di"
	made, aerr := t.addProbe(line)
	if aerr == nil {
		if err := t.RemoveProbe(group, event); err != nil {
			return true, "", fmt.Errorf("ptw trial: %w", err)
		}
	}
	// Whatever happened, nothing of the trial may stay: neither the event
	// nor anything on its file.
	if err := t.removeTrial(group, event, path); err != nil {
		return aerr == nil, "", fmt.Errorf("ptw trial: %w", err)
	}
	switch {
	case aerr == nil:
		return true, "a trial ptw: probe was listed under its own name (removed)", nil
	case len(made) > 0:
		return false, fmt.Sprintf("the kernel turned a trial ptw: line into classic probe %s (removed): no ptwrite uprobes", strings.Join(made, ", ")), nil
	case errors.Is(aerr, probes.ErrRefused) || errors.Is(aerr, ErrExists):
		return false, fmt.Sprintf("the kernel refused a trial ptw: line (%v): no ptwrite uprobes", aerr), nil
	}
	return false, "", fmt.Errorf("ptw trial: %w", aerr)
}

// removeTrial removes every probe of the trial event or on its file that
// uprobe_events still lists.
func (t *Tracefs) removeTrial(group, event, path string) error {
	lines, err := t.Events()
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range lines {
		pl, err := ParseLine(l)
		if err == nil && (pl.Group == group && pl.Event == event || pl.Path == path) {
			errs = append(errs, t.RemoveProbe(pl.Group, pl.Event))
		}
	}
	return errors.Join(errs...)
}

// trialPID returns the PID in the name of a trial file that TrialPTW made.
func trialPID(path string) (int, bool) {
	base := filepath.Base(path)
	i := strings.Index(base, trialPrefix)
	if filepath.Dir(path) != filepath.Clean(os.TempDir()) || i < 0 {
		return 0, false
	}
	return groupPID(base[:i] + "_")
}
