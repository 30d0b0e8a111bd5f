package tracefstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"ptfs/internal/testkit"
	"ptfs/tracefs"
)

func TestMain(m *testing.M) {
	// Claim this process's groups so that RemoveStale in concurrently
	// running tests of other packages leaves the real probe alone.
	c, err := tracefs.ClaimProbes()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	c.Close()
	os.Exit(code)
}

// target returns a small file to put probes on.
func target(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, make([]byte, 0x2000), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func read(t *testing.T, k *Kernel, name ...string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(append([]string{k.Tracefs.Dir}, name...)...))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestExec(t *testing.T) {
	path := target(t, "t")
	tests := []struct {
		name    string
		opts    Options
		cmd     string
		errno   syscall.Errno
		listing string // "" with errno 0: nothing created
		reason  string // error_log message
	}{
		{"classic", Options{}, "p:g/e " + path + ":0x1180 %di a=%si:u32",
			0, "p:g/e " + path + ":0x0000000000001180 arg1=%di a=%si:u32", ""},
		{"classic, default group", Options{}, "p:e " + path + ":4480",
			0, "p:uprobes/e " + path + ":0x0000000000001180", ""},
		{"classic %return", Options{}, "p:g/e " + path + ":0x10%return",
			0, "r:g/e " + path + ":0x0000000000000010", ""},
		{"ptw kernel", Options{PTW: true}, "ptw:g/e " + path + ":0x1170%multinop %di b=+8(%si):s32 \\0x2a $stack3 %nopace",
			0, "ptw:g/e " + path + ":0x1170%multinop arg1=%di b=+8(%si):s32 arg3=\\0x2a arg4=$stack3 %nopace", ""},
		{"ptw kernel, 9 args", Options{PTW: true}, "ptw:g/e " + path + ":0x10 %di %di %di %di %di %di %di %di %di",
			syscall.E2BIG, "", "Too many arguments are specified"},
		{"ptw kernel, string", Options{PTW: true}, "ptw:g/e " + path + ":0x10 %di:string",
			syscall.EINVAL, "", "Unknown type is specified"},
		{"stock kernel", Options{Stock: true}, "ptw:g/e " + path + ":0x1180 %di x=%si:u32",
			0, "p:uprobes/p_t_0x1180 " + path + ":0x0000000000001180 arg1=%di x=%si:u32", ""},
		{"stock kernel, %nopace", Options{Stock: true}, "ptw:g/e " + path + ":0x1180 %di %nopace",
			syscall.EINVAL, "", "Invalid register name"},
		{"stock kernel, %multinop", Options{Stock: true}, "ptw:g/e " + path + ":0x1180%multinop %di",
			syscall.EINVAL, "", "Invalid probed address suffix"},
		{"ptw kernel listing as p:", Options{PTW: true, ListPTWAsP: true}, "ptw:g/e " + path + ":0x1170%multinop %di b=+8(%si):s32 %nopace",
			0, "p:g/e " + path + ":0x0000000000001170%multinop arg1=%di b=+8(%si):s32 %nopace", ""},
		{"ptw kernel refusing no fetchargs", Options{PTW: true, RefuseNoArgs: true}, "ptw:g/e " + path + ":0x1170",
			syscall.EINVAL, "", "ptwrite probes need 1 to 8 arguments"},
		{"ptw kernel refusing no fetchargs, one given", Options{PTW: true, RefuseNoArgs: true}, "ptw:g/e " + path + ":0x1170 %di",
			0, "ptw:g/e " + path + ":0x1170 arg1=%di", ""},
		{"ptw kernel refusing types", Options{PTW: true, RefuseTypes: true}, "ptw:g/e " + path + ":0x1170 %di b=+8(%si):u32",
			syscall.EINVAL, "", "Unknown type is specified"},
		{"ptw kernel refusing types, classic line", Options{PTW: true, RefuseTypes: true}, "p:g/e " + path + ":0x1170 b=%si:u32",
			0, "p:g/e " + path + ":0x0000000000001170 b=%si:u32", ""},
		{"kernel that creates nothing", Options{}, "ptw:g/e " + path + ":0x1180", 0, "", ""},
		{"refused", Options{PTW: true, Refuse: func(string) (syscall.Errno, string) { return syscall.EOPNOTSUPP, "failed to install" }},
			"ptw:g/e " + path + ":0x1180", syscall.EOPNOTSUPP, "", "failed to install"},
		{"bad register", Options{}, "p:g/e " + path + ":0x1180 %ds", syscall.EINVAL, "", "Invalid register name"},
		{"no file", Options{}, "p:g/e " + path + ".missing:0x10", syscall.ENOENT, "", "Failed to find the given file"},
		{"bad name", Options{}, "p:g/9e " + path + ":0x10", syscall.EINVAL, "", "Group/Event name must follow the same rules as C identifiers"},
		{"bad immediate", Options{}, "p:g/e " + path + ":0x10 \\18446744073709551616", syscall.EINVAL, "", "Invalid immediate value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := New(t, tt.opts)
			err := k.Exec(tt.cmd)
			if tt.errno != 0 {
				if !errors.Is(err, tt.errno) {
					t.Fatalf("Exec = %v, want %v", err, tt.errno)
				}
			} else if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if got := strings.TrimSuffix(read(t, k, "uprobe_events"), "\n"); got != tt.listing {
				t.Errorf("uprobe_events = %q, want %q", got, tt.listing)
			}
			log := read(t, k, "error_log")
			if tt.reason == "" && log != "" || tt.reason != "" && !strings.Contains(log, "error: "+tt.reason+"\n  Command: "+tt.cmd+"\n") {
				t.Errorf("error_log = %q, want %q", log, tt.reason)
			}
			if cmds := k.Commands(); len(cmds) != 1 || cmds[0] != tt.cmd {
				t.Errorf("Commands = %q", cmds)
			}
		})
	}
}

func TestLifecycle(t *testing.T) {
	path := target(t, "t")
	k := New(t, Options{PTW: true})
	tf := k.Tracefs
	if ok, err := tf.ReadmeMentionsPTW(); !ok || err != nil {
		t.Errorf("ReadmeMentionsPTW = %v, %v", ok, err)
	}
	for _, l := range []string{"ptw:g/a " + path + ":0x10 %di", "p:g/b " + path + ":0x20"} {
		if err := tf.AddProbe(l); err != nil {
			t.Fatalf("AddProbe(%q): %v", l, err)
		}
	}
	a, err := tf.EventID("g", "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := tf.EventID("g", "b")
	if err != nil || a == b {
		t.Fatalf("ids %d %d, %v", a, b, err)
	}
	if err := k.Exec("p:g/a " + path + ":0x30"); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("same name again: %v, want EEXIST", err)
	}
	if err := k.Exec("ptw:g/c " + path + ":0x10"); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("second ptw probe at a site: %v, want EEXIST", err)
	}
	if err := tf.Enable("g", "a", true); err != nil {
		t.Fatal(err)
	}
	if got := read(t, k, "events", "g", "a", "enable"); got != "1\n" {
		t.Errorf("enable = %q", got)
	}
	if err := tf.RemoveProbe("g", "a"); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("removing an enabled probe: %v, want EBUSY", err)
	}
	if err := tf.Enable("g", "a", false); err != nil {
		t.Fatal(err)
	}
	for _, e := range []string{"a", "b"} {
		if err := tf.RemoveProbe("g", e); err != nil {
			t.Fatal(err)
		}
	}
	if err := tf.RemoveProbe("g", "a"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("removing a removed probe: %v, want ENOENT", err)
	}
	if got := read(t, k, "uprobe_events"); got != "" {
		t.Errorf("uprobe_events after removal: %q", got)
	}
	if _, err := os.Stat(filepath.Join(tf.Dir, "events", "g")); !os.IsNotExist(err) {
		t.Errorf("group dir after removal: %v", err)
	}
	if err := tf.Enable("g", "a", true); err == nil {
		t.Error("Enable of a removed probe: no error")
	}
	// A new event never reuses an id while the kernel lives.
	if err := tf.AddProbe("ptw:g/a " + path + ":0x10"); err != nil {
		t.Fatal(err)
	}
	if c, err := tf.EventID("g", "a"); err != nil || c == a || c == b {
		t.Errorf("id of a new event %d (old %d %d), %v", c, a, b, err)
	}
}

// TestFormatLikeKernel creates the same classic probe in this machine's
// tracefs and in a simulated kernel and compares the listings and the
// format files, but for the id.
func TestFormatLikeKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "tracefs uprobes need root")
	}
	real, err := tracefs.FindTracefs()
	if err != nil {
		t.Fatalf("no tracefs on a machine that must have one: %v", err)
	}
	path := target(t, "t")
	group := tracefs.GroupName(os.Getpid(), "probetest")
	args := ` %di a=%si:u32 b=+8(%sp):s32 c=%ax:x32 \0x2a $stack $stack2 d=%bx:u64 e=-16(%cx):x64 f=%dx:s64`
	line := "p:" + group + "/e " + path + ":0x1180" + args
	t.Cleanup(func() {
		if err := real.RemoveProbe(group, "e"); err != nil && !errors.Is(err, syscall.ENOENT) {
			t.Errorf("cleanup: %v", err)
		}
	})
	// Written raw: the line has types and an argument count beyond what
	// ptfs writes (AddProbe refuses them), to compare the simulator on all
	// of them.
	f, err := os.OpenFile(filepath.Join(real.Dir, "uprobe_events"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(line + "\n")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	k := New(t, Options{})
	if err := k.Exec(line); err != nil {
		t.Fatal(err)
	}
	for _, tf := range []*tracefs.Tracefs{real, k.Tracefs} {
		lines, err := tf.Events()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, l := range lines {
			found = found || strings.HasPrefix(l, "p:"+group+"/e ")
		}
		if !found {
			t.Fatalf("%s lists no %s/e in %q", tf.Dir, group, lines)
		}
	}
	want, got := listed(t, real, group), listed(t, k.Tracefs, group)
	if got != want {
		t.Errorf("listing\n%s\nwant (the kernel's)\n%s", got, want)
	}
	norm := func(tf *tracefs.Tracefs) string {
		data, err := os.ReadFile(filepath.Join(tf.Dir, "events", group, "e", "format"))
		if err != nil {
			t.Fatal(err)
		}
		id, err := tf.EventID(group, "e")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Replace(string(data), "ID: "+strconv.Itoa(int(id))+"\n", "ID: N\n", 1)
	}
	if got, want := norm(k.Tracefs), norm(real); got != want {
		t.Errorf("format\n%s\nwant (the kernel's)\n%s", got, want)
	}
}

func listed(t *testing.T, tf *tracefs.Tracefs, group string) string {
	t.Helper()
	lines, err := tf.Events()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "p:"+group+"/") {
			return l
		}
	}
	return ""
}

// FuzzExec feeds arbitrary commands to the kernel: it never panics, and
// whatever it lists parses as a uprobe line with a format that decodes.
func FuzzExec(f *testing.F) {
	f.Add("p:g/e PATH:0x10 %di a=%si:u32 +8(%sp):s32")
	f.Add("ptw:g/e PATH:0x10%multinop \\0x2a $stack3:x32 %nopace")
	f.Add("ptw:e PATH:0x1180 %di")
	f.Add("-:g/e")
	f.Add("r:e PATH:16 x=-0x10(%bp)")
	path := filepath.Join(f.TempDir(), "t")
	if err := os.WriteFile(path, make([]byte, 64), 0o644); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, cmd string) {
		cmd = strings.ReplaceAll(cmd, "PATH", path)
		for _, o := range []Options{{PTW: true}, {Stock: true}, {}} {
			k := New(t, o)
			k.Exec(cmd)
			lines, err := k.Tracefs.Events()
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range lines {
				pl, err := tracefs.ParseLine(l)
				if err != nil {
					t.Fatalf("listed %q: %v", l, err)
				}
				f, err := os.Open(filepath.Join(k.Tracefs.Dir, "events", pl.Group, pl.Event, "format"))
				if err != nil {
					t.Fatal(err)
				}
				ev, err := tracefs.ParseFormat(f)
				f.Close()
				if err != nil || ev == nil {
					t.Fatalf("format of %q: %v, %v", l, ev, err)
				}
			}
		}
	})
}
