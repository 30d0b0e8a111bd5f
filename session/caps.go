package session

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"ptfs/probes"
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
	PTWrite    bool
	PTWriteErr string
	PTWUprobes bool
	PTWErr     string
}

// Roots of the kernel interfaces, replaceable by tests with trees in a temp dir.
type roots struct {
	sysfs string // /sys
	dev   string // /dev
}

var defaultRoots = roots{sysfs: "/sys", dev: "/dev"}

// detect reads the capabilities. tracefs is the tracefs mount point, or "" with
// tracefsErr saying why there is none.
func (r roots) detect(tracefs string, tracefsErr error) Caps {
	var c Caps
	c.Tracefs = tracefs
	if tracefsErr != nil {
		c.TracefsErr = tracefsErr.Error()
		c.UprobesErr = "no tracefs"
		c.PTWErr = "no tracefs"
	} else {
		if _, err := os.Stat(filepath.Join(tracefs, "uprobe_events")); err == nil {
			c.Uprobes = true
		} else {
			c.UprobesErr = "no uprobe_events in tracefs (kernel without CONFIG_UPROBE_EVENTS)"
		}
		ok, err := (&probes.Tracefs{Dir: tracefs}).ReadmeMentionsPTW()
		switch {
		case err != nil:
			c.PTWErr = err.Error()
		case ok:
			c.PTWUprobes = true
		default:
			c.PTWErr = "kernel without ptwrite uprobes: its tracefs README does not document ptw probes"
		}
	}
	if fi, err := os.Stat(filepath.Join(r.dev, "fuse")); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		c.FUSE = true
	} else {
		c.FUSEErr = "no /dev/fuse"
	}
	pt := filepath.Join(r.sysfs, "bus/event_source/devices/intel_pt")
	if _, err := os.Stat(filepath.Join(pt, "type")); err == nil {
		c.IntelPT = true
		caps, err := os.ReadFile(filepath.Join(pt, "caps/ptwrite"))
		_, ferr := os.Stat(filepath.Join(pt, "format/ptw"))
		switch {
		case err != nil:
			c.PTWriteErr = "intel_pt without caps/ptwrite"
		case strings.TrimSpace(string(caps)) != "1":
			c.PTWriteErr = "CPU without PTWRITE (intel_pt/caps/ptwrite is 0)"
		case ferr != nil:
			c.PTWriteErr = "kernel without the intel_pt ptw format bit"
		default:
			c.PTWrite = true
		}
	} else {
		c.IntelPTErr = "no Intel PT: " + pt + " is missing"
		c.PTWriteErr = "no Intel PT"
	}
	return c
}

// Choose picks the mode for want, or says why want cannot run.
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
			return "", "", fmt.Errorf("ptw mode unavailable: %s", why)
		}
		// The ptw engine (PT capture) is not built yet: say so instead of
		// pretending.
		return "", "", fmt.Errorf("ptw mode: %w", errPTWNotBuilt)
	}
	if ptwOK {
		return ModeClassic, "ptw supported by this machine, but this ptfs has no ptw engine yet", nil
	}
	return ModeClassic, "ptw unavailable: " + why, nil
}

var errPTWNotBuilt = fmt.Errorf("this build of ptfs has no Intel PT capture engine")

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
	return "branches need the Intel PT capture engine, which this build of ptfs lacks"
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
	line("ptw uprobes", c.PTWUprobes, "", c.PTWErr)
	return dst
}
