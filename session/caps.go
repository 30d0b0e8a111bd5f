package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"ptfs/perfio"
	"ptfs/tracefs"
)

// Mode is the engine a mount runs on.
type Mode string

// Modes of DESIGN §3.
const (
	ModeAuto    Mode = "auto"
	ModeClassic Mode = "classic"
	ModePTW     Mode = "ptw"
)

// ParseMode parses a --mode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeClassic, ModePTW:
		return m, nil
	}
	return "", fmt.Errorf("unknown mode %q (want auto, classic or ptw)", s)
}

// Caps is what the machine offers, with the reason for every missing piece.
type Caps struct {
	Tracefs    string // mount point, "" when absent
	TracefsErr string
	Uprobes    bool
	UprobesErr string
	FUSE       bool
	FUSEErr    string
	IntelPT    bool
	IntelPTErr string
	// PTWrite: the CPU has PTWRITE and the intel_pt PMU has the ptw and
	// fup_on_ptw format bits.
	PTWrite    bool
	PTWriteErr string
	// PTWUprobes: the kernel has ptwrite uprobes; PTWHow says how that was
	// established (README or trial probe).
	PTWUprobes bool
	PTWHow     string
	PTWErr     string
}

// ErrPTWUnavailable reports that --mode=ptw cannot run on this machine.
var ErrPTWUnavailable = errors.New("ptw mode unavailable")

// Roots of the kernel interfaces, replaceable by tests with trees in a temp dir.
type roots struct {
	sysfs string // /sys
	dev   string // /dev
}

var defaultRoots = roots{sysfs: "/sys", dev: "/dev"}

// intelPT returns the sysfs directory of the intel_pt PMU.
func (r roots) intelPT() string {
	return filepath.Join(r.sysfs, "bus/event_source/devices/intel_pt")
}

// detect reads the capabilities. tfs is the tracefs to check, or nil with
// tracefsErr saying why there is none. The kernel side of ptw support comes
// from tfs.TrialPTW: the README, or a trial probe that leaves nothing
// behind.
func (r roots) detect(tfs *tracefs.Tracefs, tracefsErr error) Caps {
	var c Caps
	switch {
	case tracefsErr != nil || tfs == nil:
		c.TracefsErr = "no tracefs"
		if tracefsErr != nil {
			c.TracefsErr = tracefsErr.Error()
		}
		c.UprobesErr = "no tracefs"
		c.PTWErr = "no tracefs"
	default:
		c.Tracefs = tfs.Dir
		if !tfs.HasUprobes() {
			c.UprobesErr = "no uprobe_events in tracefs (kernel without CONFIG_UPROBE_EVENTS)"
			c.PTWErr = "no uprobe_events in tracefs"
			break
		}
		c.Uprobes = true
		ok, why, err := tfs.TrialPTW()
		switch {
		case err != nil:
			c.PTWErr = err.Error()
		case ok:
			c.PTWUprobes, c.PTWHow = true, why
		default:
			c.PTWErr = why
		}
	}
	if fi, err := os.Stat(filepath.Join(r.dev, "fuse")); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		c.FUSE = true
	} else {
		c.FUSEErr = "no /dev/fuse"
	}
	pt := r.intelPT()
	if _, err := os.Stat(filepath.Join(pt, "type")); err != nil {
		c.IntelPTErr = "no Intel PT: " + pt + " is missing"
		c.PTWriteErr = "no Intel PT"
		return c
	}
	c.IntelPT = true
	if why, err := perfio.CheckPTWrite(pt); err != nil {
		c.PTWriteErr = why
	} else {
		c.PTWrite = true
	}
	return c
}

// Choose picks the mode for want, with the reason, or says why want
// cannot run; a --mode=ptw that cannot run wraps ErrPTWUnavailable and
// says all that is missing.
func (c *Caps) Choose(want Mode) (Mode, string, error) {
	if !c.Uprobes {
		return "", "", fmt.Errorf("no uprobes: %s", c.UprobesErr)
	}
	ptwOK, why := c.ptw()
	switch want {
	case ModeClassic:
		return ModeClassic, "forced by --mode=classic", nil
	case ModePTW:
		if !ptwOK {
			return "", "", fmt.Errorf("%w: %s", ErrPTWUnavailable, why)
		}
		return ModePTW, "forced by --mode=ptw", nil
	}
	if ptwOK {
		return ModePTW, "Intel PT with PTWRITE, and ptwrite uprobes (" + c.PTWHow + ")", nil
	}
	return ModeClassic, "ptw unavailable: " + why, nil
}

// ptw tells whether ptw mode can run, or what it misses.
func (c *Caps) ptw() (bool, string) {
	var miss []string
	if !c.IntelPT {
		miss = append(miss, c.IntelPTErr)
	} else if !c.PTWrite {
		miss = append(miss, c.PTWriteErr)
	}
	if !c.PTWUprobes {
		miss = append(miss, c.PTWErr)
	}
	return len(miss) == 0, strings.Join(miss, "; ")
}

// BranchesErr says why branch tracing is unavailable (in this build, it
// always is).
func (c *Caps) BranchesErr() string {
	if !c.IntelPT {
		return "branches need Intel PT: " + c.IntelPTErr
	}
	// The capture can trace branches (perfio.PTOptions.Branch); what
	// turns them into branch lines is not written yet.
	return "this build of ptfs cannot reconstruct control flow from the PT stream yet"
}

// AppendText appends the capability lines of `ptfs check` and the root status.
func (c *Caps) AppendText(dst []byte) []byte {
	line := func(key string, ok bool, val, why string) {
		if ok {
			dst = fmt.Appendf(dst, "%s: yes%s\n", key, val)
		} else {
			dst = fmt.Appendf(dst, "%s: no (%s)\n", key, why)
		}
	}
	tr := ""
	if c.Tracefs != "" {
		tr = " (" + c.Tracefs + ")"
	}
	line("tracefs", c.Tracefs != "", tr, c.TracefsErr)
	line("uprobes", c.Uprobes, "", c.UprobesErr)
	line("fuse", c.FUSE, "", c.FUSEErr)
	line("intel_pt", c.IntelPT, "", c.IntelPTErr)
	line("ptwrite", c.PTWrite, "", c.PTWriteErr)
	line("ptw uprobes", c.PTWUprobes, " ("+c.PTWHow+")", c.PTWErr)
	return dst
}
