package capture

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// The readers sleep in epoll_wait on their rings and on an eventfd, which
// callers write to wake them for a request (flush, remove, stop).

// newWake returns a non-blocking eventfd in the epoll set epfd.
func newWake(epfd int) (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("capture: wake eventfd: %w", err)
	}
	if err := epollAdd(epfd, fd); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("capture: epoll add wake eventfd: %w", err)
	}
	return fd, nil
}

// epollAdd adds fd to the epoll set for reading; every wakeup drains all
// rings, so the event data is unused.
func epollAdd(epfd, fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	return unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev)
}

// wakeUp makes the reader sleeping on the eventfd wake return.
func wakeUp(wake int) error {
	one := [8]byte{1}
	if _, err := unix.Write(wake, one[:]); err != nil && !errors.Is(err, unix.EAGAIN) {
		return fmt.Errorf("capture: wake reader: %w", err)
	}
	return nil
}

// resetWake clears the eventfd wake, so that the next epoll_wait sleeps.
func resetWake(wake int) {
	var buf [8]byte
	unix.Read(wake, buf[:]) // EAGAIN when already read
}
