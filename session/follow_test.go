package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"ptfs/internal/testkit"
	"ptfs/objfile"
	"ptfs/tracefs"
	"ptfs/tracefs/tracefstest"
)

// buildMoved builds testdata/moved.c with flags.
func buildMoved(t *testing.T, flags ...string) string {
	t.Helper()
	return testkit.BuildC(t, filepath.Join("..", "testdata", "moved.c"), flags...)
}

// copyFile copies src to dst: over dst's inode when dst exists (a rewrite
// in place, as cp does), else as a new file.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// waitFor waits (at most 5 s) until cond holds (testkit.WaitFor).
func waitFor(t *testing.T, what string, cond func() (string, bool)) {
	t.Helper()
	testkit.WaitFor(t, 5*time.Second, what, cond)
}

// fileLine is the probe file's line naming the file at path.
func fileLine(t *testing.T, path string) string {
	t.Helper()
	id, err := objfile.StatID(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("# file: %s (%s)\n", path, id)
}

// A target follows its path, on the simulated ptwrite kernel: a rebuild
// renamed over it moves the probe to the function's new offset on the new
// inode (found by the watcher), a build without the symbol makes the probe
// stale with the reason and removes it, the symbol's return reinstalls it,
// a rewrite in place reinstalls it on the same inode, writing the same spec
// after a change installs it on the current file, and a path that goes
// leaves the probe where it is.
func TestFollowPath(t *testing.T) {
	s, _, _, _ := newPTWSession(t, tracefstest.Options{PTW: true})
	orig, padded, gone := buildMoved(t), buildMoved(t, "-DPAD"), buildMoved(t, "-DGONE")
	offOrig, offPad := testkit.FuncOffset(t, orig, "work"), testkit.FuncOffset(t, padded, "work")
	if offOrig == offPad {
		t.Fatalf("work is at 0x%x in both builds: the padding did not move it", offOrig)
	}
	path := filepath.Join(t.TempDir(), "m")
	copyFile(t, orig, path)
	tg, err := s.addTarget("m", path)
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.SetProbe("w", "work a=%di b=%si"); err != nil {
		t.Fatal(err)
	}
	lines := func() []string { return groupLines(t, s, tg.group) }
	// installedAt: the probe file shows the probe at off on the file that
	// path names now, and tracefs holds exactly its line.
	installedAt := func(off uint64) func() (string, bool) {
		return func() (string, bool) {
			text, _ := tg.ProbeText("w")
			l := lines()
			site := fmt.Sprintf("# site: work+0x0, file offset 0x%x,", off)
			ok := strings.Contains(string(text), "# state: installed") && strings.Contains(string(text), site) &&
				strings.Contains(string(text), fileLine(t, path)) &&
				len(l) == 1 && strings.Contains(l[0], fmt.Sprintf(":0x%x ", off)) && strings.Contains(string(text), "# tracefs: "+l[0]+"\n")
			return fmt.Sprintf("%s\nuprobe_events: %q", text, l), ok
		}
	}
	waitFor(t, "the probe on the first build", installedAt(offOrig))

	// A rebuild renamed over the path, as gcc -o or mv do.
	tmp := path + ".new"
	copyFile(t, padded, tmp)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the probe to follow the rename", installedAt(offPad))
	if syms, _ := tg.Symbols(); !strings.Contains(string(syms), " pad\n") {
		t.Errorf("symbols after the rename do not describe the new file:\n%s", syms)
	}

	// The symbol is gone: stale, with the reason, and out of tracefs.
	copyFile(t, gone, tmp)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the probe to go stale", func() (string, bool) {
		text, _ := tg.ProbeText("w")
		status := string(tg.Status())
		ok := strings.Contains(string(text), "work a=%di b=%si\n# state: stale: ") &&
			strings.Contains(string(text), `no function "work"`) &&
			strings.Contains(status, "probes: 0 active, 0 refused, 1 stale") && len(lines()) == 0
		return string(text) + status, ok
	})
	// Writing the spec again on a file without the symbol is refused and
	// installs nothing.
	if err := tg.SetProbe("w", "work a=%di b=%si"); err == nil || len(lines()) != 0 {
		t.Errorf("SetProbe on a file without the symbol: %v, tracefs %q", err, lines())
	}

	// The symbol comes back: the stale probe is installed again.
	copyFile(t, padded, tmp)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stale probe to come back", installedAt(offPad))
	if text, _ := tg.ProbeText("w"); strings.Contains(string(text), "# error") {
		t.Errorf("the refusal on the file without the symbol outlived it:\n%s", text)
	}

	// A rewrite in place (same inode) with other content.
	before, _ := objfile.StatID(path)
	copyFile(t, orig, path)
	if after, _ := objfile.StatID(path); !after.SameFile(before) {
		t.Fatal("the rewrite made a new inode")
	}
	waitFor(t, "the probe to follow the rewrite in place", installedAt(offOrig))

	// Writing the same spec right after a change installs it on the new
	// file, whether or not the watcher has seen the change yet.
	copyFile(t, padded, tmp)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if err := tg.SetProbe("w", "work a=%di b=%si"); err != nil {
		t.Fatal(err)
	}
	if text, ok := installedAt(offPad)(); !ok {
		t.Errorf("after writing the same spec on a new file:\n%s", text)
	}

	// The path goes: the probe stays on its file, status says why.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "status to say the path is gone", func() (string, bool) {
		status := string(tg.Status())
		return status, strings.Contains(status, "path gone") && strings.Contains(status, "probes: 1 active") && len(lines()) == 1
	})
}

// A spec refused on a file without its site and installed when the path
// names one with it: no reader of the probe file ever sees the probe
// installed beside that refusal (the follow used to clear the error in a
// lock section of its own, after the install showed: under load,
// TestFollowPath read that moment once).
func TestFollowRefusalGoesAtOnce(t *testing.T) {
	s, _, _, _ := newPTWSession(t, tracefstest.Options{PTW: true})
	padded, gone := buildMoved(t, "-DPAD"), buildMoved(t, "-DGONE")
	path := filepath.Join(t.TempDir(), "m")
	copyFile(t, padded, path)
	tg, err := s.addTarget("m", path)
	if err != nil {
		t.Fatal(err)
	}
	const spec = "work a=%di b=%si"
	if err := tg.SetProbe("w", spec); err != nil {
		t.Fatal(err)
	}
	tmp := path + ".new"
	renameOver := func(src string) {
		copyFile(t, src, tmp)
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	text := func() string { b, _ := tg.ProbeText("w"); return string(b) }
	const rounds = 10
	var seen atomic.Int64
	for range rounds {
		renameOver(gone)
		waitFor(t, "the probe to go stale", func() (string, bool) {
			return text(), strings.Contains(text(), "# state: stale: ")
		})
		if err := tg.SetProbe("w", spec); err == nil {
			t.Fatal("SetProbe on a file without the symbol succeeded")
		}
		stop := testkit.Repeat(func() {
			if x := text(); strings.Contains(x, "# state: installed") && strings.Contains(x, "# error: ") {
				seen.Add(1)
			}
			runtime.Gosched()
		})
		renameOver(padded)
		waitFor(t, "the probe to come back without the refusal", func() (string, bool) {
			x := text()
			return x, strings.Contains(x, "# state: installed") && !strings.Contains(x, "# error")
		})
		stop()
	}
	if n := seen.Load(); n > 0 {
		t.Errorf("the probe file showed the probe installed beside the old refusal %d times in %d rounds", n, rounds)
	}
}

// answers fails the test unless f returns within 10 s: one stuck behind
// the stalled install waits until the test releases it, and a loaded
// machine (the race detector) may take a second or more to answer.
func answers(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		f()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s waits behind the stalled install", what)
	}
}

// Lookups, probe files and status answer while an install is stalled in
// the kernel: only probe changes wait for it.
func TestReadersDuringStalledInstall(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	s, tg, _, _ := newPTWSession(t, tracefstest.Options{PTW: true, Refuse: func(line string) (syscall.Errno, string) {
		if strings.Contains(line, "/slow ") {
			entered <- struct{}{}
			<-release
		}
		return 0, ""
	}})
	// Runs before the session's Close, which waits for the install.
	t.Cleanup(free)
	if err := tg.SetProbe("a", "target %di"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tg.SetProbe("slow", "other %di") }()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the install never reached the kernel")
	}
	answers(t, "Probes", func() {
		if got := tg.Probes(); strings.Join(got, ",") != "a,slow" {
			t.Errorf("Probes = %q", got)
		}
	})
	answers(t, "ProbeText", func() {
		if text, _ := tg.ProbeText("a"); !strings.Contains(string(text), "# state: installed") {
			t.Errorf("probe a:\n%s", text)
		}
		if text, _ := tg.ProbeText("slow"); !strings.Contains(string(text), "# state: empty") {
			t.Errorf("probe slow while installing:\n%s", text)
		}
	})
	answers(t, "Status", func() {
		if st := string(tg.Status()); !strings.Contains(st, "probes: 1 active") {
			t.Errorf("status:\n%s", st)
		}
	})
	answers(t, "Symbols", func() { tg.Symbols() })
	answers(t, "the session's Status and Targets", func() { s.Status(); s.Targets() })
	answers(t, "CreateProbe", func() {
		if err := tg.CreateProbe("c"); err != nil {
			t.Error(err)
		}
	})
	free()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if text, _ := tg.ProbeText("slow"); !strings.Contains(string(text), "# state: installed") {
		t.Errorf("probe slow after the install:\n%s", text)
	}
}

// Close stops the watcher's goroutines, a scheduled follow included.
func TestWatcherStops(t *testing.T) {
	before := runtime.NumGoroutine()
	tg := &Target{path: filepath.Join(t.TempDir(), "m")}
	// The follow waits an hour: it is still scheduled when Close runs,
	// however late the test looks (with the real settle, a test kept off
	// the CPU for 50 ms missed the schedule and ran a follow of a bare
	// Target).
	w, err := newWatcher(func() []*Target { return []*Target{tg} }, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.watch(tg.path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tg.path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the write to schedule a follow", func() (string, bool) { return "", tg.pending.Load() })
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the goroutines to end", func() (string, bool) {
		n := runtime.NumGoroutine()
		return fmt.Sprintf("%d goroutines, %d before", n, before), n <= before
	})
}

// Hostile target and probe names: control characters are refused with
// EINVAL and the reason; anything else is accepted and reaches tracefs
// only as a sanitised C identifier, in exactly one line.
func TestHostileNames(t *testing.T) {
	s, _, k, _ := newPTWSession(t, tracefstest.Options{PTW: true})
	bin := testkit.BuildC(t, filepath.Join("..", "testdata", "target.c"))
	for _, name := range []string{"a\nb", "a\rb", "a\x00b", "\x7f", "a\tb"} {
		if _, err := s.AddTarget(name, bin); !errors.Is(err, ErrBadName) || !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "control characters") {
			t.Errorf("AddTarget(%q): %v, want ErrBadName for control characters", name, err)
		}
		if err := s.targets["t"].SetProbe(name, "target %di"); !errors.Is(err, ErrBadName) {
			t.Errorf("SetProbe(%q): %v, want ErrBadName", name, err)
		}
	}
	for i, name := range []string{"a b", "x:0x10", "p%return", "#c", "a>b", "p:evil=e", strings.Repeat("n", 255)} {
		// A file of its own: a ptwrite kernel takes one probe a site.
		own := filepath.Join(t.TempDir(), "t")
		copyFile(t, bin, own)
		tg, err := s.addTarget(name, own)
		if err != nil {
			t.Errorf("AddTarget(%q): %v", name, err)
			continue
		}
		before, _ := k.Tracefs.Events()
		if err := tg.SetProbe(name, "target %di"); err != nil {
			t.Errorf("SetProbe(%q): %v", name, err)
			continue
		}
		l := groupLines(t, s, tg.group)
		if after, _ := k.Tracefs.Events(); len(l) != 1 || len(after) != len(before)+1 {
			t.Errorf("target %d %q: tracefs gained %q", i, name, l)
			continue
		}
		if err := tracefs.CheckCommand(l[0]); err != nil {
			t.Errorf("target %d %q: listed line %q: %v", i, name, l[0], err)
		}
	}
}
