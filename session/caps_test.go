package session

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"ptfs/internal/testkit"
	"ptfs/perfio"
	"ptfs/tracefs"
	"ptfs/tracefs/tracefstest"
)

// tree writes files (path → content) below a new temp dir.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// ptSysfs is the intel_pt PMU of a recent kernel on a CPU with PTWRITE,
// with the format files' real contents (Linux 6.x, arch/x86/events/intel/pt.c).
func ptSysfs() map[string]string {
	pt := "bus/event_source/devices/intel_pt/"
	return map[string]string{
		pt + "type":              "8\n",
		pt + "caps/ptwrite":      "1\n",
		pt + "format/pt":         "config:0\n",
		pt + "format/cyc":        "config:1\n",
		pt + "format/pwr_evt":    "config:4\n",
		pt + "format/fup_on_ptw": "config:5\n",
		pt + "format/mtc":        "config:9\n",
		pt + "format/tsc":        "config:10\n",
		pt + "format/noretcomp":  "config:11\n",
		pt + "format/ptw":        "config:12\n",
		pt + "format/branch":     "config:13\n",
	}
}

// without returns m without the keys that end in any of drop, and with
// set applied.
func without(m map[string]string, set map[string]string, drop ...string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		keep := true
		for _, d := range drop {
			keep = keep && !strings.HasSuffix(k, d)
		}
		if keep {
			out[k] = v
		}
	}
	for k, v := range set {
		out["bus/event_source/devices/intel_pt/"+k] = v
	}
	return out
}

func TestDetect(t *testing.T) {
	ptwKernel := tracefstest.Options{PTW: true}
	trialKernel := tracefstest.Options{PTW: true, QuietReadme: true}
	stock := tracefstest.Options{Stock: true}
	cases := []struct {
		name     string
		sysfs    map[string]string
		kernel   tracefstest.Options
		want     Mode
		whyAuto  string
		wantErr  []string // of --mode=ptw; none: it runs
		wantText []string
	}{
		{name: "no PT, stock kernel", sysfs: map[string]string{"x": ""}, kernel: stock,
			want: ModeClassic, whyAuto: "ptw unavailable: no Intel PT",
			wantErr:  []string{"no Intel PT", "the kernel turned a trial ptw: line into classic probe p:uprobes/p_ptfs"},
			wantText: []string{"intel_pt: no (no Intel PT", "ptwrite: no (no Intel PT)", "ptw uprobes: no (the kernel turned a trial ptw: line into classic probe"}},
		{name: "PT without PTWRITE", sysfs: without(ptSysfs(), map[string]string{"caps/ptwrite": "0\n"}), kernel: ptwKernel,
			want: ModeClassic, whyAuto: "CPU without PTWRITE",
			wantErr:  []string{"CPU without PTWRITE (intel_pt/caps/ptwrite is 0)"},
			wantText: []string{"intel_pt: yes", "ptwrite: no (CPU without PTWRITE", "ptw uprobes: yes (the tracefs README documents ptw probes)"}},
		{name: "PT, kernel too old for caps/ptwrite", sysfs: without(ptSysfs(), nil, "caps/ptwrite"), kernel: ptwKernel,
			want: ModeClassic, wantErr: []string{"intel_pt without caps/ptwrite"}},
		{name: "PTWRITE, stock kernel", sysfs: ptSysfs(), kernel: stock,
			want: ModeClassic, whyAuto: "no ptwrite uprobes",
			wantErr:  []string{"the kernel turned a trial ptw: line into classic probe", "(removed): no ptwrite uprobes"},
			wantText: []string{"ptwrite: yes", "ptw uprobes: no"}},
		{name: "PTWRITE without the ptw format bit", sysfs: without(ptSysfs(), nil, "format/ptw"), kernel: ptwKernel,
			want: ModeClassic, wantErr: []string{"kernel without the intel_pt ptw format bits (format/ptw missing)"}},
		{name: "PTWRITE without fup_on_ptw", sysfs: without(ptSysfs(), nil, "format/fup_on_ptw"), kernel: ptwKernel,
			want: ModeClassic, wantErr: []string{"(format/fup_on_ptw missing)"}},
		{name: "everything, README", sysfs: ptSysfs(), kernel: ptwKernel,
			want: ModePTW, whyAuto: "Intel PT with PTWRITE, and ptwrite uprobes (the tracefs README documents ptw probes)",
			wantText: []string{"intel_pt: yes", "ptwrite: yes", "ptw uprobes: yes"}},
		{name: "everything, trial", sysfs: ptSysfs(), kernel: trialKernel,
			want: ModePTW, whyAuto: "a trial ptw: probe was listed under its own name (removed)",
			wantText: []string{"ptw uprobes: yes (a trial ptw: probe was listed under its own name (removed))"}},
		{name: "everything, trial refused", sysfs: ptSysfs(),
			kernel: tracefstest.Options{PTW: true, QuietReadme: true, Refuse: func(string) (syscall.Errno, string) { return syscall.EINVAL, "Invalid register name" }},
			want:   ModeClassic, wantErr: []string{"the kernel refused a trial ptw: line"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := roots{sysfs: tree(t, c.sysfs), dev: tree(t, map[string]string{"null": ""})}
			k := tracefstest.New(t, c.kernel)
			caps := r.detect(k.Tracefs, nil)
			got, why, err := caps.Choose(ModeAuto)
			if err != nil || got != c.want || !strings.Contains(why, c.whyAuto) {
				t.Errorf("auto: %v %q %v, want %v %q", got, why, err, c.want, c.whyAuto)
			}
			if got, _, err := caps.Choose(ModeClassic); err != nil || got != ModeClassic {
				t.Errorf("classic: %v %v", got, err)
			}
			got, _, err = caps.Choose(ModePTW)
			if len(c.wantErr) == 0 {
				if err != nil || got != ModePTW {
					t.Errorf("ptw: %v, %v", got, err)
				}
			} else if !errors.Is(err, ErrPTWUnavailable) {
				t.Errorf("ptw: %v, want ErrPTWUnavailable", err)
			} else {
				for _, w := range c.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("ptw: %v, want it to say %q", err, w)
					}
				}
			}
			checkSentinels(t, &caps)
			text := string(caps.AppendText(nil))
			for _, w := range append(c.wantText, "tracefs: yes ("+k.Tracefs.Dir+")", "uprobes: yes", "fuse: no (no /dev/fuse)") {
				if !strings.Contains(text, w) {
					t.Errorf("text lacks %q:\n%s", w, text)
				}
			}
			if l, err := k.Tracefs.Events(); err != nil || len(l) != 0 {
				t.Errorf("detection left %q, %v", l, err)
			}
		})
	}
	t.Run("no tracefs", func(t *testing.T) {
		caps := roots{sysfs: t.TempDir(), dev: t.TempDir()}.detect(nil, errors.New("mount: permission denied"))
		if _, _, err := caps.Choose(ModeAuto); !errors.Is(err, ErrNoUprobes) || !errors.Is(err, tracefs.ErrNoTracefs) || !strings.Contains(err.Error(), "no uprobes: no tracefs") {
			t.Errorf("auto without tracefs: %v", err)
		}
		checkSentinels(t, &caps)
		if text := string(caps.AppendText(nil)); !strings.Contains(text, "tracefs: no (mount: permission denied)") {
			t.Errorf("text:\n%s", text)
		}
	})
	t.Run("tracefs without uprobes", func(t *testing.T) {
		caps := roots{sysfs: tree(t, ptSysfs()), dev: t.TempDir()}.detect(&tracefs.Tracefs{Dir: t.TempDir()}, nil)
		if _, _, err := caps.Choose(ModeAuto); !errors.Is(err, ErrNoUprobes) || !strings.Contains(err.Error(), "CONFIG_UPROBE_EVENTS") {
			t.Errorf("auto without uprobe_events: %v", err)
		}
		checkSentinels(t, &caps)
		if caps.PTWUprobes || !errors.Is(caps.PTWErr, ErrNoPTWUprobes) || !strings.Contains(caps.PTWErr.Error(), "no uprobe_events") {
			t.Errorf("ptw uprobes %v (%s)", caps.PTWUprobes, caps.PTWErr)
		}
	})
}

// checkSentinels checks that every capability is either there with no
// error or missing with an error that wraps its sentinel.
func checkSentinels(t *testing.T, c *Caps) {
	t.Helper()
	for _, k := range []struct {
		name     string
		ok       bool
		err      error
		sentinel error
	}{
		{"tracefs", c.Tracefs != "", c.TracefsErr, tracefs.ErrNoTracefs},
		{"uprobes", c.Uprobes, c.UprobesErr, ErrNoUprobes},
		{"fuse", c.FUSE, c.FUSEErr, ErrNoFUSE},
		{"intel_pt", c.IntelPT, c.IntelPTErr, perfio.ErrNoPT},
		{"ptwrite", c.PTWrite, c.PTWriteErr, perfio.ErrNoPTW},
		{"ptw uprobes", c.PTWUprobes, c.PTWErr, ErrNoPTWUprobes},
	} {
		if k.ok != (k.err == nil) || !k.ok && !errors.Is(k.err, k.sentinel) {
			t.Errorf("%s: %v with error %v, want it to wrap %v when missing", k.name, k.ok, k.err, k.sentinel)
		}
	}
	// The errno FUSE returns for branches is the EOPNOTSUPP Branches adds.
	var en syscall.Errno
	if err := c.BranchesErr(); c.IntelPT != (err == nil) || !c.IntelPT && (!errors.Is(err, ErrNoBranches) || !errors.Is(err, perfio.ErrNoPT) || errors.As(err, &en)) {
		t.Errorf("branches: %v (errno %v)", err, en)
	}
	// Without Intel PT, PTWRITE goes unsaid; without uprobes, nothing runs.
	if _, _, err := c.Choose(ModePTW); errors.Is(err, ErrPTWUnavailable) {
		for _, k := range []struct {
			ok       bool
			sentinel error
		}{{c.IntelPT, perfio.ErrNoPT}, {c.PTWrite || !c.IntelPT, perfio.ErrNoPTW}, {c.PTWUprobes, ErrNoPTWUprobes}} {
			if !k.ok && !errors.Is(err, k.sentinel) {
				t.Errorf("ptw: %v, want it to wrap %v", err, k.sentinel)
			}
		}
	}
}

// TestDetectReal runs detection on this machine: a stock kernel without
// Intel PT, so classic, and no probe left behind.
func TestDetectReal(t *testing.T) {
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "tracefs uprobes need root")
	}
	tfs, err := tracefs.FindTracefs()
	if err != nil {
		t.Fatalf("no tracefs on a machine that must have one: %v", err)
	}
	if _, err := os.Stat(defaultRoots.intelPT()); err == nil {
		t.Skip("this machine has Intel PT: the test is about one without")
	}
	// Keep other packages' RemoveStale away from the trial probe.
	if c, err := tracefs.ClaimProbes(); err == nil {
		t.Cleanup(func() { c.Close() })
	}
	caps := defaultRoots.detect(tfs, nil)
	mode, why, err := caps.Choose(ModeAuto)
	if err != nil || mode != ModeClassic || !strings.Contains(why, "no Intel PT: /sys/bus/event_source/devices/intel_pt is missing") {
		t.Errorf("auto: %v %q %v", mode, why, err)
	}
	if !strings.Contains(why, "the kernel turned a trial ptw: line into classic probe p:uprobes/p_ptfs"+strconv.Itoa(os.Getpid())+"_0x0 (removed): no ptwrite uprobes") {
		t.Errorf("auto's reason does not say what the kernel lacks: %q", why)
	}
	if _, _, err := caps.Choose(ModePTW); !errors.Is(err, ErrPTWUnavailable) {
		t.Errorf("--mode=ptw: %v", err)
	}
	lines, err := tfs.Events()
	if err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(os.Getpid())
	for _, l := range lines {
		if strings.Contains(l, "ptfs"+pid+"_") {
			t.Errorf("detection left %q", l)
		}
	}
	checkSentinels(t, &caps)
	t.Logf("%s", caps.AppendText(nil))
}
