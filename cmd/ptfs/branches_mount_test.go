package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"ptfs/bind"
	"ptfs/engine/enginetest"
	ptfsfs "ptfs/fs"
	"ptfs/images"
	"ptfs/internal/testkit"
	"ptfs/live"
	"ptfs/session"
	"ptfs/tracefs/tracefstest"
)

// replayMount is a mount whose kernel is simulated: tracefs, the sysfs of
// a PT machine, and a replay in place of the PT events.
type replayMount struct {
	t   *testing.T
	s   *session.Session
	rep *enginetest.Replay
	dir string
	// release forgets the mount as this process's (mountOwn).
	release func()
	srv     interface {
		Unmount() error
		Wait()
	}
}

// newReplayMount mounts a session in mode (classic: the replay is the
// branch trace; ptw: the PT trace of records and branches) with the run's
// vDSO, unmounted at the end of the test.
func newReplayMount(t *testing.T, mode session.Mode, run *enginetest.Ptsim) *replayMount {
	t.Helper()
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "mounting FUSE with the mount syscall needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testkit.Unavailable(t, "no /dev/fuse: %v", err)
	}
	k := tracefstest.New(t, tracefstest.Options{PTW: mode == session.ModePTW, FirstID: 0x6c2})
	rep, err := enginetest.NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	vdso, err := images.OpenELF(run.VDSO)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vdso.Close() })
	o := session.Options{Mode: mode, Tracefs: k.Tracefs, Sysfs: testkit.PTSysfs(t), Latency: time.Hour,
		Branches: live.Options{VDSO: vdso, Maps: func(int32) ([]images.MapsEntry, error) { return nil, nil }}}
	if mode == session.ModePTW {
		o.Trace = rep
	} else {
		o.BranchTrace = rep
	}
	s, err := session.New(o)
	if err != nil {
		t.Fatal(err)
	}
	m := &replayMount{t: t, s: s, rep: rep, dir: t.TempDir()}
	// Through mountOwn, as `ptfs mount`: a mount of the test's PID that it
	// did not record would count as a dead predecessor's.
	srv, release, err := mountOwn(m.dir, bind.Tracer[*session.Target](s), ptfsfs.Options{})
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	m.srv, m.release = srv, release
	t.Cleanup(func() { m.unmount() })
	return m
}

// unmount unmounts as `ptfs mount` does on a signal (detaching when a
// reader holds a file) and closes the session; nothing may run after it.
func (m *replayMount) unmount() {
	if m.srv == nil {
		return
	}
	srv := m.srv
	m.srv = nil
	if err := srv.Unmount(); err != nil {
		if derr := unix.Unmount(m.dir, unix.MNT_DETACH); derr != nil {
			m.t.Errorf("unmount %s: %v, %v", m.dir, err, derr)
		}
	} else {
		srv.Wait()
	}
	m.release()
	if err := m.s.Close(); err != nil {
		m.t.Errorf("close: %v", err)
	}
	if m.rep.Running() {
		m.t.Errorf("the PT source runs after the unmount")
	}
}

func (m *replayMount) path(parts ...string) string {
	return filepath.Join(append([]string{m.dir}, parts...)...)
}

// waitStatus waits until the target's status holds want.
func (m *replayMount) waitStatus(target, want string) {
	m.t.Helper()
	var st []byte
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		var err error
		if st, err = os.ReadFile(m.path(target, "status")); err == nil && strings.Contains(string(st), want) {
			return
		}
	}
	m.t.Fatalf("%s status never had %q:\n%s", target, want, st)
}

// startTailF follows path with a real GNU tail -f; its lines come on the
// channel. It is killed (by its PID) at the end of the test.
func startTailF(t *testing.T, path string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command("tail", "-n", "+1", "-f", path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 1<<16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

// collect takes n lines from lines, failing after 20 s without one.
func collect(t *testing.T, lines <-chan string, n int) []string {
	t.Helper()
	var out []string
	for len(out) < n {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("tail ended after %d of %d lines", len(out), n)
			}
			out = append(out, l)
		case <-time.After(20 * time.Second):
			t.Fatalf("tail -f showed %d of %d lines, then nothing for 20 s", len(out), n)
		}
	}
	return out
}

// ptsimExpected runs `ptfs decode --branches` on the run, with its maps
// made absolute (the names a live side band gives), --tid and --cpu as the
// replay's side band says, and returns what a target of bin gets: its
// code's branch and trace lines, and the records.
func ptsimExpected(t *testing.T, run *enginetest.Ptsim, runDir, bin string, tid, cpu string, ptw bool) []string {
	t.Helper()
	maps := filepath.Join(t.TempDir(), "maps.txt")
	if err := os.WriteFile(maps, []byte(run.MapsText()), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--branches", "--maps", maps, "--vdso", run.VDSO, "--tid", tid, "--cpu", cpu}
	if ptw {
		args = append(args, "--events", writeEvent(t, "ptfs_t", "fib", "1730"))
	}
	code, out, errs := runDecodeT(append(args, filepath.Join(runDir, "trace.pt"))...)
	if code != 0 {
		t.Fatalf("ptfs decode: exit %d: %s", code, errs)
	}
	var want []string
	for l := range strings.SplitSeq(strings.TrimSuffix(out, "\n"), "\n") {
		switch {
		case strings.HasPrefix(l, "branch summary: "), strings.HasPrefix(l, "summary: "):
		case (strings.HasPrefix(l, "branch: ") || strings.HasPrefix(l, "trace: ")) && !strings.Contains(l, " ("+bin+")"):
		default:
			want = append(want, l)
		}
	}
	return want
}

// TestBranchesMountPtsim runs the whole mount on a simulated kernel that
// replays ptsim's recordings of a real program (its PT bytes as AUX data in
// 4 KiB pieces, the side band made from maps.txt, the binary on disk): a
// real `tail -f branches` shows exactly what `ptfs decode --branches` gives
// for the target's code, with tid= and cpu=; with the ptw probe hits, in
// ptw mode, the records among them and in `records` are exact too.
// Opening branches switches branch tracing on (the replay sees the
// configuration, with classic mode's filter of the target's code); killing
// the reader switches it off.
func TestBranchesMountPtsim(t *testing.T) {
	root := filepath.Join(testkit.Corpus(t), "ptsim")
	bin := filepath.Join(root, "flow-static")
	for _, tc := range []struct {
		run  string
		mode session.Mode
	}{{"run-static", session.ModeClassic}, {"run-static-ptw", session.ModePTW}} {
		t.Run(tc.run, func(t *testing.T) {
			runDir := filepath.Join(root, tc.run)
			run, err := enginetest.LoadPtsim(runDir, root)
			if err != nil {
				t.Fatal(err)
			}
			ptw := tc.mode == session.ModePTW
			want := ptsimExpected(t, run, runDir, bin, "42", "0", ptw)
			m := newReplayMount(t, tc.mode, run)
			if err := os.Symlink(bin, m.path("t")); err != nil {
				t.Fatal(err)
			}
			if ptw {
				if err := os.WriteFile(m.path("t", "probes", "fib"), []byte("fib %di rsi=%si\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if p, _ := os.ReadFile(m.path("t", "probes", "fib")); !strings.Contains(string(p), "event id 1730") {
					t.Fatalf("probe file:\n%s", p)
				}
			}
			tail, lines := startTailF(t, m.path("t", "branches"))
			m.waitStatus("t", "branches: on (1 readers of this target")
			cfg := m.rep.Configs()
			if len(cfg) != 1 || !cfg[0].Branch {
				t.Fatalf("configurations %+v, want branch tracing on", cfg)
			}
			if !ptw && !strings.HasPrefix(cfg[0].Filter, "filter 0x1000/0x") {
				t.Errorf("filter %q, want the range of the target's code", cfg[0].Filter)
			}
			if err := m.rep.Queue(run.Batches(0, 7, 42, 4096)...); err != nil {
				t.Fatal(err)
			}
			if err := m.rep.Flush(); err != nil {
				t.Fatal(err)
			}
			got := collect(t, lines, len(want))
			diffLines(t, "branches line", got, want)
			if ptw {
				var wantRecs []string
				for _, l := range want {
					if strings.HasPrefix(l, "record ") {
						// The record engine has no time here
						// (no TSC conversion), hence no thread.
						wantRecs = append(wantRecs, strings.Replace(l, " tid=42", "", 1))
					}
				}
				recs, err := os.ReadFile(m.path("t", "records"))
				if err != nil {
					t.Fatal(err)
				}
				diffLines(t, "record", strings.Split(strings.TrimSuffix(string(recs), "\n"), "\n"), wantRecs)
				if len(wantRecs) != 987 {
					t.Errorf("%d records", len(wantRecs))
				}
			}
			st, _ := os.ReadFile(m.path("t", "status"))
			if !strings.Contains(string(st), "branches losses: aux truncated=0 aux partial=0 aux collision=0 aux hole=0 side band lost=0 decode errors=0 unknown code=0 (replaced on disk=0)\n") {
				t.Errorf("status:\n%s", st)
			}
			// The reader killed mid-follow: branch tracing goes off.
			if err := tail.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = tail.Wait()
			m.waitStatus("t", "branches: off (no reader")
			if ptw {
				if cfg := m.rep.Configs(); len(cfg) != 2 || cfg[1].Branch {
					t.Errorf("configurations %+v, want branch tracing off after the reader", cfg)
				}
				if !m.rep.Running() {
					t.Errorf("the records' source stopped with the branches")
				}
			} else if m.rep.Running() {
				t.Errorf("branch tracing runs without a reader")
			}
			t.Logf("%d lines equal", len(got))
		})
	}
}

// TestBranchesMountLifecycle: two targets with branches open (tail -f on
// each, one also read by cat), rmdir of one with its reader running, then
// unmount with the other's tail -f running: nothing hangs, the readers
// end, branch tracing stops and nothing is left running.
func TestBranchesMountLifecycle(t *testing.T) {
	root := filepath.Join(testkit.Corpus(t), "ptsim")
	run, err := enginetest.LoadPtsim(filepath.Join(root, "run-static"), root)
	if err != nil {
		t.Fatal(err)
	}
	m := newReplayMount(t, session.ModeClassic, run)
	src := filepath.Join("..", "..", "testdata", "target.c")
	for _, name := range []string{"t", "u"} {
		if err := os.Symlink(testkit.BuildC(t, src), m.path(name)); err != nil {
			t.Fatal(err)
		}
	}
	tailT, _ := startTailF(t, m.path("t", "branches"))
	tailU, linesU := startTailF(t, m.path("u", "branches"))
	m.waitStatus("t", "branches: on (1 readers of this target, 2 targets read")
	f, err := os.Open(m.path("u", "branches"))
	if err != nil {
		t.Fatal(err)
	}
	m.waitStatus("u", "branches: on (2 readers of this target")
	if cfg := m.rep.Configs(); !strings.Contains(cfg[len(cfg)-1].Filter, ",filter ") {
		t.Errorf("configurations %+v, want the filter of both targets last", cfg)
	}
	// rmdir with tail -f reading t's branches.
	if err := unix.Rmdir(m.path("t")); err != nil {
		t.Fatal(err)
	}
	m.waitStatus("u", "branches: on (2 readers of this target, 1 targets read")
	if cfg := m.rep.Configs(); strings.Contains(cfg[len(cfg)-1].Filter, ",filter ") {
		t.Errorf("the filter keeps the removed target: %+v", cfg[len(cfg)-1])
	}
	_ = tailT.Process.Kill()
	_ = tailT.Wait()
	// A hole on the CPU: every target read gets the gap line.
	if err := m.rep.Queue(enginetest.Batch{0: {enginetest.Trace(run.Trace[:3000]), enginetest.Loss(2, 1)}}); err != nil {
		t.Fatal(err)
	}
	if err := m.rep.Flush(); err != nil {
		t.Fatal(err)
	}
	var gap string
	for gap == "" {
		select {
		case l := <-linesU:
			if strings.HasPrefix(l, "gap: error ") && strings.Contains(l, "err=trace lost: aux collision") {
				gap = l
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no gap line for the hole")
		}
	}
	m.waitStatus("u", " aux collision=1 ")
	// Unmount with tail -f and an open file on u's branches.
	done := make(chan struct{})
	go func() {
		m.unmount()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("unmount hangs with readers of branches")
	}
	f.Close()
	_ = tailU.Process.Kill()
	_ = tailU.Wait()
}
