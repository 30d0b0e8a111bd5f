package perfio

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"ptfs/engine"
)

// fakeCall is one call of the kernel interface as fakeOpener saw it.
type fakeCall struct {
	op   string // open, ioctl, mmap, munmap
	cpu  int    // open: the cpu; others: the cpu of fd
	fd   int    // the fd returned (open) or used
	attr unix.PerfEventAttr
	req  uint   // ioctl
	arg  int    // ioctl
	text string // setFilter
	off  int64  // mmap
	size int    // mmap, munmap
}

// fakeOpener plays the kernel behind PT: each open returns a real eventfd
// (so epoll and close work), mmaps return memory laid out like a perf mmap,
// every call is recorded, and open fails on the CPUs of fail.
type fakeOpener struct {
	mu    sync.Mutex
	calls []fakeCall
	fail  map[int]error // cpu → error of open
	// failEnable: cpu → error of PERF_EVENT_IOC_ENABLE
	failEnable map[int]error
	failFilter error            // of every setFilter
	cpuOf      map[int]int      // fd → cpu
	rings      map[int]*fakeAux // cpu → its PT event's memory
}

func newFakeOpener() *fakeOpener {
	return &fakeOpener{fail: map[int]error{}, cpuOf: map[int]int{}, rings: map[int]*fakeAux{}}
}

func (f *fakeOpener) open(attr *unix.PerfEventAttr, cpu, groupFD int, flags int) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if groupFD != -1 || flags != unix.PERF_FLAG_FD_CLOEXEC {
		return -1, fmt.Errorf("fake: group %d flags %#x", groupFD, flags)
	}
	if err := f.fail[cpu]; err != nil {
		return -1, err
	}
	n, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, err
	}
	f.cpuOf[n] = cpu
	f.calls = append(f.calls, fakeCall{op: "open", cpu: cpu, fd: n, attr: *attr})
	return n, nil
}

func (f *fakeOpener) ioctl(fd int, req uint, arg int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fakeCall{op: "ioctl", cpu: f.cpuOf[fd], fd: fd, req: req, arg: arg})
	if req == unix.PERF_EVENT_IOC_ENABLE {
		return f.failEnable[f.cpuOf[fd]]
	}
	return nil
}

func (f *fakeOpener) setFilter(fd int, filter string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fakeCall{op: "filter", cpu: f.cpuOf[fd], fd: fd, text: filter})
	return f.failFilter
}

func (f *fakeOpener) mmap(fd int, off int64, size int) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cpu := f.cpuOf[fd]
	f.calls = append(f.calls, fakeCall{op: "mmap", cpu: cpu, fd: fd, off: off, size: size})
	if off == 0 {
		a := &fakeAux{fakeMmap: newFakeMmap(size-fakePage, true), cpu: uint32(cpu), pid: 100, now: 1000}
		f.rings[cpu] = a
		return a.mem, nil
	}
	a := f.rings[cpu]
	if a == nil || uint64(off) != a.page.Aux_offset || uint64(size) != a.page.Aux_size {
		return nil, unix.EINVAL
	}
	a.aux = make([]byte, size)
	return a.aux, nil
}

func (f *fakeOpener) munmap(b []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fakeCall{op: "munmap", size: len(b)})
	return nil
}

// take returns the calls so far and forgets them.
func (f *fakeOpener) take() []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// ring returns cpu's PT memory.
func (f *fakeOpener) ring(cpu int) *fakeAux {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rings[cpu]
}

// Limits of testEnv.
var (
	privileged   = mlockLimits{ipcLock: true, paranoid: 2, mlockKB: 516, memlock: 8 << 20}
	unprivileged = mlockLimits{paranoid: 2, mlockKB: 516, memlock: 64 << 10}
)

// testEnv makes a cpu tree with online and a proc tree with lim, and a fake
// opener.
func testEnv(t *testing.T, online string, lim mlockLimits) ptEnv {
	t.Helper()
	root := t.TempDir()
	var caps uint64
	if lim.ipcLock {
		caps = 1 << unix.CAP_IPC_LOCK
	}
	for name, s := range map[string]string{
		"cpu/online":                          online + "\n",
		"proc/self/status":                    fmt.Sprintf("Name:\tptfs\nCapEff:\t%016x\n", caps),
		"proc/sys/kernel/perf_event_mlock_kb": fmt.Sprintf("%d\n", lim.mlockKB),
		"proc/sys/kernel/perf_event_paranoid": fmt.Sprintf("%d\n", lim.paranoid),
	} {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return ptEnv{op: newFakeOpener(), cpuDir: filepath.Join(root, "cpu"), procDir: filepath.Join(root, "proc"),
		memlock: func() (uint64, error) { return lim.memlock, nil }}
}

// failingEnv is testEnv with privileged limits whose fake opener fails
// the CPUs of fail.
func failingEnv(t *testing.T, online string, fail map[int]error) (ptEnv, *fakeOpener) {
	t.Helper()
	env := testEnv(t, online, privileged)
	fo := env.op.(*fakeOpener)
	fo.fail = fail
	return env, fo
}

// setOnline rewrites the online list of env's cpu tree.
func setOnline(t *testing.T, env ptEnv, online string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(env.cpuDir, "online"), []byte(online+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPTEvents starts PT over the fake kernel with four CPUs online, one
// failing with ENODEV and one with EBUSY, and checks every call: the exact
// attributes of the intel_pt and the dummy side-band event, perf's order
// (PT event, its mappings, the dummy, SET_OUTPUT of the dummy into the PT
// event, enable the dummy, then the PT event), that flushes and Stop never
// disable the dummy, the per-CPU status, hotplug, and the release.
func TestPTEvents(t *testing.T) {
	fds := countFDs(t)
	env, fo := failingEnv(t, "0-3", map[int]error{1: unix.ENODEV, 2: unix.EBUSY})
	p, err := newPT(copyPMU(t), PTOptions{AuxPages: 4, DataPages: 2, FlushInterval: -1}, env)
	if err != nil {
		t.Fatal(err)
	}
	s := newAuxLogSink(t)
	if err := p.Start(s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })

	wantPT := p.attr
	wantPT.Bits = unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv | unix.PerfBitSampleIDAll
	wantSide := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Config:      unix.PERF_COUNT_SW_DUMMY,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Sample:      1,
		Sample_type: unix.PERF_SAMPLE_TID | unix.PERF_SAMPLE_TIME | unix.PERF_SAMPLE_CPU | unix.PERF_SAMPLE_IDENTIFIER,
		Bits: unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv | unix.PerfBitSampleIDAll |
			unix.PerfBitComm | unix.PerfBitCommExec | unix.PerfBitTask | unix.PerfBitMmap | unix.PerfBitMmap2 |
			unix.PerfBitContextSwitch,
	}
	if wantPT.Sample_type != wantSide.Sample_type {
		t.Errorf("sample types differ: pt %#x, side band %#x: one trailer layout cannot parse both", wantPT.Sample_type, wantSide.Sample_type)
	}
	calls := fo.take()
	var ptFD, sideFD = map[int]int{}, map[int]int{}
	var got []string
	for _, c := range calls {
		switch c.op {
		case "open":
			switch c.attr {
			case wantPT:
				ptFD[c.cpu] = c.fd
				got = append(got, fmt.Sprintf("open pt %d", c.cpu))
			case wantSide:
				sideFD[c.cpu] = c.fd
				got = append(got, fmt.Sprintf("open side %d", c.cpu))
			default:
				t.Errorf("cpu %d: open with attributes %+v\nwant pt %+v\nor side band %+v", c.cpu, c.attr, wantPT, wantSide)
			}
		case "mmap":
			got = append(got, fmt.Sprintf("mmap %d %d+%d", c.cpu, c.off, c.size))
		case "ioctl":
			who := "side"
			if ptFD[c.cpu] == c.fd {
				who = "pt"
			}
			arg := fmt.Sprint(c.arg)
			if c.req == unix.PERF_EVENT_IOC_SET_OUTPUT {
				arg = "?"
				if c.arg == ptFD[c.cpu] {
					arg = "pt"
				}
			}
			got = append(got, fmt.Sprintf("ioctl %s %d %#x %s", who, c.cpu, c.req, arg))
		default:
			got = append(got, c.op)
		}
	}
	page := os.Getpagesize()
	var want []string
	for _, cpu := range []int{0, 3} {
		want = append(want, fmt.Sprintf("open pt %d", cpu),
			fmt.Sprintf("mmap %d 0+%d", cpu, 3*page),
			fmt.Sprintf("mmap %d %d+%d", cpu, 3*page, 4*page),
			fmt.Sprintf("open side %d", cpu),
			fmt.Sprintf("ioctl side %d %#x pt", cpu, unix.PERF_EVENT_IOC_SET_OUTPUT),
			fmt.Sprintf("ioctl side %d %#x 0", cpu, unix.PERF_EVENT_IOC_ENABLE),
			fmt.Sprintf("ioctl pt %d %#x 0", cpu, unix.PERF_EVENT_IOC_ENABLE))
	}
	if !slices.Equal(got, want) {
		t.Errorf("calls\n %s\nwant\n %s", strings.Join(got, "\n "), strings.Join(want, "\n "))
	}
	wantStates := func(what, want string) {
		t.Helper()
		if got := cpuStates(p); got != want {
			t.Errorf("%s: states %s\nwant %s", what, got, want)
		}
	}
	wantStates("start", "0 tracing, 1 offline, 2 busy (EBUSY: another PT or LBR user), 3 tracing")

	// The side band of the dummy arrives through the PT ring; its trailer
	// parses like the PT event's own records.
	r0 := fo.ring(0)
	r0.record(unix.PERF_RECORD_SWITCH_CPU_WIDE, 0, append(le(4, 7), le(4, 8)...))
	r0.trace([]byte("abc"), 0)
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	if log := joinLog(s.take()); !strings.Contains(log, "side 0 2; trace 0 3; loss 0 flush 1; loss 3 flush 1; round flush") {
		t.Errorf("flush: %s", log)
	}
	if side := s.side[len(s.side)-1]; side.PID != 100 || side.Time != 1001 {
		t.Errorf("switch %+v", side)
	}
	for _, c := range fo.take() {
		if c.op == "ioctl" && c.fd == sideFD[c.cpu] {
			t.Errorf("flush touched the side-band event of cpu %d: ioctl %#x", c.cpu, c.req)
		}
	}

	// cpu 0 goes offline, cpu 1 comes online: seen within a hotplug
	// interval, nothing is enabled on cpu 0 any more.
	setOnline(t, env, "1-3")
	ptWaitFor(t, "the hotplug check", func() bool {
		st := p.Status()
		return st.CPUs[0].State == CPUWentOffline && st.CPUs[1].State == CPUCameOnline
	})
	wantStates("hotplug", "0 went offline (not traced until the next start), 1 came online (traced from the next start), "+
		"2 busy (EBUSY: another PT or LBR user), 3 tracing")
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	var munmaps int
	for _, c := range fo.take() {
		if c.op == "ioctl" && (c.fd == sideFD[c.cpu] || c.cpu == 0) {
			t.Errorf("stop: ioctl %#x on cpu %d fd %d", c.req, c.cpu, c.fd)
		}
		if c.op == "munmap" {
			munmaps++
		}
	}
	if munmaps != 4 {
		t.Errorf("%d munmaps, want 4", munmaps)
	}
	if n := countFDs(t); n != fds {
		t.Errorf("%d fds after Stop, %d before", n, fds)
	}

	// The next Start re-reads the online CPUs.
	delete(fo.fail, 1)
	if err := p.Start(s); err != nil {
		t.Fatal(err)
	}
	wantStates("restart", "1 tracing, 2 busy (EBUSY: another PT or LBR user), 3 tracing")
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
}

// cpuStates returns p's CPU states as "N state, ...".
func cpuStates(p *PT) string {
	var states []string
	for _, c := range p.Status().CPUs {
		states = append(states, fmt.Sprintf("%d %s", c.CPU, c.State))
	}
	return strings.Join(states, ", ")
}

// TestPTNoCPU checks the error of a Start that opens no CPU: every CPU's
// reason with its hint, ErrNoCPU, and nothing left open; and that a CPU
// listed in PTOptions.CPUs but offline is never opened.
func TestPTNoCPU(t *testing.T) {
	fds := countFDs(t)
	env, fo := failingEnv(t, "0-1", map[int]error{0: unix.ENODEV, 1: unix.EBUSY})
	p, err := newPT(copyPMU(t), PTOptions{AuxPages: 2, DataPages: 1, CPUs: []int{0, 1, 5}}, env)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Start(newAuxLogSink(t))
	if err == nil {
		p.Stop()
		t.Fatal("Start succeeded")
	}
	for _, want := range []error{ErrNoCPU, unix.ENODEV, unix.EBUSY} {
		if !errors.Is(err, want) {
			t.Errorf("Start: %v, want %v", err, want)
		}
	}
	for _, hint := range []string{"the cpu is offline", "another PT or LBR user"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("Start: %v, without %q", err, hint)
		}
	}
	for _, c := range fo.take() {
		if c.cpu == 5 {
			t.Errorf("offline cpu 5 opened: %+v", c)
		}
	}
	if got := cpuStates(p); got != "0 offline, 1 busy (EBUSY: another PT or LBR user), 5 offline" {
		t.Errorf("status %s", got)
	}
	if n := countFDs(t); n != fds {
		t.Errorf("%d fds after a failed Start, %d before", n, fds)
	}
}

// TestPTEnableFails checks a CPU whose side-band event cannot be enabled:
// it is closed at once (no ioctl on its PT event), shown as an error, and
// the other CPU traces.
func TestPTEnableFails(t *testing.T) {
	fds := countFDs(t)
	env, fo := failingEnv(t, "0-1", nil)
	fo.failEnable = map[int]error{1: unix.EIO}
	p, err := newPT(copyPMU(t), PTOptions{AuxPages: 2, DataPages: 1}, env)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(newAuxLogSink(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	var enables []int
	for _, c := range fo.take() {
		if c.op == "ioctl" && c.req == unix.PERF_EVENT_IOC_ENABLE {
			enables = append(enables, c.cpu)
		}
	}
	if !slices.Equal(enables, []int{0, 0, 1}) {
		t.Errorf("enables on cpus %v, want [0 0 1]: both events of cpu 0, then cpu 1's side band, which fails", enables)
	}
	st := p.Status().CPUs
	if len(st) != 2 || st[0].State != CPUTracing || st[1].State != CPUError || !errors.Is(st[1].Err, unix.EIO) {
		t.Errorf("status %+v", st)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := countFDs(t); n != fds {
		t.Errorf("%d fds after Stop, %d before", n, fds)
	}
}

// TestPTEnableFailsRings: the run's poller watches the AUX ring of each
// CPU traced, aux_head and aux_tail, at the aux watermark given to the
// kernel; a CPU closed in Start because an enable failed leaves nothing
// there. Its AUX ring is unmapped then, and the reader's look reads the
// fill of every ring the poller watches: one left there is a read of
// unmapped memory (a SIGSEGV with the kernel's munmap) at every wait.
func TestPTEnableFailsRings(t *testing.T) {
	for _, failing := range []int{0, 1} {
		env, fo := failingEnv(t, "0-1", nil)
		fo.failEnable = map[int]error{failing: unix.EIO}
		p, err := newPT(copyPMU(t), PTOptions{AuxPages: 2, DataPages: 1}, env)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Start(newAuxLogSink(t)); err != nil {
			t.Fatal(err)
		}
		p.mu.Lock()
		r := p.run
		var want []watchedRing
		for _, c := range r.cpus {
			want = append(want, watchedRing{&c.rd.page.Aux_head, &c.rd.page.Aux_tail, uint64(p.attr.Aux_watermark)})
		}
		got := slices.Clone(r.poll.rings)
		p.mu.Unlock()
		if !slices.Equal(got, want) {
			t.Errorf("cpu %d failing: the poller watches %d rings, %+v; the run's %d cpus have %+v", failing, len(got), got, len(want), want)
		}
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestChooseBuffers checks the ring sizes chosen from the locked-memory
// limits, as perf chooses them, and what status says about them.
func TestChooseBuffers(t *testing.T) {
	const page = 4096
	for _, tc := range []struct {
		name      string
		o         PTOptions
		lim       mlockLimits
		lerr      error
		ncpu      int
		aux, data int
		why       string
	}{
		{"cap_ipc_lock", PTOptions{}, privileged, nil, 64, 1024, 64, "privileged defaults: CAP_IPC_LOCK"},
		{"paranoid -1", PTOptions{}, mlockLimits{paranoid: -1}, nil, 2, 1024, 64, "privileged defaults: perf_event_paranoid=-1"},
		// 2 x (4 MiB + 256 KiB + 4 KiB) = 8712 KiB fit 2 x 516 + 8192 KiB.
		{"fits the limit", PTOptions{}, mlockLimits{paranoid: 2, mlockKB: 516, memlock: 8 << 20}, nil, 2, 1024, 64,
			"privileged defaults: 8712 KiB of rings, perf_event_mlock_kb=516 x 2 cpus + RLIMIT_MEMLOCK 8192 KiB allow 9224 KiB"},
		{"data flag exceeds", PTOptions{DataPages: 4}, unprivileged, nil, 2, 32, 4,
			"flags and unprivileged defaults: 8232 KiB of rings, perf_event_mlock_kb=516 x 2 cpus + RLIMIT_MEMLOCK 64 KiB allow 1096 KiB"},
		{"exceeds the limit", PTOptions{}, unprivileged, nil, 2, 32, 64,
			"unprivileged defaults: 8712 KiB of rings, perf_event_mlock_kb=516 x 2 cpus + RLIMIT_MEMLOCK 64 KiB allow 1096 KiB"},
		{"limits unknown", PTOptions{}, mlockLimits{}, errors.New("no proc"), 2, 32, 64, "unprivileged defaults: limits unknown: no proc"},
		{"flags", PTOptions{AuxPages: 8, DataPages: 4}, unprivileged, nil, 2, 8, 4, "flags"},
		{"aux flag", PTOptions{AuxPages: 8}, unprivileged, nil, 2, 8, 64,
			"flags and privileged defaults: 584 KiB of rings, perf_event_mlock_kb=516 x 2 cpus + RLIMIT_MEMLOCK 64 KiB allow 1096 KiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			why := chooseBuffers(&o, tc.lim, tc.lerr, tc.ncpu, page)
			if o.AuxPages != tc.aux || o.DataPages != tc.data || why != tc.why {
				t.Errorf("aux %d data %d %q\nwant aux %d data %d %q", o.AuxPages, o.DataPages, why, tc.aux, tc.data, tc.why)
			}
		})
	}
}

// TestPTBuffersFromLimits reads the limits from a proc tree: the
// unprivileged defaults where perf_event_mlock_kb and RLIMIT_MEMLOCK do not
// hold the 4 MiB rings, and bad limit files taken as unknown.
func TestPTBuffersFromLimits(t *testing.T) {
	page := os.Getpagesize()
	env := testEnv(t, "0-1", unprivileged)
	p, err := newPT(copyPMU(t), PTOptions{}, env)
	if err != nil {
		t.Fatal(err)
	}
	st := p.Status()
	if st.AuxPages != unprivAuxBytes/page || st.DataPages != unprivDataBytes/page || !strings.HasPrefix(st.Buffers, "unprivileged defaults: ") {
		t.Errorf("status %+v", st)
	}
	if err := os.WriteFile(filepath.Join(env.procDir, "sys/kernel/perf_event_mlock_kb"), []byte("lots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env.memlock = func() (uint64, error) { return 1 << 40, nil }
	p, err = newPT(copyPMU(t), PTOptions{}, env)
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); st.AuxPages != unprivAuxBytes/page || !strings.Contains(st.Buffers, `"lots" is not a number`) {
		t.Errorf("status %+v", st)
	}
}

// TestPTReconfigure checks branch tracing switched on and off on a running
// source over the fake kernel: the address filter is set on each PT event
// after it opens and before it is enabled; a Reconfigure stops and closes
// every CPU's events, reports a flush loss per CPU to the same sink, and
// opens them again with the new attributes (branch on, no filter); no fd
// is left behind; a refused filter fails Start with the reason.
func TestPTReconfigure(t *testing.T) {
	fds := countFDs(t)
	env, fo := failingEnv(t, "0-1", nil)
	const filter = "filter 0x1000/0x78000@/proc/1/fd/3"
	p, err := newPT(copyPMU(t), PTOptions{AuxPages: 4, DataPages: 2, FlushInterval: -1, Filter: filter}, env)
	if err != nil {
		t.Fatal(err)
	}
	s := newAuxLogSink(t)
	if err := p.Start(s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	branchBit := uint64(1) << 13
	// summary lists the calls that matter here, in order.
	summary := func() string {
		var got []string
		for _, c := range fo.take() {
			switch {
			case c.op == "open" && c.attr.Type == 8:
				got = append(got, fmt.Sprintf("open pt %d branch=%v", c.cpu, c.attr.Config&branchBit != 0))
			case c.op == "filter":
				got = append(got, fmt.Sprintf("filter %d %s", c.cpu, c.text))
			case c.op == "ioctl" && c.req == unix.PERF_EVENT_IOC_ENABLE:
				got = append(got, fmt.Sprintf("enable %d", c.cpu))
			case c.op == "ioctl" && c.req == unix.PERF_EVENT_IOC_DISABLE:
				got = append(got, fmt.Sprintf("disable %d", c.cpu))
			}
		}
		return strings.Join(got, "; ")
	}
	want := "open pt 0 branch=false; filter 0 " + filter + "; enable 0; enable 0; open pt 1 branch=false; filter 1 " + filter + "; enable 1; enable 1"
	if got := summary(); got != want {
		t.Errorf("start:\n %s\nwant\n %s", got, want)
	}
	fo.ring(0).trace([]byte("before"), 0)
	if err := p.Reconfigure(true, ""); err != nil {
		t.Fatal(err)
	}
	want = "disable 0; disable 1; open pt 0 branch=true; enable 0; enable 0; open pt 1 branch=true; enable 1; enable 1"
	if got := summary(); got != want {
		t.Errorf("reconfigure:\n %s\nwant\n %s", got, want)
	}
	if log := joinLog(s.take()); !strings.Contains(log, "trace 0 6; round flush; loss 0 flush 1; loss 1 flush 1") {
		t.Errorf("sink: %s", log)
	}
	if st := p.Stats(); st.Switches != 1 || st.Losses[engine.LossFlush] != 2 {
		t.Errorf("stats %+v", st)
	}
	fo.ring(1).trace([]byte("after"), 0)
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	if log := joinLog(s.take()); !strings.Contains(log, "trace 1 5") {
		t.Errorf("the new events pass no trace: %s", log)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	// Stopped: the configuration waits for the next Start.
	if err := p.Reconfigure(false, filter); err != nil {
		t.Fatal(err)
	}
	if got := summary(); strings.Contains(got, "open") {
		t.Errorf("reconfigure of a stopped source opened events: %s", got)
	}
	fo.failFilter = unix.EINVAL
	err = p.Start(s)
	if !errors.Is(err, ErrNoCPU) || !strings.Contains(err.Error(), "PERF_EVENT_IOC_SET_FILTER") {
		t.Errorf("refused filter: %v", err)
	}
	if n := countFDs(t); n != fds {
		t.Errorf("%d fds, %d before", n, fds)
	}
}
