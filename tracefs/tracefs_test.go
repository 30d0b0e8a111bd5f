package tracefs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"ptfs/decode"
	"ptfs/internal/testkit"
	"ptfs/probes"
)

func TestMain(m *testing.M) {
	// Claim our groups so that RemoveStale in concurrently running tests
	// of other packages (and ours) leaves them alone.
	c, err := ClaimProbes()
	if err != nil {
		panic(err)
	}
	code := m.Run()
	c.Close()
	os.Exit(code)
}

// tracefsT returns the tracefs, skipping when the machine has none.
func tracefsT(t *testing.T) *Tracefs {
	t.Helper()
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "tracefs uprobes need root")
	}
	tf, err := FindTracefs()
	if errors.Is(err, ErrNoTracefs) {
		testkit.Unavailable(t, "no tracefs: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tf
}

// testGroup returns a group name unique to this process and test, and
// removes every probe left in it when the test ends.
func testGroup(t *testing.T, tf *Tracefs, name string) string {
	t.Helper()
	g := GroupName(os.Getpid(), "probes_"+name)
	t.Cleanup(func() { cleanGroup(t, tf, g) })
	return g
}

func cleanGroup(t *testing.T, tf *Tracefs, g string) {
	lines, err := tf.Events()
	if err != nil {
		t.Error(err)
		return
	}
	for _, l := range lines {
		if pl, err := ParseLine(l); err == nil && pl.Group == g {
			if err := tf.RemoveProbe(pl.Group, pl.Event); err != nil && !errors.Is(err, syscall.ENOENT) {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
	if left := groupLines(t, tf, g); len(left) > 0 {
		t.Errorf("cleanup left %q", left)
	}
}

// cleanPath removes every probe on path (a test's own binary, whatever
// group a kernel put it in) when the test ends.
func cleanPath(t *testing.T, tf *Tracefs, path string) {
	t.Cleanup(func() {
		lines, err := tf.Events()
		if err != nil {
			t.Error(err)
			return
		}
		for _, l := range lines {
			if pl, err := ParseLine(l); err == nil && pl.Path == path {
				if err := tf.RemoveProbe(pl.Group, pl.Event); err != nil && !errors.Is(err, syscall.ENOENT) {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
	})
}

func groupLines(t *testing.T, tf *Tracefs, g string) []string {
	t.Helper()
	lines, err := tf.Events()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range lines {
		if pl, err := ParseLine(l); err == nil && pl.Group == g {
			out = append(out, l)
		}
	}
	return out
}

func siteLines(t *testing.T, tf *Tracefs, path string, off uint64) []string {
	t.Helper()
	lines, err := tf.Events()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range lines {
		if pl, err := ParseLine(l); err == nil && pl.Path == path && pl.Offset == off {
			out = append(out, l)
		}
	}
	return out
}

func resolve(t *testing.T, b *probes.Binary, spec string) (*probes.Spec, *probes.Site) {
	t.Helper()
	s := mustParse(t, spec)
	site, err := b.Resolve(s)
	if err != nil {
		t.Fatalf("Resolve(%q): %v", spec, err)
	}
	return s, site
}

func TestFindTracefs(t *testing.T) {
	tf := tracefsT(t)
	if !hasUprobes(tf.Dir) {
		t.Fatalf("%s has no uprobe_events", tf.Dir)
	}
	// Mounting: a candidate list without tracefs makes it mount one.
	mnt := t.TempDir()
	got, err := findTracefs([]string{t.TempDir()}, mnt)
	if err != nil {
		t.Fatalf("findTracefs mounting on %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	if got.Dir != mnt || !hasUprobes(mnt) {
		t.Errorf("findTracefs = %+v, uprobe_events in %s: %v", got, mnt, hasUprobes(mnt))
	}
	_, err = findTracefs([]string{t.TempDir()}, filepath.Join(mnt, "nonexistent"))
	if !errors.Is(err, ErrNoTracefs) {
		t.Errorf("findTracefs on a missing mount point: %v, want ErrNoTracefs", err)
	}
}

// hits returns the hit count of EVENT on path from uprobe_profile.
func hits(t *testing.T, tf *Tracefs, path, event string) uint64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tf.Dir, "uprobe_profile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == path && f[1] == event {
			n, err := strconv.ParseUint(f[2], 10, 64)
			if err != nil {
				t.Fatalf("uprobe_profile line %q: %v", l, err)
			}
			return n
		}
	}
	t.Fatalf("uprobe_profile has no %s %s", path, event)
	return 0
}

// perfOpen attaches a tracepoint perf event to event id on cpu, which
// registers the uprobe with the kernel.
func perfOpen(t *testing.T, id uint16, cpu int) int {
	t.Helper()
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_TRACEPOINT,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Config:      uint64(id),
		Sample_type: unix.PERF_SAMPLE_RAW,
		Sample:      1,
	}
	fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		t.Fatalf("perf_event_open tracepoint %d cpu %d: %v", id, cpu, err)
	}
	return fd
}

func TestAddRemoveProbe(t *testing.T) {
	tf := tracefsT(t)
	path, b := sitesBinary(t, tf)
	g := testGroup(t, tf, "add")

	s, site := resolve(t, b, "target a=%di %si:u32 c=+0(%sp):s32")
	line := ClassicLine(g, "tgt", path, site.Offset, s)
	if err := tf.AddProbe(line); err != nil {
		t.Fatalf("AddProbe(%q): %v", line, err)
	}
	if l := groupLines(t, tf, g); len(l) != 1 || !strings.HasPrefix(l[0], "p:"+g+"/tgt "+path+":0x") {
		t.Fatalf("uprobe_events has %q for %s", l, g)
	}

	id, err := tf.EventID(g, "tgt")
	if err != nil {
		t.Fatal(err)
	}
	ev, err := tf.Event(g, "tgt", s)
	if err != nil {
		t.Fatal(err)
	}
	want := &decode.Event{ID: id, Group: g, Name: "tgt", Args: []decode.Arg{
		{Name: "a", Type: decode.U64, Offset: 16, Size: 8},
		{Name: "", Type: decode.U32, Offset: 24, Size: 4},
		{Name: "c", Type: decode.S32, Offset: 28, Size: 4},
	}}
	if id == 0 || ev.ID != want.ID || ev.Group != g || ev.Name != "tgt" || len(ev.Args) != 3 ||
		ev.Args[0] != want.Args[0] || ev.Args[1] != want.Args[1] || ev.Args[2] != want.Args[2] {
		t.Errorf("Event = %+v, want %+v", ev, want)
	}
	// A spec that does not match the format is caught.
	if _, err := tf.Event(g, "tgt", mustParse(t, "target a=%di")); err == nil {
		t.Error("Event with a mismatching spec: no error")
	}

	// The probe fires at the resolved site: run the program with the
	// uprobe registered through perf events on every CPU.
	for cpu := 0; cpu < 2 && cpu < numCPU(t); cpu++ {
		fd := perfOpen(t, id, cpu)
		t.Cleanup(func() { unix.Close(fd) })
	}
	if out, err := exec.Command(path).CombinedOutput(); err != nil {
		t.Fatalf("run %s: %v %s", path, err, out)
	}
	if n := hits(t, tf, path, "tgt"); n != 100 {
		t.Errorf("probe on target hit %d times, want 100", n)
	}

	// The same name again, and another name at the same site.
	if err := tf.AddProbe(line); !errors.Is(err, ErrExists) || !errors.Is(err, syscall.EEXIST) {
		t.Errorf("AddProbe duplicate name: %v, want ErrExists", err)
	}
	// A ptw probe at a used site is refused before the kernel sees it; a
	// classic one shares the site, as the kernel allows.
	ptw := PTWLine(g, "other", path, site.Offset, &probes.Spec{})
	if err := tf.AddProbe(ptw); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), g+"/tgt") {
		t.Errorf("ptw AddProbe at a used site: %v, want ErrExists naming %s/tgt", err, g)
	}
	if l := groupLines(t, tf, g); len(l) != 1 {
		t.Errorf("after refused adds, uprobe_events has %q", l)
	}
	other := ClassicLine(g, "other", path, site.Offset, &probes.Spec{})
	if err := tf.AddProbe(other); err != nil {
		t.Errorf("classic AddProbe at a used site: %v", err)
	}
	if l := groupLines(t, tf, g); len(l) != 2 {
		t.Errorf("two classic probes at one site: uprobe_events has %q", l)
	}
	if err := tf.RemoveProbe(g, "other"); err != nil {
		t.Error(err)
	}
}

func numCPU(t *testing.T) int {
	data, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Fatal(err)
	}
	// "0-1" or "0": the test only needs the count of a contiguous range.
	r := strings.TrimSpace(string(data))
	if _, hi, ok := strings.Cut(r, "-"); ok && !strings.Contains(r, ",") {
		n, err := strconv.Atoi(hi)
		if err == nil {
			return n + 1
		}
	}
	return 1
}

func TestRemoveProbe(t *testing.T) {
	tf := tracefsT(t)
	path := buildC(t, "sites", builds[1].flags...)
	cleanPath(t, tf, path)
	b := openBinary(t, path)
	g := testGroup(t, tf, "remove")
	s, site := resolve(t, b, "sites+5 %di")
	if err := tf.AddProbe(ClassicLine(g, "busy", path, site.Offset, s)); err != nil {
		t.Fatal(err)
	}
	id, err := tf.EventID(g, "busy")
	if err != nil {
		t.Fatal(err)
	}
	fd := perfOpen(t, id, 0)
	err = tf.RemoveProbe(g, "busy")
	unix.Close(fd)
	if !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "perf event") {
		t.Errorf("RemoveProbe while a perf event holds it: %v, want EBUSY", err)
	}
	if err := tf.RemoveProbe(g, "busy"); err != nil {
		t.Errorf("RemoveProbe after close: %v", err)
	}
	if l := groupLines(t, tf, g); len(l) != 0 {
		t.Errorf("removed probe still listed: %q", l)
	}
	if err := tf.RemoveProbe(g, "busy"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("RemoveProbe of a missing probe: %v, want ENOENT", err)
	}
}

func TestAddProbeRefused(t *testing.T) {
	tf := tracefsT(t)
	path, b := sitesBinary(t, tf)
	g := testGroup(t, tf, "refused")
	_, site := resolve(t, b, "sites+5")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	size := st.Size()

	// A bad offset never reaches the kernel: Resolve refuses it.
	for _, off := range []uint64{site.Offset + 1, uint64(size) + 0x1000} {
		if _, err := b.Resolve(&probes.Spec{Offset: off}); !errors.Is(err, probes.ErrBadSite) {
			t.Errorf("Resolve(0x%x): %v, want probes.ErrBadSite", off, err)
		}
	}

	tests := []struct {
		line   string
		want   error
		reason string
	}{
		// Lines outside ptfs's grammar never reach the kernel.
		{"p:" + g + "/badreg " + path + ":0x" + strconv.FormatUint(site.Offset, 16) + " %ds", ErrBadLine, `argument "%ds" is not in canonical form`},
		{"p:" + g + "/9bad " + path + ":0x10", ErrBadLine, "C identifiers"},
		{"p:" + g + "/imm " + path + ":0x10 \\18446744073709551616", ErrBadLine, "not in canonical form"},
		{"p:" + g + "/x " + path, ErrBadLine, "PATH:OFFSET"},
		// The kernel's refusal comes with its reason from error_log.
		{"p:" + g + "/nofile " + path + ".missing:0x10 %di", syscall.ENOENT, "Failed to find the given file"},
		{"p:" + g + "/far " + path + ":0x7fffffff %di", probes.ErrBadSite, "beyond the end"},
	}
	for _, tt := range tests {
		err := tf.AddProbe(tt.line)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.reason) {
			t.Errorf("AddProbe(%q) = %v, want %v with %q", tt.line, err, tt.want, tt.reason)
		}
	}
	if l := groupLines(t, tf, g); len(l) != 0 {
		t.Errorf("refused probes left %q", l)
	}
}

// TestAddProbePTW writes a ptw: line. A stock kernel accepts it but makes a
// classic stand-in, which AddProbe must remove and refuse; a kernel with
// ptwrite uprobes lists it as ptw:.
func TestAddProbePTW(t *testing.T) {
	tf := tracefsT(t)
	path, b := sitesBinary(t, tf)
	g := testGroup(t, tf, "ptw")
	s, site := resolve(t, b, "target %di %si")
	err := tf.AddProbe(PTWLine(g, "e", path, site.Offset, s))
	if err == nil {
		if l := groupLines(t, tf, g); len(l) != 1 || !strings.HasPrefix(l[0], "ptw:") {
			t.Errorf("ptw probe listed as %q", l)
		}
		return
	}
	if !errors.Is(err, probes.ErrRefused) || !strings.Contains(err.Error(), "does not support ptw probes") {
		t.Errorf("AddProbe(ptw) on a stock kernel: %v, want probes.ErrRefused about ptw support", err)
	}
	if l := siteLines(t, tf, path, site.Offset); len(l) != 0 {
		t.Errorf("stand-in left at the site: %q", l)
	}
}

// TestPTWStandInReal writes a ptw: line under ptfs's own group and event
// to this machine's stock kernel and looks at uprobe_events right after the
// write, before AddProbe reads it back: the kernel must have made its
// stand-in in the default group, named after the file and offset, and
// nothing under ptfs's name, which is what tells a stand-in from a ptw
// probe however the kernel lists that one. AddProbe removes the stand-in
// and refuses; Install does not retry a typed line that made a stand-in.
func TestPTWStandInReal(t *testing.T) {
	tf := tracefsT(t)
	if doc, err := tf.ReadmeMentionsPTW(); err != nil {
		testkit.Unavailable(t, "tracefs README: %v", err)
	} else if doc {
		t.Skip("this kernel documents ptw probes: not the stock kernel this test is about")
	}
	// A base name of this process alone: the kernel names its stand-in
	// after it, in a group that every writer shares.
	base := "ptwstandin" + strconv.Itoa(os.Getpid())
	path := filepath.Join(t.TempDir(), base)
	if err := os.WriteFile(path, append(make([]byte, 0x1000), 0x0f, 0x1f, 0x44, 0x00, 0x00), 0o755); err != nil {
		t.Fatal(err)
	}
	cleanPath(t, tf, path)
	g := testGroup(t, tf, "standin")
	var seen [][]string // the lines on path, and of g, right after each ptw write
	hooked := &Tracefs{Dir: tf.Dir, Exec: func(cmd string) error {
		err := tf.write(cmd)
		if strings.HasPrefix(cmd, "ptw:") {
			lines, lerr := tf.Events()
			if lerr != nil {
				t.Error(lerr)
			}
			var mine []string
			for _, l := range lines {
				if pl, err := ParseLine(l); err == nil && (pl.Path == path || pl.Group == g) {
					mine = append(mine, l)
				}
			}
			seen = append(seen, mine)
		}
		return err
	}}
	err := hooked.AddProbe(PTWLine(g, "e", path, 0x1000, mustParse(t, "0x1000 %di")))
	standIn := "p:uprobes/p_" + base + "_0x1000 " + path + ":0x"
	if len(seen) != 1 || len(seen[0]) != 1 || !strings.HasPrefix(seen[0][0], standIn) {
		t.Fatalf("after the ptw write the kernel listed %q, want one line %q...", seen, standIn)
	}
	if !errors.Is(err, probes.ErrRefused) || !strings.Contains(err.Error(), "created p:uprobes/p_"+base+"_0x1000 instead (removed)") {
		t.Errorf("AddProbe = %v, want the stand-in refused", err)
	}
	if l := siteLines(t, tf, path, 0x1000); len(l) != 0 {
		t.Errorf("stand-in left: %q", l)
	}
	t.Logf("stock kernel's listing of a ptw: line: %s", seen[0][0])

	seen = nil
	if _, err := hooked.Install(true, g, "typed", path, 0x1000, mustParse(t, "0x1000 %di:u32")); !errors.Is(err, probes.ErrRefused) {
		t.Errorf("Install of a typed ptw probe on a stock kernel = %v, want ErrRefused", err)
	}
	if len(seen) != 1 || len(seen[0]) != 1 || !strings.HasPrefix(seen[0][0], standIn) {
		t.Errorf("typed ptw writes listed %q, want one stand-in and no untyped retry", seen)
	}
	if l := siteLines(t, tf, path, 0x1000); len(l) != 0 {
		t.Errorf("stand-in left: %q", l)
	}
}

func TestRemoveStale(t *testing.T) {
	tf := tracefsT(t)
	path, b := sitesBinary(t, tf)

	// A dead PID: a child that has exited and been reaped.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	// A live PID that is neither ptfs nor claims its groups.
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })

	me := os.Getpid()
	deadG := GroupName(dead.Process.Pid, "probes_stale"+strconv.Itoa(me))
	sleepG := GroupName(sleeper.Process.Pid, "probes_stale"+strconv.Itoa(me))
	ownG := GroupName(me, "probes_stale")
	foreignG := "probestest" + strconv.Itoa(me)
	groups := []string{deadG, sleepG, ownG, foreignG}
	for _, g := range groups {
		t.Cleanup(func() { cleanGroup(t, tf, g) })
	}
	// Eight instruction boundaries of "sites": a site holds one probe.
	offs := []string{"sites", "sites+5", "sites+8", "sites+13", "sites+18", "sites+23", "sites+25", "sites+27"}
	for i, g := range groups {
		for j, ev := range []string{"e1", "e2"} {
			s, site := resolve(t, b, offs[2*i+j]+" %di")
			if err := tf.AddProbe(ClassicLine(g, ev, path, site.Offset, s)); err != nil {
				t.Fatalf("AddProbe %s/%s: %v", g, ev, err)
			}
		}
	}
	before := map[string]int{}
	for _, g := range groups {
		before[g] = len(groupLines(t, tf, g))
		if before[g] == 0 {
			t.Fatalf("group %s has no probes", g)
		}
	}
	// Only look at this test's groups: other packages' tests may run
	// their own ptfs groups concurrently.
	consider := func(g string) bool {
		for _, x := range groups {
			if g == x {
				return true
			}
		}
		return false
	}
	// self is not us: our own groups must survive through our claim.
	removed, err := tf.removeStale(1, consider)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range removed {
		g, _, _ := strings.Cut(r, "/")
		if g != deadG && g != sleepG {
			t.Errorf("RemoveStale removed %s", r)
		}
		n++
	}
	if n != before[deadG]+before[sleepG] {
		t.Errorf("RemoveStale removed %q, want the %d events of %s and %s", removed, before[deadG]+before[sleepG], deadG, sleepG)
	}
	for _, g := range []string{deadG, sleepG} {
		if l := groupLines(t, tf, g); len(l) != 0 {
			t.Errorf("stale group %s left: %q", g, l)
		}
	}
	for _, g := range []string{ownG, foreignG} {
		if l := groupLines(t, tf, g); len(l) != before[g] {
			t.Errorf("group %s: %d probes left of %d", g, len(l), before[g])
		}
	}
	// With self our own PID, nothing of ours goes either.
	if removed, err := tf.removeStale(me, consider); err != nil || len(removed) != 0 {
		t.Errorf("second RemoveStale = %q, %v", removed, err)
	}
}

func TestReadmeMentionsPTW(t *testing.T) {
	tests := []struct {
		readme string
		want   bool
	}{
		{"\t   Format: p[:[<group>/][<event>]] <place> [<args>]\n\t           r[maxactive][:[<group>/][<event>]] <place> [<args>]\n", false},
		{"\t   Format: p[:[<group>/][<event>]] <place> [<args>]\n\t           ptw[:[<group>/][<event>]] <place> [<args>]\n", true},
		{"uprobe_events - ... ptwrite is not a ptw line\n", false},
	}
	for _, tt := range tests {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "README"), []byte(tt.readme), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := (&Tracefs{Dir: dir}).ReadmeMentionsPTW()
		if err != nil || got != tt.want {
			t.Errorf("ReadmeMentionsPTW(%q) = %v, %v; want %v", tt.readme, got, err, tt.want)
		}
	}
	if _, err := (&Tracefs{Dir: t.TempDir()}).ReadmeMentionsPTW(); err == nil {
		t.Error("no README: no error")
	}
	if _, err := tracefsT(t).ReadmeMentionsPTW(); err != nil {
		t.Errorf("real README: %v", err)
	}
}

// TestEnable turns a real probe's enable file on and off: an enabled probe
// cannot be removed.
func TestEnable(t *testing.T) {
	tf := tracefsT(t)
	path, b := sitesBinary(t, tf)
	g := testGroup(t, tf, "enable")
	s, site := resolve(t, b, "sites %di")
	if err := tf.AddProbe(ClassicLine(g, "on", path, site.Offset, s)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tf.Enable(g, "on", false) })
	enabled := func() string {
		data, err := os.ReadFile(filepath.Join(tf.Dir, "events", g, "on", "enable"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(data))
	}
	if err := tf.Enable(g, "on", true); err != nil {
		t.Fatal(err)
	}
	if e := enabled(); e != "1" {
		t.Errorf("enable reads %q after Enable(true)", e)
	}
	if err := tf.RemoveProbe(g, "on"); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("RemoveProbe of an enabled probe: %v, want EBUSY", err)
	}
	if err := tf.Enable(g, "on", false); err != nil {
		t.Fatal(err)
	}
	if e := enabled(); e != "0" {
		t.Errorf("enable reads %q after Enable(false)", e)
	}
	if err := tf.RemoveProbe(g, "on"); err != nil {
		t.Error(err)
	}
	if err := tf.Enable(g, "on", true); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Enable of a removed probe: %v, want ErrNotExist", err)
	}
}

// sitesBinary builds testdata/sites.c, leaves no probe of tf on it when the
// test ends, and opens it.
func sitesBinary(t *testing.T, tf *Tracefs) (string, *probes.Binary) {
	t.Helper()
	path := buildC(t, "sites", builds[0].flags...)
	cleanPath(t, tf, path)
	return path, openBinary(t, path)
}

// reuseRun numbers the runs of TestRemoveStaleReusedPID: a group, once
// this process made it, stays its own.
var reuseRun int

// TestRemoveStaleReusedPID: the probes that a dead process with this PID
// left (planted by another process, in groups this process never made) are
// removed by RemoveStale(self) and by the first AddProbe in their group,
// which then installs its own probe under the same name; the groups this
// process made keep theirs.
func TestRemoveStaleReusedPID(t *testing.T) {
	tf := tracefsT(t)
	path, b := sitesBinary(t, tf)
	reuseRun++
	me, run := os.Getpid(), strconv.Itoa(reuseRun)
	liveG := GroupName(me, "probes_reuse_live"+run)
	deadG := GroupName(me, "probes_reuse_dead"+run)
	nextG := GroupName(me, "probes_reuse_next"+run)
	groups := []string{liveG, deadG, nextG}
	for _, g := range groups {
		t.Cleanup(func() { cleanGroup(t, tf, g) })
	}
	line := func(g, ev, off string) string {
		s, site := resolve(t, b, off+" %di")
		return ClassicLine(g, ev, path, site.Offset, s)
	}
	if err := tf.AddProbe(line(liveG, "e1", "sites")); err != nil {
		t.Fatal(err)
	}
	testkit.PlantProbe(t, tf.Dir, line(deadG, "e1", "sites+5"))
	testkit.PlantProbe(t, tf.Dir, line(deadG, "e2", "sites+8"))
	testkit.PlantProbe(t, tf.Dir, line(nextG, "e1", "sites+13"))
	for _, g := range groups {
		if l := groupLines(t, tf, g); len(l) == 0 {
			t.Fatalf("group %s has no probes", g)
		}
	}
	if !OwnerAlive(me) {
		t.Fatal("this process does not claim its groups")
	}
	consider := func(g string) bool { return g == liveG || g == deadG }
	removed, err := tf.removeStale(me, consider)
	if err != nil || strings.Join(removed, " ") != deadG+"/e1 "+deadG+"/e2" {
		t.Errorf("RemoveStale = %q, %v; want the two probes of %s", removed, err, deadG)
	}
	if l := groupLines(t, tf, deadG); len(l) != 0 {
		t.Errorf("stale group %s left: %q", deadG, l)
	}
	if l := groupLines(t, tf, liveG); len(l) != 1 {
		t.Errorf("group %s made by this process: %q, want its probe", liveG, l)
	}

	// The first line in nextG removes the dead process's e1 and takes its
	// name; a second one removes nothing.
	want := line(nextG, "e1", "sites+18")
	if err := tf.AddProbe(want); err != nil {
		t.Fatalf("AddProbe over a dead process's event name: %v", err)
	}
	if err := tf.AddProbe(line(nextG, "e2", "sites+23")); err != nil {
		t.Fatal(err)
	}
	wl, err := ParseLine(want)
	if err != nil {
		t.Fatal(err)
	}
	l := groupLines(t, tf, nextG)
	e1 := slices.IndexFunc(l, func(s string) bool {
		pl, err := ParseLine(s)
		return err == nil && pl.Event == "e1" && pl.Offset == wl.Offset
	})
	if len(l) != 2 || e1 < 0 {
		t.Errorf("group %s: %q, want this process's e1 (%s) and e2", nextG, l, want)
	}
	if removed, err := tf.removeStale(me, func(g string) bool { return g == nextG || g == liveG }); err != nil || len(removed) != 0 {
		t.Errorf("RemoveStale of this process's groups = %q, %v", removed, err)
	}
}

// TestClaimShared: the claims of one process share its owner socket (the
// TestMain claim is held throughout): each succeeds, and closing one, even
// twice, leaves the process claiming its groups.
func TestClaimShared(t *testing.T) {
	a, err := ClaimProbes()
	if err != nil {
		t.Fatalf("a second claim in one process: %v", err)
	}
	b, err := ClaimProbes()
	if err != nil {
		t.Fatalf("a third claim in one process: %v", err)
	}
	for range 2 {
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if !OwnerAlive(os.Getpid()) {
		t.Error("closing one claim gave up the others")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if !OwnerAlive(os.Getpid()) {
		t.Error("TestMain's claim is gone")
	}
}

// TestAdoptConcurrent: first writes in a group of this PID that a dead
// process left a probe in, from several goroutines at once and beside a
// RemoveStale, each install, and only the dead process's probe goes.
func TestAdoptConcurrent(t *testing.T) {
	tf := tracefsT(t)
	path, b := sitesBinary(t, tf)
	reuseRun++
	g := GroupName(os.Getpid(), "probes_adopt"+strconv.Itoa(reuseRun))
	t.Cleanup(func() { cleanGroup(t, tf, g) })
	offs := []string{"sites", "sites+5", "sites+8", "sites+13", "sites+18"}
	lines := make([]string, len(offs))
	for i, off := range offs {
		s, site := resolve(t, b, off+" %di")
		lines[i] = ClassicLine(g, "e"+strconv.Itoa(i), path, site.Offset, s)
	}
	testkit.PlantProbe(t, tf.Dir, lines[0])
	errs := make(chan error, len(lines))
	var wg sync.WaitGroup
	for _, l := range lines[1:] {
		wg.Go(func() { errs <- tf.AddProbe(l) })
	}
	wg.Go(func() {
		_, err := tf.removeStale(os.Getpid(), func(x string) bool { return x == g })
		errs <- err
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	var evs []string
	for _, l := range groupLines(t, tf, g) {
		if pl, err := ParseLine(l); err == nil {
			evs = append(evs, pl.Event)
		}
	}
	slices.Sort(evs)
	if strings.Join(evs, " ") != "e1 e2 e3 e4" {
		t.Errorf("group %s has events %q, want e1 to e4", g, evs)
	}
}
