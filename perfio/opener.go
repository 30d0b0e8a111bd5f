package perfio

import (
	"golang.org/x/sys/unix"
)

// opener is the kernel interface of PT: perf_event_open, the ioctls on an
// event and the mappings of its rings. The kernel's is kernelOpener; tests
// put a fake in its place that records every call and fails on demand.
// Descriptors it returns are closed with unix.Close (an fd), so a fake
// returns real descriptors.
type opener interface {
	// open is perf_event_open for all processes on cpu.
	open(attr *unix.PerfEventAttr, cpu, groupFD int, flags int) (int, error)
	// ioctl runs a PERF_EVENT_IOC_* request with an int argument.
	ioctl(fd int, req uint, arg int) error
	// setFilter is PERF_EVENT_IOC_SET_FILTER with the filter's text.
	setFilter(fd int, filter string) error
	// mmap maps size bytes of fd at offset off, shared and writable.
	mmap(fd int, off int64, size int) ([]byte, error)
	// munmap releases a mapping made by mmap.
	munmap(b []byte) error
}

// kernelOpener is the opener of the running kernel.
type kernelOpener struct{}

func (kernelOpener) open(attr *unix.PerfEventAttr, cpu, groupFD int, flags int) (int, error) {
	return unix.PerfEventOpen(attr, -1, cpu, groupFD, flags)
}

func (kernelOpener) ioctl(fd int, req uint, arg int) error { return unix.IoctlSetInt(fd, req, arg) }

func (kernelOpener) setFilter(fd int, filter string) error {
	return unix.IoctlSetString(fd, unix.PERF_EVENT_IOC_SET_FILTER, filter)
}

func (kernelOpener) mmap(fd int, off int64, size int) ([]byte, error) {
	return unix.Mmap(fd, off, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

func (kernelOpener) munmap(b []byte) error { return unix.Munmap(b) }
