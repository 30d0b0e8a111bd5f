package perfio

import (
	"encoding/binary"
	"errors"
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

// sideRecord is a side-band record of a PT data ring: header, body and
// the 32-byte sample_id trailer of task 100/101 at time 77.
func sideRecord(typ uint32, misc uint16, body ...[]byte) []byte {
	var b []byte
	for _, p := range body {
		b = append(b, p...)
	}
	b = binary.LittleEndian.AppendUint32(b, 100)
	b = binary.LittleEndian.AppendUint32(b, 101)
	b = binary.LittleEndian.AppendUint64(b, 77)
	return makeRecord(typ, misc, append(b, make([]byte, 16)...))
}

func le32s(vs ...uint32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

func le64s(vs ...uint64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

// TestSideParse holds the live reader's events to the records the kernel
// writes (perfdata.SideBand parses their fields; the trailer names the
// task of a switch) and its names to no allocation once seen.
func TestSideParse(t *testing.T) {
	name := []byte("/lib/x.so\x00\x00\x00\x00\x00\x00\x00")
	tests := []struct {
		name string
		rec  []byte
		want engine.SideEvent
		bad  bool
	}{
		{"mmap", sideRecord(unix.PERF_RECORD_MMAP, 0, le32s(1, 2), le64s(0x1000, 0x2000, 0x3000), name),
			engine.SideEvent{Kind: engine.SideMmap2, Time: 77, PID: 1, TID: 2, Addr: 0x1000, Len: 0x2000, PgOff: 0x3000, Filename: "/lib/x.so"}, false},
		{"mmap2 inode", sideRecord(unix.PERF_RECORD_MMAP2, 0, le32s(3, 4), le64s(0x1000, 0x2000, 0), le32s(8, 1), le64s(99, 7), le32s(5, 2), name),
			engine.SideEvent{Kind: engine.SideMmap2, Time: 77, PID: 3, TID: 4, Addr: 0x1000, Len: 0x2000, Filename: "/lib/x.so", Maj: 8, Min: 1, Ino: 99}, false},
		{"mmap2 build id", sideRecord(unix.PERF_RECORD_MMAP2, unix.PERF_RECORD_MISC_MMAP_BUILD_ID, le32s(3, 4), le64s(0x1000, 0x2000, 0), []byte{20, 0, 0, 0}, make([]byte, 20), le32s(5, 2), name),
			engine.SideEvent{Kind: engine.SideMmap2, Time: 77, PID: 3, TID: 4, Addr: 0x1000, Len: 0x2000, Filename: "/lib/x.so"}, false},
		{"comm exec", sideRecord(unix.PERF_RECORD_COMM, unix.PERF_RECORD_MISC_COMM_EXEC, le32s(5, 5), []byte("true\x00\x00\x00\x00")),
			engine.SideEvent{Kind: engine.SideComm, Time: 77, PID: 5, TID: 5, Comm: "true", Exec: true}, false},
		{"exit", sideRecord(unix.PERF_RECORD_EXIT, 0, le32s(7, 5, 8, 5), le64s(123)),
			engine.SideEvent{Kind: engine.SideExit, Time: 77, PID: 7, TID: 8}, false},
		{"itrace start", sideRecord(unix.PERF_RECORD_ITRACE_START, 0, le32s(9, 10)),
			engine.SideEvent{Kind: engine.SideITraceStart, Time: 77, PID: 9, TID: 10}, false},
		{"switch in", sideRecord(unix.PERF_RECORD_SWITCH, 0),
			engine.SideEvent{Kind: engine.SideSwitchIn, Time: 77, PID: 100, TID: 101, NextPID: -1, NextTID: -1}, false},
		{"switch out", sideRecord(unix.PERF_RECORD_SWITCH, unix.PERF_RECORD_MISC_SWITCH_OUT),
			engine.SideEvent{Kind: engine.SideSwitchOut, Time: 77, PID: 100, TID: 101, NextPID: -1, NextTID: -1}, false},
		{"cpu-wide switch in", sideRecord(unix.PERF_RECORD_SWITCH_CPU_WIDE, 0, le32s(3, 4)),
			engine.SideEvent{Kind: engine.SideSwitchIn, Time: 77, PID: 100, TID: 101, NextPID: -1, NextTID: -1}, false},
		{"cpu-wide switch out", sideRecord(unix.PERF_RECORD_SWITCH_CPU_WIDE, unix.PERF_RECORD_MISC_SWITCH_OUT, le32s(3, 4)),
			engine.SideEvent{Kind: engine.SideSwitchOut, Time: 77, PID: 100, TID: 101, NextPID: 3, NextTID: 4}, false},
		{"fork is not live side band", sideRecord(unix.PERF_RECORD_FORK, 0, le32s(7, 5, 8, 5), le64s(1)), engine.SideEvent{}, true},
		{"short cpu-wide switch", sideRecord(unix.PERF_RECORD_SWITCH_CPU_WIDE, 0, le32s(3)), engine.SideEvent{}, true},
		{"short mmap2", sideRecord(unix.PERF_RECORD_MMAP2, 0, le32s(3, 4), le64s(1)), engine.SideEvent{}, true},
		{"name without NUL", sideRecord(unix.PERF_RECORD_COMM, 0, le32s(5, 5), []byte("truetrue")), engine.SideEvent{}, true},
		{"no trailer", sideRecord(unix.PERF_RECORD_ITRACE_START, 0)[:16], engine.SideEvent{}, true},
	}
	var p sideParser
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ := binary.LittleEndian.Uint32(tt.rec)
			misc := binary.LittleEndian.Uint16(tt.rec[4:])
			var ev engine.SideEvent
			err := p.parse(typ, misc, tt.rec, &ev)
			if tt.bad {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("err %v, want %v", err, ErrMalformed)
				}
				return
			}
			if err != nil || ev != tt.want {
				t.Fatalf("%+v %v, want %+v", ev, err, tt.want)
			}
			if n := testing.AllocsPerRun(100, func() { _ = p.parse(typ, misc, tt.rec, &ev) }); n != 0 {
				t.Errorf("%v allocations a record seen before", n)
			}
		})
	}
}
