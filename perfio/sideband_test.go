package perfio

import (
	"encoding/binary"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"ptfs/engine"

	"golang.org/x/sys/unix"
)

// TestSideBandKernel checks the side-band event on this machine's kernel,
// without PT: a dummy event with PTAttr's sample_type and flags stands in
// for the PT event and owns the ring, stays disabled (as the PT event during
// a flush), and SideBandAttr's event, redirected into that ring with
// SET_OUTPUT, must deliver the switches and the exec of a program run on
// the CPU, each record parsing with the one 32-byte trailer.
func TestSideBandKernel(t *testing.T) {
	needPerf(t)
	const cpu = 0
	var op kernelOpener
	owner := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Config:      unix.PERF_COUNT_SW_DUMMY,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Sample_type: ptSampleType,
		Bits:        ptBits,
	}
	ofd, err := op.open(&owner, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		t.Fatalf("open the ring's owner: %v", err)
	}
	t.Cleanup(func() { unix.Close(ofd) })
	page := os.Getpagesize()
	mem, err := op.mmap(ofd, 0, (1+16)*page)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.munmap(mem) })
	side := SideBandAttr()
	sfd, err := op.open(&side, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		t.Fatalf("open the side-band event: %v", err)
	}
	t.Cleanup(func() { unix.Close(sfd) })
	if err := op.ioctl(sfd, unix.PERF_EVENT_IOC_SET_OUTPUT, ofd); err != nil {
		t.Fatalf("SET_OUTPUT of the side-band event into the owner's ring: %v", err)
	}
	if err := op.ioctl(sfd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
		t.Fatal(err)
	}

	// Sleep and run a program on the CPU: switches, a comm, mmaps.
	tid := make(chan int, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread stays pinned; it ends with the goroutine
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- err
			return
		}
		tid <- unix.Gettid()
		for range 5 {
			time.Sleep(time.Millisecond)
		}
		errc <- exec.Command("/bin/true").Run()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	me := <-tid
	if err := op.ioctl(sfd, unix.PERF_EVENT_IOC_DISABLE, 0); err != nil {
		t.Fatal(err)
	}

	ring, err := NewDataRing(mem, page)
	if err != nil {
		t.Fatal(err)
	}
	var p sideParser
	var ev engine.SideEvent
	var switches, mine, comms int
	ring.Begin()
	for {
		typ, misc, rec, ok := ring.Next()
		if !ok {
			break
		}
		if typ == unix.PERF_RECORD_LOST || !isSide(typ) {
			continue
		}
		if err := p.parse(typ, misc, rec, &ev); err != nil {
			t.Errorf("record type %d: %v", typ, err)
			continue
		}
		if got := binary.LittleEndian.Uint32(rec[len(rec)-16:]); got != cpu {
			t.Errorf("record type %d: trailer cpu %d, want %d", typ, got, cpu)
		}
		switch ev.Kind {
		case engine.SideSwitchIn, engine.SideSwitchOut:
			switches++
			if ev.TID == int32(me) {
				mine++
			}
		case engine.SideComm:
			if ev.Comm == "true" {
				comms++
			}
		}
	}
	ring.End()
	if ring.Errors() != 0 || switches == 0 || mine == 0 || comms == 0 {
		t.Errorf("ring errors %d, switches %d (%d of the test's thread %d), comm true %d", ring.Errors(), switches, mine, me, comms)
	}
	t.Logf("%d switches, %d of thread %d, %d comm", switches, mine, me, comms)
}
