package session

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"ptfs/internal/testkit"
	"ptfs/tracefs"

	"golang.org/x/sys/unix"
)

// newSession starts a session on the real kernel, closed at cleanup.
func newSession(t *testing.T) *Session {
	t.Helper()
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root for tracefs and uprobes")
	}
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// groupLines returns the uprobe_events lines of tracefs group g.
func groupLines(t *testing.T, s *Session, g string) []string {
	t.Helper()
	// The kernel hands uprobe_events out a page per read, each from the
	// line at its index: a removal elsewhere between two reads (other
	// packages' tests remove probes all the time) moves the rest up and a
	// read misses a line. The group's directory under events is exact:
	// a listing is taken once it names the same events.
	for try := 0; ; try++ {
		lines, err := s.tfs.Events()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		listed := map[string]bool{}
		for _, l := range lines {
			if pl, err := tracefs.ParseLine(l); err == nil && pl.Group == g {
				out = append(out, l)
				listed[pl.Event] = true
			}
		}
		dirs, err := os.ReadDir(filepath.Join(s.tfs.Dir, "events", g))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		events := 0
		same := true
		for _, d := range dirs {
			if d.IsDir() { // besides the group's enable and filter files
				events++
				same = same && listed[d.Name()]
			}
		}
		same = same && events == len(listed)
		if same || try == 50 {
			return out
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Names that sanitising and the 63-byte tracefs limit make equal still get
// groups and events of their own, and a probe with a long name can be
// replaced.
func TestLongNames(t *testing.T) {
	s := newSession(t)
	bin := testkit.BuildC(t, filepath.Join("..", "testdata", "target.c"))
	prefix := strings.Repeat("a", 60)
	var groups []string
	for _, name := range []string{prefix + "1", prefix + "2", prefix + "-3", prefix + ".3"} {
		tg, err := s.AddTarget(name, bin)
		if err != nil {
			t.Fatalf("AddTarget(%s): %v", name, err)
		}
		groups = append(groups, tg.group)
	}
	for i, g := range groups {
		if len(g) > 63 {
			t.Errorf("group %q is longer than tracefs allows", g)
		}
		for _, o := range groups[:i] {
			if o == g {
				t.Errorf("two targets share group %q", g)
			}
		}
	}
	tg := s.targets[prefix+"1"]
	long := strings.Repeat("p", 80)
	for _, spec := range []string{"target %di", "target %si", "other %di"} {
		if err := tg.SetProbe(long, spec); err != nil {
			t.Fatalf("SetProbe(%s): %v", spec, err)
		}
		if l := groupLines(t, s, tg.group); len(l) != 1 || !strings.Contains(l[0], strings.Fields(spec)[1]) {
			t.Fatalf("after %q: %q", spec, l)
		}
	}
	if err := s.RemoveTarget(prefix + "1"); err != nil {
		t.Fatal(err)
	}
	if l := groupLines(t, s, tg.group); len(l) != 0 {
		t.Errorf("after RemoveTarget: %q", l)
	}
}

// A probe that tracefs will not remove (another tool holds its event) is
// reported, stops being read, and goes when the session closes.
func TestLeftovers(t *testing.T) {
	s := newSession(t)
	bin := testkit.BuildC(t, filepath.Join("..", "testdata", "target.c"))
	if _, err := s.AddTarget("t", bin); err != nil {
		t.Fatal(err)
	}
	tg := s.targets["t"]
	if err := tg.SetProbe("a", "target %di"); err != nil {
		t.Fatal(err)
	}
	// The other tool: a perf event of its own on the probe's tracepoint.
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_TRACEPOINT, Config: uint64(tg.probes["a"].ev.ID), Sample: 1}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, -1, 0, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			unix.Close(fd)
		}
	})
	err = tg.RemoveProbe("a")
	if !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("RemoveProbe of a held event: %v, want EBUSY", err)
	}
	if text, _ := tg.ProbeText("a"); !strings.Contains(string(text), "# error: removing") {
		t.Errorf("probe file:\n%s", text)
	}
	if err := tg.RemoveProbe("a"); err != nil {
		t.Errorf("second rm: %v", err)
	}
	if l := groupLines(t, s, tg.group); len(l) != 1 {
		t.Fatalf("while held: %q", l)
	}
	unix.Close(fd)
	closed = true
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if l := groupLines(t, s, tg.group); len(l) != 0 {
		t.Errorf("after Close: %q", l)
	}
}
