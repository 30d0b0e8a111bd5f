package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"ptfs/decode/ptenc"
	"ptfs/engine"
	"ptfs/engine/enginetest"
	"ptfs/perfdata"
	"ptfs/tracefs"
	"ptfs/tracefs/tracefstest"
)

// TestPTWReturnRefused: ptw mode refuses %return before the kernel sees
// it, and the probe file says why and where the function's rets are.
func TestPTWReturnRefused(t *testing.T) {
	_, tg, k, _ := newPTWSession(t, tracefstest.Options{PTW: true})
	err := tg.SetProbe("r", "target%return r=$retval")
	if !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("SetProbe: %v, want EOPNOTSUPP", err)
	}
	text, _ := tg.ProbeText("r")
	for _, want := range []string{"# state: refused", "%return: ptwrite uprobes take no return probes",
		"a probe on each ret of target would do (file offsets 0x", "(pun)", "use classic mode"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("probe file:\n%s\nwant %q", text, want)
		}
	}
	if cmds := k.Commands(); len(cmds) != 0 {
		t.Errorf("the kernel got %q for a refused return probe", cmds)
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
