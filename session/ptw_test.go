package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"ptfs/bind"
	"ptfs/decode/ptenc"
	"ptfs/engine"
	"ptfs/engine/enginetest"
	ptfsfs "ptfs/fs"
	"ptfs/internal/testkit"
	"ptfs/perfdata"
	"ptfs/probes"
	"ptfs/tracefs"
	"ptfs/tracefs/tracefstest"
)

// mountSession mounts s in a temp dir until the test ends.
func mountSession(t *testing.T, s *Session) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "mounting FUSE with the mount syscall needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testkit.Unavailable(t, "no /dev/fuse: %v", err)
	}
	dir := t.TempDir()
	srv, err := ptfsfs.Mount(dir, bind.Tracer[*Target](s), ptfsfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v; detaching", err)
			unix.Unmount(dir, unix.MNT_DETACH)
			return
		}
		srv.Wait()
	})
	return dir
}

func readFile(t *testing.T, parts ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(parts...))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The whole mount in ptw mode with the kernel replaced: a simulated ptwrite
// kernel behind tracefs, the sysfs of a PT machine, and a replay of PT
// bytes that carry the ids of the probes the mount created. records shows
// the right lines in time order across two CPUs, status the right
// counters after an overflow on one CPU, a truncated AUX record and a flush
// on the other, and a header of an unknown event.
func TestPTWMount(t *testing.T) {
	s, tg, k, rep := newPTWSession(t, tracefstest.Options{PTW: true})
	bin := tg.path
	// Lines name the binary by the session's descriptor of it.
	fdPath := tg.bin.FDPath()
	dir := mountSession(t, s)
	probesDir := filepath.Join(dir, "t", "probes")
	if err := os.WriteFile(filepath.Join(probesDir, "a"), []byte("target a=%di b=%si\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(probesDir, "b"), []byte("other %di:x32 %nopace\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	group := tracefs.GroupName(os.Getpid(), "t")
	offA := testkit.FuncOffset(t, bin, "target")
	offB := testkit.FuncOffset(t, bin, "other")
	wantLines := map[string]string{
		"a": fmt.Sprintf("ptw:%s/a %s:0x%x a=%%di b=%%si", group, fdPath, offA),
		"b": fmt.Sprintf("ptw:%s/b %s:0x%x %%di:x32 %%nopace", group, fdPath, offB),
	}
	ids := map[string]uint16{}
	for name, line := range wantLines {
		text := readFile(t, probesDir, name)
		if !strings.Contains(text, "# state: installed (ptw mode") || !strings.Contains(text, "# tracefs: "+line+"\n") {
			t.Fatalf("probe %s:\n%s\nwant installed with tracefs line %q", name, text, line)
		}
		if en := strings.TrimSpace(readFile(t, k.Tracefs.Dir, "events", group, name, "enable")); en != "1" {
			t.Errorf("probe %s: enable is %q, want 1", name, en)
		}
		id, err := k.Tracefs.EventID(group, name)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = id
	}
	if starts, _, _ := rep.Counts(); starts != 1 {
		t.Fatalf("capture started %d times for two probes, want 1", starts)
	}

	// TSC t is perf time 5 s + t ns.
	tc := perfdata.TimeConv{Mult: 1, Zero: 5_000_000_000}
	stub := uint64(0x7f0000001000)
	var cpu0, cpu1, cpu0b ptenc.Encoder
	cpu0.PSB()
	cpu0.TSC(1000)
	cpu0.PSBEnd()
	cpu0.Probe(ids["a"], stub, true, 1, 2)
	cpu0.TSC(3000)
	cpu0.Probe(ids["b"], stub+0x1000, true, 0xdead)
	cpu0.TSC(6000)
	cpu0.Probe(ids["b"], stub+0x1000, true, 7)
	cpu0.PTW(ptenc.Header(ids["a"], 2), 8, false) // cut by the truncated AUX record

	cpu1.PSB()
	cpu1.TSC(2000)
	cpu1.PSBEnd()
	cpu1.Probe(ids["a"], stub, false, 10, 20)
	cpu1.TSC(4000)
	cpu1.PTW(ptenc.Header(ids["a"], 2), 8, false)
	cpu1.PTW(30, 8, false)
	cpu1.OVF() // the second word is lost
	cpu1.PSB()
	cpu1.TSC(5000)
	cpu1.PSBEnd()
	cpu1.Probe(ids["a"], stub, false, 40, 50)
	cpu1.Probe(0x7777, stub, false, 99) // not an event of this mount

	cpu0b.PSB()
	cpu0b.TSC(7000)
	cpu0b.PSBEnd()
	cpu0b.Probe(ids["a"], stub, true, 60, 70)

	side := func(time uint64, pid, tid int32) enginetest.Step {
		return enginetest.Side(engine.SideEvent{Kind: engine.SideITraceStart, Time: time, PID: pid, TID: tid})
	}
	err := rep.Queue(enginetest.Batch{
		0: {enginetest.TimeConv(tc), side(5_000_000_000, 100, 101), enginetest.Trace(cpu0.Bytes()),
			enginetest.Loss(engine.LossTruncated, 1)},
		1: {enginetest.TimeConv(tc), side(5_000_000_000, 200, 201), enginetest.Trace(cpu1.Bytes())},
	}, enginetest.Batch{
		0: {enginetest.Loss(engine.LossFlush, 1), enginetest.Trace(cpu0b.Bytes())},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Flush(); err != nil {
		t.Fatal(err)
	}
	ev := func(name string) string { return fmt.Sprintf("event=ptfs_t/%s id=0x%x", name, ids[name]) }
	want := []string{
		"record 1: " + ev("a") + " args=[a=1, b=2] tid=101 cpu=0 time=5.000001000 pid=100",
		"record 2: " + ev("a") + " args=[a=10, b=20] tid=201 cpu=1 time=5.000002000 pid=200",
		"record 3: " + ev("b") + " args=[0xdead] tid=101 cpu=0 time=5.000003000 pid=100",
		"record 4: " + ev("a") + " args=[a=40, b=50] tid=201 cpu=1 time=5.000005000 pid=200",
		"record 5: " + ev("b") + " args=[0x7] tid=101 cpu=0 time=5.000006000 pid=100",
		"record 6: " + ev("a") + " args=[a=60, b=70] tid=101 cpu=0 time=5.000007000 pid=100",
	}
	if got := readFile(t, dir, "t", "records"); got != strings.Join(want, "\n")+"\n" {
		t.Errorf("records:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	// dropped: the word after OVF and the two of the header cut by the
	// truncation; stray: the unknown header and its word; errors: the OVF
	// and the AUX loss, not the flush (counted apart).
	const summary = "summary: records=6 dropped=3 stray=2 unknown=0 errors=2\n"
	for _, st := range []string{readFile(t, dir, "status"), readFile(t, dir, "t", "status")} {
		if !strings.Contains(st, "mode: ptw\n") || !strings.HasSuffix(st, summary) {
			t.Errorf("status:\n%s\nwant mode: ptw and %q", st, summary)
		}
		if !strings.Contains(st, "aux truncated=1") || !strings.Contains(st, "flush=1") {
			t.Errorf("status:\n%s\nwant the truncated AUX record and the flush counted", st)
		}
		for _, line := range []string{"time: perf time (TSC converted by the mmap page)\n", "\nunattributed: 0 ", "\nuntimed: 0 "} {
			if !strings.Contains(st, line) {
				t.Errorf("status:\n%s\nwant %q", st, line)
			}
		}
	}

	// Removing the probes disables them before they go; the last one
	// stops the capture.
	for _, name := range []string{"a", "b"} {
		if err := os.Remove(filepath.Join(probesDir, name)); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(k.Tracefs.Dir, "events", group, name)); !os.IsNotExist(err) {
			t.Errorf("probe %s: tracefs event still there after rm (%v)", name, err)
		}
	}
	if starts, stops, _ := rep.Counts(); starts != 1 || stops != 1 || rep.Running() {
		t.Errorf("capture starts=%d stops=%d running=%v after the last probe went, want 1, 1, false", starts, stops, rep.Running())
	}
	var removals []string
	for _, c := range k.Commands() {
		if strings.HasPrefix(c, "-:") {
			removals = append(removals, c)
		}
	}
	if len(removals) != 2 {
		t.Errorf("removal commands %q, want one per probe", removals)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if lines, err := k.Tracefs.Events(); err != nil || len(lines) != 0 {
		t.Errorf("uprobe_events after close: %q, %v", lines, err)
	}
}

// newPTWSession starts a ptw session on a simulated kernel and a replay,
// with target t, closed at cleanup.
func newPTWSession(t *testing.T, opts tracefstest.Options) (*Session, *Target, *tracefstest.Kernel, *enginetest.Replay) {
	t.Helper()
	k := tracefstest.New(t, opts)
	rep, err := enginetest.NewReplay()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Tracefs: k.Tracefs, Sysfs: testkit.PTSysfs(t), Trace: rep, Latency: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	if s.Mode() != ModePTW {
		t.Fatalf("mode %s (%s), want ptw", s.Mode(), s.why)
	}
	tg, err := s.addTarget("t", testkit.BuildC(t, filepath.Join("..", "testdata", "target.c")))
	if err != nil {
		t.Fatal(err)
	}
	return s, tg, k, rep
}

// A site the ptwrite kernel refuses (punning failed) fails the write with
// EOPNOTSUPP and the kernel's reason in the probe file, and leaves nothing
// in tracefs; the capture never starts.
func TestPTWKernelRefuses(t *testing.T) {
	_, tg, k, rep := newPTWSession(t, tracefstest.Options{PTW: true, Refuse: func(line string) (syscall.Errno, string) {
		return syscall.EINVAL, "failed to install"
	}})
	err := tg.SetProbe("a", "target %di")
	if !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("SetProbe: %v, want EOPNOTSUPP", err)
	}
	text, _ := tg.ProbeText("a")
	if !strings.Contains(string(text), "# state: refused") || !strings.Contains(string(text), "failed to install") {
		t.Errorf("probe file:\n%s\nwant refused with the kernel's reason", text)
	}
	if lines, _ := k.Tracefs.Events(); len(lines) != 0 {
		t.Errorf("uprobe_events after the refusal: %q", lines)
	}
	if starts, _, _ := rep.Counts(); starts != 0 {
		t.Errorf("capture started %d times for a refused probe", starts)
	}
}

// A site that ptwrite uprobes can never take is refused before the kernel
// sees it, with the site check's reason.
func TestPTWRefusedSite(t *testing.T) {
	_, tg, k, _ := newPTWSession(t, tracefstest.Options{PTW: true})
	// main calls target: a call rel32 somewhere in main is refused.
	bin := tg.path
	site := callSite(t, bin)
	err := tg.SetProbe("c", fmt.Sprintf("0x%x %%di", site))
	if !errors.Is(err, syscall.EOPNOTSUPP) || !strings.Contains(err.Error(), "ptw:") {
		t.Fatalf("SetProbe at a call: %v, want EOPNOTSUPP with the ptw reason", err)
	}
	if cmds := k.Commands(); len(cmds) != 0 {
		t.Errorf("the kernel got %q for a refused site", cmds)
	}
}

// callSite returns the file offset of the first call rel32 in main.
func callSite(t *testing.T, bin string) uint64 {
	t.Helper()
	b, err := probes.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, f := range b.Functions() {
		if f.Name != "main" {
			continue
		}
		for off := uint64(0); off < f.Size; off++ {
			sp, err := probes.Parse(fmt.Sprintf("main+%d", off))
			if err != nil {
				t.Fatal(err)
			}
			site, err := b.Resolve(sp)
			if err == nil && strings.HasPrefix(site.Insn, "call") {
				return site.Offset
			}
		}
	}
	t.Fatal("no call in main")
	return 0
}

// When the capture cannot start, the write fails, the probe is removed from
// tracefs again, and a later write works.
func TestPTWStartFails(t *testing.T) {
	_, tg, k, rep := newPTWSession(t, tracefstest.Options{PTW: true})
	rep.FailNextStart(fmt.Errorf("perf_event_open intel_pt: %w", syscall.EBUSY))
	if err := tg.SetProbe("a", "target %di"); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("SetProbe: %v, want the source's EBUSY", err)
	}
	if lines, _ := k.Tracefs.Events(); len(lines) != 0 {
		t.Errorf("uprobe_events after the failed start: %q", lines)
	}
	if err := tg.SetProbe("a", "target %di"); err != nil {
		t.Fatalf("SetProbe after the failure: %v", err)
	}
	if lines, _ := k.Tracefs.Events(); len(lines) != 1 || !strings.HasPrefix(lines[0], "ptw:") {
		t.Errorf("uprobe_events: %q, want one ptw probe", lines)
	}
}

// commandHeads returns the kernel's commands up to their first space.
func commandHeads(k *tracefstest.Kernel) []string {
	var heads []string
	for _, c := range k.Commands() {
		heads = append(heads, strings.Fields(c)[0])
	}
	return heads
}

// Overwriting a ptw probe with one at another site installs and enables the
// new one beside it before the old one is disabled and removed; the capture
// keeps running.
func TestPTWReplace(t *testing.T) {
	_, tg, k, rep := newPTWSession(t, tracefstest.Options{PTW: true})
	if err := tg.SetProbe("a", "target %di"); err != nil {
		t.Fatal(err)
	}
	if err := tg.SetProbe("a", "other %di"); err != nil {
		t.Fatal(err)
	}
	lines, _ := k.Tracefs.Events()
	if len(lines) != 1 || !strings.Contains(lines[0], "/a_2 ") {
		t.Fatalf("uprobe_events: %q, want only the replacement a_2", lines)
	}
	if en := strings.TrimSpace(readFile(t, k.Tracefs.Dir, "events", tg.group, "a_2", "enable")); en != "1" {
		t.Errorf("replacement enable = %q", en)
	}
	want := []string{"ptw:" + tg.group + "/a", "ptw:" + tg.group + "/a_2", "-:" + tg.group + "/a"}
	if cmds := commandHeads(k); !slices.Equal(cmds, want) {
		t.Errorf("kernel commands %q, want %q", cmds, want)
	}
	if starts, stops, _ := rep.Counts(); starts != 1 || stops != 0 {
		t.Errorf("capture starts=%d stops=%d across a replacement, want 1, 0", starts, stops)
	}
}

// A ptwrite kernel takes one probe a site: a replacement at the same site
// removes the old probe first, and puts it back when the kernel refuses the
// new one.
func TestPTWReplaceSameSite(t *testing.T) {
	_, tg, k, _ := newPTWSession(t, tracefstest.Options{PTW: true, Refuse: func(line string) (syscall.Errno, string) {
		if strings.Contains(line, "%ax") {
			return syscall.EINVAL, "failed to install"
		}
		return 0, ""
	}})
	if err := tg.SetProbe("a", "target %di"); err != nil {
		t.Fatal(err)
	}
	if err := tg.SetProbe("a", "target %di %si"); err != nil {
		t.Fatal(err)
	}
	g := tg.group
	want := []string{"ptw:" + g + "/a", "-:" + g + "/a", "ptw:" + g + "/a"}
	if cmds := commandHeads(k); !slices.Equal(cmds, want) {
		t.Errorf("kernel commands %q, want %q", cmds, want)
	}
	if err := tg.SetProbe("a", "target %ax"); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("refused replacement: %v, want EOPNOTSUPP", err)
	}
	lines, _ := k.Tracefs.Events()
	if len(lines) != 1 || !strings.HasSuffix(lines[0], " arg1=%di arg2=%si") {
		t.Errorf("uprobe_events: %q, want the replaced probe back", lines)
	}
	text, _ := tg.ProbeText("a")
	if !strings.HasPrefix(string(text), "target %di %si\n# state: installed") || !strings.Contains(string(text), "kept the probe above") ||
		!strings.Contains(string(text), "failed to install") {
		t.Errorf("probe file:\n%s\nwant the old probe installed and the refusal", text)
	}
	if en := strings.TrimSpace(readFile(t, k.Tracefs.Dir, "events", g, "a", "enable")); en != "1" {
		t.Errorf("restored probe enable = %q", en)
	}
}

// A ptwrite kernel that refuses typed fetchargs gets the probe untyped:
// the probe file says so and shows the untyped line, and records print the
// spec's u32/s32/x32 from the low 32 bits of the 8-byte payloads, byte for
// byte as a typed install's records of the same hits (4-byte payloads).
func TestPTWUntypedInstall(t *testing.T) {
	const spec = "target a=%di:s32 %si:x32 c=+8(%sp):u32 d=%dx"
	hits := [][]uint64{
		{0xffff_ffff_ffff_fffe, 0x1234_5678_0000_beef, 0xdead_0000_0000_0009, 1 << 40},
		{0x0000_0001_0000_0005, 0xffff_ffff_ffff_ffff, 0xffff_ffff_ffff_ffff, 3},
	}
	// Each kernel in a subtest of its own: one session a process at a
	// time, closed at the subtest's end.
	run := func(name string, opts tracefstest.Options, payload int) (records, probe string) {
		t.Run(name, func(t *testing.T) { records, probe = runPTWHits(t, opts, spec, hits, payload) })
		return records, probe
	}
	const note = "# ptw: the kernel refused typed fetchargs; installed untyped, ptfs formats u32/s32/x32\n"
	typedRecs, typedProbe := run("typed", tracefstest.Options{PTW: true}, 4)
	recs, probe := run("untyped", tracefstest.Options{PTW: true, RefuseTypes: true}, 8)
	if strings.Contains(typedProbe, note) || !strings.Contains(typedProbe, " a=%di:s32 %si:x32 c=+8(%sp):u32 d=%dx\n") {
		t.Errorf("typed probe file:\n%s", typedProbe)
	}
	if !strings.Contains(probe, note) || !strings.Contains(probe, " a=%di %si c=+8(%sp) d=%dx\n") {
		t.Errorf("untyped probe file:\n%s\nwant the untyped tracefs line and %q", probe, note)
	}
	want := "args=[a=-2, 0xbeef, c=9, d=1099511627776]"
	if recs != typedRecs || !strings.Contains(recs, want) || !strings.Contains(recs, "args=[a=5, 0xffffffff, c=4294967295, d=3]") {
		t.Errorf("untyped records:\n%s\ntyped records:\n%s\nwant them equal, with %s", recs, typedRecs, want)
	}
}

// runPTWHits mounts a ptw session on a kernel of opts, installs spec as
// probe a through the mount, replays hits of it with payloads of that many
// bytes (the last argument always 8), and returns records and the probe
// file.
func runPTWHits(t *testing.T, opts tracefstest.Options, spec string, hits [][]uint64, payload int) (records, probe string) {
	t.Helper()
	s, tg, _, rep := newPTWSession(t, opts)
	dir := mountSession(t, s)
	probeFile := filepath.Join(dir, "t", "probes", "a")
	if err := os.WriteFile(probeFile, []byte(spec+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id, err := s.tfs.EventID(tg.group, "a")
	if err != nil {
		t.Fatal(err)
	}
	replayHits(t, rep, id, hits, payload)
	return readFile(t, dir, "t", "records"), readFile(t, probeFile)
}

// replayHits replays hits of event id on CPU 0 of rep, in one thread from
// perf time 5 s: a header, then a payload of that many bytes for each
// argument (the last always 8).
func replayHits(t *testing.T, rep *enginetest.Replay, id uint16, hits [][]uint64, payload int) {
	t.Helper()
	var e ptenc.Encoder
	e.PSB()
	e.TSC(1000)
	e.PSBEnd()
	for _, h := range hits {
		e.PTW(ptenc.Header(id, len(h)), 8, false)
		for i, v := range h {
			size := payload
			if i == len(h)-1 {
				size = 8 // the last argument is u64
			}
			if size == 4 {
				v &= 0xffff_ffff
			}
			e.PTW(v, size, false)
		}
	}
	tc := perfdata.TimeConv{Mult: 1, Zero: 5_000_000_000}
	err := rep.Queue(enginetest.Batch{0: {enginetest.TimeConv(tc),
		enginetest.Side(engine.SideEvent{Kind: engine.SideITraceStart, Time: 5_000_000_000, PID: 100, TID: 101}),
		enginetest.Trace(e.Bytes())}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Flush(); err != nil {
		t.Fatal(err)
	}
}
