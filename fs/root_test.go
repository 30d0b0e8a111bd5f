package fs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// answers runs a command line that must finish within a deadline: a
// regression that holds the root lock across a tracer call makes it hang
// until the stall ends, and the deadline turns that into a failure. The
// stall lasts until the test ends, so the deadline can leave a loaded
// machine its seconds to start bash.
func answers(t *testing.T, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.WaitDelay = time.Second // a child stuck in the mount keeps the pipe open
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%q did not answer while a tracer call was stalled", script)
	}
	if err != nil {
		t.Fatalf("%q: %v\n%s", script, err, out)
	}
	return string(out)
}

// entry waits for a stalled tracer call of name.
func entry(t *testing.T, entered <-chan string, name string) {
	t.Helper()
	select {
	case got := <-entered:
		if got != name {
			t.Fatalf("stalled call for %q, want %q", got, name)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no tracer call for %q", name)
	}
}

// The root lock is not held across AddTarget and RemoveTarget (they open
// ELF files and remove probes): while one is stalled, lookups, stat and
// reads of the mount answer. The kernel itself holds the root directory's
// lock during symlink and rmdir (and so serializes two `ln -s` of one
// name), so a name it has not cached yet and `ls MNT` wait for that
// regardless of the server: the names are looked up before the stall.
func TestRootAnswersDuringSlowCalls(t *testing.T) {
	tr := newFakeTracer(newFakeTarget("t", "/usr/bin/true"))
	mnt := mountFake(t, tr)
	answers(t, "cat "+mnt+"/status && stat "+mnt+"/t")
	entered, release := tr.stallCalls()
	t.Cleanup(release) // before the unmount: a stalled request blocks it

	linked := make(chan error, 1)
	go func() { linked <- os.Symlink("/usr/bin/false", filepath.Join(mnt, "u")) }()
	entry(t, entered, "u")
	answers(t, "cat "+mnt+"/status && stat "+mnt+"/t && ls "+mnt+"/t && cat "+mnt+"/t/status")
	release()
	if err := <-linked; err != nil {
		t.Fatalf("ln -s: %v", err)
	}
	if err := os.Symlink("/usr/bin/env", filepath.Join(mnt, "u")); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("second ln -s of a name: %v, want EEXIST", err)
	}
	if got, want := names(t, mnt), []string{"status", "t", "u"}; !slices.Equal(got, want) {
		t.Fatalf("root lists %v, want %v", got, want)
	}

	entered, release = tr.stallCalls()
	t.Cleanup(release)
	removed := make(chan error, 1)
	go func() { removed <- syscall.Rmdir(filepath.Join(mnt, "u")) }()
	entry(t, entered, "u")
	answers(t, "cat "+mnt+"/status && stat "+mnt+"/u && cat "+mnt+"/t/status")
	release()
	if err := <-removed; err != nil {
		t.Fatalf("rmdir: %v", err)
	}
	if got, want := names(t, mnt), []string{"status", "t"}; !slices.Equal(got, want) {
		t.Fatalf("root lists %v after rmdir, want %v", got, want)
	}
	added, gone := tr.calls()
	if !slices.Equal(added, []string{"u=/usr/bin/false"}) || !slices.Equal(gone, []string{"u"}) {
		t.Errorf("tracer calls: added %q, removed %q", added, gone)
	}
}
