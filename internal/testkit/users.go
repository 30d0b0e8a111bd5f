package testkit

import (
	"errors"
	"fmt"
	"os/user"
	"syscall"
	"testing"
)

// Nobody is the uid and gid of user nobody (Debian's), the second user of
// the permission tests.
const Nobody = 65534

// AsNobody returns the attributes of a child process that runs as user
// nobody, in exactly the supplementary groups given, with caps raised as
// ambient capabilities (so that they stay effective across exec).
func AsNobody(groups []uint32, caps ...uintptr) *syscall.SysProcAttr {
	if groups == nil {
		groups = []uint32{} // nil would keep the parent's groups
	}
	return &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: Nobody, Gid: Nobody, Groups: groups},
		AmbientCaps: caps,
	}
}

// FreeGID returns a gid that no group of this machine has: a readers
// group whose only members are the test's child processes, with nothing
// added to /etc/group.
func FreeGID(t testing.TB) uint32 {
	t.Helper()
	for gid := 54321; gid < 54421; gid++ {
		_, err := user.LookupGroupId(fmt.Sprint(gid))
		var unknown user.UnknownGroupIdError
		if errors.As(err, &unknown) {
			return uint32(gid)
		}
		if err != nil {
			t.Fatalf("look up gid %d: %v", gid, err)
		}
	}
	t.Fatal("no free gid in 54321-54420")
	return 0
}
