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

// Caps is what the machine offers, with the reason for every missing
// piece: an error whose text is the reason `ptfs check` shows and which
// wraps the sentinel of the missing piece (tracefs.ErrNoTracefs,
// ErrNoUprobes, ErrNoFUSE, perfio.ErrNoPT, perfio.ErrNoPTW,
// ErrNoPTWUprobes) and the error that made it missing, if any.
type Caps struct {
	Tracefs    string // mount point, "" when absent
	TracefsErr error
	Uprobes    bool
	UprobesErr error
	FUSE       bool
	FUSEErr    error
	IntelPT    bool
	IntelPTErr error
	// PTWrite: the CPU has PTWRITE and the intel_pt PMU has the ptw and
	// fup_on_ptw format bits.
	PTWrite    bool
	PTWriteErr error
	// PTWUprobes: the kernel has ptwrite uprobes; PTWHow says how that was
	// established (README or trial probe).
	PTWUprobes bool
	PTWHow     string
	PTWErr     error
}

var (
	// ErrPTWUnavailable reports that --mode=ptw cannot run on this machine.
	ErrPTWUnavailable = errors.New("ptw mode unavailable")
	// ErrNoUprobes reports a kernel without uprobe events.
	ErrNoUprobes = errors.New("no uprobes")
	// ErrNoFUSE reports a machine without /dev/fuse.
	ErrNoFUSE = errors.New("no /dev/fuse")
	// ErrNoPTWUprobes reports a kernel without ptwrite uprobes.
	ErrNoPTWUprobes = errors.New("no ptwrite uprobes")
	// ErrNoBranches reports that branch tracing cannot run.
	ErrNoBranches = errors.New("branch tracing unavailable")
)

// missing is a missing capability: its text is the reason alone (the
// capability lines name what is missing), and it wraps the sentinel and
// the cause.
type missing struct {
	why  string
	errs []error
}

func (m *missing) Error() string   { return m.why }
func (m *missing) Unwrap() []error { return m.errs }

// lack returns the missing-capability error with text why that wraps errs.
func lack(why string, errs ...error) error { return &missing{why, errs} }

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
		c.TracefsErr = lack("no tracefs", tracefs.ErrNoTracefs)
		if tracefsErr != nil {
			c.TracefsErr = lack(tracefsErr.Error(), tracefs.ErrNoTracefs, tracefsErr)
		}
		c.UprobesErr = lack("no tracefs", ErrNoUprobes, tracefs.ErrNoTracefs)
		c.PTWErr = lack("no tracefs", ErrNoPTWUprobes, tracefs.ErrNoTracefs)
	default:
		c.Tracefs = tfs.Dir
		if !tfs.HasUprobes() {
			c.UprobesErr = lack("no uprobe_events in tracefs (kernel without CONFIG_UPROBE_EVENTS)", ErrNoUprobes)
			c.PTWErr = lack("no uprobe_events in tracefs", ErrNoPTWUprobes)
			break
		}
		c.Uprobes = true
		ok, why, err := tfs.TrialPTW()
		switch {
		case err != nil:
			c.PTWErr = lack(err.Error(), ErrNoPTWUprobes, err)
		case ok:
			c.PTWUprobes, c.PTWHow = true, why
		default:
			c.PTWErr = lack(why, ErrNoPTWUprobes)
		}
	}
	if fi, err := os.Stat(filepath.Join(r.dev, "fuse")); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		c.FUSE = true
	} else {
		c.FUSEErr = ErrNoFUSE
	}
	pt := r.intelPT()
	if _, err := os.Stat(filepath.Join(pt, "type")); err != nil {
		c.IntelPTErr = lack("no Intel PT: "+pt+" is missing", perfio.ErrNoPT)
		c.PTWriteErr = lack("no Intel PT", perfio.ErrNoPTW, perfio.ErrNoPT)
		return c
	}
	c.IntelPT = true
	if why, err := perfio.CheckPTWrite(pt); err != nil {
		c.PTWriteErr = lack(why, err)
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
		return "", "", fmt.Errorf("%w: %w", ErrNoUprobes, c.UprobesErr)
	}
	why := c.ptw()
	switch want {
	case ModeClassic:
		return ModeClassic, "forced by --mode=classic", nil
	case ModePTW:
		if why != nil {
			return "", "", fmt.Errorf("%w: %w", ErrPTWUnavailable, why)
		}
		return ModePTW, "forced by --mode=ptw", nil
	}
	if why == nil {
		return ModePTW, "Intel PT with PTWRITE, and ptwrite uprobes (" + c.PTWHow + ")", nil
	}
	return ModeClassic, "ptw unavailable: " + why.Error(), nil
}

// ptw says what ptw mode misses, or nil when it can run.
func (c *Caps) ptw() error {
	var miss []error
	if !c.IntelPT {
		miss = append(miss, c.IntelPTErr)
	} else if !c.PTWrite {
		miss = append(miss, c.PTWriteErr)
	}
	if !c.PTWUprobes {
		miss = append(miss, c.PTWErr)
	}
	if len(miss) == 0 {
		return nil
	}
	why := make([]string, len(miss))
	for i, e := range miss {
		why[i] = e.Error()
	}
	return lack(strings.Join(why, "; "), miss...)
}

// BranchesErr says why branch tracing is unavailable, nil when it is
// available (Intel PT, with or without PTWRITE); it wraps ErrNoBranches and
// perfio.ErrNoPT. It wraps no errno: Branches adds EOPNOTSUPP for FUSE.
func (c *Caps) BranchesErr() error {
	if !c.IntelPT {
		return lack("branches need Intel PT: "+c.IntelPTErr.Error(), ErrNoBranches, perfio.ErrNoPT)
	}
	return nil
}

// AppendText appends the capability lines of `ptfs check` and the root status.
func (c *Caps) AppendText(dst []byte) []byte {
	line := func(key string, ok bool, val string, why error) {
		if ok {
			dst = fmt.Appendf(dst, "%s: yes%s\n", key, val)
		} else {
			dst = fmt.Appendf(dst, "%s: no (%v)\n", key, why)
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
