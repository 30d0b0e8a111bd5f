package perfio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNoClockSample reports that the kernel wrote no COMM record for the
// clock measurement.
var ErrNoClockSample = errors.New("no comm record of the clock measurement")

// PerfClockOffset measures perf time (the clock of PT's side band and of
// its TSC conversion: events without use_clockid) minus CLOCK_MONOTONIC
// (the clock of classic samples), in ns, so that classic records can be
// placed among branch lines. A software dummy event of this thread
// (no Intel PT needed) records the COMM that renaming the thread to its
// own name writes; its perf time is set against CLOCK_MONOTONIC read
// before and after. The result is within the bracket's half width, which
// is returned too: the narrowest of clockTries, as a thread preempted
// between its clock reads (a loaded machine) widens a bracket to the
// preemption. The clocks drift apart (NTP slews CLOCK_MONOTONIC, up to
// 500 ppm): callers measure again now and then.
func PerfClockOffset() (offset int64, halfWidth uint64, err error) {
	// The event and the rename are of one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Config:      unix.PERF_COUNT_SW_DUMMY,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Sample_type: unix.PERF_SAMPLE_TIME,
		Bits:        unix.PerfBitComm | unix.PerfBitSampleIDAll | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return 0, 0, fmt.Errorf("perf_event_open dummy: %w (%s)", err, openHint(err))
	}
	defer unix.Close(fd)
	pg := os.Getpagesize()
	mem, err := unix.Mmap(fd, 0, 2*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, fmt.Errorf("mmap dummy ring: %w", err)
	}
	defer unix.Munmap(mem)
	ring, err := NewDataRing(mem, pg)
	if err != nil {
		return 0, 0, fmt.Errorf("dummy ring: %w", err)
	}
	var name [16]byte
	if err := unix.Prctl(unix.PR_GET_NAME, uintptr(unsafe.Pointer(&name[0])), 0, 0, 0); err != nil {
		return 0, 0, fmt.Errorf("prctl PR_GET_NAME: %w", err)
	}
	halfWidth = math.MaxUint64
	for range clockTries {
		off, half, err := commOffset(ring, name[:])
		if err != nil {
			return 0, 0, err
		}
		if half < halfWidth {
			offset, halfWidth = off, half
		}
	}
	return offset, halfWidth, nil
}

// clockTries is how many brackets PerfClockOffset takes the narrowest of.
const clockTries = 3

// commOffset renames the thread to name, its own, and returns the perf
// time of the COMM record that ring gets for it minus the middle of the
// CLOCK_MONOTONIC bracket around the rename, and the bracket's half width.
func commOffset(ring *Ring, name []byte) (offset int64, halfWidth uint64, err error) {
	t0 := monotonicNow()
	err = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0, 0, 0)
	t1 := monotonicNow()
	if err != nil {
		return 0, 0, fmt.Errorf("prctl PR_SET_NAME: %w", err)
	}
	ring.Begin()
	defer ring.End()
	for {
		typ, _, rec, ok := ring.Next()
		if !ok {
			return 0, 0, ErrNoClockSample
		}
		// COMM: header, pid, tid, name; its sample_id is the time alone.
		if typ == unix.PERF_RECORD_COMM && len(rec) >= 8+8+8 {
			perf := binary.LittleEndian.Uint64(rec[len(rec)-8:])
			mid := t0 + (t1-t0)/2
			return int64(perf - mid), (t1 - t0 + 1) / 2, nil
		}
	}
}
