// Package testkit holds what the tests of several packages need: the shared
// corpus, C test programs built with gcc, reference harnesses run beside a
// benchmark, and function offsets read from ELF files independently of the
// probes package.
package testkit

import (
	"bufio"
	"compress/gzip"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Unavailable stops a test that lacks something of its environment (root,
// FUSE, tracefs, gcc, libipt, the corpus): it skips, except when the CI
// variable is set, where the run must not pass by skipping, so it fails.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set, so this cannot be skipped: "+format, args...)
	}
	t.Skipf(format, args...)
}

// CPUTime is the CPU time the process used so far: on a machine shared
// with other work a benchmark that reports it measures its code, where wall
// time measures the load too.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Root returns the repository root: the nearest directory above the test's
// working directory that holds go.mod.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// CorpusPath returns where the reference corpus should be: $PTFS_CORPUS,
// else ../shared/corpus beside the repository.
func CorpusPath(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("PTFS_CORPUS"); dir != "" {
		return dir
	}
	return filepath.Join(Root(t), "..", "shared", "corpus")
}

// Corpus returns the reference corpus directory (CorpusPath). Without it, the
// test is Unavailable.
func Corpus(t testing.TB) string {
	t.Helper()
	dir := CorpusPath(t)
	if _, err := os.Stat(dir); err != nil {
		Unavailable(t, "corpus absent at %s (set PTFS_CORPUS): %v", dir, err)
	}
	return dir
}

// BuildC compiles the C file src (relative to the test's directory) with
// gcc -O2 and flags into the test's temp dir and returns the binary. It
// is Unavailable without gcc.
func BuildC(t testing.TB, src string, flags ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		Unavailable(t, "gcc not found: cannot build the test program")
	}
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".c"))
	args := append([]string{"-O2", "-o", out, src}, flags...)
	if b, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return out
}

// PlantProbe writes line to uprobe_events in the tracefs at dir from a
// child process, as a process that died since would have left it: the
// test's process has no record of making it. The caller removes it.
func PlantProbe(t testing.TB, dir, line string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", `printf '%s\n' "$1" >> "$2"`, "sh", line, filepath.Join(dir, "uprobe_events"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("plant %q: %v: %s", line, err, out)
	}
}

// FuncOffset returns the file offset of function sym in the ELF file bin,
// through the PT_LOAD segment that maps it.
func FuncOffset(t testing.TB, bin, sym string) uint64 {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	for _, s := range syms {
		if s.Name != sym || elf.ST_TYPE(s.Info) != elf.STT_FUNC {
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && s.Value >= p.Vaddr && s.Value < p.Vaddr+p.Filesz {
				return s.Value - p.Vaddr + p.Off
			}
		}
	}
	t.Fatalf("%s: no function %s", bin, sym)
	return 0
}

// Harness starts the reference program bin with args, one that answers each
// line on its stdin with one line on stdout (the libipt harnesses' bench
// modes), and returns a function that sends a request line and returns the
// answer without its newline. The program's stdin is closed and it is
// waited for when the test ends.
func Harness(t testing.TB, bin string, args ...string) func(req string) string {
	t.Helper()
	ask, _ := HarnessPID(t, bin, args...)
	return ask
}

// HarnessPID is Harness that also returns the program's pid, for a
// benchmark that reads its CPU time.
func HarnessPID(t testing.TB, bin string, args ...string) (ask func(req string) string, pid int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	out := bufio.NewReader(outPipe)
	return func(req string) string {
		if _, err := io.WriteString(in, req+"\n"); err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		line, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: no answer: %v", bin, err)
		}
		return strings.TrimSuffix(line, "\n")
	}, cmd.Process.Pid
}

// ReadGzip returns the uncompressed contents of the gzipped file at path.
func ReadGzip(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	data, err := io.ReadAll(z)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return data
}

// GzipLines returns the lines of the gzipped text file at path, without
// their newlines.
func GzipLines(t testing.TB, path string) []string {
	t.Helper()
	return strings.Split(strings.TrimSuffix(string(ReadGzip(t, path)), "\n"), "\n")
}

// ReadStream reads a stream's reader (stream.Reader: ReadAt gives whole
// lines and io.EOF at the end, never blocking) from offset 0 to its end.
func ReadStream(t testing.TB, r interface {
	ReadAt(p []byte, off int64) (int, error)
}) []byte {
	t.Helper()
	var out []byte
	buf := make([]byte, 64<<10)
	for off := int64(0); ; {
		n, err := r.ReadAt(buf, off)
		out = append(out, buf[:n]...)
		off += int64(n)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// PTSysfs returns a sysfs root in a temp dir whose intel_pt PMU is the tree
// of a PTWRITE-capable machine (perfio/testdata/sysfs-intel_pt), for tests
// of Intel PT capture without the hardware.
func PTSysfs(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	dst := filepath.Join(root, "bus", "event_source", "devices", "intel_pt")
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(dst, os.DirFS(filepath.Join(Root(t), "perfio", "testdata", "sysfs-intel_pt"))); err != nil {
		t.Fatal(err)
	}
	return root
}

// Repeat calls f over and over in a goroutine of its own until stop is
// called (a reader racing a change); stop returns once f has returned.
func Repeat(f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
			}
			f()
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// Bounded runs f on a goroutine locked to a thread of its own and fails t
// when f has not returned once that thread used cpu of CPU time (schedstat's
// first field), or after a minute in all: code that cannot block hangs by
// spinning, which shows as CPU time, where a wall-clock bound measures the
// machine's load too (a fuzz worker beside other work waits on a run queue
// for seconds). f keeps running after a failure.
func Bounded(t testing.TB, cpu time.Duration, what string, f func()) {
	t.Helper()
	type thread struct {
		stat string
		base time.Duration // the thread's CPU time before f
	}
	began := make(chan thread, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		th := thread{stat: "/proc/self/task/" + strconv.Itoa(syscall.Gettid()) + "/schedstat"}
		th.base = threadCPU(th.stat)
		began <- th
		f()
		close(done)
	}()
	th := <-began
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for start := time.Now(); ; {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if used := threadCPU(th.stat) - th.base; used > cpu || time.Since(start) > time.Minute {
			t.Fatalf("%s did not end within %v of CPU time (%v used, %v since it began)",
				what, cpu, used, time.Since(start).Round(time.Millisecond))
		}
	}
}

// threadCPU is the CPU time of the thread whose schedstat file is at path
// (its first field); 0 when it cannot be read.
func threadCPU(path string) time.Duration {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	ns, _ := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(ns)
}

// RunDelays returns how long each thread of this process has waited on a
// run queue so far (schedstat's second field), by thread id.
func RunDelays() map[string]time.Duration {
	paths, _ := filepath.Glob("/proc/self/task/*/schedstat")
	d := make(map[string]time.Duration, len(paths))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		if f := strings.Fields(string(data)); len(f) >= 2 {
			if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				d[filepath.Base(filepath.Dir(p))] = time.Duration(ns)
			}
		}
	}
	return d
}

// MaxWaitSince returns the longest any thread of this process has waited
// on a run queue since before was taken (RunDelays): how long the machine
// kept a runnable thread of the test off the CPU, at most.
func MaxWaitSince(before map[string]time.Duration) time.Duration {
	var longest time.Duration
	for tid, now := range RunDelays() {
		longest = max(longest, now-before[tid])
	}
	return longest
}

// TotalWait returns how long the threads of this process waited on a run
// queue, added up, from before to after (two RunDelays): a goroutine moves
// between threads, so its waits may be any of theirs.
func TotalWait(before, after map[string]time.Duration) time.Duration {
	var total time.Duration
	for tid, d := range after {
		total += d - before[tid]
	}
	return total
}

// WaitFor polls cond until it holds and fails the test after limit with
// what and the text cond returned last.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() (string, bool)) {
	t.Helper()
	for deadline := time.Now().Add(limit); ; time.Sleep(10 * time.Millisecond) {
		text, ok := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last seen:\n%s", what, limit, text)
		}
	}
}
