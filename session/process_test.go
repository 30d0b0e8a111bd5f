package session

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"ptfs/decode"
	"ptfs/decode/ptenc"
	"ptfs/engine"
	"ptfs/engine/enginetest"
	"ptfs/internal/testkit"
	"ptfs/perfdata"
	"ptfs/tracefs"
	"ptfs/tracefs/tracefstest"
)

// TestPTWReturn: ptw mode emulates %return with a ptw probe on each ret
// of the function, found by the site checker, fetching %ax for $retval;
// the probe file lists them, their records carry the probe's name, and
// removing the probe removes every one of them.
func TestPTWReturn(t *testing.T) {
	s, tg, k, rep := newPTWSession(t, tracefstest.Options{PTW: true})
	dir := mountSession(t, s)
	probeFile := filepath.Join(dir, "t", "probes", "r")
	if err := os.WriteFile(probeFile, []byte("target%return r=$retval\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	text := readFile(t, probeFile)
	if !strings.Contains(text, "# state: installed (ptw mode") || !strings.Contains(text, "# ptw: %return emulated by a probe on each ret of target (file offsets 0x") {
		t.Fatalf("probe file:\n%s", text)
	}
	group := tracefs.GroupName(os.Getpid(), "t")
	lines, err := k.Tracefs.Events()
	if err != nil {
		t.Fatal(err)
	}
	tg.mu.Lock()
	rets := tg.probes["r"].site.Rets
	tg.mu.Unlock()
	if len(rets) == 0 || len(lines) != len(rets) {
		t.Fatalf("rets %x, uprobe_events %q", rets, lines)
	}
	var e ptenc.Encoder
	e.PSB()
	e.TSC(1000)
	e.PSBEnd()
	for i, off := range rets {
		name := "r"
		if i > 0 {
			name = tracefs.Numbered("r", i+1)
		}
		want := fmt.Sprintf("%s/%s %s:0x%x r=%%ax", group, name, tg.bin.FDPath(), off)
		if !strings.Contains(text, "# tracefs: ptw:"+want+"\n") {
			t.Errorf("probe file:\n%s\nwant the line %q", text, want)
		}
		id, err := k.Tracefs.EventID(group, name)
		if err != nil {
			t.Fatal(err)
		}
		e.Probe(id, 0x7f0000001000, true, uint64(40+i))
	}
	tc := perfdata.TimeConv{Mult: 1, Zero: 5_000_000_000}
	if err := rep.Queue(enginetest.Batch{0: {enginetest.TimeConv(tc), enginetest.Trace(e.Bytes())}}); err != nil {
		t.Fatal(err)
	}
	if err := rep.Flush(); err != nil {
		t.Fatal(err)
	}
	recs := readFile(t, dir, "t", "records")
	for i := range rets {
		if !strings.Contains(recs, "event=ptfs_t/r id=0x") || !strings.Contains(recs, fmt.Sprintf(" args=[r=%d] cpu=0", 40+i)) {
			t.Errorf("records:\n%s\nwant r=%d", recs, 40+i)
		}
	}
	if err := os.Remove(probeFile); err != nil {
		t.Fatal(err)
	}
	if lines, _ := k.Tracefs.Events(); len(lines) != 0 {
		t.Errorf("uprobe_events after rm: %q", lines)
	}
}

// TestPTWProcessFilters: in ptw mode %pid and %comm reach no kernel line
// (ptfs filters the decoded records), records carry pid= and, once the
// side band named the process, comm=; records of other processes are
// counted as filtered, not as losses.
func TestPTWProcessFilters(t *testing.T) {
	s, _, k, rep := newPTWSession(t, tracefstest.Options{PTW: true})
	dir := mountSession(t, s)
	probesDir := filepath.Join(dir, "t", "probes")
	for name, spec := range map[string]string{"a": "target %pid=100 a=%di", "b": "other %comm=worker %di"} {
		if err := os.WriteFile(filepath.Join(probesDir, name), []byte(spec+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	group := tracefs.GroupName(os.Getpid(), "t")
	ids := map[string]uint16{}
	for _, name := range []string{"a", "b"} {
		text := readFile(t, probesDir, name)
		_, tline, _ := strings.Cut(text, "# tracefs: ")
		tline, _, _ = strings.Cut(tline, "\n")
		if !strings.Contains(text, "# state: installed (ptw mode") || !strings.HasPrefix(tline, "ptw:"+group+"/"+name+" ") ||
			strings.Contains(tline, "%pid") || strings.Contains(tline, "%comm") {
			t.Fatalf("probe %s:\n%s", name, text)
		}
		id, err := k.Tracefs.EventID(group, name)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = id
	}
	for _, c := range k.Commands() {
		if strings.Contains(c, "pid") || strings.Contains(c, "comm") {
			t.Errorf("kernel line %q carries a process filter", c)
		}
	}
	tc := perfdata.TimeConv{Mult: 1, Zero: 5_000_000_000}
	stub := uint64(0x7f0000001000)
	var cpu0, cpu1 ptenc.Encoder
	for i, e := range []*ptenc.Encoder{&cpu0, &cpu1} {
		e.PSB()
		e.TSC(uint64(1000 + i))
		e.PSBEnd()
	}
	cpu0.Probe(ids["a"], stub, true, 1) // pid 100: kept
	cpu0.Probe(ids["b"], stub, true, 2) // "procs": filtered
	cpu1.TSC(2000)
	cpu1.Probe(ids["a"], stub, true, 3) // pid 200: filtered
	cpu1.Probe(ids["b"], stub, true, 4) // "worker": kept
	side := func(kind engine.SideKind, time uint64, pid, tid int32, comm string) enginetest.Step {
		return enginetest.Side(engine.SideEvent{Kind: kind, Time: time, PID: pid, TID: tid, Comm: comm})
	}
	err := rep.Queue(enginetest.Batch{
		0: {enginetest.TimeConv(tc), side(engine.SideITraceStart, 5_000_000_000, 100, 101, ""),
			side(engine.SideComm, 5_000_000_000, 100, 100, "procs"), enginetest.Trace(cpu0.Bytes())},
		1: {enginetest.TimeConv(tc), side(engine.SideITraceStart, 5_000_000_000, 200, 200, ""),
			side(engine.SideComm, 5_000_000_000, 200, 200, "worker"), enginetest.Trace(cpu1.Bytes())},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Flush(); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("record 1: event=ptfs_t/a id=0x%x args=[a=1] tid=101 cpu=0 time=5.000001000 pid=100 comm=procs\n"+
		"record 2: event=ptfs_t/b id=0x%x args=[4] tid=200 cpu=1 time=5.000002000 pid=200 comm=worker\n", ids["a"], ids["b"])
	if got := readFile(t, dir, "t", "records"); got != want {
		t.Errorf("records:\n%s\nwant:\n%s", got, want)
	}
	st := readFile(t, dir, "t", "status")
	if !strings.Contains(st, "\nfiltered: 2 (") || !strings.Contains(st, "summary: records=2 dropped=0 stray=0 unknown=0 errors=0\n") {
		t.Errorf("status:\n%s", st)
	}
}

// TestPTWReturnRename: a renamed ptw return probe names the records of
// every ret's event anew, in records and in branches, not the first's
// only.
func TestPTWReturnRename(t *testing.T) {
	s, _, _, _ := newPTWSession(t, tracefstest.Options{PTW: true})
	// two returns in two places: one event a ret.
	src := filepath.Join(t.TempDir(), "rets.c")
	code := "__attribute__((naked)) long two(long a) {\n" +
		"\t__asm__(\"cmp $5, %rdi\\n\\tjg 1f\\n\\tlea 1(%rdi), %rax\\n\\tret\\n1:\\tlea (%rdi,%rdi,2), %rax\\n\\tret\\n\");\n" +
		"}\nint main(int argc, char **argv) { return (int)two(argc); }\n"
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	tg, err := s.addTarget("p", testkit.BuildC(t, src))
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.SetProbe("r", "two%return r=$retval"); err != nil {
		t.Fatal(err)
	}
	if err := tg.RenameProbe("r", "r2", false); err != nil {
		t.Fatal(err)
	}
	tg.mu.Lock()
	p := tg.probes["r2"]
	evs := []*decode.Event{p.ev}
	for _, r := range p.rets {
		evs = append(evs, r.ev)
	}
	tg.mu.Unlock()
	if len(evs) < 2 {
		t.Fatalf("%d events: the test wants a function of several rets", len(evs))
	}
	routes := *s.routes.Load()
	s.br.mu.Lock()
	defer s.br.mu.Unlock()
	for _, ev := range evs {
		if rt := routes[ev.ID]; ev.Name != "r2" || rt == nil || rt.ev == nil || rt.ev.Name != "r2" {
			t.Errorf("event %d: name %q, route %+v", ev.ID, ev.Name, rt)
		}
		if b := s.br.events[ev.ID]; b == nil || b.Name != "r2" {
			t.Errorf("event %d in branches: %+v", ev.ID, b)
		}
	}
}
