package perfio

import (
	"fmt"
	"runtime"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// uprobePMUType is the file that holds the type number of the kernel's
// uprobe PMU (perf_event_open of a uprobe without tracefs).
const uprobePMUType = "/sys/bus/event_source/devices/uprobe/type"

// SyncUprobes returns once every uprobe hit whose handlers were running
// when it was called has run them all. The kernel runs a hit's consumers
// (one per event at the probed instruction, the newest first) one after
// the other, preemptibly, inside an RCU Tasks Trace read-side section: a
// thread can stall between two of them for as long as the scheduler keeps
// it off its CPU. Unregistering a uprobe waits for a grace period of that
// RCU (uprobe_unregister_sync), so SyncUprobes opens a perf event of the
// uprobe PMU at offset 0 of a memfd that no process maps (its uprobe
// patches no process) and closes it: the close unregisters it.
func SyncUprobes() error {
	typ, err := readSysfsUint(uprobePMUType, 10, 32)
	if err != nil {
		return fmt.Errorf("uprobe pmu type: %w", err)
	}
	mfd, err := unix.MemfdCreate("ptfs-sync", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("memfd for the uprobe sync: %w", err)
	}
	defer unix.Close(mfd)
	path, err := unix.BytePtrFromString("/proc/self/fd/" + strconv.Itoa(mfd))
	if err != nil {
		return err
	}
	attr := unix.PerfEventAttr{
		Type: uint32(typ),
		Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Ext1: uint64(uintptr(unsafe.Pointer(path))), // uprobe_path
		Ext2: 0,                                     // probe_offset
		Bits: unix.PerfBitDisabled,
	}
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	runtime.KeepAlive(path)
	if err != nil {
		return fmt.Errorf("perf_event_open of a uprobe for the sync: %w", err)
	}
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close the uprobe of the sync: %w", err)
	}
	return nil
}
