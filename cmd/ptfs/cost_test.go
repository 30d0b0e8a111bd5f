package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"ptfs/probes"
)

// costSites are testdata/cost.c's sites with the class the kernel's rules
// give them (probes.CostClass).
var costSites = []struct {
	sym   string
	class probes.CostClass
}{
	{"site_nop5", probes.Optimized},
	{"site_nopw5", probes.Optimized},
	{"site_nop1", probes.Emulated},
	{"site_push", probes.Emulated},
	{"site_mov", probes.SingleStepped},
	{"site_endbr", probes.SingleStepped},
}

// steppedOver is the CPU a hit costs the program above which the kernel
// single-stepped the instruction: two traps, 5-6 µs of the program's CPU
// here with the ftrace event written, against 1.0-1.5 µs for one trap or
// none (BenchmarkProbeCost).
const steppedOver = 3 * time.Microsecond

// TestProbeCostKernel checks the classic cost class of each site of
// testdata/cost.c against the kernel: a real probe on each, the traced
// program timed with and without it. Optimized: the kernel mapped its
// trampoline page into the program; single-stepped: a hit costs more
// than 3 µs of its CPU; emulated: neither.
func TestProbeCostKernel(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "cost", "cost", "-O2", "-no-pie")
	costs := measureCosts(t, bin, 100000)
	for _, s := range costSites {
		c := costs[s.sym]
		t.Logf("%s (%s): %v a hit, trampoline %v; ptfs says %s", s.sym, c.site.Insn, c.perHit, c.tramp, c.site.Cost.Class)
		if c.site.Cost.Class != s.class {
			t.Errorf("%s: class %s, want %s", s.sym, c.site.Cost.Class, s.class)
		}
		var kernel probes.CostClass
		switch {
		case c.tramp:
			kernel = probes.Optimized
		case c.perHit > steppedOver:
			kernel = probes.SingleStepped
		default:
			kernel = probes.Emulated
		}
		if kernel != c.site.Cost.Class {
			t.Errorf("%s (%s): the kernel ran it %s (%v a hit, trampoline %v), ptfs says %s",
				s.sym, c.site.Insn, kernel, c.perHit, c.tramp, c.site.Cost.Class)
		}
	}
	if got, want := costs["site_endbr"].site.Cost.Cheaper, "site_endbr+0x4 (push %rbp, "+probes.Emulated.String()+")"; got != want {
		t.Errorf("site_endbr: cheaper site %q, want %q", got, want)
	}
	if got := costs["site_mov"].site.Cost.Cheaper; got != "" {
		t.Errorf("site_mov: cheaper site %q, want none", got)
	}
}

// BenchmarkProbeCost measures what a classic uprobe hit costs the traced
// program on each class of site, b.N hits each (testdata/cost.c, time
// with the probe less time without).
func BenchmarkProbeCost(b *testing.B) {
	needKernel(b)
	bin := buildC(b, "cost", "cost", "-O2", "-no-pie")
	b.ResetTimer()
	costs := measureCosts(b, bin, b.N)
	b.StopTimer()
	for _, s := range []string{"site_nop5", "site_push", "site_mov"} {
		b.ReportMetric(float64(costs[s].perHit.Nanoseconds()), strings.TrimPrefix(s, "site_")+"-ns/hit")
	}
}

type siteCost struct {
	site   *probes.Site
	perHit time.Duration
	tramp  bool
}

// measureCosts resolves each cost site of bin, times n calls of it without
// a probe, then with a classic probe of its own tracefs group installed and
// enabled (removed again in Cleanup, also on failure).
func measureCosts(tb testing.TB, bin string, n int) map[string]siteCost {
	tb.Helper()
	b, err := probes.Open(bin)
	if err != nil {
		tb.Fatal(err)
	}
	defer b.Close()
	tfs := tracefsDir(tb)
	group := fmt.Sprintf("ptfscost%d", os.Getpid())
	out := map[string]siteCost{}
	for _, s := range costSites {
		site, err := b.Resolve(&probes.Spec{Symbol: s.sym})
		if err != nil {
			tb.Fatal(err)
		}
		base, _ := timeCost(tb, bin, s.sym, n)
		line := fmt.Sprintf("p:%s/%s %s:0x%x %%di", group, s.sym, bin, site.Offset)
		if out, err := shell(fmt.Sprintf("echo %s >> %s/uprobe_events", shellQuote(line), tfs)); err != nil {
			tb.Fatalf("%s: %v %s", line, err, out)
		}
		enable := filepath.Join(tfs, "events", group, s.sym, "enable")
		tb.Cleanup(func() {
			// Disabled first: an enabled event cannot be removed.
			os.WriteFile(enable, []byte("0"), 0)
			removeLine(tb, line)
		})
		if err := os.WriteFile(enable, []byte("1"), 0); err != nil {
			tb.Fatalf("enable %s: %v", s.sym, err)
		}
		with, tramp := timeCost(tb, bin, s.sym, n)
		if err := os.WriteFile(enable, []byte("0"), 0); err != nil {
			tb.Fatalf("disable %s: %v", s.sym, err)
		}
		out[s.sym] = siteCost{site: site, perHit: (with - base) / time.Duration(max(n, 1)), tramp: tramp}
	}
	return out
}

// timeCost runs bin on sym for n calls twice and returns the smaller CPU
// time (user and system: a loaded machine's waits are not the probe's)
// and whether the kernel's uprobe trampoline was mapped.
func timeCost(tb testing.TB, bin, sym string, n int) (time.Duration, bool) {
	tb.Helper()
	best, tramp := time.Duration(1<<62), false
	for range 2 {
		cmd := exec.Command(bin, sym, strconv.Itoa(n))
		o, err := cmd.CombinedOutput()
		if err != nil {
			tb.Fatalf("%s %s: %v\n%s", bin, sym, err, o)
		}
		d := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		best = min(best, d)
		tramp = tramp || strings.Contains(string(o), "trampoline=1")
	}
	return best, tramp
}
