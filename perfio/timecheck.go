package perfio

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TSCConversion reports whether the kernel gives user space the TSC to
// perf-time conversion (cap_user_time_zero of a perf mmap page), which ptw
// records need for their time. x86 sets it for every event alike, only
// with a stable native sched_clock: under kvm-clock it is clear. So a
// software dummy event of this process, which needs no Intel PT, tells
// before any capture runs. reason says why not when ok is false.
func TSCConversion() (ok bool, reason string, err error) {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_DUMMY,
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Bits:   unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return false, "", fmt.Errorf("perf_event_open dummy: %w (%s)", err, openHint(err))
	}
	defer unix.Close(fd)
	mem, err := unix.Mmap(fd, 0, os.Getpagesize(), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return false, "", fmt.Errorf("mmap dummy page: %w", err)
	}
	defer unix.Munmap(mem)
	_, ok, consistent := readTimeConv((*unix.PerfEventMmapPage)(unsafe.Pointer(&mem[0])))
	switch {
	case !consistent:
		return false, "", fmt.Errorf("perf mmap page: the seqlock never held still")
	case !ok:
		return false, "the kernel gives no TSC conversion (cap_user_time_zero clear: sched_clock is not the stable native TSC, as under kvm-clock)", nil
	}
	return true, "", nil
}
