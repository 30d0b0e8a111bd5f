package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// Unmounting removes every probe of the mount: 200 of them here. The
// kernel makes this slow and nothing in ptfs can overlap it: closing the
// last perf event of a uprobe event unregisters the uprobe and waits for
// about five RCU grace periods (~80 ms measured here) while holding the
// kernel-wide event_mutex, so removals are serial whoever asks for them.
// The test bounds the cleanup by that cost with a margin, and checks that
// umount itself answers at once and that no line of the mount is left.
func TestUnmountManyProbes(t *testing.T) {
	needKernel(t)
	const n = 200
	bin := manyFuncs(t, n)
	m := startMount(t, "t="+bin)
	start := time.Now()
	script := fmt.Sprintf("for i in $(seq 0 %d); do echo \"f$i %%di\" > %s/p$i || exit 1; done", n-1, m.path("t", "probes"))
	if out, err := shell(script); err != nil {
		t.Fatalf("installing %d probes: %v\n%s\n%s", n, err, out, m.log)
	}
	t.Logf("%d probes installed in %v", n, time.Since(start))
	if got := len(uprobeLines(t, m.group()+"t/")); got != n {
		t.Fatalf("%d lines of the mount in uprobe_events, want %d", got, n)
	}
	start = time.Now()
	if out, err := exec.Command("umount", m.dir).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v\n%s", err, out)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("umount(8) took %v", took)
	}
	select {
	case err := <-m.done:
		m.done <- err
		if err != nil {
			t.Fatalf("ptfs mount: %v\n%s", err, m.log)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("ptfs mount did not exit within 60 s of umount\n%s", m.log)
	}
	took := time.Since(start)
	t.Logf("umount with %d probes: %v until ptfs exited", n, took)
	if left := uprobeLines(t, m.group()); len(left) > 0 {
		t.Fatalf("%d probes of the mount left in uprobe_events", len(left))
	}
	// Measured here: ~80 ms a probe, 16-17 s for 200.
	if limit := n * 250 * time.Millisecond; took > limit {
		t.Errorf("cleanup after umount with %d probes took %v, want under %v", n, took, limit)
	}
}
