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
	"ptfs/internal/testkit"
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
		listed string // the listing's head, when installed
	}{
		{"ptw kernel", tracefstest.Options{PTW: true}, nil, "", "ptw:ptfs1_t/e " + path + ":0x1170 "},
		{"ptw kernel listing ptw probes as p:", tracefstest.Options{PTW: true, ListPTWAsP: true}, nil, "",
			"p:ptfs1_t/e " + path + ":0x0000000000001170 "},
		{"stock kernel", tracefstest.Options{Stock: true}, probes.ErrRefused, "kernel: Invalid register name", ""},
		{"kernel that creates nothing", tracefstest.Options{}, probes.ErrRefused, "does not list it", ""},
		{"punning failed", tracefstest.Options{PTW: true, Refuse: installFailed}, probes.ErrRefused, "kernel: failed to install", ""},
		{"busy", tracefstest.Options{PTW: true, Refuse: func(string) (syscall.Errno, string) { return syscall.EBUSY, "no memory for the stub" }},
			syscall.EBUSY, "kernel: no memory for the stub", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := tracefstest.New(t, tt.opts)
			err := k.Tracefs.AddProbe(line)
			if tt.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				if l := events(t, k.Tracefs); len(l) != 1 || !strings.HasPrefix(l[0], tt.listed) {
					t.Errorf("listed %q, want %q...", l, tt.listed)
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

// TestAddProbeStandInOnly removes, of what appeared in uprobe_events
// during a ptw write, only the stand-in: a new line of the default group at
// the write's file and offset. Lines that other writers added meanwhile (a
// probe of their own group at the same site, an unnamed probe elsewhere)
// stay.
func TestAddProbeStandInOnly(t *testing.T) {
	path, other := siteFile(t), siteFile(t)
	theirs := []string{"p:theirs/same_site " + path + ":0x1170 %di", "p:uprobes/elsewhere " + other + ":0x1170 %di"}
	for _, opts := range []tracefstest.Options{{Stock: true}, {}} {
		k := tracefstest.New(t, opts)
		tf := *k.Tracefs
		// Another writer adds its probes right after ptfs's write.
		tf.Exec = func(cmd string) error {
			err := k.Exec(cmd)
			if strings.HasPrefix(cmd, "ptw:") {
				for _, c := range theirs {
					if err := k.Exec(c); err != nil {
						t.Fatal(err)
					}
				}
			}
			return err
		}
		err := tf.AddProbe(tracefs.PTWLine("ptfs1_t", "e", path, 0x1170, spec(t, "0x1170 %di")))
		if !errors.Is(err, probes.ErrRefused) {
			t.Errorf("stock %v: AddProbe = %v, want ErrRefused", opts.Stock, err)
		}
		l := events(t, k.Tracefs)
		if len(l) != 2 || !strings.HasPrefix(l[0], "p:theirs/same_site ") || !strings.HasPrefix(l[1], "p:uprobes/elsewhere ") {
			t.Errorf("stock %v: left %q, want the other writer's two probes", opts.Stock, l)
		}
		// Besides the stand-in, only the line's own name may go: a kernel
		// that lists nothing of it gets it removed in case it is there
		// unlisted.
		removed := 0
		for _, c := range k.Commands() {
			switch {
			case c == "-:uprobes/p_t_0x1170":
				removed++
			case c == "-:ptfs1_t/e" && !opts.Stock:
			case strings.HasPrefix(c, "-:"):
				t.Errorf("stock %v: removed %q", opts.Stock, c)
			}
		}
		if want := map[bool]int{true: 1, false: 0}[opts.Stock]; removed != want {
			t.Errorf("stock %v: %d removals, want %d", opts.Stock, removed, want)
		}
	}
}

// TestAddProbeUnlistedRemoved: a line that the kernel takes but that no
// read of uprobe_events lists (a read misses a line that another writer's
// removal moved) is refused, and removed by its name, so that nothing of a
// refused line stays behind.
func TestAddProbeUnlistedRemoved(t *testing.T) {
	path := siteFile(t)
	k := tracefstest.New(t, tracefstest.Options{})
	tf := *k.Tracefs
	hidden := false
	tf.Exec = func(cmd string) error {
		if err := k.Exec(cmd); err != nil {
			return err
		}
		if !strings.HasPrefix(cmd, "ptw:") {
			return nil
		}
		// The kernel holds the event; every read now misses it.
		hidden = true
		return os.WriteFile(filepath.Join(k.Tracefs.Dir, "uprobe_events"), nil, 0o644)
	}
	err := tf.AddProbe(tracefs.PTWLine("ptfs1_t", "e", path, 0x1170, spec(t, "0x1170 %di")))
	if !hidden || !errors.Is(err, probes.ErrRefused) || !strings.Contains(err.Error(), "does not list it") {
		t.Fatalf("AddProbe = %v, want ErrRefused: does not list it", err)
	}
	if c := k.Commands(); len(c) != 2 || c[1] != "-:ptfs1_t/e" {
		t.Errorf("commands %q, want the line and its removal", c)
	}
	if l := events(t, k.Tracefs); len(l) != 0 {
		t.Errorf("left %q", l)
	}
}

// TestInstallUntyped installs typed ptw probes on a ptwrite kernel that
// refuses typed fetchargs: the line goes in again without the types, the
// event keeps the spec's types, and records print exactly as a typed
// install's do. Nothing is retried where the types were not the problem.
func TestInstallUntyped(t *testing.T) {
	path := siteFile(t)
	s := spec(t, "0x1170 a=%di +8(%si):u32 c=$stack2:s32 \\0x2a:x32 %nopace")
	typedLine := tracefs.PTWLine("ptfs1_t", "e", path, 0x1170, s)
	untypedLine := "ptw:ptfs1_t/e " + path + ":0x1170 a=%di +8(%si) c=$stack2 \\0x2a %nopace"

	typed := tracefstest.New(t, tracefstest.Options{PTW: true})
	tin, err := typed.Tracefs.Install(true, "ptfs1_t", "e", path, 0x1170, s)
	if err != nil || tin.Untyped || tin.Line != typedLine {
		t.Fatalf("Install on a kernel that takes types = %+v, %v", tin, err)
	}

	k := tracefstest.New(t, tracefstest.Options{PTW: true, RefuseTypes: true})
	in, err := k.Tracefs.Install(true, "ptfs1_t", "e", path, 0x1170, s)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Untyped || in.Line != untypedLine {
		t.Errorf("Install = %+v, want untyped line %q", in, untypedLine)
	}
	if c := k.Commands(); len(c) != 2 || c[0] != typedLine || c[1] != untypedLine {
		t.Errorf("commands %q, want the typed line, then the untyped one", c)
	}
	if l := events(t, k.Tracefs); len(l) != 1 || !strings.HasPrefix(l[0], "ptw:ptfs1_t/e ") {
		t.Errorf("listed %q", l)
	}
	if len(in.Event.Args) != 4 {
		t.Fatalf("event %+v", in.Event)
	}
	for i, want := range []decode.ArgType{decode.U64, decode.U32, decode.S32, decode.X32} {
		if a := in.Event.Args[i]; a.Type != want || a.Size != 8 || a.Name != tin.Event.Args[i].Name {
			t.Errorf("arg %d = %+v, want type %v in an 8-byte field named %q", i, a, want, tin.Event.Args[i].Name)
		}
	}
	// A hit whose payloads carry high bits (an 8-byte load, a 64-bit
	// register) prints as the typed probe's zero-extended 4-byte words.
	wide := decode.Record{N: 4, Args: [8]uint64{1 << 40, 0xdead_beef_0000_0007, 0x1234_5678_ffff_fffe, 0xffff_ffff_0000_002a}, TID: 7, CPU: 1, Time: 5}
	narrow := decode.Record{N: 4, Args: [8]uint64{1 << 40, 7, 0xffff_fffe, 0x2a}, TID: 7, CPU: 1, Time: 5}
	wide.Event, narrow.Event = in.Event, tin.Event
	in.Event.ID = tin.Event.ID
	got, want := string(decode.AppendRecord(nil, 1, &wide)), string(decode.AppendRecord(nil, 1, &narrow))
	if got != want || !strings.Contains(got, "args=[a=1099511627776, 7, c=-2, 0x2a]") {
		t.Errorf("untyped install prints %q, typed %q", got, want)
	}

	// Refused for another reason too: the typed line's error, with the
	// untyped line's reason, and nothing left behind.
	k = tracefstest.New(t, tracefstest.Options{PTW: true, RefuseTypes: true, Refuse: func(string) (syscall.Errno, string) {
		return syscall.EINVAL, "failed to install"
	}})
	_, err = k.Tracefs.Install(true, "ptfs1_t", "e", path, 0x1170, s)
	if !errors.Is(err, probes.ErrRefused) || !strings.Contains(err.Error(), "Unknown type is specified") ||
		!strings.Contains(err.Error(), "without types: probe refused: kernel: failed to install") {
		t.Errorf("Install refused twice: %v", err)
	}
	if l := events(t, k.Tracefs); len(l) != 0 {
		t.Errorf("left %q", l)
	}
	// No retry: an untyped spec, a classic line, a stock kernel's stand-in.
	for _, tc := range []struct {
		name string
		opts tracefstest.Options
		ptw  bool
		spec string
	}{
		{"untyped spec", tracefstest.Options{PTW: true, Refuse: func(string) (syscall.Errno, string) { return syscall.EINVAL, "failed to install" }}, true, "0x1170 %di"},
		{"classic line", tracefstest.Options{PTW: true, Refuse: func(string) (syscall.Errno, string) { return syscall.EINVAL, "failed to install" }}, false, "0x1170 %di:u32"},
		{"stock kernel", tracefstest.Options{Stock: true}, true, "0x1170 %di:u32"},
	} {
		k := tracefstest.New(t, tc.opts)
		if _, err := k.Tracefs.Install(tc.ptw, "ptfs1_t", "e", path, 0x1170, spec(t, tc.spec)); !errors.Is(err, probes.ErrRefused) {
			t.Errorf("%s: Install = %v, want ErrRefused", tc.name, err)
		}
		n := 0
		for _, c := range k.Commands() {
			if !strings.HasPrefix(c, "-:") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: commands %q, want one probe line", tc.name, k.Commands())
		}
		if l := events(t, k.Tracefs); len(l) != 0 {
			t.Errorf("%s: left %q", tc.name, l)
		}
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
		{"ptw kernel, quiet README", tracefstest.Options{PTW: true, QuietReadme: true}, true, "listed under its own name", 1},
		{"stock kernel", tracefstest.Options{Stock: true}, false, "the kernel turned a trial ptw: line into classic probe p:uprobes/p_ptfs" + pid + "_0x0 (removed): no ptwrite uprobes", 1},
		{"kernel that creates nothing", tracefstest.Options{}, false, "does not list it", 1},
		{"ptw kernel listing ptw probes as p:", tracefstest.Options{PTW: true, QuietReadme: true, ListPTWAsP: true}, true, "listed under its own name", 1},
		{"ptw kernel refusing lines without fetchargs", tracefstest.Options{PTW: true, QuietReadme: true, RefuseNoArgs: true}, true, "listed under its own name", 1},
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
					if !strings.HasSuffix(c, ":0x0 %di") {
						t.Errorf("trial line %q: want one fetcharg, %%di", c)
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
		testkit.Unavailable(t, "tracefs uprobes need root")
	}
	tf, err := tracefs.FindTracefs()
	if err != nil {
		t.Fatalf("no tracefs on a machine that must have one: %v", err)
	}
	if doc, err := tf.ReadmeMentionsPTW(); err != nil {
		testkit.Unavailable(t, "tracefs README: %v", err)
	} else if doc {
		t.Skip("this kernel documents ptw probes: not the stock kernel this test is about")
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
