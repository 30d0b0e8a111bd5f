package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestCheckModes runs `ptfs check` with each --mode on this machine (a
// stock kernel without Intel PT): classic runs, ptw cannot and says why,
// and the ptw trial leaves no probe behind.
func TestCheckModes(t *testing.T) {
	needKernel(t)
	if _, err := os.Stat("/sys/bus/event_source/devices/intel_pt"); err == nil {
		t.Skip("this machine has Intel PT: the test is about one without")
	}
	cases := []struct {
		mode string
		code int
		want []string
	}{
		{"auto", 0, []string{"ptw uprobes: no (the kernel turned a trial ptw: line into classic probe", "\nptw time: ", "mode: classic (ptw unavailable: no Intel PT: "}},
		{"classic", 0, []string{"mode: classic (", "--mode=classic: classic (forced by --mode=classic)"}},
		{"ptw", 1, []string{"mode: classic (", "--mode=ptw: cannot run (ptw mode unavailable: no Intel PT: ", "no ptwrite uprobes)"}},
	}
	for _, c := range cases {
		var out, errOut strings.Builder
		if code := run([]string{"check", "--mode=" + c.mode}, &out, &errOut); code != c.code {
			t.Errorf("check --mode=%s: exit %d, want %d: %s %s", c.mode, code, c.code, out.String(), errOut.String())
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("check --mode=%s lacks %q:\n%s", c.mode, w, out.String())
			}
		}
	}
	data, err := os.ReadFile("/sys/kernel/tracing/uprobe_events")
	if err != nil {
		t.Fatal(err)
	}
	if p := "ptfs" + strconv.Itoa(os.Getpid()) + "_"; strings.Contains(string(data), p) {
		t.Errorf("check left probes of %s:\n%s", p, data)
	}
}
