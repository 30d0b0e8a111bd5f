package tracefs_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"ptfs/decode"
	"ptfs/probes"
	"ptfs/tracefs"
	"ptfs/tracefs/tracefstest"
)

// siteFile returns a file of 8 KiB to put probes on.
func siteFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "t")
	if err := os.WriteFile(p, make([]byte, 0x2000), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func spec(t *testing.T, s string) *probes.Spec {
	t.Helper()
	sp, err := probes.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

func events(t *testing.T, tf *tracefs.Tracefs) []string {
	t.Helper()
	l, err := tf.Events()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestAddProbePTWKernels installs a ptw line on each kind of simulated
// kernel and checks AddProbe's read-back.
func TestAddProbePTWKernels(t *testing.T) {
	path := siteFile(t)
	s := spec(t, "0x1170 a=%di +8(%si):u32 c=$stack2:s32 \\0x2a:x32 %nopace")
	line := tracefs.PTWLine("ptfs1_t", "e", path, 0x1170, s)
	installFailed := func(l string) (syscall.Errno, string) {
		if strings.Contains(l, ":0x1170") {
			return syscall.EOPNOTSUPP, "failed to install"
		}
		return 0, ""
	}
	tests := []struct {
		name   string
		opts   tracefstest.Options
		err    error
		reason string
	}{
		{"ptw kernel", tracefstest.Options{PTW: true}, nil, ""},
		{"stock kernel", tracefstest.Options{Stock: true}, probes.ErrRefused, "kernel: Invalid register name"},
		{"kernel that creates nothing", tracefstest.Options{}, probes.ErrRefused, "does not list it"},
		{"punning failed", tracefstest.Options{PTW: true, Refuse: installFailed}, probes.ErrRefused, "kernel: failed to install"},
		{"busy", tracefstest.Options{PTW: true, Refuse: func(string) (syscall.Errno, string) { return syscall.EBUSY, "no memory for the stub" }},
			syscall.EBUSY, "kernel: no memory for the stub"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := tracefstest.New(t, tt.opts)
			err := k.Tracefs.AddProbe(line)
			if tt.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				if l := events(t, k.Tracefs); len(l) != 1 || !strings.HasPrefix(l[0], "ptw:ptfs1_t/e "+path+":0x1170 ") {
					t.Errorf("listed %q", l)
				}
				ev, err := k.Tracefs.Event("ptfs1_t", "e", s)
				if err != nil {
					t.Fatal(err)
				}
				want := []decode.Arg{{Name: "a", Type: decode.U64, Offset: 16, Size: 8}, {Type: decode.U32, Offset: 24, Size: 4},
					{Name: "c", Type: decode.S32, Offset: 28, Size: 4}, {Type: decode.X32, Offset: 32, Size: 4}}
				if ev.ID == 0 || len(ev.Args) != len(want) {
					t.Fatalf("Event = %+v", ev)
				}
				for i := range want {
					if ev.Args[i] != want[i] {
						t.Errorf("arg %d = %+v, want %+v", i, ev.Args[i], want[i])
					}
				}
				return
			}
			if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("AddProbe = %v, want %v with %q", err, tt.err, tt.reason)
			}
			if l := events(t, k.Tracefs); len(l) != 0 {
				t.Errorf("left %q", l)
			}
		})
	}
	// Without options the stock kernel accepts the line and makes a
	// classic stand-in, which AddProbe removes.
	k := tracefstest.New(t, tracefstest.Options{Stock: true})
	plain := tracefs.PTWLine("ptfs1_t", "e", path, 0x1170, spec(t, "0x1170 %di"))
	err := k.Tracefs.AddProbe(plain)
	if !errors.Is(err, probes.ErrRefused) || !strings.Contains(err.Error(), "created p:uprobes/p_t_0x1170 instead (removed)") {
		t.Errorf("AddProbe on a stock kernel: %v", err)
	}
	if l := events(t, k.Tracefs); len(l) != 0 {
		t.Errorf("stand-in left: %q", l)
	}
	if c := k.Commands(); len(c) != 2 || c[0] != plain || c[1] != "-:uprobes/p_t_0x1170" {
		t.Errorf("commands %q", c)
	}
}

func TestTrialPTWKernels(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	tests := []struct {
		name   string
		opts   tracefstest.Options
		ok     bool
		why    string
		trials int // ptw: lines written
	}{
		{"README documents ptw", tracefstest.Options{PTW: true}, true, "README documents ptw", 0},
		{"ptw kernel, quiet README", tracefstest.Options{PTW: true, QuietReadme: true}, true, "listed as ptw:", 1},
		{"stock kernel", tracefstest.Options{Stock: true}, false, "the kernel turned a trial ptw: line into classic probe p:uprobes/p_ptfs" + pid + "_0x0 (removed): no ptwrite uprobes", 1},
		{"kernel that creates nothing", tracefstest.Options{}, false, "does not list it", 1},
		{"trial refused", tracefstest.Options{PTW: true, QuietReadme: true, Refuse: func(string) (syscall.Errno, string) { return syscall.EINVAL, "failed to install" }},
			false, "the kernel refused a trial ptw: line (probe refused: kernel: failed to install (at ", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := tracefstest.New(t, tt.opts)
			ok, why, err := k.Tracefs.TrialPTW()
			if err != nil || ok != tt.ok || !strings.Contains(why, tt.why) {
				t.Errorf("TrialPTW = %v, %q, %v; want %v, %q", ok, why, err, tt.ok, tt.why)
			}
			if l := events(t, k.Tracefs); len(l) != 0 {
				t.Errorf("left %q", l)
			}
			n := 0
			for _, c := range k.Commands() {
				if strings.HasPrefix(c, "ptw:") {
					n++
					if !strings.HasPrefix(c, "ptw:"+tracefs.GroupName(os.Getpid(), "check")+"/") {
						t.Errorf("trial line %q is not in the check group", c)
					}
					f := strings.Fields(c)[1]
					if _, err := os.Stat(strings.TrimSuffix(f, ":0x0")); !os.IsNotExist(err) {
						t.Errorf("trial file of %q still there: %v", c, err)
					}
				}
			}
			if n != tt.trials {
				t.Errorf("%d trial lines in %q, want %d", n, k.Commands(), tt.trials)
			}
		})
	}
	t.Run("no README", func(t *testing.T) {
		k := tracefstest.New(t, tracefstest.Options{PTW: true})
		if err := os.Remove(filepath.Join(k.Tracefs.Dir, "README")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := k.Tracefs.TrialPTW(); err == nil || !strings.Contains(err.Error(), "README") {
			t.Errorf("TrialPTW without a README: %v", err)
		}
	})
}

// TestTrialPTWReal runs the trial on this machine's stock kernel: it must
// say no, and leave uprobe_events as it was.
func TestTrialPTWReal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("tracefs uprobes need root")
	}
	tf, err := tracefs.FindTracefs()
	if err != nil {
		t.Fatalf("no tracefs on a machine that must have one: %v", err)
	}
	if doc, err := tf.ReadmeMentionsPTW(); err != nil || doc {
		t.Skipf("this kernel documents ptw probes (%v, %v): not the stock kernel this test is about", doc, err)
	}
	group := tracefs.GroupName(os.Getpid(), "check")
	// Lines of this process: the check group, or a stand-in on a trial
	// file of this PID. Other packages' tests change uprobe_events
	// concurrently, so only these are compared.
	ours := func() []string {
		var out []string
		for _, l := range events(t, tf) {
			f := strings.Fields(l)
			if strings.Contains(l, ":"+group+"/") || len(f) > 1 && strings.Contains(f[1], "ptfs"+strconv.Itoa(os.Getpid())+"_trial") {
				out = append(out, l)
			}
		}
		return out
	}
	before := ours()
	ok, why, err := tf.TrialPTW()
	after := ours()
	if err != nil || ok {
		t.Fatalf("TrialPTW on a stock kernel = %v, %q, %v", ok, why, err)
	}
	if !strings.Contains(why, "into classic probe p:uprobes/p_ptfs"+strconv.Itoa(os.Getpid())+"_0x0 (removed)") {
		t.Errorf("why = %q", why)
	}
	if len(before) != 0 || len(after) != 0 {
		t.Errorf("trial lines before %q, after %q", before, after)
	}
	t.Logf("why: %s", why)
}

// TestRemoveStaleTrial removes the stand-in that a process killed during
// its trial left on a stock kernel, and nothing else.
func TestRemoveStaleTrial(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp("", "ptfs"+strconv.Itoa(dead.Process.Pid)+"_trial*")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	t.Cleanup(func() { os.Remove(f.Name()) })
	k := tracefstest.New(t, tracefstest.Options{Stock: true})
	other := siteFile(t)
	for _, c := range []string{"ptw:ptfs1_check/trial_1 " + f.Name() + ":0x0", "ptw:e " + other + ":0x0"} {
		if err := k.Exec(c); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := k.Tracefs.RemoveStale(os.Getpid())
	want := "uprobes/p_ptfs" + strconv.Itoa(dead.Process.Pid) + "_0x0"
	if err != nil || len(removed) != 1 || removed[0] != want {
		t.Errorf("RemoveStale = %q, %v; want [%s]", removed, err, want)
	}
	if l := events(t, k.Tracefs); len(l) != 1 || !strings.Contains(l[0], other) {
		t.Errorf("left %q, want the probe on %s", l, other)
	}
}
