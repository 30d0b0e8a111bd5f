package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"ptfs/internal/testkit"
)

// manyFuncs writes and builds a C program with n functions f0..f(n-1),
// each a distinct probe site, and returns the binary.
func manyFuncs(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "__attribute__((noinline, noipa)) unsigned long f%d(unsigned long a) { asm volatile(\"\" ::: \"memory\"); return a + %d; }\n", i, i)
	}
	b.WriteString("int main(int argc, char **argv) { unsigned long acc = 0;\n")
	for i := range n {
		fmt.Fprintf(&b, "acc += f%d(argc);\n", i)
	}
	b.WriteString("return (int)(acc & 1); }\n")
	src := filepath.Join(t.TempDir(), "many.c")
	if err := os.WriteFile(src, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return testkit.BuildC(t, src)
}

// Unmounting removes every probe of the mount. The kernel makes this slow
// and nothing in ptfs can overlap it: closing the last perf event of a
// uprobe event unregisters the uprobe and waits for about five RCU grace
// periods (~80 ms measured here) while holding the kernel-wide
// event_mutex, so removals are serial whoever asks for them. The cleanup's
// wall time is thus the machine's (other tenants' removals queue on that
// mutex, the load delays the process), not ptfs's, and is not bounded.
// What ptfs controls is: umount itself answers at once (well before the
// cleanup ends), the cleanup keeps going (a line goes within kernelWait of
// the one before), none is left, and ptfs's own work a probe (the CPU time
// of the mount process, beyond that of a mount without probes) does not
// grow with the number of probes: measured for 50 and 200 in the same run,
// a cleanup that is quadratic in them spends four times as much a probe
// on the second.
func TestUnmountManyProbes(t *testing.T) {
	needKernel(t)
	const small, large = 50, 200
	bin := manyFuncs(t, large)
	base := unmountCPU(t, bin, 0)
	perSmall := (unmountCPU(t, bin, small) - base) / small
	perLarge := (unmountCPU(t, bin, large) - base) / large
	t.Logf("CPU time of the mount's cleanup a probe: %v with %d probes, %v with %d (%v without probes)", perSmall, small, perLarge, large, base)
	// Twice as much a probe allows for the kernel's own growth and the
	// noise of a loaded machine (1.1-1.2 times idle, 0.9-1.4 beside two
	// busy loops); a cleanup quadratic in the probes shows up to four
	// times, and fails here once its quadratic part at 200 probes is about
	// twice the rest (40 us more CPU a removal for each probe still there:
	// 2.1 times).
	if perLarge > 2*max(perSmall, 50*time.Microsecond) {
		t.Errorf("the cleanup cost %v of CPU a probe with %d probes, %v with %d: it grows with the number of probes", perLarge, large, perSmall, small)
	}
}

// unmountCPU mounts bin with n probes (f0..f(n-1)), unmounts it and returns
// the CPU time the mount process used from umount until it exited. It
// fails the test if umount(8) waits for the cleanup, if the cleanup stops
// making progress or if a line of the mount is left.
func unmountCPU(t *testing.T, bin string, n int) time.Duration {
	t.Helper()
	m := startMount(t, "t="+bin)
	start := time.Now()
	if n > 0 {
		script := fmt.Sprintf("for i in $(seq 0 %d); do echo \"f$i %%di\" > %s/p$i || exit 1; done", n-1, m.path("t", "probes"))
		if out, err := shell(script); err != nil {
			t.Fatalf("installing %d probes: %v\n%s\n%s", n, err, out, m.log)
		}
	}
	t.Logf("%d probes installed in %v", n, time.Since(start))
	if got := len(uprobeLines(t, m.group()+"t/")); got != n {
		t.Fatalf("%d lines of the mount in uprobe_events, want %d", got, n)
	}
	cpu0 := taskCPU(t, m.cmd.Process.Pid)
	start = time.Now()
	if out, err := exec.Command("umount", m.dir).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v\n%s", err, out)
	}
	umount := time.Since(start)
	// The cleanup must keep removing: kernelWait without a line gone is a
	// hang, however long the whole takes on a loaded machine.
	left, moved := n, time.Now()
	for done := false; !done; {
		select {
		case err := <-m.done:
			m.done <- err
			if err != nil {
				t.Fatalf("ptfs mount: %v\n%s", err, m.log)
			}
			done = true
		case <-time.After(250 * time.Millisecond):
			if now := len(uprobeLines(t, m.group())); now < left {
				left, moved = now, time.Now()
			} else if time.Since(moved) > kernelWait {
				t.Fatalf("ptfs mount removed no probe in %v, %d of %d left\n%s", kernelWait, left, n, m.log)
			}
		}
	}
	took := time.Since(start)
	ru := m.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano() - cpu0)
	t.Logf("umount with %d probes: umount(8) returned in %v, ptfs exited after %v, using %v of CPU", n, umount, took, cpu)
	if left := uprobeLines(t, m.group()); len(left) > 0 {
		t.Fatalf("%d probes of the mount left in uprobe_events", len(left))
	}
	// umount(8) waiting for the cleanup would take as long as it.
	if n > 0 && umount > took/2 {
		t.Errorf("umount(8) took %v of the %v until ptfs exited: it waited for the cleanup", umount, took)
	}
	return cpu
}

// A refused `ln -s` says why in the root status and in the log at the
// default level, beyond the errno that ln prints.
func TestRefusedTargetSaysWhy(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t")
	elf, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	elf[18], elf[19] = 183, 0                     // e_machine = EM_AARCH64
	arm := filepath.Join(t.TempDir(), "arm\nbin") // a hostile name stays on one line
	if err := os.WriteFile(arm, elf, 0o755); err != nil {
		t.Fatal(err)
	}
	m := startMount(t)
	if err := os.Symlink(arm, m.path("arm")); !errors.Is(err, syscall.ENOEXEC) {
		t.Fatalf("ln -s of an AArch64 binary: %v, want ENOEXEC", err)
	}
	st := m.read("status")
	want := fmt.Sprintf("refused target: \"arm\" -> %q: target arm: ", arm)
	var line string
	for _, l := range lines(st) {
		if strings.HasPrefix(l, "refused target: ") {
			line = l
		}
	}
	if !strings.HasPrefix(line, want) || !strings.Contains(line, "EM_AARCH64, not x86-64") {
		t.Errorf("status line %q, want %q... naming EM_AARCH64\n%s", line, want, st)
	}
	// The log comes through a pipe: it may lag the refusal.
	warned := func(l string) bool {
		return strings.Contains(l, "level=warning") && strings.Contains(l, "target refused") && strings.Contains(l, "EM_AARCH64")
	}
	for deadline := time.Now().Add(10 * time.Second); !slices.ContainsFunc(lines(m.log.String()), warned); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no warning with the reason in the log:\n%s", m.log)
		}
	}
}

// A new mount detaches the dead mounts of killed ptfs processes wherever
// they are, and leaves live mounts of other ptfs processes alone.
func TestNewMountDetachesDeadMounts(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t")
	dead := filepath.Join(t.TempDir(), "dead dir") // escaped as \040 in mountinfo
	if err := os.Mkdir(dead, 0o755); err != nil {
		t.Fatal(err)
	}
	live := startMount(t, "t="+bin)
	killed := startMountAt(t, dead, "t="+bin)
	killed.cmd.Process.Kill()
	err := <-killed.done
	killed.done <- err // for its cleanup, which then only detaches
	var st syscall.Statfs_t
	if err := syscall.Statfs(dead, &st); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("statfs of the killed mount: %v, want ENOTCONN", err)
	}
	fresh := startMount(t, "t="+bin)
	if mounted(t, dead) {
		t.Errorf("%s is still mounted after a new mount elsewhere\n%s", dead, fresh.log)
	}
	if !strings.Contains(fresh.log.String(), "detached the dead mount") {
		t.Errorf("the new mount did not say it detached a dead mount:\n%s", fresh.log)
	}
	if !mounted(t, live.dir) {
		t.Fatalf("the live mount %s is gone", live.dir)
	}
	live.read("t", "status") // and still serves
}

// mounted tells whether dir is a mount point in /proc/self/mountinfo.
func mounted(t *testing.T, dir string) bool {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(ptfsMounts(info), func(m ptfsMount) bool { return m.dir == dir })
}

func TestPtfsMounts(t *testing.T) {
	info := `22 1 0:21 / /proc rw,nosuid - proc proc rw
47 27 0:40 / /tmp/a rw,nosuid,nodev,relatime - fuse.ptfs ptfs:4711 rw,user_id=0,group_id=0
48 27 0:41 / /tmp/dead\040dir\134x rw,relatime shared:7 master:2 - fuse.ptfs ptfs:99 rw
49 27 0:42 / /tmp/old rw - fuse.ptfs ptfs rw
50 27 0:43 / /tmp/other rw - fuse.sshfs ptfs:12 rw
51 27 0:44 / /tmp/bad rw - fuse.ptfs ptfs:-3 rw
52 27 0:45 / /tmp/short - fuse.ptfs
53 27 0:46 / /tmp/\777 rw - fuse.ptfs ptfs:x rw
`
	want := []ptfsMount{{"/tmp/a", 4711, "0:40"}, {"/tmp/dead dir\\x", 99, "0:41"}, {"/tmp/old", 0, "0:42"}, {"/tmp/bad", 0, "0:44"}, {`/tmp/\777`, 0, "0:46"}}
	if got := ptfsMounts([]byte(info)); !slices.Equal(got, want) {
		t.Errorf("ptfsMounts = %+v, want %+v", got, want)
	}
}

func FuzzPtfsMounts(f *testing.F) {
	f.Add([]byte("48 27 0:41 / /tmp/d\\040x rw shared:7 - fuse.ptfs ptfs:99 rw\n"))
	f.Fuzz(func(t *testing.T, info []byte) {
		for _, m := range ptfsMounts(info) {
			if m.pid < 0 {
				t.Errorf("negative pid %d", m.pid)
			}
		}
	})
}

// Overwriting a probe at its own site while the program hits it records
// every hit exactly once: the old and the new event both record the hits
// of the moment they overlap, and one copy is dropped. A run proves
// nothing when the kernel lost samples (a loaded machine keeps the reader
// off the CPU) or when no hit fell in an overlap: it is run again, at half
// the rate after a loss, up to three times.
func TestOverwriteRecordsOnce(t *testing.T) {
	needKernel(t)
	rate := 50000 // hits/s, few enough that the kernel loses none
	if testkit.Race {
		rate = 5000 // the race detector slows the reader many times over
	}
	bin := buildC(t, "nop5", "t")
	var why []string
	for range 3 {
		lost, paired := overwriteRun(t, bin, rate)
		if t.Failed() || (!lost && paired) {
			return
		}
		if lost {
			why = append(why, fmt.Sprintf("the kernel lost samples at %d hits/s", rate))
			rate /= 2
		} else {
			why = append(why, "no hit was recorded by both events of a replacement")
		}
		t.Logf("run again: %s", why[len(why)-1])
	}
	t.Errorf("no run could show the overlap's hits recorded once: %q", why)
}

// overwriteRun overwrites a probe 60 times on a new mount while bin hits it
// rate times a second; it checks that each hit was recorded once and tells
// whether the kernel lost samples (nothing then to conclude) and whether
// a hit was recorded by both events of a replacement.
func overwriteRun(t *testing.T, bin string, rate int) (lost, paired bool) {
	const overwrites = 60
	m := startMount(t, "--max-stream=1000000000", "t="+bin)
	// Ended with the run: a run again would otherwise have this mount's
	// probe at the same site record every one of its hits too.
	defer m.stop(syscall.SIGTERM)
	specs := []string{"hot %di", "hot i=%di"}
	m.setProbe("t", "e", specs[0])
	// The program runs until the overwrites are done (SIGTERM), however
	// long a loaded machine takes for them, and says how many hits it made.
	prog := exec.Command(bin, fmt.Sprint(rate*600), fmt.Sprint(rate))
	var out strings.Builder
	prog.Stdout = &out
	if err := prog.Start(); err != nil {
		t.Fatal(err)
	}
	progDone := make(chan error, 1)
	go func() { progDone <- prog.Wait() }()
	t.Cleanup(func() {
		prog.Process.Kill()
		<-progDone
	})
	start := time.Now()
	for i := 1; i <= overwrites; i++ {
		select {
		case err := <-progDone:
			progDone <- err
			t.Fatalf("%s ended before the overwrites: %v", bin, err)
		default:
		}
		m.setProbe("t", "e", specs[i%2])
	}
	prog.Process.Signal(syscall.SIGTERM)
	if err := <-progDone; err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	progDone <- nil
	var acc uint64
	var n int
	if _, err := fmt.Sscanf(out.String(), "acc=%d calls=%d", &acc, &n); err != nil || n == 0 {
		t.Fatalf("%s said %q: %v", bin, out.String(), err)
	}
	t.Logf("%d overwrites in %v while %d hits at %d a second", overwrites, time.Since(start), n, rate)
	recs := m.waitLines(n, "t", "records")
	st := m.read("status")
	if statusValue(st, "lost") != "0 (samples dropped by full kernel rings, all targets)" {
		t.Logf("the kernel lost samples: nothing to conclude\n%s", st)
		return true, false
	}
	seen := make([]int, n)
	first := make([]string, n)
	dups, other := 0, 0
	for _, l := range recs {
		mm := recordRE.FindStringSubmatch(l)
		if mm == nil {
			t.Fatalf("not a record line: %q", l)
		}
		var i int
		if _, err := fmt.Sscanf(strings.TrimPrefix(mm[3], "i="), "%d", &i); err != nil || i < 0 || i >= n {
			other++
			continue
		}
		if seen[i]++; seen[i] == 2 {
			dups++
			if dups <= 3 {
				t.Logf("recorded twice: %q and %q", first[i], l)
			}
		}
		first[i] = l
	}
	missing := 0
	for i, c := range seen {
		if c != 0 {
			continue
		}
		// Which event recorded its neighbours, and when, tells the
		// moment of the replacement it fell in.
		if missing++; missing <= 3 {
			for j := max(0, i-2); j < min(n, i+3); j++ {
				t.Logf("hit %d missing: hit %d recorded as %q", i, j, first[j])
			}
		}
	}
	t.Logf("%d records: %d hits recorded twice, %d missing, %d others", len(recs), dups, missing, other)
	if dups != 0 || missing != 0 || other != 0 {
		t.Errorf("%d hits recorded twice, %d not recorded, %d bad records\n%s", dups, missing, other, st)
	}
	// The hits that both events recorded: without any, the run proved
	// nothing.
	pairs := statusValue(st, "replacement duplicates")
	t.Logf("replacement duplicates: %s", pairs)
	return false, pairs != "" && !strings.HasPrefix(pairs, "0 ")
}
