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
// SET_OUTPUT, must deliver the switches of the test's thread and the exec
// of a program it runs on the CPU, each record parsing with the one 32-byte
// trailer. The ring is read while they run, as the PT reader does: the
// event takes every task of the CPU (their switches, execs and mmaps): a
// busy machine here made 47,000 switches a second on one CPU, and the
// 16-page ring that was read only at the end holds 1,365 of them, 30 ms.
// Once full, the kernel drops what the test looks for (LOST).
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
	mem, err := op.mmap(ofd, 0, (1+64)*page)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.munmap(mem) })
	ring, err := NewDataRing(mem, page)
	if err != nil {
		t.Fatal(err)
	}
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
	tid, child := make(chan int, 1), make(chan int, 1)
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
		cmd := exec.Command("/bin/true")
		if err := cmd.Start(); err != nil {
			errc <- err
			return
		}
		child <- cmd.Process.Pid
		errc <- cmd.Wait()
	}()

	var p sideParser
	var ev engine.SideEvent
	var switches, lost int
	// Who switched and who exec'd true: the thread and the child are
	// known from their channels, maybe after their records were read.
	switched, execd := map[int32]bool{}, map[int32]bool{}
	me, pid := -1, -1
	// Until the run ended and the records looked for were read; the
	// deadline only bounds a failure.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		ran := false
		select {
		case err := <-errc:
			if err != nil {
				t.Fatal(err)
			}
			errc = nil
		case me = <-tid:
		case pid = <-child:
		default:
			ran = errc == nil
		}
		ring.Begin()
		for {
			typ, misc, rec, ok := ring.Next()
			if !ok {
				break
			}
			if typ == unix.PERF_RECORD_LOST {
				lost++
				continue
			}
			if !isSide(typ) {
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
				switched[ev.TID] = true
			case engine.SideComm:
				if ev.Comm == "true" {
					execd[ev.PID] = true
				}
			}
		}
		ring.End()
		if ran && switched[int32(me)] && execd[int32(pid)] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: run ended %v, %d switches, of the test's thread %d: %v; comm true of pid %d: %v; %d LOST records",
				ran, switches, me, switched[int32(me)], pid, execd[int32(pid)], lost)
		}
	}
	if err := op.ioctl(sfd, unix.PERF_EVENT_IOC_DISABLE, 0); err != nil {
		t.Fatal(err)
	}
	if ring.Errors() != 0 {
		t.Errorf("ring errors %d", ring.Errors())
	}
	t.Logf("%d switches, comm true of pid %d, %d LOST records", switches, pid, lost)
}
