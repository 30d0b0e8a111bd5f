package perfio

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"ptfs/decode"

	"golang.org/x/sys/unix"
)

// pollerWithPipe returns a poller whose set holds the read end of a pipe
// (level-triggered, as a ring fd is added) besides its eventfd, and the
// pipe's write end.
func pollerWithPipe(t *testing.T) (*poller, int, int) {
	t.Helper()
	p, err := newPoller()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.close() })
	var pfd [2]int
	if err := unix.Pipe2(pfd[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(pfd[0]); unix.Close(pfd[1]) })
	if err := p.add(pfd[0]); err != nil {
		t.Fatal(err)
	}
	return p, pfd[0], pfd[1]
}

// timedWait runs p.wait(d) and returns how long it took.
func timedWait(t *testing.T, p *poller, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := p.wait(d); err != nil {
		t.Fatalf("wait(%v): %v", d, err)
	}
	return time.Since(start)
}

// timedSleep is timedWait for a wait that should sleep its whole time d:
// when the first wait ends early it waits once more and returns that. An
// fd made ready while no wait was parked leaves the netpoller's wake-up
// pending after the look that saw the fd; the next wait takes it and ends
// with nothing found (a stale wake-up, see poller), and only that wait.
func timedSleep(t *testing.T, p *poller, d time.Duration) time.Duration {
	t.Helper()
	if took := timedWait(t, p, d); took >= d*5/6 {
		return took
	}
	return timedWait(t, p, d)
}

// TestPollerWait checks the wait in the netpoller over the level-triggered
// set: it sleeps its whole time when nothing is ready; an fd made ready
// while it sleeps, or before it starts (while the reader drains), ends it
// at once; an fd left ready keeps ending every wait (the netpoller's edge
// is only a hint, the raw look decides); a wake does the same until reset.
func TestPollerWait(t *testing.T) {
	p, rd, wr := pollerWithPipe(t)
	const long = 5 * time.Second
	write := func() {
		if _, err := unix.Write(wr, []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	consume := func() {
		var b [16]byte
		unix.Read(rd, b[:])
	}

	if d := timedWait(t, p, 30*time.Millisecond); d < 25*time.Millisecond || d > 2*time.Second {
		t.Errorf("idle wait of 30ms took %v", d)
	}
	if d := timedWait(t, p, 0); d > time.Second {
		t.Errorf("wait(0) took %v", d)
	}

	// Ready while the wait sleeps.
	go func() { time.Sleep(20 * time.Millisecond); write() }()
	if d := timedWait(t, p, long); d > 2*time.Second {
		t.Errorf("a pipe made ready during the wait ended it after %v", d)
	}
	// Left ready: every later wait returns at once.
	for i := range 3 {
		if d := timedWait(t, p, long); d > 2*time.Second {
			t.Errorf("wait %d over an fd left ready took %v", i, d)
		}
	}
	consume()
	if d := timedWait(t, p, 30*time.Millisecond); d < 25*time.Millisecond {
		t.Errorf("wait over a drained pipe ended after %v", d)
	}

	// Ready between two waits: the netpoller's readiness came while no
	// one waited; the next wait sees the fd.
	write()
	time.Sleep(10 * time.Millisecond)
	if d := timedWait(t, p, long); d > 2*time.Second {
		t.Errorf("a pipe made ready before the wait ended it after %v", d)
	}
	consume()

	// Many rounds of ready-during-wait: none missed.
	for i := range 50 {
		go func() { time.Sleep(time.Millisecond); write() }()
		if d := timedWait(t, p, long); d > 2*time.Second {
			t.Fatalf("round %d: wakeup missed, wait took %v", i, d)
		}
		consume()
	}

	// A wake ends every wait until reset.
	if err := p.wake(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if d := timedWait(t, p, long); d > 2*time.Second {
			t.Errorf("wait %d after a wake took %v", i, d)
		}
	}
	p.reset()
	if d := timedSleep(t, p, 30*time.Millisecond); d < 25*time.Millisecond {
		t.Errorf("wait after reset ended after %v", d)
	}
}

// TestPollerCloseDuringWait: closing the poller while a wait sleeps ends
// the wait at once with an error (never a hang, never a look at a closed or
// reused fd), and a wake after close does nothing.
func TestPollerCloseDuringWait(t *testing.T) {
	p, _, _ := pollerWithPipe(t)
	done := make(chan error, 1)
	go func() { done <- p.wait(10 * time.Second) }()
	waitInPollerWait(t, p)
	if err := p.close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Error("a wait ended by close returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close did not end the wait")
	}
	if err := p.wake(); err != nil {
		t.Errorf("wake after close: %v", err)
	}
	if err := p.close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

// TestPollerTimerAfterClose: a wait after close (as the disarm of a wait
// that close ended) leaves the timerfd's old number alone: by then it may
// be another file's, here another timer armed for an hour.
func TestPollerTimerAfterClose(t *testing.T) {
	p, err := newPoller()
	if err != nil {
		t.Fatal(err)
	}
	old := p.timer.n
	if err := p.close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	// The lowest free number goes first: the poller freed three.
	other := -1
	for range 3 {
		tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(tfd) })
		if tfd == old {
			other = tfd
		}
	}
	if other < 0 {
		t.Fatalf("no new timerfd took the closed timer's number %d", old)
	}
	hour := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(time.Hour))}
	if err := unix.TimerfdSettime(other, 0, &hour, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(time.Millisecond); err == nil {
		t.Error("a wait after close returned no error")
	}
	var its unix.ItimerSpec
	if err := unix.TimerfdGettime(other, &its); err != nil {
		t.Fatal(err)
	}
	if left := time.Duration(its.Value.Nano()); left < 59*time.Minute {
		t.Errorf("a wait after close set the timer now at its old number: %v to go, armed for an hour", left)
	}
}

// TestPollerWaitNoAlloc: a wait allocates nothing, whether an fd is ready,
// the time is up or it only looks (d <= 0): the reader waits once a pass.
func TestPollerWaitNoAlloc(t *testing.T) {
	p, _, _ := pollerWithPipe(t)
	if err := p.wake(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{time.Second, 0, -time.Second} {
		if a := testing.AllocsPerRun(50, func() { p.wait(d) }); a != 0 {
			t.Errorf("wait(%v) with an fd ready: %v allocations", d, a)
		}
	}
	p.reset()
	if a := testing.AllocsPerRun(5, func() { p.wait(time.Millisecond) }); a != 0 {
		t.Errorf("wait that times out: %v allocations", a)
	}
}

// TestPollerRingFilled: the look reads each registered ring's unread bytes
// (head - tail, modulo 2^64) and a wait ends at once when one holds its
// watermark, though its fd (here a pipe never written) is not ready; under
// the watermark the wait sleeps its time. Such a wait allocates nothing. A
// ring without a watermark is refused, and the set stays as it was.
func TestPollerRingFilled(t *testing.T) {
	p, _, _ := pollerWithPipe(t)
	const mark = 4096
	var pos [2][2]uint64 // head, tail of two rings
	for i := range pos {
		var pfd [2]int
		if err := unix.Pipe2(pfd[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(pfd[0]); unix.Close(pfd[1]) })
		if err := p.addRing(pfd[0], &pos[i][0], &pos[i][1], mark); err != nil {
			t.Fatal(err)
		}
	}
	const d = 300 * time.Millisecond
	for _, tc := range []struct {
		name       string
		ring       int
		head, tail uint64
		ends       bool
	}{
		{"empty", 0, 1000, 1000, false},
		{"a byte short", 0, 1000 + mark - 1, 1000, false},
		{"at the watermark", 0, 1000 + mark, 1000, true},
		{"past it", 0, 1000 + 3*mark, 1000, true},
		{"wrapped u64", 0, mark - 8, ^uint64(0) - 7, true},
		{"wrapped u64, short", 0, mark - 9, ^uint64(0) - 7, false},
		{"second ring", 1, 1000 + mark, 1000, true},
	} {
		pos = [2][2]uint64{}
		pos[tc.ring] = [2]uint64{tc.head, tc.tail}
		if tc.ends {
			if took := timedWait(t, p, d); took >= d/2 {
				t.Errorf("%s: %d bytes unread at watermark %d, the wait took %v", tc.name, tc.head-tc.tail, mark, took)
			}
		} else if took := timedSleep(t, p, d); took < d*5/6 {
			t.Errorf("%s: %d bytes unread at watermark %d, the wait ended after %v", tc.name, tc.head-tc.tail, mark, took)
		}
	}
	pos[0] = [2]uint64{mark, 0}
	if a := testing.AllocsPerRun(50, func() { p.wait(20 * time.Millisecond) }); a != 0 {
		t.Errorf("wait ended by a filled ring: %v allocations", a)
	}
	n := len(p.evs)
	if err := p.addRing(0, &pos[0][0], &pos[0][1], 0); !errors.Is(err, errNoWatermark) {
		t.Errorf("a ring without a watermark: %v, want %v", err, errNoWatermark)
	}
	if len(p.evs) != n || len(p.rings) != 2 {
		t.Errorf("after the refused ring: %d events, %d rings; want %d, 2", len(p.evs), len(p.rings), n)
	}
}

// TestPollerWoken: woken tells a wait that saw a wake, once, and clears the
// wake with it; a ring fd that ended the wait is no wake.
func TestPollerWoken(t *testing.T) {
	p, rd, wr := pollerWithPipe(t)
	if _, err := unix.Write(wr, []byte{1}); err != nil {
		t.Fatal(err)
	}
	timedWait(t, p, time.Second)
	if p.woken() {
		t.Error("woken after a wait that only a ring fd ended")
	}
	var b [1]byte
	unix.Read(rd, b[:])
	if err := p.wake(); err != nil {
		t.Fatal(err)
	}
	timedWait(t, p, time.Second)
	if !p.woken() {
		t.Error("not woken after a wait that a wake ended")
	}
	if p.woken() {
		t.Error("woken twice for one wake")
	}
	if d := timedSleep(t, p, 30*time.Millisecond); d < 25*time.Millisecond {
		t.Errorf("wait after woken ended after %v: the wake was not cleared", d)
	}
}

// ringPoller returns a poller over CPU 0's 16-page ring, which wakes its
// reader at 16 KiB (about 230 hits), with an enabled uprobe on the target
// program's target_nop writing into it; bin is that program (run it pinned
// to CPU 0). Cleanup closes the event before the probe's removal and the
// poller before the ring.
func ringPoller(t *testing.T) (p *poller, cr *cpuRing, bin string) {
	t.Helper()
	tracefs := needKernel(t)
	bin, offs := buildTarget(t)
	ev := probe(t, tracefs, bin, offs["target_nop"], "wm", "%di %si", decode.U64, decode.U64)
	cr, err := openCPURing(0, 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Munmap(cr.task.mem)
		cr.task.fd.Close()
		unix.Munmap(cr.mem)
		cr.anchor.Close()
	})
	if p, err = newPoller(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.close() }) // ends a wait still asleep
	if err := p.addRing(cr.anchor.n, cr.ring.head, cr.ring.tail, cr.wakeup); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PerfEventOpen(perfAttr(unix.PERF_TYPE_TRACEPOINT, uint64(ev.ID)), -1, 0, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		t.Fatalf("open event %d: %v", ev.ID, err)
	}
	t.Cleanup(func() { closeFDs([]int{fd}) }) // before the probe's removal
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_SET_OUTPUT, cr.anchor.n); err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
		t.Fatal(err)
	}
	return p, cr, bin
}

// TestPollerRingWatermark checks that a wait over a CPU's ring ends when
// the ring reaches its wake-up watermark. perf_poll hands a ring's
// readiness out once, and the netpoller's look at the set took it before
// the wait's own look: every such wait slept to its end (the reader read
// its rings only on its timers, 100 ms apart when idle, and the default
// ring lost samples at 100,000 hits/s after 45 ms off the CPU).
func TestPollerRingWatermark(t *testing.T) {
	p, cr, bin := ringPoller(t)
	woke := make(chan error, 1)
	go func() { woke <- p.wait(time.Hour) }()
	waitInPollerWait(t, p)
	// 1,000 hits, 72 KB: past the watermark whatever the machine's load.
	run(t, bin, "1000", "0")
	select {
	case err := <-woke:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		head := atomic.LoadUint64(cr.ring.head)
		t.Fatalf("the wait slept on 10 s after the hits, with %d bytes in a ring that wakes at %d", head, cr.wakeup)
	}
}

// TestPollerRingWakeBetweenWaits: a ring that passes its watermark while no
// wait is parked (the reader is in its pass) ends the next wait at once.
// The kernel's wake-up then reaches the netpoller, whose poll of the set
// takes the ring's one-shot readiness (perf_poll); the next wait's
// RawConn.Read clears that pending wake-up at its start, and its raw look
// finds no fd ready: a wait that trusted the look slept to its timer with
// the ring past its watermark, every round. The 20 ms idle lets the
// netpoller's thread poll the set before the wait starts.
func TestPollerRingWakeBetweenWaits(t *testing.T) {
	p, cr, bin := ringPoller(t)
	const long = 2 * time.Second
	for round := range 3 {
		timedWait(t, p, 0) // a look: takes any readiness left
		run(t, bin, "1000", "0")
		time.Sleep(20 * time.Millisecond)
		head := atomic.LoadUint64(cr.ring.head)
		tail := atomic.LoadUint64(cr.ring.tail)
		if head-tail < cr.wakeup {
			t.Fatalf("round %d: %d bytes in the ring after 1,000 hits, under its watermark %d", round, head-tail, cr.wakeup)
		}
		if d := timedWait(t, p, long); d >= long/2 {
			t.Errorf("round %d: the wait after the ring passed its watermark (%d bytes, wakes at %d) took %v", round, head-tail, cr.wakeup, d)
		}
		atomic.StoreUint64(cr.ring.tail, head) // read: the next round starts empty
	}
}

// TestPollerWaitEndedEarlyDisarms: a wait that a ready fd ends before its
// time disarms its timer, which would otherwise fire into the reader's
// pass and wake the netpoller's thread for nothing; a wait that timed out
// leaves nothing armed either, and the next wait sleeps its time.
func TestPollerWaitEndedEarlyDisarms(t *testing.T) {
	p, rd, wr := pollerWithPipe(t)
	left := func() time.Duration {
		var its unix.ItimerSpec
		if _, _, errno := unix.RawSyscall(unix.SYS_TIMERFD_GETTIME, uintptr(p.timer.n), uintptr(unsafe.Pointer(&its)), 0); errno != 0 {
			t.Fatalf("timerfd_gettime: %v", errno)
		}
		return time.Duration(its.Value.Nano())
	}
	for i := range 3 {
		go func() { time.Sleep(5 * time.Millisecond); unix.Write(wr, []byte{1}) }()
		timedWait(t, p, time.Hour)
		if l := left(); l != 0 {
			t.Errorf("round %d: a wait that a ready fd ended left its timer armed, %v to go", i, l)
		}
		var b [16]byte
		unix.Read(rd, b[:])
		if d := timedWait(t, p, 30*time.Millisecond); d < 25*time.Millisecond {
			t.Errorf("round %d: the wait after one ended early ended after %v", i, d)
		}
		if l := left(); l != 0 {
			t.Errorf("round %d: a wait that timed out left its timer armed, %v to go", i, l)
		}
	}
}

// TestPollerWaitSysmon: a wait that sleeps its time wakes no more threads
// than its own wake-up. A deadline of the netpoller (the poller's wait
// before the timerfd) is a Go timer, which also ends sysmon's deep sleep,
// after which it polls a round or more before it sleeps again: compared
// in the same run, the thread switches of the process (all of them
// voluntary sleeps) over waits of 5 ms, against reads with a deadline.
func TestPollerWaitSysmon(t *testing.T) {
	p, _, _ := pollerWithPipe(t)
	var pfd [2]int
	if err := unix.Pipe2(pfd[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	rd := os.NewFile(uintptr(pfd[0]), "pipe")
	t.Cleanup(func() { rd.Close(); unix.Close(pfd[1]) })
	const waits, d = 60, 5 * time.Millisecond
	deadline := func() {
		var b [1]byte
		rd.SetReadDeadline(time.Now().Add(d))
		if _, err := rd.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read with a deadline: %v", err)
		}
	}
	wait := func() {
		if err := p.wait(d); err != nil {
			t.Fatal(err)
		}
	}
	switches := func(f func()) int {
		time.Sleep(50 * time.Millisecond) // sysmon back in its deep sleep
		n0 := voluntarySwitches(t)
		for range waits {
			f()
		}
		return voluntarySwitches(t) - n0
	}
	// Two rounds each, in turn: the fewest of each.
	w, dl := switches(wait), switches(deadline)
	w, dl = min(w, switches(wait)), min(dl, switches(deadline))
	t.Logf("thread switches over %d waits of %v: poller %d, deadline %d", waits, d, w, dl)
	if w*4 > dl*3 {
		t.Errorf("the poller's waits took %d thread switches, reads with a deadline %d: not a quarter fewer", w, dl)
	}
}

// voluntarySwitches returns the voluntary context switches of all the
// process's threads.
func voluntarySwitches(t *testing.T) int {
	paths, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				k, _ := strconv.Atoi(strings.TrimSpace(v))
				n += k
			}
		}
	}
	return n
}
