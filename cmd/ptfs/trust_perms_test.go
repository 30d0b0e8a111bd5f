package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"ptfs/internal/testkit"
)

// shellAs runs a bash command line as a child with the given attributes
// (another user), from / so that it needs no access to the test's
// directory.
func shellAs(attr *syscall.SysProcAttr, cmdline string) (string, error) {
	cmd := exec.Command("bash", "-c", cmdline)
	cmd.SysProcAttr = attr
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestTrustPermissions mounts with --readers and lets user nobody try
// what the issue reported: reading the trace and the probes, installing,
// overwriting and removing probes, adding /usr/bin/passwd and libc as
// targets with a probe on getenv, removing targets, truncating records.
// Only a member of the readers group reads; nobody changes anything, even
// with CAP_DAC_OVERRIDE, and uprobe_events gains nothing; root does it all.
func TestTrustPermissions(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t", "-no-pie")
	gid := testkit.FreeGID(t)
	// nobody must be able to walk to the mount point: t.TempDir and the
	// test's directory above it are 0700.
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(base, "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := startMountAt(t, dir, fmt.Sprintf("--readers=%d", gid), bin)
	m.setProbe("t", "e", "target a=%di")
	runProg(t, bin, "5")
	records := m.waitLines(5, "t", "records")
	if len(records) != 5 {
		t.Fatalf("records before the attempts: %q", records)
	}
	probeText := m.probeText("t", "e")
	installed := uprobeLines(t, m.group())
	if len(installed) != 1 {
		t.Fatalf("uprobe_events of the mount: %q, want the probe e", installed)
	}

	// The files say who may do what.
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{
		{"", os.ModeDir | 0o755}, {"status", 0o444}, {"t", os.ModeDir | 0o755},
		{"t/records", 0o640}, {"t/probes", os.ModeDir | 0o750}, {"t/probes/e", 0o640},
	} {
		fi, err := os.Lstat(m.path(f.path))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode() != f.mode || st.Uid != 0 || st.Gid != gid {
			t.Errorf("/%s: %v %d:%d, want %v 0:%d", f.path, fi.Mode(), st.Uid, st.Gid, f.mode, gid)
		}
	}

	const denied, notPermitted = "Permission denied", "Operation not permitted"
	mnt := func(s string) string { return strings.ReplaceAll(s, "M", m.dir) }
	other := testkit.AsNobody(nil)
	reader := testkit.AsNobody([]uint32{gid})
	// Passes the kernel's check of the modes, not ptfs's.
	dacOverride := testkit.AsNobody(nil, unix.CAP_DAC_OVERRIDE)

	// Everyone may list the tree and read the status files; only readers
	// read the trace and the probes.
	for _, who := range []struct {
		name  string
		attr  *syscall.SysProcAttr
		reads bool
	}{{"nobody", other, false}, {"nobody in the readers group", reader, true}} {
		if out, err := shellAs(who.attr, mnt("ls M M/t && cat M/status M/t/status M/t/symbols")); err != nil {
			t.Errorf("%s: list and read status: %v %s", who.name, err, out)
		}
		for _, f := range []string{"M/t/records", "M/t/probes/e"} {
			out, err := shellAs(who.attr, mnt("cat "+f))
			switch {
			case who.reads && err != nil:
				t.Errorf("%s: cat %s: %v %s", who.name, f, err, out)
			case who.reads && f == "M/t/records" && out != strings.Join(records, "\n")+"\n":
				t.Errorf("%s: cat records = %q, want %q", who.name, out, records)
			case !who.reads && (err == nil || !strings.Contains(out, denied)):
				t.Errorf("%s: cat %s: %v %q, want %s", who.name, f, err, out, denied)
			}
		}
	}

	changes := []struct {
		cmdline string
		dacWant string // the answer to a caller with CAP_DAC_OVERRIDE (ptfs's)
	}{
		{"echo 'target a=%di' > M/t/probes/x", denied},
		{"echo 'other %di' > M/t/probes/e", denied},
		{"echo 'other %di' >> M/t/probes/e", denied},
		{"touch -c M/t/probes/e", notPermitted},
		{"rm M/t/probes/e", notPermitted},
		{"ln -s /usr/bin/passwd M/passwd", notPermitted},
		{"ln -s /lib/x86_64-linux-gnu/libc.so.6 M/libc", notPermitted},
		{"echo 'getenv s=+0(%di)' > M/t/probes/getenv", denied},
		{"rmdir M/t", notPermitted},
		{": > M/t/records", denied},
		{"truncate -s 0 M/t/records", denied},
		{"touch -c M/t/records", notPermitted},
	}
	for _, who := range []struct {
		name string
		attr *syscall.SysProcAttr
	}{{"nobody", other}, {"nobody in the readers group", reader}, {"nobody with CAP_DAC_OVERRIDE", dacOverride}} {
		for _, c := range changes {
			want := denied // the kernel's, by the modes
			if who.attr == dacOverride {
				want = c.dacWant
			}
			if out, err := shellAs(who.attr, mnt(c.cmdline)); err == nil || !strings.Contains(out, want) {
				t.Errorf("%s: %s: %v %q, want %s", who.name, mnt(c.cmdline), err, out, want)
			}
		}
	}
	if got := uprobeLines(t, m.group()); !slices.Equal(got, installed) {
		t.Errorf("uprobe_events of the mount after the refused attempts: %q, want %q", got, installed)
	}
	for _, s := range []string{"passwd", "libc"} {
		if got := uprobeLines(t, s); len(got) != 0 {
			t.Errorf("uprobe_events has probes on %s: %q", s, got)
		}
	}
	if got := m.probeText("t", "e"); got != probeText {
		t.Errorf("probe e after the refused attempts: %q, want %q", got, probeText)
	}
	if got := lines(m.read("t", "records")); !slices.Equal(got, records) {
		t.Errorf("records after the refused attempts: %q, want %q", got, records)
	}
	if names, err := os.ReadDir(m.dir); err != nil || len(names) != 2 {
		t.Errorf("root after the refused attempts: %v %v, want status and t", names, err)
	}

	// Root, the mounting user, does all of it. Writing to records is
	// refused with EPERM; ln -s onto the existing target t with EEXIST.
	for _, c := range []struct{ cmdline, want string }{
		{"echo x > M/t/records", notPermitted},
		{"echo x >> M/t/records", notPermitted},
		{"ln -s " + bin + " M/t", "File exists"},
	} {
		if out, err := shell(mnt(c.cmdline)); err == nil || !strings.Contains(out, c.want) {
			t.Errorf("root: %s: %v %q, want %s", mnt(c.cmdline), err, out, c.want)
		}
	}
	for _, cmdline := range []string{
		"echo 'other a=%di' > M/t/probes/e",
		"echo 'target a=%di' > M/t/probes/x",
		"rm M/t/probes/x",
		"ln -s " + bin + " M/u",
		"echo 'target b=%si' > M/u/probes/y",
		"rmdir M/u",
		": > M/t/records",
	} {
		if out, err := shell(mnt(cmdline)); err != nil {
			t.Errorf("root: %s: %v %s\n%s", mnt(cmdline), err, out, m.log)
		}
	}
	got := uprobeLines(t, m.group())
	if len(got) != 1 || !strings.Contains(got[0], m.group()+"t/e") || slices.Equal(got, installed) {
		t.Errorf("uprobe_events after root's changes: %q, want only e, moved to other", got)
	}
	if s := m.read("t", "records"); s != "" {
		t.Errorf("records after root's : > records: %q", s)
	}
}

// TestReadersFlag checks that `ptfs mount --help` documents --readers and
// that a group that does not exist is refused before anything is mounted.
func TestReadersFlag(t *testing.T) {
	var stdout, stderr strings.Builder
	run([]string{"mount", "-h"}, &stdout, &stderr)
	if !strings.Contains(stderr.String(), "-readers GROUP") {
		t.Errorf("mount -h does not show --readers:\n%s", stderr.String())
	}
	stderr.Reset()
	dir := t.TempDir()
	if code := run([]string{"mount", "--readers=no-such-group-ptfs", dir}, &stdout, &stderr); code != 2 {
		t.Errorf("mount with an unknown readers group: exit %d, want 2", code)
	}
	if !strings.Contains(stderr.String(), `--readers: bad group: "no-such-group-ptfs"`) {
		t.Errorf("mount with an unknown readers group says %q", stderr.String())
	}
}
