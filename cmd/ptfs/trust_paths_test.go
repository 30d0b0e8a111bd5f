package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"ptfs/internal/testkit"
)

// The attack: a target whose path carries a newline and a probe
// line. ptfs probes the file by its descriptor, so no evil line ever
// appears in uprobe_events, and the probe works on the hostile path.
func TestInjectionThroughTargetPath(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "load", "-no-pie")
	off := testkit.FuncOffset(t, bin, "target")
	// The file the injected line would probe exists, so a line that got
	// through would be created for real.
	victim := filepath.Join(t.TempDir(), "x", "load")
	copyExec(t, bin, victim)
	evil := fmt.Sprintf("p:evil/e %s:0x%x x=%%di", victim, off)
	hostile := fmt.Sprintf("%s:0x%x\n%s\n#/load", victim, off, evil)
	copyExec(t, bin, hostile)
	t.Cleanup(func() {
		for _, l := range uprobeLines(t, "p:evil/") {
			if strings.Contains(l, victim) {
				removeLine(t, l)
			}
		}
	})
	m := startMount(t)
	if out, err := shell("ln -s " + shellQuote(hostile) + " " + m.path("t")); err != nil {
		t.Fatalf("ln -s: %v: %s\n%s", err, out, m.log)
	}
	if link, err := os.Readlink(m.path("t", "exe")); err != nil || link != hostile {
		t.Errorf("exe -> %q, %v; want the hostile path", link, err)
	}
	m.setProbe("t", "e", "target %di %si")
	text := m.probeText("t", "e")
	if !strings.Contains(text, "# state: installed") || !strings.Contains(text, "/proc/"+strconv.Itoa(m.cmd.Process.Pid)+"/fd/") {
		t.Fatalf("probe file:\n%s", text)
	}
	if l := uprobeLines(t, "evil"); len(l) != 0 {
		t.Fatalf("injected lines in uprobe_events: %q", l)
	}
	mine := uprobeLines(t, m.group()+"t/e ")
	if len(mine) != 1 || !strings.Contains(mine[0], fmt.Sprintf(" /proc/%d/fd/", m.cmd.Process.Pid)) || strings.Contains(mine[0], victim) {
		t.Fatalf("the probe's uprobe_events lines: %q, want one on ptfs's descriptor", mine)
	}
	runProg(t, hostile, "5")
	checkRecords(t, m.waitLines(5, "t", "records"), "ptfs_t/e", 5)
	m.stop(syscall.SIGTERM)
	if l := uprobeLines(t, "evil"); len(l) != 0 {
		t.Fatalf("injected lines after the unmount: %q", l)
	}
}

// copyExec copies the executable src to dst, making dst's directories.
func copyExec(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// A rebuilt target: the probe follows a rebuild renamed over the path (the
// program still computes right, the records carry the right arguments),
// goes stale when the symbol is gone, and follows a rewrite in place.
func TestProbeFollowsRebuild(t *testing.T) {
	needKernel(t)
	orig := buildC(t, "moved", "orig")
	padded := buildC(t, "moved", "padded", "-DPAD")
	gone := buildC(t, "moved", "gone", "-DGONE")
	offOrig, offPad := testkit.FuncOffset(t, orig, "work"), testkit.FuncOffset(t, padded, "work")
	if offOrig == offPad {
		t.Fatalf("work is at 0x%x in both builds", offOrig)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "m")
	copyExec(t, orig, path)
	m := startMount(t, "m="+path)
	m.setProbe("m", "w", "work a=%di b=%si")
	total := 0
	// run runs the program (it exits 1 if its result is wrong) and checks
	// that n new records carry a=i, b=i+1.
	run := func(n int) {
		t.Helper()
		runProg(t, path, fmt.Sprint(n))
		got := m.waitLines(total+n, "m", "records")
		if len(got) != total+n {
			t.Fatalf("%d records, want %d:\n%s", len(got), total+n, strings.Join(got, "\n"))
		}
		for i, l := range got[total:] {
			if want := fmt.Sprintf("args=[a=%d, b=%d]", i, i+1); !strings.Contains(l, want) {
				t.Fatalf("record %q, want %s", l, want)
			}
		}
		total += n
	}
	// Following a file removes a probe and installs one: each may wait
	// seconds on the kernel's event_mutex.
	at := func(off uint64) {
		t.Helper()
		site := fmt.Sprintf("# site: work+0x0, file offset 0x%x,", off)
		m.waitUntil(fmt.Sprintf("the probe to be at 0x%x", off), func() (string, bool) {
			text := m.probeText("m", "w")
			l := uprobeLines(t, m.group()+"m/")
			return fmt.Sprintf("%s\nuprobe_events: %q", text, l), strings.Contains(text, "# state: installed") && strings.Contains(text, site) &&
				strings.Contains(text, fmt.Sprintf("# file: %s (", path)) && len(l) == 1 && strings.Contains(l[0], fmt.Sprintf(":0x%016x ", off))
		})
	}
	at(offOrig)
	run(3)

	tmp := filepath.Join(dir, ".m.tmp")
	copyExec(t, padded, tmp)
	if out, err := shell(fmt.Sprintf("mv %s %s", tmp, path)); err != nil {
		t.Fatalf("mv: %v: %s", err, out)
	}
	at(offPad)
	run(4)

	copyExec(t, gone, tmp)
	if out, err := shell(fmt.Sprintf("mv %s %s", tmp, path)); err != nil {
		t.Fatalf("mv: %v: %s", err, out)
	}
	m.waitUntil("the probe to go stale", func() (string, bool) {
		text, st := m.probeText("m", "w"), m.read("m", "status")
		return text + "\nstatus:\n" + st, strings.Contains(text, "# state: stale: ") && strings.Contains(text, `no function "work"`) &&
			strings.Contains(st, "probes: 0 active, 0 refused, 1 stale") && len(uprobeLines(t, m.group()+"m/")) == 0
	})
	// A stale probe records nothing: run(2) below counts every record
	// since, and time order puts any of this run's before its own.
	runProg(t, path, "3")

	// cp over the path rewrites the same inode.
	if out, err := shell(fmt.Sprintf("cp %s %s", orig, path)); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	at(offOrig)
	run(2)
}

// A FIFO is refused at once as a target, whether linked into the mount or
// named on the command line: nothing opens it in a way that blocks.
func TestFIFOTarget(t *testing.T) {
	needKernel(t)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	m := startMount(t)
	start := time.Now()
	out, err := shell("ln -s " + fifo + " " + m.path("x"))
	if err == nil || time.Since(start) > 10*time.Second { // a blocked open is forever; bash on a loaded machine takes seconds
		t.Fatalf("ln -s FIFO: %v after %v: %s", err, time.Since(start), out)
	}
	if !strings.Contains(out, "Invalid argument") {
		t.Errorf("ln -s FIFO said %q, want Invalid argument", out)
	}
	if st := m.read("status"); !strings.Contains(st, "not a regular file") {
		t.Errorf("the root status gives no reason:\n%s", st)
	}
	// The log reaches the test through a pipe: wait for it, not a sleep.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(m.log.String(), "not a regular file"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("the mount's log gives no reason:\n%s", m.log)
			break
		}
	}
	if _, err := os.Stat(m.path("status")); err != nil {
		t.Errorf("stat status after the refusal: %v", err)
	}

	cmd := exec.Command(os.Args[0], "mount", t.TempDir(), fifo)
	cmd.Env = append(os.Environ(), "PTFS_TEST_MAIN=1")
	done := make(chan error, 1)
	var outb lockedBuffer
	cmd.Stdout, cmd.Stderr = &outb, &outb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(outb.String(), "not a regular file") {
			t.Errorf("ptfs mount DIR FIFO: %v: %s", err, outb.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("ptfs mount DIR FIFO blocks: %s", outb.String())
	}
}
