package cred

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"ptfs/internal/testkit"
)

func TestCapEff(t *testing.T) {
	tests := []struct {
		name    string
		status  string
		want    uint64
		wantErr error
	}{
		{"root", "Name:\tbash\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n", 0x1ffffffffff, nil},
		{"none", "Name:\tcat\nCapEff:\t0000000000000000\nCapBnd:\t000001ffffffffff\n", 0, nil},
		{"last line without newline", "Uid:\t0\nCapEff:\t0000004000000000", 1 << unix.CAP_PERFMON, nil},
		{"CapEff only counts, not CapPrm", "CapPrm:\t0000000000200000\nCapEff:\t0000000000000000\n", 0, nil},
		{"missing", "Name:\tx\nCapPrm:\t0000000000000000\n", 0, ErrMalformed},
		{"not hex", "CapEff:\tzz\n", 0, ErrMalformed},
		{"too long", "CapEff:\t1000000000000000000\n", 0, ErrMalformed},
		{"empty value", "CapEff:\n", 0, ErrMalformed},
		{"empty file", "", 0, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CapEff([]byte(tc.status))
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("CapEff = %#x, want %#x", got, tc.want)
			}
		})
	}
}

func FuzzCapEff(f *testing.F) {
	f.Add([]byte("CapEff:\t000001ffffffffff\n"))
	f.Add([]byte("CapEff:\n\nCapEff: 1"))
	f.Fuzz(func(t *testing.T, status []byte) {
		caps, err := CapEff(status)
		if err != nil && caps != 0 {
			t.Fatalf("error %v with caps %#x", err, caps)
		}
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
	})
}

func TestMayTrace(t *testing.T) {
	if _, err := MayTrace(0); !errors.Is(err, ErrNoPid) {
		t.Errorf("MayTrace(0): %v, want ErrNoPid", err)
	}
	// The pid space wraps well below this.
	if _, err := MayTrace(1 << 30); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("MayTrace of a missing pid: %v, want ErrNotExist", err)
	}
	// This process, judged by its own status file read independently.
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		testkit.Unavailable(t, "no /proc: %v", err)
	}
	caps, err := CapEff(status)
	if err != nil {
		t.Fatal(err)
	}
	want := caps&(1<<unix.CAP_SYS_ADMIN|1<<unix.CAP_PERFMON) != 0
	got, err := MayTrace(uint32(os.Getpid()))
	if err != nil || got != want {
		t.Errorf("MayTrace(self) = %v, %v; want %v (CapEff %#x)", got, err, want, caps)
	}
}

// TestMayTraceUserNS checks that capabilities in a user namespace of the
// caller's own count for nothing: a child made in a new user namespace is
// root there, with every capability in CapEff.
func TestMayTraceUserNS(t *testing.T) {
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root to judge a root child")
	}
	start := func(attr *syscall.SysProcAttr) uint32 {
		t.Helper()
		cmd := exec.Command("sleep", "10")
		cmd.SysProcAttr = attr
		if err := cmd.Start(); err != nil {
			t.Fatalf("start a child (%+v): %v", attr, err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		return uint32(cmd.Process.Pid)
	}
	plain := start(nil)
	inNS := start(&syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	})
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", inNS))
	if err != nil {
		t.Fatal(err)
	}
	if caps, err := CapEff(status); err != nil || caps&(1<<unix.CAP_SYS_ADMIN) == 0 {
		t.Fatalf("the child in a user namespace has CapEff %#x, %v; the test proves nothing", caps, err)
	}
	if ok, err := MayTrace(plain); !ok || err != nil {
		t.Errorf("MayTrace(root child) = %v, %v; want true", ok, err)
	}
	if ok, err := MayTrace(inNS); ok || err != nil {
		t.Errorf("MayTrace(root of its own user namespace) = %v, %v; want false", ok, err)
	}
}

func TestGroup(t *testing.T) {
	tests := []struct {
		in      string
		want    uint32
		wantErr bool
	}{
		{"root", 0, false},
		{"0", 0, false},
		{"54321", 54321, false}, // a number need not name a group
		{"4294967294", 4294967294, false},
		{"4294967295", 0, true}, // (gid_t)-1
		{"4294967296", 0, true}, // not a gid, and no such name
		{"-1", 0, true},
		{"", 0, true},
		{"no-such-group-ptfs", 0, true},
	}
	for _, tc := range tests {
		got, err := Group(tc.in)
		if tc.wantErr {
			if !errors.Is(err, ErrBadGroup) {
				t.Errorf("Group(%q) = %d, %v; want ErrBadGroup", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Group(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}
