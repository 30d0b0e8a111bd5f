package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"ptfs/internal/testkit"
)

// The test binary doubles as ptfs: with PTFS_TEST_MAIN=1 it runs the command
// line instead of the tests, so end-to-end tests run the real program.
func TestMain(m *testing.M) {
	if os.Getenv("PTFS_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	if dir := os.Getenv("PTFS_TEST_PLANT_MOUNT"); dir != "" {
		os.Exit(plantMountMain(dir, os.Getenv("PTFS_TEST_PLANT_SOURCE")))
	}
	if dir := os.Getenv("PTFS_TEST_FLOOR"); dir != "" {
		os.Exit(floorMain(dir, os.Getenv("PTFS_TEST_FLOOR_LINES"), os.Getenv("PTFS_TEST_FLOOR_RATE")))
	}
	os.Exit(m.Run())
}

// needKernel skips unless the test can mount FUSE, install uprobes and
// build the traced programs.
func needKernel(t testing.TB) {
	t.Helper()
	needFUSE(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		testkit.Unavailable(t, "needs gcc to build the traced programs")
	}
}

// needFUSE skips unless the test can mount FUSE and install uprobes.
func needFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root for FUSE mounts and uprobes")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testkit.Unavailable(t, "needs /dev/fuse")
	}
}

// buildC compiles testdata/NAME.c with flags into a temp dir, named out.
func buildC(t testing.TB, name, out string, flags ...string) string {
	t.Helper()
	bin := testkit.BuildC(t, filepath.Join("..", "..", "testdata", name+".c"), flags...)
	named := filepath.Join(filepath.Dir(bin), out)
	if err := os.Rename(bin, named); err != nil {
		t.Fatal(err)
	}
	return named
}

// tracefsDir returns the tracefs mount point (ptfs mounts it if needed).
func tracefsDir(t testing.TB) string {
	for _, d := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		if _, err := os.Stat(filepath.Join(d, "uprobe_events")); err == nil {
			return d
		}
	}
	if err := unix.Mount("nodev", "/sys/kernel/tracing", "tracefs", 0, ""); err != nil {
		t.Fatalf("mount tracefs: %v", err)
	}
	return "/sys/kernel/tracing"
}

// uprobeLines returns the lines of uprobe_events that contain substr. The
// kernel hands the file out a page per read, each page from the line at
// its index, so a line that another process removes meanwhile moves the
// rest up and one read misses a line (or, with one added, shows one
// twice): as tracefs.AddProbe does, the file is read more than once, and
// the lines any read showed are returned once each, in order.
func uprobeLines(t testing.TB, substr string) []string {
	t.Helper()
	var out []string
	seen := map[string]bool{}
	for range 3 {
		data, err := os.ReadFile(filepath.Join(tracefsDir(t), "uprobe_events"))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(data), "\n") {
			if l != "" && strings.Contains(l, substr) && !seen[l] {
				seen[l] = true
				out = append(out, l)
			}
		}
	}
	return out
}

// lockedBuffer collects a child's output for failure messages.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// mountProc is a running `ptfs mount` (or the FUSE floor's server,
// startFloor).
type mountProc struct {
	t    testing.TB
	dir  string
	cmd  *exec.Cmd
	log  *lockedBuffer
	done chan error
}

// group is the tracefs group prefix of this mount's probes.
func (m *mountProc) group() string { return fmt.Sprintf("ptfs%d_", m.cmd.Process.Pid) }

// startMount runs `ptfs mount [FLAGS] DIR TARGETS...` (args starting with
// "-" are flags) and waits until it serves. The
// cleanup stops it (SIGTERM), detaches a leftover mount and fails the test
// if any probe of it stayed in uprobe_events.
func startMount(t testing.TB, args ...string) *mountProc {
	t.Helper()
	return startMountAt(t, t.TempDir(), args...)
}

// startMountAt is startMount on a given mount point.
func startMountAt(t testing.TB, dir string, args ...string) *mountProc {
	t.Helper()
	m := &mountProc{t: t, dir: dir, log: &lockedBuffer{}, done: make(chan error, 1)}
	// Flags go before the mount point, targets after it.
	cmdline := []string{"-v", "mount"}
	var targets []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			cmdline = append(cmdline, a)
		} else {
			targets = append(targets, a)
		}
	}
	m.cmd = exec.Command(os.Args[0], append(append(cmdline, dir), targets...)...)
	m.cmd.Env = append(os.Environ(), "PTFS_TEST_MAIN=1")
	// Up means serving and past go-fuse's start-up (its poll hack opens a
	// file on the mount from the server's own process): a SIGKILL during
	// that open would leave the process unable to exit, waiting on its own
	// mount. "ptfs: mounted" is logged after it. The session's start
	// removes what a dead ptfs of its PID left in uprobe_events: kernel
	// waits.
	m.serve("ptfs mount", func() bool {
		_, err := os.Stat(filepath.Join(dir, "status"))
		return err == nil && strings.Contains(m.log.String(), "ptfs: mounted")
	}, func() {
		if left := uprobeLines(t, m.group()); len(left) > 0 {
			t.Errorf("probes left in uprobe_events after the mount ended: %q", left)
			for _, l := range left {
				removeLine(t, l)
			}
		}
	})
	return m
}

// serve starts m.cmd, a server called what, with its output into m.log,
// and waits up to kernelWait until up reports it serving. The cleanup
// stops it (SIGTERM), detaches a leftover mount, then calls after if it
// is not nil.
func (m *mountProc) serve(what string, up func() bool, after func()) {
	t := m.t
	t.Helper()
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	go func() { m.done <- m.cmd.Wait() }()
	t.Cleanup(func() {
		m.stop(syscall.SIGTERM)
		if after != nil {
			after()
		}
	})
	deadline := time.Now().Add(kernelWait)
	for !up() {
		select {
		case err := <-m.done:
			m.done <- err
			t.Fatalf("%s exited: %v\n%s", what, err, m.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not come up\n%s", what, m.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop signals the mount and waits for it; it detaches the mount point if
// the process could not (SIGKILL).
func (m *mountProc) stop(sig syscall.Signal) error {
	var err error
	if m.cmd.ProcessState == nil {
		m.cmd.Process.Signal(sig)
		select {
		case err = <-m.done:
			m.done <- err
		case <-time.After(kernelWait): // exiting removes the mount's probes
			m.cmd.Process.Kill()
			err = <-m.done
			m.done <- err
			m.t.Errorf("ptfs mount did not exit on %v\n%s", sig, m.log)
		}
	}
	unix.Unmount(m.dir, unix.MNT_DETACH)
	return err
}

// removeLine removes the probe of an uprobe_events line.
func removeLine(t testing.TB, line string) {
	name := strings.Fields(line)[0]
	name = name[strings.IndexByte(name, ':')+1:]
	f, err := os.OpenFile(filepath.Join(tracefsDir(t), "uprobe_events"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString("-:" + name + "\n"); err != nil {
		t.Errorf("remove %s: %v", name, err)
	}
}

// path joins parts below the mount point.
func (m *mountProc) path(parts ...string) string {
	return filepath.Join(append([]string{m.dir}, parts...)...)
}

// read returns a file of the mount.
func (m *mountProc) read(parts ...string) string {
	m.t.Helper()
	b, err := os.ReadFile(m.path(parts...))
	if err != nil {
		m.t.Fatalf("read %s: %v\n%s", filepath.Join(parts...), err, m.log)
	}
	return string(b)
}

// shell runs a bash command line, as a user would.
func shell(cmdline string) (string, error) {
	out, err := exec.Command("bash", "-c", cmdline).CombinedOutput()
	return string(out), err
}

// setProbe writes spec to probes/NAME of target with bash's echo.
func (m *mountProc) setProbe(target, name, spec string) {
	m.t.Helper()
	if out, err := shell(fmt.Sprintf("echo %s > %s", shellQuote(spec), m.path(target, "probes", name))); err != nil {
		m.t.Fatalf("echo %q > probes/%s: %v: %s\nprobe file: %s\n%s", spec, name, err, out, m.probeText(target, name), m.log)
	}
}

func (m *mountProc) probeText(target, name string) string {
	b, _ := os.ReadFile(m.path(target, "probes", name))
	return string(b)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// run runs a traced program to completion.
func runProg(t testing.TB, bin string, args ...string) {
	t.Helper()
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
}

// waitLines waits until the file has at least n lines and returns them.
func (m *mountProc) waitLines(n int, parts ...string) []string {
	m.t.Helper()
	// The deadline moves while lines keep coming: a loaded machine (the
	// race detector, other work) delivers late, which is not a loss.
	deadline, seen := time.Now().Add(10*time.Second), -1
	for {
		lines := lines(m.read(parts...))
		if len(lines) > seen {
			deadline, seen = time.Now().Add(10*time.Second), len(lines)
		}
		if len(lines) >= n || time.Now().After(deadline) {
			return lines
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kernelWait bounds a wait for probe installs and removals. Each takes the
// kernel's event_mutex, which another process's uprobe removal holds
// through RCU grace periods (the tests of other packages, other users of
// tracefs): seconds each on a loaded machine are normal, half a minute is
// a hang.
const kernelWait = 30 * time.Second

// waitUntil waits (at most kernelWait) until cond holds; a failure shows
// the mount's log too.
func (m *mountProc) waitUntil(what string, cond func() (string, bool)) {
	m.t.Helper()
	held := false
	defer func() {
		if !held { // Fatalf ends the goroutine through here
			m.t.Logf("the mount's log:\n%s", m.log)
		}
	}()
	testkit.WaitFor(m.t, kernelWait, what, cond)
	held = true
}

// waitStatus waits until the status file of target (the root's for "")
// contains want, and returns it.
func (m *mountProc) waitStatus(target, want string) string {
	m.t.Helper()
	var st string
	m.waitUntil(fmt.Sprintf("status of %q to say %q", target, want), func() (string, bool) {
		st = m.read(target, "status")
		return st, strings.Contains(st, want)
	})
	return st
}

func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// statusValue returns the value of key in a status file.
func statusValue(status, key string) string {
	for _, l := range lines(status) {
		if v, ok := strings.CutPrefix(l, key+": "); ok {
			return v
		}
	}
	return ""
}
