package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"ptfs/bind"
	ptfsfs "ptfs/fs"
	"ptfs/session"
	"ptfs/tracefs"
)

// plantMountMain is the child of plantDeadMount: it mounts an unserved
// FUSE file system of type fuse.ptfs with source on dir and exits, so the
// kernel closes its /dev/fuse and the mount is dead, as a killed ptfs's.
func plantMountMain(dir, source string) int {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open /dev/fuse:", err)
		return 1
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	if err := unix.Mount(source, dir, "fuse.ptfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		fmt.Fprintln(os.Stderr, "mount:", err)
		return 1
	}
	return 0
}

// plantDeadMount leaves a dead ptfs mount with source ptfs:PID on dir,
// made by a child process that has exited: the test's process has no
// record of making it. It is detached at the end of the test if still
// there.
func plantDeadMount(t *testing.T, dir string, pid int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "PTFS_TEST_PLANT_MOUNT="+dir, fmt.Sprintf("PTFS_TEST_PLANT_SOURCE=ptfs:%d", pid))
	out, err := cmd.CombinedOutput()
	t.Cleanup(func() {
		if mounted(t, dir) {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	if err != nil {
		t.Fatalf("plant a dead mount on %s: %v: %s", dir, err, out)
	}
}

// ptfsMountAt returns the ptfs mount on dir in /proc/self/mountinfo (the
// top one).
func ptfsMountAt(t *testing.T, dir string) (ptfsMount, bool) {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	ms := ptfsMounts(info)
	for j := len(ms) - 1; j >= 0; j-- {
		if ms[j].dir == dir {
			return ms[j], true
		}
	}
	return ptfsMount{}, false
}

// A ptfs mount whose source names this process's PID but that this process
// did not make is a dead predecessor's (the PID was reused), although the
// PID's owner is alive (its claim): a new mount detaches it and may mount
// over its directory, and leaves this process's own mount alone.
func TestDeadMountOfOwnPID(t *testing.T) {
	needFUSE(t)
	// The session claims this PID, as a ptfs's does: OwnerAlive(self) is
	// true, which alone kept the dead mount before.
	s, err := session.New(session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	if !tracefs.OwnerAlive(os.Getpid()) {
		t.Fatal("the session does not claim this process's PID")
	}
	live := t.TempDir()
	serveOwn(t, live, s)
	dead := filepath.Join(t.TempDir(), "dead dir") // escaped in mountinfo
	if err := os.Mkdir(dead, 0o755); err != nil {
		t.Fatal(err)
	}
	plantDeadMount(t, dead, os.Getpid())
	if m, ok := ptfsMountAt(t, dead); !ok || m.pid != os.Getpid() {
		t.Fatalf("planted mount on %s: %+v (found %v), want source ptfs:%d", dead, m, ok, os.Getpid())
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dead, &st); !errors.Is(err, unix.ENOTCONN) {
		t.Fatalf("statfs of the planted mount: %v, want ENOTCONN", err)
	}

	if err := refuseLiveMount(dead); err != nil {
		t.Errorf("a mount over the dead mount of this PID is refused: %v", err)
	}
	if err := refuseLiveMount(live); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("a mount over this process's live mount: %v, want EBUSY", err)
	}
	clearDeadMounts()
	if mounted(t, dead) {
		t.Errorf("the dead mount of this PID on %s is still mounted", dead)
	}
	if !mounted(t, live) {
		t.Fatalf("this process's live mount on %s is gone", live)
	}
	if _, err := os.ReadFile(filepath.Join(live, "status")); err != nil {
		t.Errorf("this process's live mount does not serve: %v", err)
	}

	// A second mount of this process, over the dead one's directory, is
	// its own too.
	serveOwn(t, dead, s)
	if err := refuseLiveMount(dead); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("a mount over this process's second mount: %v, want EBUSY", err)
	}
	clearDeadMounts()
	if !mounted(t, dead) || !mounted(t, live) {
		t.Errorf("clearDeadMounts took a live mount of this process: %s %v, %s %v", dead, mounted(t, dead), live, mounted(t, live))
	}
}

// serveOwn mounts s on dir as `ptfs mount` does (mountOwn) until the end of
// the test.
func serveOwn(t *testing.T, dir string, s *session.Session) {
	t.Helper()
	srv, release, err := mountOwn(dir, bind.Tracer[*session.Target](s), ptfsfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer release()
		if err := srv.Unmount(); err != nil {
			if derr := unix.Unmount(dir, unix.MNT_DETACH); derr != nil {
				t.Errorf("unmount %s: %v, %v", dir, err, derr)
			}
			return
		}
		srv.Wait()
	})
}
