package fs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"ptfs/internal/testkit"
	"ptfs/stream"
)

var (
	fuseOnce   sync.Once
	fuseReason string
)

// requireFUSE skips when this process cannot mount FUSE; checked once.
func requireFUSE(t testing.TB) {
	t.Helper()
	fuseOnce.Do(func() {
		if os.Geteuid() != 0 {
			fuseReason = "FUSE tests mount with the mount syscall and need root"
			return
		}
		f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
		if err != nil {
			fuseReason = fmt.Sprintf("FUSE tests need /dev/fuse: %v", err)
			return
		}
		f.Close()
	})
	if fuseReason != "" {
		testkit.Unavailable(t, "%s", fuseReason)
	}
}

// mountFake mounts tr in a temporary directory, owned by this process's
// user, and unmounts it when the test ends, whatever its outcome.
func mountFake(t testing.TB, tr *fakeTracer) string {
	t.Helper()
	return mountFakeWith(t, tr, Options{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())})
}

// mountFakeWith is mountFake with options.
func mountFakeWith(t testing.TB, tr *fakeTracer, opts Options) string {
	t.Helper()
	requireFUSE(t)
	dir := t.TempDir()
	opts.Debug = os.Getenv("PTFS_FUSE_DEBUG") != ""
	srv, err := Mount(dir, tr, opts)
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount %s: %v; detaching", dir, err)
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("detach %s: %v", dir, err)
			}
			return
		}
		srv.Wait()
	})
	return dir
}

// sh runs a shell command line with a deadline and returns its combined
// output and error.
func sh(t *testing.T, script string) (string, error) {
	t.Helper()
	return shWith(t, nil, script)
}

// shWith is sh with attributes of the process (credentials).
func shWith(t *testing.T, attr *syscall.SysProcAttr, script string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.SysProcAttr = attr
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%q timed out", script)
	}
	return string(out), err
}

// mustSh runs a shell command line that must succeed.
func mustSh(t *testing.T, script string) string {
	t.Helper()
	out, err := sh(t, script)
	if err != nil {
		t.Fatalf("%q: %v\n%s", script, err, out)
	}
	return out
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("ReadDir %s: %v", dir, err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestTree(t *testing.T) {
	ft := newFakeTarget("t", "/usr/bin/true")
	mnt := mountFake(t, newFakeTracer(ft))

	if got, want := names(t, mnt), []string{"status", "t"}; !slices.Equal(got, want) {
		t.Errorf("root lists %v, want %v", got, want)
	}
	want := []string{"branches", "exe", "probes", "records", "status", "symbols"}
	if got := names(t, filepath.Join(mnt, "t")); !slices.Equal(got, want) {
		t.Errorf("target lists %v, want %v", got, want)
	}
	if got := names(t, filepath.Join(mnt, "t/probes")); len(got) != 0 {
		t.Errorf("probes/ lists %v, want nothing", got)
	}
	if l, err := os.Readlink(filepath.Join(mnt, "t/exe")); err != nil || l != "/usr/bin/true" {
		t.Errorf("readlink exe = %q, %v", l, err)
	}

	types := []struct {
		path string
		mode os.FileMode
	}{
		{"t", os.ModeDir | 0o755},
		{"t/probes", os.ModeDir | 0o700},
		{"t/exe", os.ModeSymlink | 0o777},
		{"t/records", 0o600},
		{"t/branches", 0o600},
		{"t/status", 0o444},
		{"t/symbols", 0o444},
		{"status", 0o444},
	}
	for _, tc := range types {
		fi, err := os.Lstat(filepath.Join(mnt, tc.path))
		if err != nil {
			t.Errorf("lstat %s: %v", tc.path, err)
			continue
		}
		if fi.Mode() != tc.mode {
			t.Errorf("%s mode %v, want %v", tc.path, fi.Mode(), tc.mode)
		}
	}

	// cat and grep work on the generated files, and stat reports the
	// size cat reads.
	if got := mustSh(t, "cat "+mnt+"/status"); got != "mode: classic\ntargets: 1\n" {
		t.Errorf("cat status = %q", got)
	}
	if got := mustSh(t, "grep -c 'f(int)' "+mnt+"/t/symbols"); got != "1\n" {
		t.Errorf("grep symbols = %q", got)
	}
	st := mustSh(t, "cat "+mnt+"/t/status")
	if !strings.HasPrefix(st, "target: t\n") {
		t.Errorf("cat t/status = %q", st)
	}
	fi, err := os.Stat(filepath.Join(mnt, "t/status"))
	if err != nil || fi.Size() != int64(len(st)) {
		t.Errorf("stat t/status size = %v, %v; want %d", fi.Size(), err, len(st))
	}
	if _, err := os.OpenFile(filepath.Join(mnt, "status"), os.O_WRONLY, 0); !errors.Is(err, syscall.EACCES) {
		t.Errorf("open status for write: %v, want EACCES", err)
	}

	// An engine error reaches the reader as its errno.
	ft.mu.Lock()
	ft.symbolsOK = false
	ft.mu.Unlock()
	if _, err := os.ReadFile(filepath.Join(mnt, "t/symbols")); !errors.Is(err, syscall.ENOEXEC) {
		t.Errorf("read symbols with a failing engine: %v, want ENOEXEC", err)
	}
	if fi, err := os.Stat(filepath.Join(mnt, "t/symbols")); err != nil || fi.Size() != 0 {
		t.Errorf("stat symbols with a failing engine: %v %v, want size 0", fi, err)
	}
}

// TestFixedEntries checks that nothing the mount defines can be removed,
// renamed or joined by new files.
func TestFixedEntries(t *testing.T) {
	mnt := mountFake(t, newFakeTracer(newFakeTarget("t", "/usr/bin/true")))
	p := func(s string) string { return filepath.Join(mnt, s) }
	tests := []struct {
		name string
		op   func() error
		want syscall.Errno
	}{
		{"rm status", func() error { return syscall.Unlink(p("status")) }, syscall.EPERM},
		{"rmdir status", func() error { return syscall.Rmdir(p("status")) }, syscall.ENOTDIR},
		{"rm target dir", func() error { return syscall.Unlink(p("t")) }, syscall.EISDIR},
		{"rm records", func() error { return syscall.Unlink(p("t/records")) }, syscall.EPERM},
		{"rm exe", func() error { return syscall.Unlink(p("t/exe")) }, syscall.EPERM},
		{"rm symbols", func() error { return syscall.Unlink(p("t/symbols")) }, syscall.EPERM},
		{"rmdir probes", func() error { return syscall.Rmdir(p("t/probes")) }, syscall.EPERM},
		{"rm missing", func() error { return syscall.Unlink(p("t/nothing")) }, syscall.ENOENT},
		{"rename records", func() error { return os.Rename(p("t/records"), p("t/r2")) }, syscall.EPERM},
		{"rename target", func() error { return os.Rename(p("t"), p("u")) }, syscall.EPERM},
		{"create in target", func() error { return mkfile(p("t/new")) }, syscall.EPERM},
		{"create in root", func() error { return mkfile(p("new")) }, syscall.EPERM},
		{"mkdir in root", func() error { return os.Mkdir(p("d"), 0o755) }, syscall.EPERM},
		{"mkdir in target", func() error { return os.Mkdir(p("t/d"), 0o755) }, syscall.EPERM},
		{"mkdir in probes", func() error { return os.Mkdir(p("t/probes/d"), 0o755) }, syscall.EPERM},
		{"symlink in target", func() error { return os.Symlink("/x", p("t/l")) }, syscall.EPERM},
		// `ln -s /usr/bin/passwd MNT/t` with t a target makes t/passwd.
		{"ln -s into a target", func() error { return os.Symlink("/usr/bin/passwd", p("t/passwd")) }, syscall.EEXIST},
		{"symlink onto records", func() error { return os.Symlink("/x", p("t/records")) }, syscall.EEXIST},
		{"symlink in probes", func() error { return os.Symlink("/x", p("t/probes/l")) }, syscall.EPERM},
		{"chmod records", func() error { return os.Chmod(p("t/records"), 0o600) }, syscall.EPERM},
		{"truncate records to 5", func() error { return os.Truncate(p("t/records"), 5) }, syscall.EINVAL},
		{"truncate status", func() error { return os.Truncate(p("t/status"), 0) }, syscall.EACCES},
		{"write records", func() error { return appendFile(p("t/records"), "x\n") }, syscall.EPERM},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.op(); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	want := []string{"branches", "exe", "probes", "records", "status", "symbols"}
	if got := names(t, p("t")); !slices.Equal(got, want) {
		t.Errorf("after the attempts target lists %v, want %v", got, want)
	}
}

func mkfile(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// TestTargets adds a target with ln -s and removes it with rmdir.
func TestTargets(t *testing.T) {
	tr := newFakeTracer()
	mnt := mountFake(t, tr)

	mustSh(t, "ln -s /usr/bin/env "+mnt+"/env")
	fi, err := os.Stat(filepath.Join(mnt, "env"))
	if err != nil || !fi.IsDir() {
		t.Fatalf("after ln -s, env is %v, %v; want a directory", fi, err)
	}
	if fi, err := os.Lstat(filepath.Join(mnt, "env")); err != nil || !fi.IsDir() {
		t.Fatalf("after ln -s, lstat env is %v, %v; want a directory", fi, err)
	}
	if got, want := mustSh(t, "ls "+mnt+"/env/"), "branches\nexe\nprobes\nrecords\nstatus\nsymbols\n"; got != want {
		t.Errorf("ls env/ = %q, want %q", got, want)
	}
	if l, err := os.Readlink(filepath.Join(mnt, "env/exe")); err != nil || l != "/usr/bin/env" {
		t.Errorf("readlink env/exe = %q, %v", l, err)
	}
	if got, want := names(t, mnt), []string{"env", "status"}; !slices.Equal(got, want) {
		t.Errorf("root lists %v, want %v", got, want)
	}

	// A second ln on the same name, and an engine refusal.
	if out, err := sh(t, "ln -sT /usr/bin/env "+mnt+"/env"); err == nil || !strings.Contains(out, "File exists") {
		t.Errorf("second ln -sT: %v %q, want File exists", err, out)
	}
	// Without -T, ln makes env/env inside the existing target.
	if out, err := sh(t, "ln -s /usr/bin/env "+mnt+"/env"); err == nil || !strings.Contains(out, "File exists") {
		t.Errorf("second ln -s: %v %q, want File exists", err, out)
	}
	if out, err := sh(t, "ln -s relative/path "+mnt+"/bad"); err == nil || !strings.Contains(out, "No such file or directory") {
		t.Errorf("ln -s to a path the engine refuses: %v %q, want ENOENT", err, out)
	}
	if _, err := os.Lstat(filepath.Join(mnt, "bad")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("refused target exists: %v", err)
	}

	// Plain rm never reaches the file system for a directory (coreutils
	// refuses it itself); rmdir removes the target.
	mustSh(t, "rmdir "+mnt+"/env")
	if _, err := os.Lstat(filepath.Join(mnt, "env")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("after rmdir, lstat env: %v, want ENOENT", err)
	}
	if got := names(t, mnt); !slices.Equal(got, []string{"status"}) {
		t.Errorf("after rmdir root lists %v", got)
	}
	added, removed := tr.calls()
	if want := []string{"env=/usr/bin/env", "bad=relative/path"}; !slices.Equal(added, want) {
		t.Errorf("AddTarget calls %v, want %v", added, want)
	}
	if want := []string{"env"}; !slices.Equal(removed, want) {
		t.Errorf("RemoveTarget calls %v, want %v", removed, want)
	}

	// The name can be used again.
	mustSh(t, "ln -s /usr/bin/true "+mnt+"/env && test -d "+mnt+"/env/probes")
	if l, err := os.Readlink(filepath.Join(mnt, "env/exe")); err != nil || l != "/usr/bin/true" {
		t.Errorf("readlink env/exe after re-adding = %q, %v", l, err)
	}
}

// TestProbes drives probe files through bash, as users do.
func TestProbes(t *testing.T) {
	ft := newFakeTarget("t", "/usr/bin/true")
	mnt := mountFake(t, newFakeTracer(ft))
	probes := filepath.Join(mnt, "t/probes")

	mustSh(t, "echo '0x1040 %di %si' > "+probes+"/e")
	if got := ft.lastSet(); got != "e=0x1040 %di %si" {
		t.Errorf("SetProbe got %q", got)
	}
	if got, want := mustSh(t, "cat "+probes+"/e"), "0x1040 %di %si\n# installed\n"; got != want {
		t.Errorf("cat probes/e = %q, want %q", got, want)
	}
	if got := names(t, probes); !slices.Equal(got, []string{"e"}) {
		t.Errorf("probes/ lists %v", got)
	}

	// Overwriting with a bad spec fails in echo and keeps the working probe.
	out, err := sh(t, "echo bogus > "+probes+"/e")
	if err == nil || !strings.Contains(out, "Invalid argument") {
		t.Errorf("echo bad spec: %v %q, want a write error with Invalid argument", err, out)
	}
	if got := ft.lastSet(); got != "e=bogus" {
		t.Errorf("SetProbe got %q", got)
	}
	if p := ft.probe("e"); p.spec != "0x1040 %di %si" {
		t.Errorf("working spec after bad overwrite = %q", p.spec)
	}
	text := mustSh(t, "cat "+probes+"/e")
	if !strings.HasPrefix(text, "0x1040 %di %si\n") || !strings.Contains(text, "# refused: \"bogus\": offset must start with 0x") {
		t.Errorf("cat probes/e after bad overwrite = %q", text)
	}

	// `: >` truncates without writing: the probe stays.
	mustSh(t, ": > "+probes+"/e")
	if p := ft.probe("e"); p.spec != "0x1040 %di %si" {
		t.Errorf("working spec after : > = %q", p.spec)
	}

	// A good overwrite replaces it; >> writes the spec too.
	mustSh(t, "echo 0x1050 > "+probes+"/e")
	if p := ft.probe("e"); p.spec != "0x1050" || p.refused != "" {
		t.Errorf("after good overwrite probe = %+v", p)
	}
	mustSh(t, "echo 0x1060 %ax >> "+probes+"/f")
	if p := ft.probe("f"); p.spec != "0x1060 %ax" {
		t.Errorf("after >> probe f = %+v", p)
	}

	// Each errno of the engine reaches the writer.
	errnos := []struct {
		spec, msg string
	}{
		{"nonsense", "Invalid argument"},
		{"0xdead %di", "Operation not supported"},
		{"", "Invalid argument"},
	}
	for _, tc := range errnos {
		out, err := sh(t, fmt.Sprintf("echo '%s' > %s/g", tc.spec, probes))
		if err == nil || !strings.Contains(out, tc.msg) {
			t.Errorf("echo %q: %v %q, want %s", tc.spec, err, out, tc.msg)
		}
	}
	// A new probe with a bad spec exists and shows why.
	if got := mustSh(t, "cat "+probes+"/g"); !strings.HasPrefix(got, "# refused: ") {
		t.Errorf("cat refused probe = %q", got)
	}
	// Several writes in one open: the pending text accumulates.
	mustSh(t, "{ printf '0x10'; printf '70 %%di\\n'; } > "+probes+"/h")
	if p := ft.probe("h"); p.spec != "0x1070 %di" {
		t.Errorf("after two writes probe h = %+v", p)
	}
	// The engine refuses a name.
	if out, err := sh(t, "echo 0x1 > "+probes+"/.hidden"); err == nil || !strings.Contains(out, "Invalid argument") {
		t.Errorf("create refused name: %v %q", err, out)
	}

	if got, want := names(t, probes), []string{"e", "f", "g", "h"}; !slices.Equal(got, want) {
		t.Errorf("probes/ lists %v, want %v", got, want)
	}
	mustSh(t, "rm "+probes+"/e")
	if _, err := os.Stat(filepath.Join(probes, "e")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("after rm, stat probes/e: %v", err)
	}
	if err := syscall.Unlink(filepath.Join(probes, "e")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("second rm: %v, want ENOENT", err)
	}
	// mv renames the probe (the engine's RenameProbe); renaming over an
	// existing one with RENAME_NOREPLACE is EEXIST.
	if err := os.Rename(filepath.Join(probes, "f"), filepath.Join(probes, "f2")); err != nil {
		t.Errorf("rename probe: %v", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(probes, "f2"), unix.AT_FDCWD, filepath.Join(probes, "g"), unix.RENAME_NOREPLACE); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("rename probe over another with RENAME_NOREPLACE: %v, want EEXIST", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(probes, "f2"), unix.AT_FDCWD, filepath.Join(probes, "g"), unix.RENAME_EXCHANGE); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("RENAME_EXCHANGE of probes: %v, want EINVAL", err)
	}
	if got, want := names(t, probes), []string{"f2", "g", "h"}; !slices.Equal(got, want) {
		t.Errorf("probes/ lists %v, want %v", got, want)
	}
}

// lineReader delivers the lines a process prints.
func lineReader(r io.Reader) <-chan string {
	ch := make(chan string, 100)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

func expectLines(t *testing.T, ch <-chan string, want ...string) {
	t.Helper()
	// tail -f polls FUSE files once a second; a loaded machine or the
	// race detector may take some more.
	deadline := time.After(10 * time.Second)
	for _, w := range want {
		select {
		case got, ok := <-ch:
			if !ok {
				t.Fatalf("output ended, want %q", w)
			}
			if got != w {
				t.Fatalf("got line %q, want %q", got, w)
			}
		case <-deadline:
			t.Fatalf("no line %q within 10 s", w)
		}
	}
}

// startTail runs a real GNU tail -f on path and kills it (by its PID) when
// the test ends.
func startTail(t *testing.T, path string) (*exec.Cmd, <-chan string, <-chan string) {
	t.Helper()
	cmd := exec.Command("tail", "-n", "+1", "-f", path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start tail: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, lineReader(stdout), lineReader(stderr)
}

// TestRecordsTail follows records with a real tail -f while the engine
// appends, then truncates with `: >`.
func TestRecordsTail(t *testing.T) {
	ft := newFakeTarget("t", "/usr/bin/true")
	mnt := mountFake(t, newFakeTracer(ft))
	records := filepath.Join(mnt, "t/records")

	ft.records.Append([]byte("record 1: a\n"))
	if fi, err := os.Stat(records); err != nil || fi.Size() != 12 {
		t.Fatalf("stat records before any open: %v %v, want size 12", fi, err)
	}
	_, out, errs := startTail(t, records)
	expectLines(t, out, "record 1: a")
	ft.records.Append([]byte("record 2: b\nrecord 3: c\n"))
	expectLines(t, out, "record 2: b", "record 3: c")
	for i := 4; i < 100; i++ {
		ft.records.Append(fmt.Appendf(nil, "record %d: x\n", i))
	}
	for i := 4; i < 100; i++ {
		expectLines(t, out, fmt.Sprintf("record %d: x", i))
	}

	// tail without +N seeks from the end, trusting st_size.
	if got := mustSh(t, "tail -n 2 "+records); got != "record 98: x\nrecord 99: x\n" {
		t.Errorf("tail -n 2 records = %q", got)
	}
	fi, err := os.Stat(records)
	if err != nil || fi.Size() != ft.records.Size() {
		t.Fatalf("stat records: %v %v, want size %d", fi, err, ft.records.Size())
	}
	mustSh(t, ": > "+records)
	if ft.records.Size() != 0 {
		t.Fatalf(": > records left %d bytes", ft.records.Size())
	}
	if fi, err := os.Stat(records); err != nil || fi.Size() != 0 {
		t.Fatalf("stat after : > records: %v %v", fi, err)
	}
	select {
	case msg := <-errs:
		if !strings.Contains(msg, "file truncated") {
			t.Errorf("tail stderr %q, want file truncated", msg)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("tail did not notice the truncation within 10 s")
	}
	ft.records.Append([]byte("record 1: after\n"))
	expectLines(t, out, "record 1: after")
	if got := mustSh(t, "cat "+records); got != "record 1: after\n" {
		t.Errorf("cat records = %q", got)
	}
	// truncate(2) on the name, without an open file, empties it too.
	if err := os.Truncate(records, 0); err != nil || ft.records.Size() != 0 {
		t.Errorf("truncate records: %v, size %d", err, ft.records.Size())
	}
}

// testStream returns a stream with bounds limit and hard (0: default)
// whose spill file is released when the test ends.
func testStream(t testing.TB, limit, hard int64) *stream.Stream {
	s := stream.New(stream.Options{Limit: limit, HardLimit: hard, Dir: t.TempDir()})
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// TestRecordsBound checks the bound with a real tail -f (DESIGN §2): what
// an open reader has not read is kept beyond the soft bound, a new reader
// gets the window, and past the hard bound tail prints a gap line that
// counts exactly the records it missed, never a spliced line, and never
// takes the gap for a truncation.
func TestRecordsBound(t *testing.T) {
	ft := newFakeTarget("t", "/usr/bin/true")
	ft.records = testStream(t, 256, 1) // hard bound: 2*256+64 bytes
	mnt := mountFake(t, newFakeTracer(ft))
	records := filepath.Join(mnt, "t/records")
	rec := func(i int) string { return fmt.Sprintf("record %d: event=ptfs_t/e args=[%d]", i, i) }

	// Under the hard bound, tail -f misses nothing though its poll lags.
	_, out, errs := startTail(t, records)
	for wait := time.Now(); ft.records.Stats().Readers == 0; time.Sleep(5 * time.Millisecond) {
		if time.Since(wait) > 10*time.Second { // starting tail on a loaded machine
			t.Fatal("tail did not open records within 10 s")
		}
	}
	for i := 1; i <= 12; i++ {
		ft.records.Append([]byte(rec(i) + "\n"))
	}
	for i := 1; i <= 12; i++ {
		expectLines(t, out, rec(i))
	}
	if st := ft.records.Stats(); st.Size <= 256 || st.Unread != 0 {
		t.Fatalf("setup: size %d, unread discarded %d", st.Size, st.Unread)
	}
	// A new reader gets a gap line for what went before the window, then
	// the window's whole lines.
	cat := mustSh(t, "cat "+records)
	gap := fmt.Sprintf("lost: records=%d reason=bound\n", ft.records.Stats().Discarded)
	if rest, ok := strings.CutPrefix(cat, gap); !ok || !strings.HasSuffix(cat, rec(12)+"\n") ||
		!strings.HasPrefix(rest, "record ") || len(rest) > 256 {
		t.Errorf("cat records = %q, want %q and the window's whole lines", cat, gap)
	}

	// Past the hard bound between two polls of tail: a gap line.
	const total = 200
	for i := 13; i <= total; i++ {
		ft.records.Append([]byte(rec(i) + "\n"))
	}
	// The deadline moves while tail prints: it polls once a second, and
	// a loaded machine delays it more.
	next, missed := 13, 0
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for next <= total {
		select {
		case l := <-out:
			if n, ok := strings.CutPrefix(l, "lost: records="); ok {
				v, err := strconv.Atoi(strings.TrimSuffix(n, " reason=bound"))
				if err != nil {
					t.Fatalf("gap line %q", l)
				}
				missed += v
				next += v
				deadline.Reset(10 * time.Second)
				continue
			}
			if l != rec(next) {
				t.Fatalf("tail printed %q, want %q (a gap line must explain any jump)", l, rec(next))
			}
			next++
			deadline.Reset(10 * time.Second)
		case msg := <-errs:
			t.Fatalf("tail: %s", msg)
		case <-deadline.C:
			t.Fatalf("tail stopped at record %d of %d", next, total)
		}
	}
	st := ft.records.Stats()
	if missed == 0 || uint64(missed) != st.Unread {
		t.Errorf("tail missed %d records, status counts %d unread", missed, st.Unread)
	}
	if next != total+1 {
		t.Errorf("tail's lines and gaps end at record %d, want %d", next-1, total)
	}
	// The stream stops; tail must not take its position for a truncation.
	select {
	case msg := <-errs:
		t.Errorf("tail: %s", msg)
	case l := <-out:
		t.Errorf("tail printed %q after the end", l)
	case <-time.After(1500 * time.Millisecond):
	}
}

func TestBranches(t *testing.T) {
	nopt := newFakeTarget("nopt", "/usr/bin/true")
	pt := newFakeTarget("pt", "/usr/bin/env")
	pt.branches = testStream(t, 1<<10, 0)
	pt.branches.Append([]byte("branch: 0x1 [unknown] => 0x2 [unknown]\n"))
	mnt := mountFake(t, newFakeTracer(nopt, pt))

	_, err := os.Open(filepath.Join(mnt, "nopt/branches"))
	if !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("open branches without PT: %v, want EOPNOTSUPP", err)
	}
	if out, err := sh(t, "cat "+mnt+"/nopt/branches"); err == nil || !strings.Contains(out, "Operation not supported") {
		t.Errorf("cat branches without PT: %v %q", err, out)
	}
	if got := mustSh(t, "cat "+mnt+"/pt/branches"); got != "branch: 0x1 [unknown] => 0x2 [unknown]\n" {
		t.Errorf("cat branches = %q", got)
	}
	// Release reaches the engine after close; the kernel sends it
	// asynchronously, late on a loaded machine.
	testkit.WaitFor(t, 10*time.Second, "branches opened and closed once", func() (string, bool) {
		opened, closed := pt.branchCounts()
		return fmt.Sprintf("opened %d, closed %d times", opened, closed), opened == 1 && closed == 1
	})
}

// readPos returns the file position of process pid in path, or -1 while
// it has no such file open.
func readPos(pid int, path string) int64 {
	dir := fmt.Sprintf("/proc/%d/", pid)
	fds, _ := os.ReadDir(dir + "fd")
	for _, fd := range fds {
		if l, err := os.Readlink(dir + "fd/" + fd.Name()); err != nil || l != path {
			continue
		}
		info, err := os.ReadFile(dir + "fdinfo/" + fd.Name())
		if err != nil {
			return -1
		}
		pos, _ := strings.CutPrefix(strings.SplitN(string(info), "\n", 2)[0], "pos:")
		n, err := strconv.ParseInt(strings.TrimSpace(pos), 10, 64)
		if err != nil {
			return -1
		}
		return n
	}
	return -1
}

// TestKilledReader kills a reader in the middle of a large read and checks
// that the mount still answers and unmounts.
func TestKilledReader(t *testing.T) {
	ft := newFakeTarget("t", "/usr/bin/true")
	ft.records = testStream(t, 8<<20, 0)
	line := []byte(strings.Repeat("x", 99) + "\n")
	for ft.records.Size()+100 <= 8<<20 {
		ft.records.Append(line)
	}
	mnt := mountFake(t, newFakeTracer(ft))

	for range 3 {
		// dd with 1-byte reads takes seconds for 8 MiB.
		cmd := exec.Command("dd", "if="+filepath.Join(mnt, "t/records"), "of=/dev/null", "bs=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill dd once it is in the middle of the file.
		for wait := time.Now(); readPos(cmd.Process.Pid, filepath.Join(mnt, "t/records")) <= 0; time.Sleep(5 * time.Millisecond) {
			if time.Since(wait) > 10*time.Second { // starting dd on a loaded machine
				cmd.Process.Kill()
				t.Fatal("dd did not read records within 10 s")
			}
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err == nil {
			t.Fatal("dd finished before it was killed; the test proves nothing")
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := os.ReadFile(filepath.Join(mnt, "t/status"))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("read status after killed readers: %v", err)
		}
	case <-time.After(10 * time.Second): // a hang is forever; a loaded machine takes seconds
		t.Fatal("mount does not answer after a reader was killed")
	}
}

// BenchmarkRecordsRead reads 8 MiB of records through the mount, as cat
// does, to measure the FUSE read path.
func BenchmarkRecordsRead(b *testing.B) {
	ft := newFakeTarget("t", "/usr/bin/true")
	ft.records = testStream(b, 16<<20, 16<<20)
	line := []byte(strings.Repeat("x", 99) + "\n")
	for ft.records.Size()+100 <= 8<<20 {
		ft.records.Append(line)
	}
	mnt := mountFake(b, newFakeTracer(ft))
	path := filepath.Join(mnt, "t/records")
	buf := make([]byte, 128<<10)
	b.SetBytes(ft.records.Size())
	for b.Loop() {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		var total int64
		for {
			n, err := f.Read(buf)
			total += int64(n)
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		f.Close()
		if total != ft.records.Size() {
			b.Fatalf("read %d bytes, want %d", total, ft.records.Size())
		}
	}
}
