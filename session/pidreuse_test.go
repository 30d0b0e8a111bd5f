package session

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"ptfs/internal/testkit"
	"ptfs/probes"
	"ptfs/tracefs"
)

// reuseRun numbers the runs of TestReusedPID: a group, once this process
// made it, stays its own.
var reuseRun int

// TestReusedPID: the probes that a dead process with this PID left (planted
// by another process: this process never made their groups) are removed by a new session, which then installs its own
// probe under the same group and event name; a live session of this
// process keeps its probes meanwhile, and its claim outlives the other's.
func TestReusedPID(t *testing.T) {
	a := newSession(t)
	bin := testkit.BuildC(t, filepath.Join("..", "testdata", "target.c"))
	ta, err := a.AddTarget("live", bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := ta.SetProbe("p", "target %di"); err != nil {
		t.Fatal(err)
	}
	if l := groupLines(t, a, ta.group); len(l) != 1 {
		t.Fatalf("live session's lines: %q", l)
	}

	// The dead process: its probe p in the group of target "reusedN", and
	// one in a group that nobody makes again.
	reuseRun++
	name := "reused" + strconv.Itoa(reuseRun)
	deadG := tracefs.GroupName(os.Getpid(), name)
	goneG := tracefs.GroupName(os.Getpid(), "gone"+strconv.Itoa(reuseRun))
	b, err := probes.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sp, err := probes.Parse("target %di")
	if err != nil {
		t.Fatal(err)
	}
	site, err := b.Resolve(sp)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{deadG, goneG} {
		t.Cleanup(func() { removeGroup(t, a.tfs, g) })
		testkit.PlantProbe(t, a.tfs.Dir, tracefs.ClassicLine(g, "p", bin, site.Offset, sp))
	}
	if len(groupLines(t, a, deadG)) != 1 || len(groupLines(t, a, goneG)) != 1 {
		t.Fatal("planted lines are not listed")
	}

	s := newSession(t)
	for _, g := range []string{deadG, goneG} {
		if l := groupLines(t, s, g); len(l) != 0 {
			t.Errorf("the new session left the dead process's lines: %q", l)
		}
	}
	if l := groupLines(t, s, ta.group); len(l) != 1 {
		t.Errorf("the new session took the live session's lines: %q", l)
	}
	tg, err := s.AddTarget(name, bin)
	if err != nil {
		t.Fatal(err)
	}
	if tg.group != deadG {
		t.Fatalf("target %s has group %s, want %s", name, tg.group, deadG)
	}
	if err := tg.SetProbe("p", "target %di"); err != nil {
		t.Fatalf("install under a dead process's event name: %v", err)
	}
	if l := groupLines(t, s, deadG); len(l) != 1 || !strings.Contains(l[0], tg.bin.FDPath()) {
		t.Errorf("new session's lines: %q, want one on %s", l, tg.bin.FDPath())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !tracefs.OwnerAlive(os.Getpid()) {
		t.Error("closing one session gave up the live one's claim")
	}
	if l := groupLines(t, a, ta.group); len(l) != 1 {
		t.Errorf("live session's lines after the other closed: %q", l)
	}
}

// removeGroup removes every line of group g that is left.
func removeGroup(t *testing.T, tfs *tracefs.Tracefs, g string) {
	lines, err := tfs.Events()
	if err != nil {
		t.Error(err)
		return
	}
	for _, l := range lines {
		if pl, err := tracefs.ParseLine(l); err == nil && pl.Group == g {
			if err := tfs.RemoveProbe(pl.Group, pl.Event); err != nil && !errors.Is(err, syscall.ENOENT) {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
}
