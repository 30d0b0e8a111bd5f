package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// On this machine (no Intel PT, stock kernel) `ptfs mount --mode=ptw` fails
// at mount with what is missing, and leaves no mount and no probe behind.
func TestMountPTWUnavailable(t *testing.T) {
	needKernel(t)
	if _, err := os.Stat("/sys/bus/event_source/devices/intel_pt"); err == nil {
		t.Skip("this machine has Intel PT: the test is about one without")
	}
	bin := buildC(t, "target", "t")
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "mount", "--mode=ptw", dir, bin)
	cmd.Env = append(os.Environ(), "PTFS_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("mount --mode=ptw: %v, want exit 1\n%s", err, out)
	}
	for _, want := range []string{"ptw mode unavailable", "no Intel PT"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("mount --mode=ptw said %q, want it to contain %q", out, want)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), " "+dir+" ") {
		t.Errorf("%s is mounted after the failed mount", dir)
	}
	if lines := uprobeLines(t, "ptfs"+strconv.Itoa(cmd.Process.Pid)+"_"); len(lines) != 0 {
		t.Errorf("probes left behind: %q", lines)
	}
}
