package perfio

import (
	"errors"
	"fmt"
	"sync"
	"time"

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
type poller struct {
	epoll, event *fd
	evs          []unix.EpollEvent // one per fd in the set

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
	p := &poller{epoll: newFD(ep)}
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("wake eventfd: %w", err), p.close())
	}
	p.event = newFD(ev)
	if err := p.add(ev); err != nil {
		return nil, errors.Join(fmt.Errorf("wake eventfd: %w", err), p.close())
	}
	return p, nil
}

// add puts fd in the set for reading; every wakeup drains all rings, so the
// event data is unused.
func (p *poller) add(fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(p.epoll.n, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll add fd %d: %w", fd, err)
	}
	p.evs = append(p.evs, unix.EpollEvent{})
	return nil
}

// wait sleeps until a ring reaches its wakeup watermark, a wake, or d
// (rounded up to a millisecond) has passed. An interrupted sleep is no
// error. Only the reader calls it.
func (p *poller) wait(d time.Duration) error {
	ms := max(0, int((d+time.Millisecond-1)/time.Millisecond))
	if _, err := unix.EpollWait(p.epoll.n, p.evs, ms); err != nil && !errors.Is(err, unix.EINTR) {
		return fmt.Errorf("epoll_wait: %w", err)
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
	for _, f := range []*fd{p.event, p.epoll} {
		if f != nil {
			if err := f.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close reader fd: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
