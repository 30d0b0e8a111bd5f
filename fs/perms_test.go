package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"ptfs/cred"
	"ptfs/internal/testkit"
)

// ownerPerms is the permission model of a mount by this process's user,
// and ownerCtx the context of a request that this process makes.
var (
	ownerPerms = newPerms(Options{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())})
	ownerCtx   = callerCtx(uint32(os.Getuid()), uint32(os.Getgid()), uint32(os.Getpid()))
)

func callerCtx(uid, gid, pid uint32) context.Context {
	return fuse.NewContext(context.Background(), &fuse.Caller{Owner: fuse.Owner{Uid: uid, Gid: gid}, Pid: pid})
}

func TestControl(t *testing.T) {
	errLookup := errors.New("no such process")
	mayTrace := func(pid uint32) (bool, error) {
		switch pid {
		case 10:
			return true, nil
		case 11:
			return false, nil
		}
		return false, errLookup
	}
	p := newPerms(Options{UID: 1000, GID: 1000, MayTrace: mayTrace})
	tests := []struct {
		name string
		p    *perms
		ctx  context.Context
		want syscall.Errno
	}{
		{"owner", p, callerCtx(1000, 1000, 11), 0},
		{"owner in another group", p, callerCtx(1000, 5, 12), 0},
		{"other with a tracing capability", p, callerCtx(65534, 65534, 10), 0},
		{"other without", p, callerCtx(65534, 65534, 11), syscall.EPERM},
		{"other in the owner's group", p, callerCtx(65534, 1000, 11), syscall.EPERM},
		{"root is not the owner", p, callerCtx(0, 0, 11), syscall.EPERM},
		{"capabilities unknown", p, callerCtx(65534, 65534, 12), syscall.EPERM},
		{"no caller", p, context.Background(), syscall.EPERM},
		{"nobody else may", newPerms(Options{UID: 1000}), callerCtx(65534, 65534, 10), syscall.EPERM},
	}
	for _, tc := range tests {
		if got := tc.p.control(tc.ctx, "test", syscall.EPERM); got != tc.want {
			t.Errorf("%s: control = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := p.control(callerCtx(2, 2, 11), "open", syscall.EACCES); got != syscall.EACCES {
		t.Errorf("control answers %v, want the errno it was given", got)
	}
}

// TestOwnersAndModes checks that every node reports the mount's owner, the
// readers group and modes that say who may do what (DESIGN §2).
func TestOwnersAndModes(t *testing.T) {
	gid := testkit.FreeGID(t)
	uid := uint32(os.Getuid())
	for _, readers := range []bool{false, true} {
		t.Run(fmt.Sprintf("readers=%v", readers), func(t *testing.T) {
			ft := newFakeTarget("t", "/usr/bin/true")
			if err := ft.CreateProbe("e"); err != nil {
				t.Fatal(err)
			}
			mnt := mountFakeWith(t, newFakeTracer(ft), Options{UID: uid, GID: gid, GroupReads: readers})
			private, privateDir := os.FileMode(0o600), os.ModeDir|0o700
			if readers {
				private, privateDir = 0o640, os.ModeDir|0o750
			}
			mustSh(t, "ln -s /usr/bin/env "+mnt+"/env")
			want := map[string]os.FileMode{
				".":              os.ModeDir | 0o755,
				"status":         0o444,
				"t":              os.ModeDir | 0o755,
				"env":            os.ModeDir | 0o755,
				"t/exe":          os.ModeSymlink | 0o777,
				"t/status":       0o444,
				"t/symbols":      0o444,
				"t/records":      private,
				"t/branches":     private,
				"t/probes":       privateDir,
				"t/probes/e":     private,
				"env/probes":     privateDir,
				"env/records":    private,
				"env/symbols":    0o444,
				"env/exe":        os.ModeSymlink | 0o777,
				"t/probes/../..": os.ModeDir | 0o755,
			}
			for name, mode := range want {
				fi, err := os.Lstat(filepath.Join(mnt, name))
				if err != nil {
					t.Errorf("lstat %s: %v", name, err)
					continue
				}
				st := fi.Sys().(*syscall.Stat_t)
				if fi.Mode() != mode || st.Uid != uid || st.Gid != gid {
					t.Errorf("%s: %v uid %d gid %d, want %v uid %d gid %d", name, fi.Mode(), st.Uid, st.Gid, mode, uid, gid)
				}
			}
		})
	}
}

// As whom TestOtherUsers runs commands: nobody, with or without the
// readers group and capabilities.
type who struct {
	name   string
	groups bool // in the readers group
	caps   []uintptr
}

var (
	other   = who{name: "other"}
	reader  = who{name: "reader", groups: true}
	dac     = who{name: "dac-override", caps: []uintptr{unix.CAP_DAC_OVERRIDE}}
	perfmon = who{name: "perfmon", caps: []uintptr{unix.CAP_DAC_OVERRIDE, unix.CAP_PERFMON}}
)

// shAs runs a shell command line as user nobody and returns its combined
// output and error.
func shAs(t *testing.T, w who, gid uint32, script string) (string, error) {
	t.Helper()
	var groups []uint32
	if w.groups {
		groups = []uint32{gid}
	}
	// From /: nobody may not be able to enter the test's directory.
	return shWith(t, testkit.AsNobody(groups, w.caps...), "cd / && "+script)
}

// Answers of the commands in TestOtherUsers.
const (
	ok     = ""
	eacces = "Permission denied"
	eperm  = "Operation not permitted"
)

// TestOtherUsers runs commands as another user on a mount with
// allow_other and a readers group: the kernel refuses by the modes, ptfs
// refuses a caller that passes them (CAP_DAC_OVERRIDE) but may not trace,
// and lets one that may (CAP_PERFMON) do what the owner does.
func TestOtherUsers(t *testing.T) {
	requireFUSE(t)
	gid := testkit.FreeGID(t)
	ft := newFakeTarget("t", "/usr/bin/true")
	ft.records.Append([]byte("record 1: secret\n"))
	if err := ft.CreateProbe("e"); err != nil {
		t.Fatal(err)
	}
	if err := ft.SetProbe("e", "0x1040 %di"); err != nil {
		t.Fatal(err)
	}
	tr := newFakeTracer(ft)
	mnt := mountFakeWith(t, tr, Options{
		AllowOther: true, UID: uint32(os.Getuid()), GID: gid, GroupReads: true, MayTrace: cred.MayTrace,
	})
	// nobody must be able to walk to the mount point.
	if err := os.Chmod(filepath.Dir(mnt), 0o755); err != nil {
		t.Fatal(err)
	}
	reads := []struct {
		script string
		want   map[string]string // who.name -> answer
	}{
		{"ls M M/t && cat M/status M/t/status M/t/symbols >/dev/null",
			map[string]string{"other": ok, "reader": ok, "dac-override": ok}},
		{"cat M/t/records", map[string]string{"other": eacces, "reader": ok, "dac-override": ok}},
		{"cat M/t/probes/e", map[string]string{"other": eacces, "reader": ok, "dac-override": ok}},
		{"ls M/t/probes", map[string]string{"other": eacces, "reader": ok, "dac-override": ok}},
	}
	changes := []struct {
		script   string
		refusals map[string]string
	}{
		{"echo 0x10 > M/t/probes/new", map[string]string{"other": eacces, "reader": eacces, "dac-override": eacces}},
		{"echo 0x20 > M/t/probes/e", map[string]string{"other": eacces, "reader": eacces, "dac-override": eacces}},
		{"echo 0x20 >> M/t/probes/e", map[string]string{"other": eacces, "reader": eacces, "dac-override": eacces}},
		// touch -c sets the times without an open: a setattr.
		{"touch -c M/t/records", map[string]string{"other": eacces, "reader": eacces, "dac-override": eperm}},
		{"touch -c M/t/probes/e", map[string]string{"other": eacces, "reader": eacces, "dac-override": eperm}},
		{"mv M/t/probes/e M/t/probes/f && mv M/t/probes/f M/t/probes/e", map[string]string{"other": eacces, "reader": eacces, "dac-override": eperm}},
		{"rm M/t/probes/e", map[string]string{"other": eacces, "reader": eacces, "dac-override": eperm}},
		{": > M/t/records", map[string]string{"other": eacces, "reader": eacces, "dac-override": eacces}},
		{"truncate -s 0 M/t/records", map[string]string{"other": eacces, "reader": eacces, "dac-override": eacces}},
		{"ln -s /usr/bin/passwd M/passwd", map[string]string{"other": eacces, "reader": eacces, "dac-override": eperm}},
		{"rmdir M/t", map[string]string{"other": eacces, "reader": eacces, "dac-override": eperm}},
	}
	for _, w := range []who{other, reader, dac} {
		for _, r := range reads {
			script := strings.ReplaceAll(r.script, "M", mnt)
			out, err := shAs(t, w, gid, script)
			checkAnswer(t, w, script, out, err, r.want[w.name])
			if err == nil && strings.Contains(r.script, "records") && out != "record 1: secret\n" {
				t.Errorf("%s: %s read %q", w.name, script, out)
			}
		}
		for _, c := range changes {
			script := strings.ReplaceAll(c.script, "M", mnt)
			out, err := shAs(t, w, gid, script)
			checkAnswer(t, w, script, out, err, c.refusals[w.name])
		}
	}
	// Nothing changed.
	if got := ft.Probes(); !slices.Equal(got, []string{"e"}) {
		t.Errorf("probes after the refused attempts: %v", got)
	}
	if p := ft.probe("e"); p.spec != "0x1040 %di" {
		t.Errorf("probe e after the refused attempts: %+v", p)
	}
	if got := ft.records.Size(); got != int64(len("record 1: secret\n")) {
		t.Errorf("records after the refused attempts: %d bytes", got)
	}
	if added, removed := tr.calls(); len(added)+len(removed) != 0 {
		t.Errorf("targets added %v removed %v by refused attempts", added, removed)
	}

	// A file the owner opened for write and handed over (inherited
	// across a change of user, or passed on a socket) needs no new
	// permission check from the kernel: ptfs's own check refuses.
	for _, c := range []struct{ file, script string }{
		{"t/probes/e", "echo 0x30 >&3"},
		{"t/records", "python3 -c 'import os; os.ftruncate(3, 0)'"},
	} {
		f, err := os.OpenFile(filepath.Join(mnt, c.file), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("bash", "-c", "cd / && "+c.script)
		cmd.SysProcAttr = testkit.AsNobody(nil)
		cmd.ExtraFiles = []*os.File{f}
		out, err := cmd.CombinedOutput()
		f.Close()
		if err == nil || !strings.Contains(string(out), eperm) {
			t.Errorf("nobody: %s on %s opened by the owner: %v %q, want %s", c.script, c.file, err, out, eperm)
		}
	}
	if p := ft.probe("e"); p.spec != "0x1040 %di" {
		t.Errorf("probe e after a write by nobody through the owner's file: %+v", p)
	}
	if got := ft.records.Size(); got != int64(len("record 1: secret\n")) {
		t.Errorf("records after ftruncate by nobody through the owner's file: %d bytes", got)
	}

	// A caller that may trace may do all of it.
	for _, c := range changes {
		script := strings.ReplaceAll(c.script, "M", mnt)
		out, err := shAs(t, perfmon, gid, script)
		checkAnswer(t, perfmon, script, out, err, ok)
	}
	if p := ft.probe("new"); p.spec != "0x10" {
		t.Errorf("probe new written with CAP_PERFMON: %+v", p)
	}
	if got := ft.Probes(); !slices.Equal(got, []string{"new"}) {
		t.Errorf("probes after rm with CAP_PERFMON: %v", got)
	}
	if added, removed := tr.calls(); !slices.Equal(added, []string{"passwd=/usr/bin/passwd"}) || !slices.Equal(removed, []string{"t"}) {
		t.Errorf("targets added %v removed %v with CAP_PERFMON", added, removed)
	}
}

// checkAnswer fails unless a command run as w succeeded (want "") or
// failed with the message want.
func checkAnswer(t *testing.T, w who, script, out string, err error, want string) {
	t.Helper()
	switch {
	case want == ok && err != nil:
		t.Errorf("%s: %s: %v %q, want success", w.name, script, err, out)
	case want != ok && (err == nil || !strings.Contains(out, want)):
		t.Errorf("%s: %s: %v %q, want %q", w.name, script, err, out, want)
	}
}
