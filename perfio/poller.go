package perfio

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fd is a file descriptor that closes exactly once: Close is idempotent and
// safe against concurrent calls, which all return the first result, so that
// no path closes a number the process has since reused.
type fd struct {
	n    int
	once sync.Once
	err  error
}

// newFD takes ownership of n.
func newFD(n int) *fd { return &fd{n: n} }

// Close closes the descriptor the first time and returns that result.
func (f *fd) Close() error {
	f.once.Do(func() { f.err = unix.Close(f.n) })
	return f.err
}

// poller is where the readers (Classic, PT) sleep: an epoll set over their
// ring fds plus an eventfd that callers write to wake the reader for a
// request (flush, remove, stop) at once.
//
// The set itself waits in the Go netpoller (it is pollable: readable while
// one of its fds is), and is looked at with a raw, non-blocking
// epoll_pwait. A reader that slept in a blocking epoll_wait made the
// runtime's sysmon poll every 20 µs for a millisecond or more at every
// pass (issue 13): exitsyscall and entersyscall wake it from its deep sleep
// and restart that polling, and after 10 ms in the syscall it retook the
// P and started again. Parked in the netpoller the reader holds no P and
// makes no syscall to sleep or wake, so sysmon stays asleep.
//
// A perf ring's readiness is read once: perf_poll clears it. The
// netpoller's epoll learns that the set is readable by polling the set,
// which polls the ring's fd and so takes that readiness: the raw look
// after the netpoller's wake-up then finds nothing (the reader slept
// through every wake-up at its ring's watermark, to the end of its sleep).
// A look that follows the netpoller's wake-up therefore ends the wait
// whatever it finds. A wake-up that came while no wait was parked is lost
// that way too: RawConn.Read clears the netpoller's pending wake-up at its
// start. So the look also reads each ring's fill from its control page
// (rings, addRing) and ends the wait when one is at its watermark; it
// runs after that clearing, so a ring that crosses later wakes the parked
// wait.
//
// The wait's time is a timerfd in the set, not a deadline of the
// netpoller: every Go timer also bounds sysmon's deep sleep, so a deadline
// at each pass (25 ms apart while records are held) woke sysmon 40 times a
// second, and each time it polled a few rounds more before it slept again
// (DESIGN §4, the twelfth pass). The timerfd is armed and disarmed with raw
// system calls, which do not wake it either.
type poller struct {
	ep    *os.File // the epoll set, registered in the netpoller
	rc    syscall.RawConn
	epfd  int
	event *fd
	// timer ends a wait that nothing else ends; armed tells that it may
	// still fire (a wait that something else ended disarms it), fired
	// that a look saw it ready.
	timer *fd
	armed bool
	fired bool
	evs   []unix.EpollEvent // one per fd in the set
	rings []watchedRing     // the rings whose fds are in the set
	// ready and look are rc.Read's and rc.Control's checks, made once so
	// that a wait allocates nothing; errno is their result. looks counts
	// ready's calls in a wait: rc.Read calls it again only after the
	// netpoller's wake-up.
	ready func(fd uintptr) bool
	look  func(fd uintptr)
	errno syscall.Errno
	looks int
	// woke: a look saw the eventfd ready since the last woken.
	woke bool

	// mu orders wake against close: a wake after close does nothing
	// instead of writing to a closed (or reused) descriptor.
	mu     sync.RWMutex
	closed bool
}

// newPoller returns a poller whose set holds only its eventfd.
func newPoller() (*poller, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	// Non-blocking, os.NewFile puts it in the netpoller.
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("epoll set non-blocking: %w", err)
	}
	p := &poller{ep: os.NewFile(uintptr(ep), "epoll"), epfd: ep}
	if p.rc, err = p.ep.SyscallConn(); err != nil {
		return nil, errors.Join(fmt.Errorf("epoll raw conn: %w", err), p.close())
	}
	// os.NewFile falls back to a plain blocking file when the runtime
	// cannot register the set (epoll_ctl fails: ENOSPC at the user's
	// max_user_watches); every wait would then fail, each pass counted as
	// an error, so refuse it here.
	if err := p.ep.SetReadDeadline(time.Time{}); err != nil {
		return nil, errors.Join(fmt.Errorf("epoll set not in the Go netpoller: %w", err), p.close())
	}
	p.ready = func(fd uintptr) bool {
		p.looks++
		ready := p.check(fd)
		return ready || p.filled() || p.looks > 1
	}
	p.look = func(fd uintptr) { p.check(fd) }
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("wake eventfd: %w", err), p.close())
	}
	p.event = newFD(ev)
	if err := p.add(ev); err != nil {
		return nil, errors.Join(fmt.Errorf("wake eventfd: %w", err), p.close())
	}
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("wait timerfd: %w", err), p.close())
	}
	p.timer = newFD(tfd)
	if err := p.add(tfd); err != nil {
		return nil, errors.Join(fmt.Errorf("wait timerfd: %w", err), p.close())
	}
	return p, nil
}

// add puts fd in the set for reading; every wakeup drains all rings, so the
// event data is unused.
func (p *poller) add(fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll add fd %d: %w", fd, err)
	}
	p.evs = append(p.evs, unix.EpollEvent{})
	return nil
}

// watchedRing is a ring the look reads: the producer's and consumer's
// positions in its mapped control page, and the unread bytes at which the
// kernel wakes the reader.
type watchedRing struct {
	head, tail *uint64
	mark       uint64
}

// errNoWatermark reports a ring registered without a wake-up watermark,
// which the look would find full at every wait.
var errNoWatermark = errors.New("ring without a wake-up watermark")

// addRing puts a ring's fd in the set, as add, and registers the ring:
// head and tail are its positions in the fd's mapped control page (data
// or aux), mark the bytes past tail at which the kernel wakes the reader
// (the event's wakeup_watermark or aux_watermark), which must not be 0.
// The mapping must outlive the poller's waits.
func (p *poller) addRing(fd int, head, tail *uint64, mark uint64) error {
	if mark == 0 {
		return fmt.Errorf("poller fd %d: %w", fd, errNoWatermark)
	}
	if err := p.add(fd); err != nil {
		return err
	}
	p.rings = append(p.rings, watchedRing{head: head, tail: tail, mark: mark})
	return nil
}

// filled reports whether a ring holds its watermark's bytes unread: the
// kernel's wake-up for it may have been taken by the netpoller's poll of
// the set (see poller). Atomic loads, as the Ring's: no system call.
func (p *poller) filled() bool {
	for i := range p.rings {
		r := &p.rings[i]
		if atomic.LoadUint64(r.head)-atomic.LoadUint64(r.tail) >= r.mark {
			return true
		}
	}
	return false
}

// check reports whether the set has an fd ready (or the look failed),
// consuming the ready events as epoll_wait does. It never blocks, so it
// uses the raw syscall: an entersyscall would wake sysmon.
func (p *poller) check(fd uintptr) bool {
	n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, fd,
		uintptr(unsafe.Pointer(&p.evs[0])), uintptr(len(p.evs)), 0, 0, 0)
	if errno == unix.EINTR {
		errno = 0
	}
	p.errno = errno
	if errno == 0 {
		for i := range int(n) {
			p.woke = p.woke || p.evs[i].Fd == int32(p.event.n)
			p.fired = p.fired || p.evs[i].Fd == int32(p.timer.n)
		}
	}
	return n > 0 || errno != 0
}

// setTimer arms the timer to fire once after d, or disarms it for d 0.
// Arming also clears an expiry not read (the timerfd's count), so that a
// timer that fired before is no longer ready. A raw system call: it never
// blocks, and an entersyscall would wake sysmon. After close it does
// nothing: the descriptor's number may be another file's by then.
func (p *poller) setTimer(d time.Duration) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		p.armed = false
		return nil
	}
	its := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	_, _, errno := unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, uintptr(p.timer.n), 0,
		uintptr(unsafe.Pointer(&its)), 0, 0, 0)
	p.armed = d > 0 && errno == 0
	if errno != 0 {
		return fmt.Errorf("timerfd_settime: %w", errno)
	}
	return nil
}

// wait sleeps until a ring reaches its wakeup watermark (or holds that
// much unread when it starts), a wake, or d has passed. An interrupted
// sleep is no error. Only the reader calls it. A wake-up the netpoller
// took while the reader was not parked (for an fd that the reader's own
// look then saw) ends the next wait at once, with nothing found: one
// stale pass, then the wait sleeps again.
func (p *poller) wait(d time.Duration) error {
	var err error
	if d <= 0 {
		err = p.rc.Control(p.look)
	} else if err = p.setTimer(d); err == nil {
		p.looks, p.fired = 0, false
		err = p.rc.Read(p.ready)
		if p.armed && !p.fired {
			// Ended before its time: a timer left armed would fire
			// into the reader's pass and wake the netpoller's thread
			// for nothing.
			err = errors.Join(err, p.setTimer(0))
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("epoll wait: %w", err)
	case p.errno != 0:
		return fmt.Errorf("epoll_pwait: %w", p.errno)
	}
	return nil
}

// wake makes the reader's wait return now, and every wait after it until
// reset. After close it does nothing.
func (p *poller) wake() error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil
	}
	one := [8]byte{1}
	if _, err := unix.Write(p.event.n, one[:]); err != nil && !errors.Is(err, unix.EAGAIN) {
		return fmt.Errorf("wake reader: %w", err)
	}
	return nil
}

// woken reports whether a wait saw a wake since the last call, and clears
// it then (reset). A reader that takes its requests after woken returns
// true misses none: a wake that woken clears was made after its request
// was queued, and a later one ends the next wait. Only the reader calls
// it.
func (p *poller) woken() bool {
	if !p.woke {
		return false
	}
	p.woke = false
	p.reset()
	return true
}

// reset clears the wake, so that the next wait sleeps.
func (p *poller) reset() {
	var buf [8]byte
	unix.Read(p.event.n, buf[:]) // EAGAIN when already read
}

// close releases the epoll set and the eventfd; the ring fds stay with
// their owners. It is idempotent.
func (p *poller) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var errs []error
	if p.event != nil {
		if err := p.event.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close reader eventfd: %w", err))
		}
	}
	if p.timer != nil {
		if err := p.timer.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close reader timerfd: %w", err))
		}
	}
	if p.ep != nil {
		if err := p.ep.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, fmt.Errorf("close reader epoll: %w", err))
		}
	}
	return errors.Join(errs...)
}
