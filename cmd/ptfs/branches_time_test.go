package main

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"ptfs/decode/ptenc"
	"ptfs/internal/testkit"
	"ptfs/perfdata"
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

// exec appends a COMM exec of pid.
func (w *perfWriter) exec(pid, tid uint32, time uint64, comm string) {
	w.side(3, 1<<13, pid, tid, time, u32(pid), u32(tid), name8(comm))
}

// mmap appends an MMAP2 of a page of file at addr for pid.
func (w *perfWriter) mmap(pid, tid uint32, time, addr uint64, file string) {
	w.mmapAt(pid, tid, time, addr, 0x1000, 0, file)
}

// mmapAt appends an MMAP2 of n bytes of file from offset off at addr.
func (w *perfWriter) mmapAt(pid, tid uint32, time, addr, n, off uint64, file string) {
	w.side(10, 0, pid, tid, time, u32(pid), u32(tid), u64(addr), u64(n), u64(off),
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

// overTimeRecording writes the code files of TestBranchesPerfOverTime
// under root and returns root and the recording.
func overTimeRecording(tb testing.TB) (root string, data []byte) {
	root = tb.TempDir()
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
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, file), code, 0o644); err != nil {
			tb.Fatal(err)
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

	return root, w.b
}

// FuzzBranchesPerf decodes mutated recordings through the whole perf.data
// path (side band over time, AUX cuts, streams): an error or lines, never
// a panic or a hang.
func FuzzBranchesPerf(f *testing.F) {
	root, data := overTimeRecording(f)
	f.Add(data)
	f.Fuzz(func(t *testing.T, data []byte) {
		pf, err := perfdata.Parse(data)
		if err != nil || len(pf.Buffers) == 0 {
			return
		}
		a := branchesArgs{root: root, tid: -1, cpu: -1, trace: "fuzz"}
		_ = perfBranches(io.Discard, &a, pf)
	})
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
	root, data := overTimeRecording(t)
	path := filepath.Join(t.TempDir(), "perf.data")
	if err := os.WriteFile(path, data, 0o644); err != nil {
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

// TestBranchesPerfPtsim turns the corpus's ptsim runs into perf.data (an
// exec, an MMAP2 per line of maps.txt, ITRACE_START, the trace as AUX
// data): decoded through the side band, the lines are those of the raw
// trace decoded with --maps (the real binary's symbols, the vDSO dump),
// each with the thread, CPU and time.
func TestBranchesPerfPtsim(t *testing.T) {
	root := filepath.Join(testkit.Corpus(t), "ptsim")
	for _, name := range []string{"run-static", "run-static-ptw"} {
		t.Run(name, func(t *testing.T) {
			run := filepath.Join(root, name)
			args := ptsimArgs(t, run, root)
			code, raw, errs := runDecodeT(append(append([]string{"--branches"}, args...), filepath.Join(run, "trace.pt"))...)
			if code != 0 {
				t.Fatalf("raw: exit %d: %s", code, errs)
			}
			entries, err := readMaps(filepath.Join(run, "maps.txt"))
			if err != nil {
				t.Fatal(err)
			}
			trace, err := os.ReadFile(filepath.Join(run, "trace.pt"))
			if err != nil {
				t.Fatal(err)
			}
			w := newPerfWriter()
			w.exec(42, 43, 1, "flow-static")
			for _, e := range entries {
				if e.Path != "" {
					w.mmapAt(42, 43, 2, e.Start, e.End-e.Start, e.Off, e.Path)
				}
			}
			w.side(12, 0, 42, 43, 3, u32(42), u32(43)) // ITRACE_START
			w.trace(trace, 10, 0)
			path := filepath.Join(t.TempDir(), "perf.data")
			if err := os.WriteFile(path, w.b, 0o644); err != nil {
				t.Fatal(err)
			}
			code, out, errs := runDecodeT("--branches", "--root", root, "--vdso", args[len(args)-1], path)
			if code != 0 {
				t.Fatalf("perf.data: exit %d: %s", code, errs)
			}
			var got, want []string
			for l := range strings.Lines(raw) {
				if !strings.Contains(l, "summary: ") {
					want = append(want, strings.TrimSuffix(l, "\n"))
				}
			}
			for l := range strings.Lines(out) {
				l = strings.TrimSuffix(l, "\n")
				if strings.HasPrefix(l, "perf ") || strings.Contains(l, "summary: ") {
					continue
				}
				// ptsim's trace has TSC packets: perf time follows the
				// context.
				i := strings.Index(l, " tid=43 cpu=0 time=")
				if i < 0 {
					t.Fatalf("line without its thread and time: %q", l)
				}
				got = append(got, l[:i])
			}
			if len(want) < 100 || !strings.Contains(strings.Join(want, "\n"), "(flow-static)") {
				t.Fatalf("raw decode: %d lines", len(want))
			}
			diffLines(t, "line", got, want)
		})
	}
}
