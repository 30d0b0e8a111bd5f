package perfio

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"ptfs/engine"
	"ptfs/internal/testkit"

	"golang.org/x/sys/unix"
)

// TestPTOptions checks option validation and defaults.
func TestPTOptions(t *testing.T) {
	dir := copyPMU(t)
	env := testEnv(t, "0-1", privileged)
	for _, tc := range []struct {
		name string
		o    PTOptions
	}{
		{"data pages not power of two", PTOptions{DataPages: 3}},
		{"aux pages not power of two", PTOptions{AuxPages: 1000}},
		{"negative aux pages", PTOptions{AuxPages: -2}},
		{"too many pages", PTOptions{AuxPages: 1 << 21}},
		{"aux ring below 8 KiB", PTOptions{AuxPages: 1}},
		{"watermark beyond ring", PTOptions{AuxPages: 2, AuxWatermark: 1 << 20}},
		{"negative watermark", PTOptions{AuxWatermark: -1}},
		{"cpu twice", PTOptions{CPUs: []int{1, 1}}},
		{"negative cpu", PTOptions{CPUs: []int{-1}}},
	} {
		if _, err := newPT(dir, tc.o, env); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("%s: %v, want engine.ErrOptions", tc.name, err)
		}
	}
	if _, err := newPT(dir, PTOptions{AuxPages: 1}, env); err == nil || !strings.Contains(err.Error(), "at least 8 KiB") {
		t.Errorf("--aux-pages 1: %v, want the 8 KiB reason", err)
	}
	p, err := newPT(dir, PTOptions{}, env)
	if err != nil {
		t.Fatal(err)
	}
	want := PTOptions{DataPages: DefaultPTDataPages, AuxPages: privAuxBytes / os.Getpagesize(), AuxWatermark: DefaultAuxWatermark, FlushInterval: DefaultFlushInterval}
	if o := p.opts; o.DataPages != want.DataPages || o.AuxPages != want.AuxPages || o.AuxWatermark != want.AuxWatermark || o.FlushInterval != want.FlushInterval {
		t.Errorf("defaults %+v, want %+v", o, want)
	}
	if p.attr.Aux_watermark != DefaultAuxWatermark {
		t.Errorf("aux watermark %d", p.attr.Aux_watermark)
	}
	small, err := newPT(dir, PTOptions{AuxPages: 2}, env)
	if err != nil {
		t.Fatal(err)
	}
	if want := os.Getpagesize(); small.opts.AuxWatermark != want {
		t.Errorf("default watermark of a 2-page ring: %d, want %d", small.opts.AuxWatermark, want)
	}
	if err := p.Start(nil); !errors.Is(err, engine.ErrOptions) {
		t.Errorf("Start(nil): %v", err)
	}
	if err := p.Flush(); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Flush before Start: %v", err)
	}
	if err := p.Stop(); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Stop before Start: %v", err)
	}
}

// TestNewPTHere checks this machine's real sysfs: without an intel_pt PMU,
// NewPT fails with ErrNoPT and opens nothing.
func TestNewPTHere(t *testing.T) {
	if _, err := os.Stat(PTSysfsDir); err == nil {
		t.Skipf("%s exists: this machine has Intel PT, the no-PT path cannot be checked here", PTSysfsDir)
	}
	fds := countFDs(t)
	p, err := NewPT(PTSysfsDir, PTOptions{})
	if !errors.Is(err, ErrNoPT) || p != nil {
		t.Fatalf("NewPT: %v, want ErrNoPT", err)
	}
	if !strings.Contains(err.Error(), PTSysfsDir) {
		t.Errorf("error does not name %s: %v", PTSysfsDir, err)
	}
	t.Log(err)
	if got := countFDs(t); got != fds {
		t.Errorf("%d fds after NewPT, %d before", got, fds)
	}
}

// needPerf makes the test Unavailable unless this process may open system-wide perf events.
func needPerf(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root for system-wide perf events")
	}
}

// TestPTStartFails runs Start on the real kernel with PMU trees that make it
// fail at each step it can reach without PT hardware, and checks the error
// and that every fd and mapping is released.
func TestPTStartFails(t *testing.T) {
	needPerf(t)
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string)
		want   error
		hint   string
	}{
		{
			// No PMU has this type: perf_event_open fails.
			name:   "no such pmu",
			change: func(t *testing.T, dir string) { writePMUFile(t, dir, "type", "4000000\n") },
			want:   unix.ENOENT,
			hint:   "not supported",
		},
		{
			// A software cpu-clock event with every PT field in config2,
			// which it ignores: it opens and maps its data ring, but has
			// no AUX area, so the AUX mmap fails after the first CPU's
			// event and data ring are open.
			name: "no aux area",
			change: func(t *testing.T, dir string) {
				writePMUFile(t, dir, "type", "1\n")
				for name, spec := range map[string]string{"pt": "config2:0", "tsc": "config2:1", "ptw": "config2:2",
					"fup_on_ptw": "config2:3", "branch": "config2:4", "psb_period": "config2:8-11",
					"mtc": "config2:5", "mtc_period": "config2:12-15"} {
					writePMUFile(t, dir, "format/"+name, spec+"\n")
				}
			},
			want: unix.EOPNOTSUPP,
			hint: "no AUX area",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyPMU(t)
			tc.change(t, dir)
			p, err := NewPT(dir, PTOptions{DataPages: 1, AuxPages: 4, AuxWatermark: 4096})
			if err != nil {
				t.Fatal(err)
			}
			fds := countFDs(t)
			for range 2 { // a failed Start leaves p ready for another
				err = p.Start(newAuxLogSink(t))
				if err == nil {
					p.Stop()
					t.Fatal("Start succeeded")
				}
				if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.hint) || !strings.Contains(err.Error(), "cpu") {
					t.Errorf("Start: %v, want %v with hint %q", err, tc.want, tc.hint)
				}
				if got := countFDs(t); got != fds {
					t.Errorf("%d fds after a failed Start, %d before", got, fds)
				}
			}
			t.Log(err)
			if err := p.Stop(); !errors.Is(err, ErrNotStarted) {
				t.Errorf("Stop after a failed Start: %v", err)
			}
		})
	}
}

// fakePTRun is a run of p over fake mappings, one per CPU, with real epoll
// and eventfd. The CPUs' fds are /dev/null, where the enable and disable
// ioctls fail (counted as errors); the mappings are not the kernel's, so
// release must not unmap them: the ptCPUs hold none.
func fakePTRun(t *testing.T, p *PT, fakes ...*fakeAux) *ptRun {
	t.Helper()
	r := &ptRun{p: p, flushReq: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	var err error
	if r.poll, err = newPoller(); err != nil {
		t.Fatal(err)
	}
	for i, f := range fakes {
		rd, err := newAuxReader(i, f.mem, f.aux, fakePage, &p.cnt)
		if err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		r.cpus = append(r.cpus, &ptCPU{cpu: i, fd: newFD(fd), op: p.op, rd: rd})
	}
	return r
}

// ptWaitFor polls cond for up to 10 s.
func ptWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPTReader runs the reader goroutine over two fake CPUs: trace flows
// to the sink, Flush reports a flush gap per CPU and ends with
// Round(true), idle CPUs get flushed every FlushInterval, and Stop passes
// on the rest and releases the fds.
func TestPTReader(t *testing.T) {
	fds := countFDs(t)
	f0, f1 := newFakeAux(4096, 256), newFakeAux(4096, 256)
	f1.cpu = 1
	p := &PT{opts: PTOptions{FlushInterval: 20 * time.Millisecond}, op: kernelOpener{}, cpuDir: cpuSysDir}
	s := newAuxLogSink(t)
	r := fakePTRun(t, p, f0, f1)
	p.run = r
	go r.loop(s)

	f0.trace([]byte("abc"), 0)
	f1.trace([]byte("xy"), 0)
	ptWaitFor(t, "the trace", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.buf(0).Len() >= 3 && s.buf(1).Len() >= 2
	})
	// Nothing published for a few intervals: both CPUs get flushed.
	ptWaitFor(t, "idle flushes", func() bool { return p.Stats().Losses[engine.LossFlush] >= 4 })
	if p.Stats().Errors == 0 {
		t.Error("failed ioctls on /dev/null not counted")
	}

	s.take()
	f0.trace([]byte("def"), 0)
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	log := joinLog(s.take())
	if !strings.Contains(log, "trace 0 3; loss 0 flush 1; loss 1 flush 1; round flush") {
		t.Errorf("Flush: %s", log)
	}

	f1.trace([]byte("z"), 0)
	if err := p.Stop(); err == nil {
		t.Error("Stop: disabling /dev/null succeeded")
	}
	if p.run != nil {
		t.Error("run left after Stop")
	}
	log = joinLog(s.take())
	if !strings.HasSuffix(log, "trace 1 1; round flush") {
		t.Errorf("Stop: %s", log)
	}
	if got0, got1 := s.buf(0).String(), s.buf(1).String(); strings.ReplaceAll(got0, "|", "") != "abcdef" || strings.ReplaceAll(got1, "|", "") != "xyz" {
		t.Errorf("trace %q %q", got0, got1)
	}
	if got := countFDs(t); got != fds {
		t.Errorf("%d fds after Stop, %d before", got, fds)
	}
	st := p.Stats()
	if st.Bytes != 9 || st.Records != 4 {
		t.Errorf("stats %+v", st)
	}
}

// TestPTFlushIdle checks that only CPUs that published nothing since the
// last check are flushed, and that a truncation asks for the event to be
// enabled again.
func TestPTFlushIdle(t *testing.T) {
	f0, f1 := newFakeAux(4096, 64), newFakeAux(4096, 64)
	f1.cpu = 1
	p := &PT{op: kernelOpener{}}
	r := fakePTRun(t, p, f0, f1)
	defer r.release()
	s := newAuxLogSink(t)
	f0.trace([]byte("abc"), 0)
	r.drainAll(s)
	r.flushIdle(s) // cpu 0 published since the start: only cpu 1 is flushed
	if got := joinLog(s.take()); got != "trace 0 3; loss 1 flush 1" {
		t.Errorf("first check: %s", got)
	}
	f1.trace([]byte("x"), 0)
	r.flushIdle(s) // cpu 1 published: only cpu 0 is flushed
	if got := joinLog(s.take()); got != "loss 0 flush 1" {
		t.Errorf("second check: %s", got)
	}
	f0.trace(make([]byte, 100), 0)
	r.drainCPU(s, r.cpus[0])
	if r.cpus[0].reenable != reenablePasses || r.cpus[1].reenable != 0 {
		t.Errorf("after a truncation on cpu 0: reenable %v %v", r.cpus[0].reenable, r.cpus[1].reenable)
	}
	if got := atomic.LoadUint64(&f0.page.Aux_tail); got != 3+64 {
		t.Errorf("aux_tail %d", got)
	}
}

// TestPTReenable checks the enables after a truncation: one at the end of
// each read pass, so that one after the kernel's pending disable wins, until
// the event publishes trace again or reenablePasses passes went by; a flush
// ends them.
func TestPTReenable(t *testing.T) {
	f0 := newFakeAux(4096, 64)
	fo := newFakeOpener()
	p := &PT{op: fo}
	r := fakePTRun(t, p, f0)
	defer r.release()
	s := newAuxLogSink(t)
	enables := func() int {
		n := 0
		for _, c := range fo.take() {
			if c.op == "ioctl" && c.req == unix.PERF_EVENT_IOC_ENABLE && c.fd == r.cpus[0].fd.n {
				n++
			}
		}
		return n
	}
	pass := func() { r.drainAll(s); r.reenableAll() }

	f0.trace(make([]byte, 100), 0) // truncated: the kernel disables the event
	for range reenablePasses + 5 {
		pass()
	}
	if n := enables(); n != reenablePasses {
		t.Errorf("%d enables after a truncation and no trace since, want %d", n, reenablePasses)
	}

	f0.trace(make([]byte, 100), 0)
	pass()
	pass()
	f0.trace([]byte("running"), 0) // the event runs again
	for range 5 {
		pass()
	}
	if n := enables(); n != 2 {
		t.Errorf("%d enables, want 2: none once aux_head moved", n)
	}

	f0.trace(make([]byte, 100), 0)
	pass()
	r.flushCPU(s, r.cpus[0])
	pass()
	if n := enables(); n != 2 {
		t.Errorf("%d enables, want 2: the pass's and the flush's", n)
	}
}
