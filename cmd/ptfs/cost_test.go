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
	{"site_lock", probes.KernelRefused},
}

// TestProbeCostKernel checks the classic cost class of each site of
// testdata/cost.c against the kernel: a real probe on each, the traced
// program timed with and without it (logged). Refused: the kernel counted
// no hit (uprobe_profile); optimized: it mapped its trampoline page into
// the program; single-stepped: it mapped its [uprobes] page (the slots it
// steps instructions in); emulated: none of these. The kernel's own
// mappings, not the time a hit takes: the cost of a trap differs 3-4x
// between the VMs this runs on (a single-stepped hit took 5-6 µs of the
// program's CPU on one, an emulated one 6.8 µs on another).
func TestProbeCostKernel(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "cost", "cost", "-O2", "-no-pie")
	const n = 100000
	costs := measureCosts(t, bin, n)
	for _, s := range costSites {
		c := costs[s.sym]
		t.Logf("%s (%s): %d hits, %v a hit, trampoline %v, xol %v; ptfs says %s", s.sym, c.site.Insn, c.hits, c.perHit, c.tramp, c.xol, c.site.Cost.Class)
		if c.site.Cost.Class != s.class {
			t.Errorf("%s: class %s, want %s", s.sym, c.site.Cost.Class, s.class)
		}
		var kernel probes.CostClass
		switch {
		case c.hits == 0:
			kernel = probes.KernelRefused
		case c.hits != 2*n:
			t.Errorf("%s: the kernel counted %d hits of %d", s.sym, c.hits, 2*n)
		case c.tramp:
			kernel = probes.Optimized
		case c.xol:
			kernel = probes.SingleStepped
		default:
			kernel = probes.Emulated
		}
		if kernel != c.site.Cost.Class {
			t.Errorf("%s (%s): the kernel ran it %s (%v a hit, trampoline %v, xol %v), ptfs says %s",
				s.sym, c.site.Insn, kernel, c.perHit, c.tramp, c.xol, c.site.Cost.Class)
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
	tramp  bool // the kernel's [uprobes-trampoline] page was mapped
	xol    bool // its [uprobes] page (single-step slots) was mapped
	hits   int  // the kernel's count (uprobe_profile) over the two runs
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
		base, _, _ := timeCost(tb, bin, s.sym, n)
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
		with, tramp, xol := timeCost(tb, bin, s.sym, n)
		if err := os.WriteFile(enable, []byte("0"), 0); err != nil {
			tb.Fatalf("disable %s: %v", s.sym, err)
		}
		out[s.sym] = siteCost{site: site, perHit: (with - base) / time.Duration(max(n, 1)), tramp: tramp, xol: xol, hits: profileHits(tb, tfs, bin, s.sym)}
	}
	return out
}

// timeCost runs bin on sym for n calls twice and returns the smaller CPU
// time (user and system: a loaded machine's waits are not the probe's)
// and whether the kernel's uprobe trampoline and its single-step page
// were mapped.
func timeCost(tb testing.TB, bin, sym string, n int) (_ time.Duration, tramp, xol bool) {
	tb.Helper()
	best := time.Duration(1 << 62)
	for range 2 {
		cmd := exec.Command(bin, sym, strconv.Itoa(n))
		o, err := cmd.CombinedOutput()
		if err != nil {
			tb.Fatalf("%s %s: %v\n%s", bin, sym, err, o)
		}
		d := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		best = min(best, d)
		tramp = tramp || strings.Contains(string(o), "trampoline=1")
		xol = xol || strings.Contains(string(o), "xol=1")
	}
	return best, tramp, xol
}

// profileHits returns the hits that uprobe_profile counts for event of
// the probe on bin.
func profileHits(tb testing.TB, tfs, bin, event string) int {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(tfs, "uprobe_profile"))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == bin && f[1] == event {
			n, _ := strconv.Atoi(f[2])
			return n
		}
	}
	tb.Fatalf("no %s of %s in uprobe_profile", event, bin)
	return 0
}

// TestProbeCostRefused: a classic probe on a site the kernel refuses
// (TestProbeCostKernel: it counts no hit) fails the write with EOPNOTSUPP
// and the reason, and no line reaches uprobe_events.
func TestProbeCostRefused(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "cost", "cost", "-O2", "-no-pie")
	m := startMount(t, "--mode=classic", "t="+bin)
	out, err := shell(fmt.Sprintf("echo site_lock > %s", m.path("t", "probes", "l")))
	if err == nil || !strings.Contains(out, "Operation not supported") {
		t.Fatalf("echo site_lock: %v %s", err, out)
	}
	if text := m.probeText("t", "l"); !strings.Contains(text, "# error: probe refused: classic: lock addl $0x0,(%rsp) has prefix f0") {
		t.Fatalf("probe file:\n%s", text)
	}
	if l := uprobeLines(t, m.group()+"t/"); len(l) != 0 {
		t.Fatalf("uprobe_events lines: %q", l)
	}
	m.setProbe("t", "e", "site_mov")
	if text := m.probeText("t", "e"); !strings.Contains(text, "\n# classic: single-stepped") {
		t.Fatalf("probe file:\n%s", text)
	}
}
