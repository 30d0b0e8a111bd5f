package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"ptfs/decode/ptenc"
)

// perfWriter writes pipe-mode perf.data whose records carry a sample_id
// trailer (TID, TIME, CPU, IDENTIFIER, sample_id_all), as perf record -e
// intel_pt// writes them, and a TIME_CONV that makes perf time the TSC.
type perfWriter struct {
	b   []byte
	aux uint64 // the AUX offset of the next trace bytes
}

const perfSampleType = 1<<1 | 1<<2 | 1<<7 | 1<<16 // TID, TIME, CPU, IDENTIFIER

func newPerfWriter() *perfWriter {
	w := &perfWriter{b: append([]byte("PERFILE2"), binary.LittleEndian.AppendUint64(nil, 16)...)}
	attr := make([]byte, 64)
	binary.LittleEndian.PutUint32(attr[4:], 64)
	binary.LittleEndian.PutUint64(attr[24:], perfSampleType)
	binary.LittleEndian.PutUint64(attr[40:], 1<<18) // sample_id_all
	w.rec(64, 0, attr, u64(7))                      // HEADER_ATTR, id 7
	w.rec(79, 0, u64(0), u64(1), u64(0))            // TIME_CONV: shift 0, mult 1, zero 0
	return w
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

// rec appends a record of type typ.
func (w *perfWriter) rec(typ uint32, misc uint16, body ...[]byte) {
	n := 8
	for _, b := range body {
		n += len(b)
	}
	w.b = binary.LittleEndian.AppendUint32(w.b, typ)
	w.b = binary.LittleEndian.AppendUint16(w.b, misc)
	w.b = binary.LittleEndian.AppendUint16(w.b, uint16(n))
	for _, b := range body {
		w.b = append(w.b, b...)
	}
}

// side appends a side-band record with the trailer of pid/tid at time on
// CPU 0.
func (w *perfWriter) side(typ uint32, misc uint16, pid, tid uint32, time uint64, body ...[]byte) {
	trailer := [][]byte{u32(pid), u32(tid), u64(time), u32(0), u32(0), u64(7)}
	w.rec(typ, misc, append(body, trailer...)...)
}

func name8(s string) []byte { return append([]byte(s), make([]byte, 8-len(s)%8)...) }

// exec appends COMM exec and an MMAP2 of file at addr for pid.
func (w *perfWriter) exec(pid, tid uint32, time uint64, comm string) {
	w.side(3, 1<<13, pid, tid, time, u32(pid), u32(tid), name8(comm))
}

func (w *perfWriter) mmap(pid, tid uint32, time, addr uint64, file string) {
	w.side(10, 0, pid, tid, time, u32(pid), u32(tid), u64(addr), u64(0x1000), u64(0),
		make([]byte, 24), u32(5), u32(2), name8(file))
}

// switchTo appends the CPU-wide switch out of from and in of to at time.
func (w *perfWriter) switchTo(fromPID, fromTID, toPID, toTID uint32, time uint64) {
	w.side(15, 1<<13, fromPID, fromTID, time, u32(toPID), u32(toTID))
	w.side(15, 0, toPID, toTID, time, u32(fromPID), u32(fromTID))
}

// trace appends AUX data: its PERF_RECORD_AUX (written at time, with
// flags) and the AUXTRACE record that carries it.
func (w *perfWriter) trace(data []byte, time, flags uint64) {
	w.side(11, 0, 0, 0, time, u64(w.aux), u64(uint64(len(data))), u64(flags))
	w.rec(71, 0, u64(uint64(len(data))), u64(w.aux), u64(0), u32(0), u32(0xffffffff), u32(0), u32(0))
	w.b = append(w.b, data...)
	w.aux += uint64(len(data))
}

// psbAt appends a PSB+ with a TSC that starts tracing at ip in 64-bit mode.
func psbAt(e *ptenc.Encoder, tsc, ip uint64) {
	e.PSB()
	e.TSC(tsc)
	e.IP(ptenc.FUP, ip)
	e.ModeExec(true, false)
	e.PSBEnd()
}

// TestBranchesPerfOverTime decodes a synthesized recording of one CPU on
// which two processes take turns: pid 100 (/bin/a) runs a loop and makes a
// syscall; the CPU switches to thread 201 of pid 200 (/bin/b), which jumps
// and makes a syscall (its exec): /bin/c replaces /bin/b at the same
// address, calls and returns; pid 200 maps /lib/d in the middle of the
// trace: code there before its time is unknown (a gap), after it decodes;
// back on pid 100, its AUX data is truncated (a gap) and decoding goes on
// at the next PSB; side band lost after that leaves the thread unknown (no
// tid=, a gap line). Every line has the thread and the code of its time.
func TestBranchesPerfOverTime(t *testing.T) {
	root := t.TempDir()
	for file, code := range map[string][]byte{
		// 1000: nop; 1001: jne 1000; 1003: syscall; 1005: jmp 1000
		"bin/a": {0x90, 0x75, 0xfd, 0x0f, 0x05, 0xeb, 0xf9},
		// 1000: jmp 1010; ...; 1010: syscall
		"bin/b": append(append([]byte{0xeb, 0x0e}, make([]byte, 14)...), 0x0f, 0x05),
		// 1000: call 1008; 1005: syscall; 1007: nop; 1008: ret
		"bin/c": {0xe8, 0x03, 0, 0, 0, 0x0f, 0x05, 0x90, 0xc3},
		// 2000: jmp 2002; 2002: syscall
		"lib/d": {0xeb, 0x00, 0x0f, 0x05},
	} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(file)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, file), code, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w := newPerfWriter()
	w.exec(100, 100, 100, "a")
	w.mmap(100, 100, 101, 0x1000, "/bin/a")
	w.exec(200, 201, 102, "b")
	w.mmap(200, 201, 103, 0x1000, "/bin/b")
	w.side(12, 0, 100, 100, 110, u32(100), u32(100)) // ITRACE_START

	e := ptenc.New()
	psbAt(e, 200, 0x1000)
	e.TNT(0b110, 3)
	e.IPC(ptenc.TIPPGD, 0, 0) // the syscall at 1003
	w.trace(e.Bytes(), 250, 0)

	w.switchTo(100, 100, 200, 201, 300)
	e = ptenc.New()
	e.TSC(400)
	e.IP(ptenc.TIPPGE, 0x1000)
	e.IPC(ptenc.TIPPGD, 0, 0) // the syscall at 1010: exec
	w.trace(e.Bytes(), 450, 0)

	w.exec(200, 201, 500, "c")
	w.mmap(200, 201, 501, 0x1000, "/bin/c")
	e = ptenc.New()
	e.TSC(600)
	e.IP(ptenc.TIPPGE, 0x1000)
	e.TNT(1, 1)               // the ret
	e.IPC(ptenc.TIPPGD, 0, 0) // the syscall at 1005
	w.trace(e.Bytes(), 620, 0)
	e = ptenc.New()
	psbAt(e, 650, 0x2000) // /lib/d is not mapped yet
	e.IPC(ptenc.TIPPGD, 0, 0)
	w.trace(e.Bytes(), 680, 0)

	w.mmap(200, 201, 700, 0x2000, "/lib/d")
	e = ptenc.New()
	psbAt(e, 800, 0x2000)
	e.IPC(ptenc.TIPPGD, 0, 0) // the syscall at 2002
	w.trace(e.Bytes(), 850, 0)

	w.switchTo(200, 201, 100, 100, 900)
	e = ptenc.New()
	e.TSC(1000)
	e.IP(ptenc.TIPPGE, 0x1005)
	e.TNT(0b1, 1)
	w.trace(e.Bytes(), 1050, 0x01)           // TRUNCATED: what follows is lost
	w.side(2, 0, 0, 0, 1100, u64(7), u64(2)) // LOST: 2 side-band records
	e = ptenc.New()
	psbAt(e, 1200, 0x1001)
	e.TNT(0b0, 1)
	e.IPC(ptenc.TIPPGD, 0, 0)
	w.trace(e.Bytes(), 1250, 0)

	path := filepath.Join(t.TempDir(), "perf.data")
	if err := os.WriteFile(path, w.b, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runDecodeT("--branches", "--root", root, path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := `perf buffer: idx=0 cpu=0 tid=-1 pid=100
trace: sync at 0x1000 [unknown] (/bin/a) tid=100 cpu=0 time=0.000000200
branch: 0x1001 [unknown] (/bin/a) => 0x1000 [unknown] (/bin/a) jcc tid=100 cpu=0 time=0.000000200
branch: 0x1001 [unknown] (/bin/a) => 0x1000 [unknown] (/bin/a) jcc tid=100 cpu=0 time=0.000000200
trace: stop after 0x1003 [unknown] (/bin/a) tid=100 cpu=0 time=0.000000400
trace: start at 0x1000 [unknown] (/bin/b) tid=201 cpu=0 time=0.000000400
branch: 0x1000 [unknown] (/bin/b) => 0x1010 [unknown] (/bin/b) jmp tid=201 cpu=0 time=0.000000400
trace: stop after 0x1010 [unknown] (/bin/b) tid=201 cpu=0 time=0.000000600
trace: start at 0x1000 [unknown] (/bin/c) tid=201 cpu=0 time=0.000000600
branch: 0x1000 [unknown] (/bin/c) => 0x1008 [unknown] (/bin/c) call tid=201 cpu=0 time=0.000000600
branch: 0x1008 [unknown] (/bin/c) => 0x1005 [unknown] (/bin/c) ret tid=201 cpu=0 time=0.000000600
trace: stop after 0x1005 [unknown] (/bin/c) tid=201 cpu=0 time=0.000000650
gap: error offset=0x5a ip=0x2000 [unknown] ([unknown]) err=no memory mapped at this address tid=201 cpu=0 time=0.000000650
trace: sync at 0x2000 [unknown] (/lib/d) tid=201 cpu=0 time=0.000000800
branch: 0x2000 [unknown] (/lib/d) => 0x2002 [unknown] (/lib/d) jmp tid=201 cpu=0 time=0.000000800
trace: stop after 0x2002 [unknown] (/lib/d) tid=201 cpu=0 time=0.000001000
trace: start at 0x1005 [unknown] (/bin/a) tid=100 cpu=0 time=0.000001000
branch: 0x1005 [unknown] (/bin/a) => 0x1000 [unknown] (/bin/a) jmp tid=100 cpu=0 time=0.000001000
branch: 0x1001 [unknown] (/bin/a) => 0x1000 [unknown] (/bin/a) jcc tid=100 cpu=0 time=0.000001000
gap: error offset=0x86 ip=0x1001 [unknown] (/bin/a) err=trace lost: aux truncated tid=100 cpu=0 time=0.000001000
gap: error offset=0xa7 err=side band lost: 2 records cpu=0 time=0.000001200
trace: sync at 0x1001 [unknown] (/bin/a) cpu=0 time=0.000001200
trace: stop after 0x1003 [unknown] (/bin/a) cpu=0 time=0.000001200
perf summary: buffers=1 lost=3 unknown-mappings=0 image-errors=0
perf losses: aux-truncated=1 aux-collision=0 aux-partial=0 aux-hole=0 side-band-lost=1 switches=4
branch summary: branches=8 insns=19 gaps=3
summary: records=0 dropped=0 stray=0 unknown=0 errors=2
`
	if out != want {
		t.Errorf("lines:\n%s\nwant:\n%s", out, want)
	}
}
