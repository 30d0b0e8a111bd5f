package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"ptfs/internal/testkit"
)

// recordRE matches a classic record line; pid= is there, comm= when the
// process could still be named (group 9: pid, 11: comm).
var recordRE = regexp.MustCompile(`^record (\d+): event=(\S+) id=0x[0-9a-f]+ args=\[(.*)\] tid=(\d+) cpu=(\d+) time=(\d+)\.(\d{9})( pid=(\d+))( comm=(\S+))?$`)

// checkRecords asserts that lines are records 1..n of event with args
// [i, i+1], in time order.
func checkRecords(t *testing.T, got []string, event string, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%d record lines, want %d:\n%s", len(got), n, strings.Join(got, "\n"))
	}
	var last string
	for i, l := range got {
		m := recordRE.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %d %q is not a record line", i+1, l)
		}
		if m[1] != fmt.Sprint(i+1) || m[2] != event || m[3] != fmt.Sprintf("%d, %d", i, i+1) {
			t.Fatalf("line %d = %q, want record %d of %s with args [%d, %d]", i+1, l, i+1, event, i, i+1)
		}
		ts := fmt.Sprintf("%020s.%s", m[6], m[7])
		if ts < last {
			t.Fatalf("line %d: time goes back: %q", i+1, l)
		}
		last = ts
	}
}

// Test 1: exactly 100 records in order, PIE and not, by symbol and by offset.
func TestRecordsExact(t *testing.T) {
	needKernel(t)
	for _, build := range []struct {
		name  string
		flags []string
	}{{"nopie", []string{"-no-pie"}}, {"pie", []string{"-fPIE", "-pie"}}} {
		bin := buildC(t, "target", "t", build.flags...)
		off := testkit.FuncOffset(t, bin, "target")
		for _, spec := range []string{"target %di %si", fmt.Sprintf("0x%x %%di %%si", off)} {
			t.Run(build.name+"/"+strings.Fields(spec)[0], func(t *testing.T) {
				m := startMount(t, "t="+bin)
				m.setProbe("t", "e", spec)
				text := m.probeText("t", "e")
				if !strings.HasPrefix(text, spec+"\n# state: installed") {
					t.Fatalf("probe file:\n%s", text)
				}
				// target starts with mov %rdi,%rax: a classic probe there
				// is single-stepped (TestProbeCostKernel measures it).
				if !strings.Contains(text, "\n# classic: single-stepped (two traps a hit, the dearest): mov %rdi,%rax is run out of line under the trap flag\n") {
					t.Fatalf("probe file without its cost:\n%s", text)
				}
				if l := uprobeLines(t, m.group()+"t/e "); len(l) != 1 {
					t.Fatalf("uprobe_events lines of the probe: %q", l)
				}
				runProg(t, bin, "100")
				checkRecords(t, m.waitLines(100, "t", "records"), "ptfs_t/e", 100)
				// Nothing more may come: a marker call after the run
				// is record 101 only if no other record came before it
				// (records are in time order).
				runProg(t, bin, "1")
				got := m.waitLines(101, "t", "records")
				checkRecords(t, got[:min(len(got), 100)], "ptfs_t/e", 100)
				if mk := recordRE.FindStringSubmatch(got[len(got)-1]); len(got) != 101 || mk == nil || mk[1] != "101" || mk[3] != "0, 1" {
					t.Fatalf("after the marker call, %d records:\n%s", len(got), strings.Join(got[min(len(got), 100):], "\n"))
				}
				st := m.read("t", "status")
				if !strings.Contains(st, "summary: records=101 dropped=0 stray=0 unknown=0 errors=0\n") {
					t.Fatalf("status:\n%s", st)
				}
			})
		}
	}
}

// Test 2: a real `tail -f` sees records while the program runs.
func TestTailFollows(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t", "-no-pie")
	m := startMount(t, bin)
	m.setProbe("t", "e", "target a=%di b=%si")
	tail := exec.Command("tail", "-n", "+1", "-f", m.path("t", "records"))
	out, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tail.Process.Kill(); tail.Wait() })
	// Iterations 40 ms apart for a minute at most: the program still runs
	// when tail -f shows its first 50 records, however long a loaded
	// machine takes to start tail or deliver them (a 2 s program could
	// end first), unless records wait for its exit. It is killed then.
	prog := exec.Command(bin, "1500", "40000")
	if err := prog.Start(); err != nil {
		t.Fatal(err)
	}
	progDone := make(chan struct{})
	go func() { prog.Wait(); close(progDone) }()
	t.Cleanup(func() { prog.Process.Kill(); <-progDone })
	sc := bufio.NewScanner(out)
	got := make(chan string)
	ctx := t.Context() // done when the test ends: the sender does too
	go func() {
		defer close(got)
		for sc.Scan() {
			select {
			case got <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	first := true
	for i := 0; i < 50; i++ {
		select {
		case l := <-got:
			want := fmt.Sprintf("record %d: event=ptfs_t/e id=", i+1)
			if !strings.HasPrefix(l, want) || !strings.Contains(l, fmt.Sprintf("args=[a=%d, b=%d]", i, i+1)) {
				t.Fatalf("tail line %d = %q", i+1, l)
			}
			if first {
				first = false
				select {
				case <-progDone:
					t.Fatal("tail -f showed the first record only after the program ended")
				default:
				}
			}
		case <-time.After(10 * time.Second): // tail polls FUSE once a second
			t.Fatalf("tail -f showed %d records, then nothing for 10 s\n%s", i, m.log)
		}
	}
}

// Test 3: bad specs fail the writer's echo with the right errno, the probe
// file says why, and uprobe_events does not change.
func TestBadSpecs(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t", "-no-pie")
	off := testkit.FuncOffset(t, bin, "target")
	m := startMount(t, bin)
	const (
		einval = "Invalid argument"
		enoent = "No such file or directory"
		eexist = "File exists"
	)
	cases := []struct{ spec, errno, reason string }{
		{"", einval, ""},
		{"   ", einval, ""},
		{"target %di %si %dx %cx %r8 %r9 %ax %bx %bp", einval, "8"},
		{"target %xx", einval, "xx"},
		{"target %eax", einval, "eax"},
		{"target %di:u128", einval, "u128"},
		{"target %di:string", einval, "+0(%si):string"},
		{"target %di:symbol", einval, "only in kernel probes"},
		{"target %di:b4@30/32", einval, "outside the 32-bit container"},
		{"target @0x1234", einval, "@0x1234"},
		{"target %nosuchopt", einval, "nosuchopt"},
		{"target $retval", einval, "retval"},
		{"target %pid=0", einval, "pid"},
		{"target %comm=0123456789abcdef", einval, "comm"},
		{"target +8(%si", einval, ""},
		{"target +x(%si)", einval, ""},
		{"target $stackx", einval, "stackx"},
		{"target \\zz", einval, ""},
		{"target 1a=%di", einval, "1a"},
		{"target a=%di a=%si", einval, "a"},
		{"target =%di", einval, ""},
		{"target+ %di", einval, ""},
		{"target+0x %di", einval, ""},
		{"0xzz %di", einval, ""},
		{"nosuchsymbol %di", enoent, "nosuchsymbol"},
		{"target+100000 %di", einval, ""},
		{"0x0 %di", einval, ""},
		{"0xfffffff %di", einval, ""},
		{fmt.Sprintf("0x%x %%di", off+1), einval, ""},
		{"target+1 %di", einval, ""},
		{"target %di extra=", einval, ""},
	}
	// Other packages' tests add probes meanwhile: look at those on this
	// test's binary (a path of its own) only.
	before := uprobeLines(t, bin)
	for i, c := range cases {
		name := fmt.Sprintf("bad%d", i)
		out, err := shell(fmt.Sprintf("echo %s > %s", shellQuote(c.spec), m.path("t", "probes", name)))
		if err == nil {
			t.Errorf("spec %q: echo succeeded; probe file:\n%s", c.spec, m.probeText("t", name))
			continue
		}
		if !strings.Contains(out, c.errno) {
			t.Errorf("spec %q: echo said %q, want %q", c.spec, out, c.errno)
		}
		text := m.probeText("t", name)
		if !strings.Contains(text, "# error: ") || !strings.Contains(text, c.reason) {
			t.Errorf("spec %q: probe file does not say why (want %q in it):\n%s", c.spec, c.reason, text)
		}
		// Classic mode's errors name its limits, not ptw mode's.
		if !strings.Contains(c.spec, "%return") && strings.Contains(text, "ptwrite") {
			t.Errorf("spec %q: a classic-mode error names ptwrite:\n%s", c.spec, text)
		}
	}
	if after := uprobeLines(t, bin); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("uprobe_events changed:\nbefore %q\nafter  %q", before, after)
	}

	// A second probe at the same site: EEXIST. Overwriting the working
	// probe with a bad spec keeps it working.
	m.setProbe("t", "good", "target %di %si")
	if out, err := shell(fmt.Sprintf("echo 0x%x %%di > %s", off, m.path("t", "probes", "dup"))); err == nil || !strings.Contains(out, eexist) {
		t.Errorf("second probe at the same site: err %v, %q", err, out)
	}
	if out, err := shell(fmt.Sprintf("echo 'target %%zz' > %s", m.path("t", "probes", "good"))); err == nil || !strings.Contains(out, einval) {
		t.Errorf("overwrite with a bad spec: err %v, %q", err, out)
	}
	text := m.probeText("t", "good")
	if !strings.HasPrefix(text, "target %di %si\n# state: installed") || !strings.Contains(text, "zz") {
		t.Errorf("probe file after a bad overwrite:\n%s", text)
	}
	runProg(t, bin, "10")
	checkRecords(t, m.waitLines(10, "t", "records"), "ptfs_t/good", 10)
	// A good overwrite replaces it, at the same site or another.
	m.setProbe("t", "good", "target b=%si")
	if l := uprobeLines(t, m.group()); len(l) != 1 || !strings.Contains(l[0], " b=%si") {
		t.Errorf("after replacing at the same site: %q", l)
	}
	runProg(t, bin, "1")
	if got := m.waitLines(11, "t", "records"); len(got) != 11 || !strings.Contains(got[10], "record 11: event=ptfs_t/good id=") || !strings.Contains(got[10], "args=[b=1]") {
		t.Errorf("record of the replaced probe: %q", got[10:])
	}
	m.setProbe("t", "good", "other %di")
	if l := uprobeLines(t, m.group()); len(l) != 1 {
		t.Errorf("after replacing: %q", l)
	}
}

// Test 4: rm, unmount, SIGTERM and SIGKILL + a new mount leave no probe of
// a mount behind, and never touch a probe someone else installed.
func TestProbeLifetime(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t", "-no-pie")
	off := testkit.FuncOffset(t, bin, "other")
	// A probe that another program owns, in a group that looks like ours.
	foreign := fmt.Sprintf("p:notptfs%d/keep %s:0x%x", os.Getpid(), bin, off)
	if out, err := shell(fmt.Sprintf("echo %s >> %s/uprobe_events", shellQuote(foreign), tracefsDir(t))); err != nil {
		t.Fatalf("foreign probe: %v %s", err, out)
	}
	t.Cleanup(func() { removeLine(t, foreign) })
	keepForeign := func(when string) {
		if len(uprobeLines(t, fmt.Sprintf("notptfs%d/keep", os.Getpid()))) != 1 {
			t.Fatalf("%s: the foreign probe is gone", when)
		}
	}

	t.Run("rm", func(t *testing.T) {
		m := startMount(t, bin)
		m.setProbe("t", "a", "target %di")
		m.setProbe("t", "b", "other %di")
		if n := len(uprobeLines(t, m.group())); n != 2 {
			t.Fatalf("%d probes installed, want 2", n)
		}
		if err := os.Remove(m.path("t", "probes", "a")); err != nil {
			t.Fatal(err)
		}
		if l := uprobeLines(t, m.group()); len(l) != 1 || !strings.Contains(l[0], "/b ") {
			t.Fatalf("after rm: %q", l)
		}
		if err := os.Remove(m.path("t", "records")); !errors.Is(err, syscall.EPERM) {
			t.Errorf("rm records: %v, want EPERM", err)
		}
		if err := os.Remove(m.path("t")); err != nil {
			t.Fatalf("rm target: %v", err)
		}
		if l := uprobeLines(t, m.group()); len(l) != 0 {
			t.Fatalf("after rm of the target: %q", l)
		}
		keepForeign("rm")
	})
	t.Run("umount", func(t *testing.T) {
		m := startMount(t, bin)
		m.setProbe("t", "a", "target %di")
		if out, err := exec.Command("umount", m.dir).CombinedOutput(); err != nil {
			t.Fatalf("umount: %v %s", err, out)
		}
		select {
		case err := <-m.done:
			m.done <- err
			if err != nil {
				t.Fatalf("ptfs exited with %v\n%s", err, m.log)
			}
		case <-time.After(kernelWait): // it removes the probe first
			t.Fatal("ptfs did not exit after umount")
		}
		if l := uprobeLines(t, m.group()); len(l) != 0 {
			t.Fatalf("after umount: %q", l)
		}
		keepForeign("umount")
	})
	t.Run("SIGTERM with a reader", func(t *testing.T) {
		m := startMount(t, bin)
		m.setProbe("t", "a", "target %di")
		tail := exec.Command("tail", "-f", m.path("t", "records"))
		if err := tail.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tail.Process.Kill(); tail.Wait() })
		m.waitStatus("t", " readers=1\n") // tail has the records file open
		if err := m.stop(syscall.SIGTERM); err != nil {
			t.Fatalf("ptfs exited with %v\n%s", err, m.log)
		}
		if l := uprobeLines(t, m.group()); len(l) != 0 {
			t.Fatalf("after SIGTERM with a reader: %q", l)
		}
		keepForeign("SIGTERM with a reader")
	})
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			m := startMount(t, bin)
			m.setProbe("t", "a", "target %di")
			if err := m.stop(sig); err != nil {
				t.Fatalf("ptfs exited with %v\n%s", err, m.log)
			}
			if l := uprobeLines(t, m.group()); len(l) != 0 {
				t.Fatalf("after %v: %q", sig, l)
			}
			keepForeign(sig.String())
		})
	}
	t.Run("SIGKILL", func(t *testing.T) {
		live := startMount(t, bin) // another live mount: its probe must stay
		live.setProbe("t", "live", "other %di")
		m := startMount(t, bin)
		m.setProbe("t", "a", "target %di")
		group := m.group()
		m.cmd.Process.Kill()
		err := <-m.done
		m.done <- err
		if l := uprobeLines(t, group); len(l) != 1 {
			t.Fatalf("after SIGKILL the probe should still be there (nobody removed it): %q", l)
		}
		// The dead mount still holds the mount point (ENOTCONN): the
		// next mount there detaches it. statfs, because stat may be
		// answered from cached attributes.
		var st syscall.Statfs_t
		if err := syscall.Statfs(m.dir, &st); !errors.Is(err, syscall.ENOTCONN) {
			t.Fatalf("mount point of the killed ptfs: %v, want ENOTCONN", err)
		}
		next := startMountAt(t, m.dir, bin)
		if _, err := os.Stat(next.path("t", "records")); err != nil {
			t.Fatalf("the next mount on the dead one's mount point: %v", err)
		}
		if l := uprobeLines(t, group); len(l) != 0 {
			t.Fatalf("the next mount left the dead mount's probes: %q", l)
		}
		if l := uprobeLines(t, live.group()); len(l) != 1 {
			t.Fatalf("the next mount removed a live mount's probe: %q", l)
		}
		keepForeign("SIGKILL")
	})
}

// Hits just before a probe is removed or replaced still reach records:
// nothing held back for ordering is dropped with the probe.
func TestRecordsSurviveRemoval(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t", "-no-pie")
	m := startMount(t, bin)
	m.setProbe("t", "a", "target %di %si")
	runProg(t, bin, "1000")
	if err := os.Remove(m.path("t", "probes", "a")); err != nil {
		t.Fatal(err)
	}
	checkRecords(t, lines(m.read("t", "records")), "ptfs_t/a", 1000)

	m.setProbe("t", "b", "target %di %si")
	runProg(t, bin, "500")
	m.setProbe("t", "b", "other %di")
	got := lines(m.read("t", "records"))
	if len(got) != 1500 || !strings.Contains(got[1499], "event=ptfs_t/b ") || !strings.Contains(got[1499], "args=[499, 500]") {
		t.Fatalf("%d records after replacing; last %q", len(got), got[len(got)-1])
	}
}

// Test 5: two targets, two probes each, four processes hitting them at
// once: every count exact, or the loss counted.
func TestConcurrentTargets(t *testing.T) {
	needKernel(t)
	const hits = 10000
	bins := map[string]string{
		"t1": buildC(t, "target", "t1", "-no-pie"),
		"t2": buildC(t, "target", "t2", "-fPIE", "-pie"),
	}
	m := startMount(t, "t1="+bins["t1"], "t2="+bins["t2"])
	for name := range bins {
		m.setProbe(name, "tgt", "target %di %si")
		m.setProbe(name, "oth", "other %di")
	}
	var wg sync.WaitGroup
	for _, name := range []string{"t1", "t1", "t2", "t2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runProg(t, bins[name], fmt.Sprint(hits))
		}()
	}
	wg.Wait()
	for name := range bins {
		want := 4 * hits // two processes, two probes each
		got := m.waitLines(want, name, "records")
		st := m.read(name, "status")
		lost := statusValue(st, "lost")
		counts := map[string]int{}
		for _, l := range got {
			mm := recordRE.FindStringSubmatch(l)
			if mm == nil {
				t.Fatalf("%s: bad line %q", name, l)
			}
			counts[mm[2]]++
		}
		if len(got) != want {
			if strings.HasPrefix(lost, "0 ") {
				t.Fatalf("%s: %d records of %d and no loss counted: %v\n%s", name, len(got), want, counts, st)
			}
			t.Logf("%s: %d of %d records, loss counted: %s", name, len(got), want, lost)
			continue
		}
		if counts["ptfs_"+name+"/tgt"] != 2*hits || counts["ptfs_"+name+"/oth"] != 2*hits {
			t.Fatalf("%s: counts %v", name, counts)
		}
		if !strings.Contains(st, fmt.Sprintf("summary: records=%d ", want)) {
			t.Fatalf("%s: status:\n%s", name, st)
		}
	}
}

// Test 6: every fetcharg form, printed as DESIGN §5 says.
func TestFetchArgs(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "fetch", "f")
	m := startMount(t, bin)
	m.setProbe("f", "all", `fetch neg=%di:s32 x=+0(%si):u32 y=+4(%si):s32 s=$stack1 k=\0x42 %di:x32 %si:u64`)
	runProg(t, bin, "5")
	got := m.waitLines(5, "f", "records")
	if len(got) != 5 {
		t.Fatalf("%d records, want 5:\n%s", len(got), strings.Join(got, "\n"))
	}
	for i, l := range got {
		mm := recordRE.FindStringSubmatch(l)
		if mm == nil {
			t.Fatalf("bad line %q", l)
		}
		neg := -(i + 1)
		want := fmt.Sprintf("neg=%d, x=%d, y=%d, s=%d, k=66, 0x%x, ", neg, 3*i, -i, 10*i, uint32(int32(neg)))
		if !strings.HasPrefix(mm[3], want) {
			t.Errorf("record %d args [%s], want prefix [%s]", i+1, mm[3], want)
		}
	}
}

// The other files: symbols, status, branches, truncating records.
func TestFiles(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t", "-no-pie")
	m := startMount(t, bin)
	off := testkit.FuncOffset(t, bin, "target")
	if !regexp.MustCompile(fmt.Sprintf(`(?m)^0x%x \d+ target$`, off)).MatchString(m.read("t", "symbols")) {
		t.Errorf("symbols has no line for target at 0x%x:\n%s", off, m.read("t", "symbols"))
	}
	root := m.read("status")
	for _, want := range []string{"mode: classic\n", "uprobes: yes\n", "fuse: yes\n", "summary: records=0 "} {
		if !strings.Contains(root, want) {
			t.Errorf("root status lacks %q:\n%s", want, root)
		}
	}
	if link, err := os.Readlink(m.path("t", "exe")); err != nil || link != bin {
		t.Errorf("exe -> %q, %v; want %s", link, err, bin)
	}
	if _, err := os.Open(m.path("t", "branches")); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("open branches: %v, want EOPNOTSUPP", err)
	}
	if st := m.read("t", "status"); !strings.Contains(st, "branches: unavailable: ") {
		t.Errorf("status does not say why branches are unavailable:\n%s", st)
	}
	m.setProbe("t", "e", "target %di %si")
	runProg(t, bin, "3")
	m.waitLines(3, "t", "records")
	if out, err := shell(": > " + m.path("t", "records")); err != nil {
		t.Fatalf(": > records: %v %s", err, out)
	}
	if s := m.read("t", "records"); s != "" {
		t.Fatalf("records after truncation: %q", s)
	}
	runProg(t, bin, "2")
	got := m.waitLines(2, "t", "records")
	if len(got) != 2 || !strings.HasPrefix(got[0], "record 4: ") {
		t.Fatalf("records after truncation and 2 hits: %q", got)
	}
	// ln -s adds a target, rm removes it.
	if err := os.Symlink(bin, m.path("u")); err != nil {
		t.Fatalf("ln -s: %v", err)
	}
	if fi, err := os.Stat(m.path("u", "records")); err != nil || fi.Size() != 0 {
		t.Fatalf("new target: %v", err)
	}
	if err := os.Symlink("/nonexistent/bin", m.path("v")); err == nil {
		t.Errorf("ln -s of a missing binary succeeded")
	}
}

// `ptfs check` on this machine, and --mode=ptw where ptw cannot run.
func TestCheckAndModes(t *testing.T) {
	needKernel(t)
	var out, errOut strings.Builder
	if code := run([]string{"check"}, &out, &errOut); code != 0 {
		t.Fatalf("check: exit %d: %s %s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"tracefs: yes", "uprobes: yes", "fuse: yes", "intel_pt: ", "ptwrite: ", "ptw uprobes: ", "mode: classic ("} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"mount", "--mode=ptw", t.TempDir()}, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "ptw mode") {
		t.Errorf("mount --mode=ptw: exit %d, %q", code, errOut.String())
	}
	if code := run([]string{"mount", "--mode=fast", t.TempDir()}, &out, &errOut); code != 2 {
		t.Errorf("mount --mode=fast: exit %d", code)
	}
}

// TestMountCPUProfile: --cpuprofile writes a pprof profile (gzip) of the
// mount once it ends, and refuses a file that exists (the mount runs as
// root; the path is the user's).
func TestMountCPUProfile(t *testing.T) {
	needKernel(t)
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	m := startMount(t, "--cpuprofile="+path)
	if err := m.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("mount: %v\n%s", err, m.log)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < 2 || data[0] != 0x1f || data[1] != 0x8b {
		t.Errorf("profile is not gzip: % x", data[:min(len(data), 8)])
	}
	var stdout, stderr strings.Builder
	if code := runMount([]string{"--cpuprofile=" + path, t.TempDir()}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "--cpuprofile") {
		t.Errorf("existing profile file: exit %d, stderr %q", code, stderr.String())
	}
}
