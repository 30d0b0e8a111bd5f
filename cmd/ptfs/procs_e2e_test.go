package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// procRecord is a parsed record line of testdata/procs.c's hit(a, b).
type procRecord struct {
	event    string
	a, b     string
	tid, pid int
	comm     string
	hasComm  bool
}

// parseProcRecords parses record lines whose args are [a=A, b=B].
func parseProcRecords(t *testing.T, ls []string) []procRecord {
	t.Helper()
	var out []procRecord
	for _, l := range ls {
		m := recordRE.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("not a record line: %q", l)
		}
		r := procRecord{event: m[2], comm: m[11], hasComm: m[10] != ""}
		r.tid, _ = strconv.Atoi(m[4])
		r.pid, _ = strconv.Atoi(m[9])
		if a, b, ok := strings.Cut(m[3], ", b="); ok {
			r.a, r.b = strings.TrimPrefix(a, "a="), b
		} else {
			r.a = m[3]
		}
		out = append(out, r)
	}
	return out
}

// startProcs starts procs (or a link to it) with args; its stdin stays
// open, and with it the program, until the returned function closes it
// and waits for the exit. The cleanup kills it by its PID if still there.
func startProcs(t *testing.T, bin string, args ...string) (*exec.Cmd, io.WriteCloser, func()) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := false
	finish := func() {
		if done {
			return
		}
		done = true
		in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s %v: %v", bin, args, err)
		}
	}
	t.Cleanup(func() {
		if !done {
			cmd.Process.Kill()
			finish()
		}
	})
	return cmd, in, finish
}

// buildProcs builds testdata/procs.c as "procs" and a link to it named
// link: a program run through the link is named link.
func buildProcs(t *testing.T, link string) (bin, linked string) {
	bin = buildC(t, "procs", "procs", "-O0", "-pthread")
	linked = filepath.Join(filepath.Dir(bin), link)
	if err := os.Symlink(bin, linked); err != nil {
		t.Fatal(err)
	}
	return bin, linked
}

// TestProcessFork: a parent, a child that renamed itself and a child that
// hit, then exec'd the program under another name: every record has its
// process's pid and the name the process had at the hit (the exec'd
// child's hit before the exec has that name or none, never the later one).
func TestProcessFork(t *testing.T) {
	needKernel(t)
	bin, renamed := buildProcs(t, "renamed")
	m := startMount(t, "p="+bin)
	m.setProbe("p", "h", "hit a=%di b=%si")
	cmd, _, finish := startProcs(t, bin, "fork", renamed)
	recs := parseProcRecords(t, m.waitLines(4, "p", "records"))
	finish()
	if len(recs) != 4 {
		t.Fatalf("%d records, want 4:\n%s", len(recs), m.read("p", "records"))
	}
	byA := map[string]procRecord{}
	for _, r := range recs {
		if strconv.Itoa(r.pid) != r.b || r.tid != r.pid {
			t.Errorf("record %+v: pid and tid are not the process's own (b)", r)
		}
		if r.a == "0" && r.pid != cmd.Process.Pid {
			byA["exec"] = r
			continue
		}
		byA[r.a] = r
	}
	parent, child, before, after := byA["0"], byA["1"], byA["2"], byA["exec"]
	if parent.pid != cmd.Process.Pid || parent.comm != "procs" {
		t.Errorf("parent's record %+v, want pid %d comm procs", parent, cmd.Process.Pid)
	}
	if child.pid == parent.pid || child.comm != "child" {
		t.Errorf("renamed child's record %+v, want its own pid and comm child", child)
	}
	if before.pid == parent.pid || before.pid == child.pid || after.pid != before.pid {
		t.Errorf("exec'd child's records %+v then %+v: want one pid of its own", before, after)
	}
	if before.hasComm && before.comm != "procs" {
		t.Errorf("exec'd child's record before the exec: comm %q, want procs or none", before.comm)
	}
	if after.comm != "renamed" {
		t.Errorf("exec'd child's record after the exec: comm %q, want renamed (refreshed by the exec)", after.comm)
	}
	t.Logf("records:\n%s", m.read("p", "records"))
}

// TestProcessThreads: records of the main thread and four threads (named
// "worker" each) share the process's pid and name; each has its own tid.
func TestProcessThreads(t *testing.T) {
	needKernel(t)
	bin, _ := buildProcs(t, "unused")
	m := startMount(t, "p="+bin)
	m.setProbe("p", "h", "hit a=%di b=%si")
	cmd, _, finish := startProcs(t, bin, "threads", "4")
	recs := parseProcRecords(t, m.waitLines(5, "p", "records"))
	finish()
	if len(recs) != 5 {
		t.Fatalf("%d records, want 5", len(recs))
	}
	var tids []int
	for _, r := range recs {
		if r.pid != cmd.Process.Pid || strconv.Itoa(r.tid) != r.b || r.comm != "procs" {
			t.Errorf("record %+v: want pid %d, tid = b, comm procs", r, cmd.Process.Pid)
		}
		tids = append(tids, r.tid)
	}
	slices.Sort(tids)
	if len(slices.Compact(tids)) != 5 || !slices.Contains(tids, cmd.Process.Pid) {
		t.Errorf("tids %v: want the main thread's and four others", tids)
	}
}

// filtered returns the filtered count of a target's status.
func filtered(t *testing.T, m *mountProc, target string) int {
	n, err := strconv.Atoi(strings.Fields(statusValue(m.read(target, "status"), "filtered"))[0])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFiltered waits until the target's status counts n filtered records.
func waitFiltered(t *testing.T, m *mountProc, target string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); filtered(t, m, target) < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("filtered %d, want %d:\n%s", filtered(t, m, target), n, m.read(target, "status"))
		}
	}
}

// TestProcessFilters: two processes hit the same probe; %pid keeps one's
// records, then %comm the other's. %pid is the kernel's (events on the
// process's threads only: the other's hits never reach ptfs), %comm
// ptfs's: the other's records are counted as filtered, not lost.
func TestProcessFilters(t *testing.T) {
	needKernel(t)
	bin, other := buildProcs(t, "other")
	m := startMount(t, "p="+bin)
	const k = 50
	run := func(specFor func(pidA int) string, want func(a, b *exec.Cmd) *exec.Cmd, before, wantFiltered int) {
		a, ina, fa := startProcs(t, bin, "wait", strconv.Itoa(k))
		b, inb, fb := startProcs(t, other, "wait", strconv.Itoa(k))
		spec := specFor(a.Process.Pid)
		m.setProbe("p", "h", spec)
		for _, in := range []io.Writer{ina, inb} {
			if _, err := in.Write([]byte{'\n'}); err != nil {
				t.Fatal(err)
			}
		}
		waitFiltered(t, m, "p", wantFiltered)
		recs := parseProcRecords(t, m.waitLines(before+k, "p", "records"))
		fa()
		fb()
		if len(recs) != before+k {
			t.Fatalf("%s: %d records, want %d", spec, len(recs), before+k)
		}
		keep := want(a, b)
		for _, r := range recs[before:] {
			if r.pid != keep.Process.Pid || r.b != strconv.Itoa(r.pid) || r.comm != filepath.Base(keep.Path) {
				t.Fatalf("%s: record %+v, want only pid %d (%s)", spec, r, keep.Process.Pid, filepath.Base(keep.Path))
			}
		}
		if n := filtered(t, m, "p"); n != wantFiltered {
			t.Errorf("%s: filtered %d, want %d", spec, n, wantFiltered)
		}
	}
	run(func(pid int) string { return fmt.Sprintf("hit %%pid=%d a=%%di b=%%si", pid) },
		func(a, _ *exec.Cmd) *exec.Cmd { return a }, 0, 0)
	run(func(int) string { return "hit %comm=other a=%di b=%si" },
		func(_, b *exec.Cmd) *exec.Cmd { return b }, k, k)
	// A process that does not exist: ESRCH, and the probe file says so.
	if err := os.Remove(m.path("p", "probes", "h")); err != nil {
		t.Fatal(err)
	}
	if out, err := shell(fmt.Sprintf("echo 'hit %%pid=4194304' > %s", m.path("p", "probes", "gone"))); err == nil ||
		!strings.Contains(out, "No such process") {
		t.Errorf("%%pid of no process: err %v, %q\n%s", err, out, m.probeText("p", "gone"))
	}
	st := m.read("p", "status")
	if !strings.Contains(st, "summary: records=100 dropped=0 stray=0 unknown=0 errors=0\n") || statusValue(st, "lost") != "0 (samples dropped by full kernel rings, all targets)" {
		t.Errorf("status:\n%s", st)
	}
	// This machine's kernel (6.0+) counts each event's losses.
	if got := statusValue(st, "lost counted"); got != "per event (PERF_FORMAT_LOST)" {
		t.Errorf("lost counted: %q\n%s", got, st)
	}
}

// fibOrder returns fib's arguments in call order and its return values in
// return order for fib(n), as testdata/procs.c computes it.
func fibOrder(n int64, calls, rets *[]string) int64 {
	*calls = append(*calls, strconv.FormatInt(n, 10))
	v := n
	if n >= 2 {
		v = fibOrder(n-1, calls, rets) + fibOrder(n-2, calls, rets)
	}
	*rets = append(*rets, strconv.FormatInt(v, 10))
	return v
}

// TestReturnProbe: an entry probe and a return probe on the recursive fib:
// the kernel lists an r: line, every call gives one entry record (its n)
// and one return record (its value), in the order of the recursion.
func TestReturnProbe(t *testing.T) {
	needKernel(t)
	bin, _ := buildProcs(t, "unused")
	m := startMount(t, "p="+bin)
	m.setProbe("p", "in", "fib n=%di")
	m.setProbe("p", "out", "fib%return r=$retval")
	text := m.probeText("p", "out")
	if !strings.HasPrefix(text, "fib%return r=$retval\n# state: installed") || !strings.Contains(text, "# tracefs: r:"+m.group()+"p/out ") {
		t.Fatalf("probe file:\n%s", text)
	}
	if l := uprobeLines(t, m.group()+"p/out "); len(l) != 1 || !strings.HasPrefix(l[0], "r:") {
		t.Fatalf("uprobe_events lines of the return probe: %q", l)
	}
	var calls, rets []string
	fibOrder(12, &calls, &rets)
	cmd, _, finish := startProcs(t, bin, "fib", "12")
	recs := parseProcRecords(t, m.waitLines(2*len(calls), "p", "records"))
	finish()
	var in, out []string
	for _, r := range recs {
		if r.pid != cmd.Process.Pid {
			t.Fatalf("record %+v of another process", r)
		}
		switch r.event {
		case "ptfs_p/in":
			in = append(in, strings.TrimPrefix(r.a, "n="))
		case "ptfs_p/out":
			out = append(out, strings.TrimPrefix(r.a, "r="))
		}
	}
	if !slices.Equal(in, calls) || !slices.Equal(out, rets) {
		t.Errorf("%d entry records %v\n%d return records %v\nwant %d calls %v\nand returns %v",
			len(in), in, len(out), out, len(calls), calls, rets)
	}
	// A return probe goes at a function's entry only.
	if out, err := shell(fmt.Sprintf("echo 'fib+1 %%return' > %s", m.path("p", "probes", "bad"))); err == nil || !strings.Contains(m.probeText("p", "bad"), "function's entry") {
		t.Errorf("return probe inside fib: err %v %s\n%s", err, out, m.probeText("p", "bad"))
	}
}
