package perfio

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"ptfs/engine"
	"ptfs/perfdata"

	"golang.org/x/sys/unix"
)

// fakeAux is memory laid out like the perf mmap of an AUX event: control
// page and data ring (fakeMmap), and an AUX ring at the page's aux_offset,
// with methods that play the kernel.
type fakeAux struct {
	*fakeMmap
	aux []byte
	cpu uint32
	pid uint32
	now uint64 // time of the next record's sample_id
}

// newFakeAux lays out a data ring of dataSize bytes and an AUX ring of
// auxSize bytes.
func newFakeAux(dataSize, auxSize int) *fakeAux {
	f := &fakeAux{fakeMmap: newFakeMmap(dataSize, true), aux: make([]byte, auxSize), pid: 100, now: 1000}
	f.page.Aux_offset = uint64(fakePage + dataSize)
	f.page.Aux_size = uint64(auxSize)
	return f
}

// trailer returns the sample_id of ptSampleType for task pid/tid.
func (f *fakeAux) trailer(pid, tid uint32) []byte {
	f.now++
	b := binary.LittleEndian.AppendUint32(nil, pid)
	b = binary.LittleEndian.AppendUint32(b, tid)
	b = binary.LittleEndian.AppendUint64(b, f.now)
	b = binary.LittleEndian.AppendUint32(b, f.cpu)
	b = binary.LittleEndian.AppendUint32(b, 0)
	return binary.LittleEndian.AppendUint64(b, 77) // the event's id
}

// record writes a record with its sample_id trailer into the data ring.
func (f *fakeAux) record(typ uint32, misc uint16, body []byte) {
	f.write(makeRecord(typ, misc, append(slices.Clip(body), f.trailer(f.pid, f.pid)...)))
}

// auxRecordBytes is a PERF_RECORD_AUX with trailer.
func (f *fakeAux) auxRecordBytes(off, size, flags uint64) []byte {
	body := binary.LittleEndian.AppendUint64(nil, off)
	body = binary.LittleEndian.AppendUint64(body, size)
	body = binary.LittleEndian.AppendUint64(body, flags)
	return makeRecord(unix.PERF_RECORD_AUX, 0, append(body, f.trailer(f.pid, f.pid)...))
}

// trace writes data at aux_head as the hardware does, as much as the space
// before aux_tail allows (TRUNCATED when it does not all fit), then the
// PERF_RECORD_AUX and the new aux_head, in the kernel's order. It returns
// what was written.
func (f *fakeAux) trace(data []byte, flags uint64) []byte {
	head := f.page.Aux_head
	room := uint64(len(f.aux)) - (head - atomic.LoadUint64(&f.page.Aux_tail))
	if uint64(len(data)) > room {
		data = data[:room]
		flags |= unix.PERF_AUX_FLAG_TRUNCATED
	}
	for i, c := range data {
		f.aux[(head+uint64(i))%uint64(len(f.aux))] = c
	}
	f.write(f.auxRecordBytes(head, uint64(len(data)), flags))
	atomic.StoreUint64(&f.page.Aux_head, head+uint64(len(data)))
	return data
}

// traceUnannounced writes data at aux_head without a PERF_RECORD_AUX, as
// when the record is lost to a full data ring.
func (f *fakeAux) traceUnannounced(n int) {
	atomic.StoreUint64(&f.page.Aux_head, f.page.Aux_head+uint64(n))
}

// setTime fills the page's time fields under the seqlock.
func (f *fakeAux) setTime(caps uint64, tc perfdata.TimeConv) {
	f.page.Lock++
	f.page.Capabilities = caps
	f.page.Time_shift, f.page.Time_mult, f.page.Time_zero = tc.Shift, tc.Mult, tc.Zero
	f.page.Time_cycles, f.page.Time_mask = tc.Cycles, tc.Mask
	f.page.Lock++
}

// auxLogSink records what an engine.TraceSource passes: a log line per call, the trace
// bytes per CPU with "|" where a loss broke them, and how many bytes
// Trace got.
type auxLogSink struct {
	mu     sync.Mutex
	log    []string
	trace  map[int]*bytes.Buffer
	side   []engine.SideEvent
	rounds int
	traced uint64 // bytes passed to Trace
	// within, when set, checks that Trace data lies in some memory.
	within func(data []byte) bool
	t      testing.TB
}

func newAuxLogSink(t testing.TB) *auxLogSink {
	return &auxLogSink{trace: map[int]*bytes.Buffer{}, t: t}
}

func (s *auxLogSink) buf(cpu int) *bytes.Buffer {
	if s.trace[cpu] == nil {
		s.trace[cpu] = new(bytes.Buffer)
	}
	return s.trace[cpu]
}

func (s *auxLogSink) TimeConv(cpu int, tc perfdata.TimeConv) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, fmt.Sprintf("time %d %+v", cpu, tc))
}

func (s *auxLogSink) Trace(cpu int, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(data) == 0 {
		s.t.Errorf("empty Trace on cpu %d", cpu)
	}
	if s.within != nil && !s.within(data) {
		s.t.Errorf("Trace data of cpu %d not in the AUX mapping (copied?)", cpu)
	}
	s.log = append(s.log, fmt.Sprintf("trace %d %d", cpu, len(data)))
	s.traced += uint64(len(data))
	s.buf(cpu).Write(data)
}

func (s *auxLogSink) Loss(cpu int, why engine.LossKind, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, fmt.Sprintf("loss %d %s %d", cpu, why, n))
	if why.BreaksTrace() {
		s.buf(cpu).WriteByte('|')
	}
}

func (s *auxLogSink) Side(cpu int, ev *engine.SideEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, fmt.Sprintf("side %d %d", cpu, ev.Kind))
	s.side = append(s.side, *ev)
}

func (s *auxLogSink) Round(flush bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rounds++
	if flush {
		s.log = append(s.log, "round flush")
	}
}

// take returns and clears the log.
func (s *auxLogSink) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.log
	s.log = nil
	return l
}

// inMem returns a check that data lies inside mem.
func inMem(mem []byte) func([]byte) bool {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	hi := lo + uintptr(len(mem))
	return func(data []byte) bool {
		p := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
		return p >= lo && p+uintptr(len(data)) <= hi
	}
}

// newTestReader returns a reader over f with fresh counters and a sink that
// checks that Trace data comes from f's AUX ring.
func newTestReader(t testing.TB, f *fakeAux) (*auxReader, *auxLogSink, *ptCounters) {
	t.Helper()
	cnt := new(ptCounters)
	r, err := newAuxReader(int(f.cpu), f.mem, f.aux, fakePage, cnt)
	if err != nil {
		t.Fatal(err)
	}
	s := newAuxLogSink(t)
	s.within = inMem(f.aux)
	return r, s, cnt
}

func joinLog(l []string) string { return strings.Join(l, "; ") }

// TestAuxReader drives the reader through the cases of the AUX protocol:
// each step lets the fake kernel write, drains, and checks the sink's log,
// the trace bytes (gaps as "|") and aux_tail.
func TestAuxReader(t *testing.T) {
	const auxSize = 64
	type step struct {
		kernel    func(f *fakeAux) // what the kernel writes before the drain
		log       string           // the sink's calls
		truncated bool
	}
	for _, tc := range []struct {
		name   string
		steps  []step
		trace  string // all trace bytes passed on, "|" at gaps
		errors uint64
	}{
		{
			name: "in order",
			steps: []step{{
				kernel: func(f *fakeAux) { f.trace([]byte("abcd"), 0); f.trace([]byte("efg"), 0) },
				log:    "trace 0 4; trace 0 3",
			}},
			trace: "abcdefg",
		},
		{
			name: "wrap-around",
			steps: []step{
				{kernel: func(f *fakeAux) { f.trace(bytes.Repeat([]byte("a"), 40), 0) }, log: "trace 0 40"},
				// 40 more: 24 up to the end of the ring, 16 from its start.
				{kernel: func(f *fakeAux) { f.trace(bytes.Repeat([]byte("b"), 40), 0) }, log: "trace 0 24; trace 0 16"},
			},
			trace: strings.Repeat("a", 40) + strings.Repeat("b", 40),
		},
		{
			name: "full ring truncated",
			steps: []step{
				// head-tail == size: the kernel writes 64 of 70 bytes,
				// flags TRUNCATED and stops.
				{kernel: func(f *fakeAux) { f.trace(bytes.Repeat([]byte("x"), 70), 0) }, log: "trace 0 64; loss 0 aux truncated 1", truncated: true},
				{kernel: func(f *fakeAux) { f.trace([]byte("yz"), 0) }, log: "trace 0 2"},
			},
			trace: strings.Repeat("x", 64) + "|yz",
		},
		{
			name: "truncated without data",
			steps: []step{{
				kernel: func(f *fakeAux) {
					f.trace(bytes.Repeat([]byte("x"), 64), 0)
					f.trace([]byte("lost"), 0) // no room at all
				},
				log:       "trace 0 64; loss 0 aux truncated 1",
				truncated: true,
			}},
			trace: strings.Repeat("x", 64) + "|",
		},
		{
			name: "partial and collision",
			steps: []step{{
				kernel: func(f *fakeAux) {
					f.trace([]byte("ab"), 0)
					f.trace([]byte("cd"), unix.PERF_AUX_FLAG_PARTIAL)
					f.trace([]byte("ef"), unix.PERF_AUX_FLAG_COLLISION)
					f.trace([]byte("gh"), unix.PERF_AUX_FLAG_PARTIAL|unix.PERF_AUX_FLAG_COLLISION|unix.PERF_AUX_FLAG_TRUNCATED)
				},
				log:       "trace 0 2; loss 0 aux partial 1; trace 0 2; loss 0 aux collision 1; trace 0 2; loss 0 aux partial 1; loss 0 aux collision 1; trace 0 2; loss 0 aux truncated 1",
				truncated: true,
			}},
			trace: "ab|cd|ef||gh|",
		},
		{
			// The AUX record of 5 bytes was lost to a full data ring:
			// its bytes are read all the same, up to the next record.
			name: "no hole after a lost aux record",
			steps: []step{{
				kernel: func(f *fakeAux) {
					f.trace([]byte("ab"), 0)
					copy(f.aux[2:], "12345")
					f.traceUnannounced(5)
					f.record(unix.PERF_RECORD_LOST, 0, append(le(8, 1), le(8, 3)...))
					f.trace([]byte("cd"), 0)
				},
				log: "trace 0 2; loss 0 side band lost 3; trace 0 5; trace 0 2",
			}},
			trace: "ab12345cd",
		},
		{
			// The last records were lost: the bytes up to aux_head are
			// read; a record that comes later gives only its flags.
			name: "bytes up to aux_head without a record",
			steps: []step{
				{
					kernel: func(f *fakeAux) {
						f.trace([]byte("ab"), 0)
						copy(f.aux[2:], "xyz")
						f.traceUnannounced(3)
					},
					log: "trace 0 2; trace 0 3",
				},
				{
					kernel: func(f *fakeAux) { f.write(f.auxRecordBytes(2, 3, unix.PERF_AUX_FLAG_TRUNCATED)) },
					log:    "loss 0 aux truncated 1", truncated: true,
				},
			},
			trace: "abxyz|",
		},
		{
			name: "record before aux_head",
			steps: []step{
				{
					// The kernel wrote the record but not yet aux_head:
					// the record and what follows wait for the next drain.
					kernel: func(f *fakeAux) {
						f.trace([]byte("ab"), 0)
						copy(f.aux[2:], "cd")
						f.write(f.auxRecordBytes(2, 2, 0))
						f.record(unix.PERF_RECORD_ITRACE_START, 0, append(le(4, 7), le(4, 8)...))
					},
					log: "trace 0 2",
				},
				{
					kernel: func(f *fakeAux) { atomic.StoreUint64(&f.page.Aux_head, 4) },
					log:    "trace 0 2; side 0 1",
				},
			},
			trace: "abcd",
		},
		{
			name: "record past aux_head for good",
			steps: []step{
				{kernel: func(f *fakeAux) { f.write(f.auxRecordBytes(0, 8, 0)) }, log: ""},
				{kernel: func(*fakeAux) {}, log: ""},
				{kernel: func(f *fakeAux) { f.trace([]byte("ok"), 0) }, log: "trace 0 2"},
			},
			trace:  "ok",
			errors: 1,
		},
		{
			name: "malformed aux records",
			steps: []step{{
				kernel: func(f *fakeAux) {
					f.trace([]byte("ab"), 0)
					f.write(makeRecord(unix.PERF_RECORD_AUX, 0, le(8, 2)))                   // too short
					f.write(f.auxRecordBytes(0, 2, 0))                                       // behind aux_tail: bytes passed already
					f.write(f.auxRecordBytes(2, 100, 0))                                     // larger than the ring
					f.write(f.auxRecordBytes(60, 8, 0))                                      // beyond tail+size
					f.write(f.auxRecordBytes(2, 2, unix.PERF_AUX_FLAG_OVERWRITE))            // snapshot mode
					f.write(f.auxRecordBytes(^uint64(0)-1, 4, 0))                            // wraps the u64
					f.write(makeRecord(unix.PERF_RECORD_LOST, 0, le(8, 1)))                  // short LOST
					f.write(makeRecord(unix.PERF_RECORD_COMM, 0, []byte("no trailer")))      // short side band
					f.record(unix.PERF_RECORD_COMM, 0, append(le(8, 0), []byte("nonul")...)) // comm without NUL
					f.record(unix.PERF_RECORD_FORK, 0, make([]byte, 24))                     // not ours: skipped
					f.trace([]byte("cd"), 0)
				},
				// Bad records are counted and ignored: the bytes are read
				// up to aux_head all the same.
				log: "trace 0 2; trace 0 2",
			}},
			trace:  "abcd",
			errors: 8,
		},
		{
			name: "size zero record",
			steps: []step{{
				kernel: func(f *fakeAux) { f.trace(nil, unix.PERF_AUX_FLAG_PARTIAL); f.trace([]byte("a"), 0) },
				log:    "loss 0 aux partial 1; trace 0 1",
			}},
			trace: "|a",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAux(4096, auxSize)
			r, s, cnt := newTestReader(t, f)
			for i, st := range tc.steps {
				st.kernel(f)
				res := r.drain(s)
				if got := joinLog(s.take()); got != st.log {
					t.Errorf("step %d: log\n %s\nwant\n %s", i, got, st.log)
				}
				if res.truncated != st.truncated {
					t.Errorf("step %d: truncated %v, want %v", i, res.truncated, st.truncated)
				}
				if tail := atomic.LoadUint64(&f.page.Aux_tail); tail != r.pos {
					t.Errorf("step %d: aux_tail %d, reader at %d", i, tail, r.pos)
				}
			}
			if got := s.buf(0).String(); got != tc.trace {
				t.Errorf("trace %q, want %q", got, tc.trace)
			}
			if got := cnt.errors.Load(); got != tc.errors {
				t.Errorf("errors %d, want %d", got, tc.errors)
			}
			if !r.stalled && atomic.LoadUint64(&f.page.Aux_tail) != f.page.Aux_head && tc.errors == 0 {
				t.Errorf("aux_tail %d behind aux_head %d after the last drain", f.page.Aux_tail, f.page.Aux_head)
			}
		})
	}
}

// TestAuxReaderStream writes a long stream in chunks of many sizes through
// a small AUX ring, draining now and then, and checks that every byte
// arrives once, in order, and that bytes and records are counted.
func TestAuxReaderStream(t *testing.T) {
	f := newFakeAux(1<<12, 256)
	r, s, cnt := newTestReader(t, f)
	var want bytes.Buffer
	n := 0
	for i := range 2000 {
		chunk := make([]byte, 1+i*7%97)
		for j := range chunk {
			chunk[j] = byte(n)
			n++
		}
		want.Write(f.trace(chunk, 0))
		if i%3 == 0 {
			r.drain(s)
		}
		if atomic.LoadUint64(&f.page.Aux_head)-atomic.LoadUint64(&f.page.Aux_tail) > 128 {
			r.drain(s)
		}
	}
	r.drain(s)
	if !bytes.Equal(s.buf(0).Bytes(), want.Bytes()) {
		t.Fatalf("got %d bytes, want %d, not equal", s.buf(0).Len(), want.Len())
	}
	if cnt.bytes.Load() != uint64(want.Len()) || cnt.records.Load() != 2000 || cnt.errors.Load() != 0 {
		t.Errorf("bytes %d records %d errors %d", cnt.bytes.Load(), cnt.records.Load(), cnt.errors.Load())
	}
}

// TestAuxReaderSideBand checks every kind of side-band record.
func TestAuxReaderSideBand(t *testing.T) {
	f := newFakeAux(4096, 64)
	r, s, _ := newTestReader(t, f)
	pt := func(pid, tid uint32) []byte { return append(le(4, uint64(pid)), le(4, uint64(tid))...) }
	f.record(unix.PERF_RECORD_ITRACE_START, 0, pt(10, 11))
	f.record(unix.PERF_RECORD_COMM, unix.PERF_RECORD_MISC_COMM_EXEC, append(pt(10, 11), "target\x00\x00"...))
	mmap2 := append(pt(10, 10), le(8, 0x400000)...)
	mmap2 = append(mmap2, le(8, 0x2000)...)
	mmap2 = append(mmap2, le(8, 0x1000)...)
	head := mmap2
	mmap2 = append(mmap2, le(4, 254)...)     // maj
	mmap2 = append(mmap2, le(4, 1)...)       // min
	mmap2 = append(mmap2, le(8, 9985995)...) // ino
	mmap2 = append(mmap2, le(8, 7)...)       // ino_generation
	tail := append(le(4, 5), le(4, 2)...)    // prot, flags
	tail = append(tail, "/usr/bin/target\x00"...)
	f.record(unix.PERF_RECORD_MMAP2, 0, append(mmap2, tail...))
	// With a build id in place of maj/min/ino, the file is not known by
	// its inode.
	withID := append(append(head[:len(head):len(head)], 20, 0, 0, 0), make([]byte, 20)...)
	f.record(unix.PERF_RECORD_MMAP2, unix.PERF_RECORD_MISC_MMAP_BUILD_ID, append(withID, tail...))
	mmap := append(pt(12, 12), le(8, 0x7f0000)...)
	mmap = append(mmap, le(8, 0x1000)...)
	mmap = append(mmap, le(8, 0)...)
	mmap = append(mmap, "/lib/x.so\x00\x00\x00\x00\x00\x00\x00"...)
	f.record(unix.PERF_RECORD_MMAP, 0, mmap)
	f.pid = 10
	f.record(unix.PERF_RECORD_SWITCH_CPU_WIDE, unix.PERF_RECORD_MISC_SWITCH_OUT, pt(20, 21))
	f.pid = 20
	f.record(unix.PERF_RECORD_SWITCH_CPU_WIDE, 0, pt(10, 10))
	f.record(unix.PERF_RECORD_SWITCH, unix.PERF_RECORD_MISC_SWITCH_OUT|unix.PERF_RECORD_MISC_SWITCH_OUT_PREEMPT, nil)
	exit := append(pt(10, 1), pt(11, 1)...)
	exit = append(exit, le(8, 5000)...)
	f.record(unix.PERF_RECORD_EXIT, 0, exit)
	// The same comm again reuses the string.
	f.record(unix.PERF_RECORD_COMM, 0, append(pt(10, 11), "target\x00\x00"...))
	r.drain(s)
	want := []engine.SideEvent{
		{Kind: engine.SideITraceStart, Time: 1001, PID: 10, TID: 11},
		{Kind: engine.SideComm, Time: 1002, PID: 10, TID: 11, Comm: "target", Exec: true},
		{Kind: engine.SideMmap2, Time: 1003, PID: 10, TID: 10, Addr: 0x400000, Len: 0x2000, PgOff: 0x1000, Filename: "/usr/bin/target",
			Maj: 254, Min: 1, Ino: 9985995},
		{Kind: engine.SideMmap2, Time: 1004, PID: 10, TID: 10, Addr: 0x400000, Len: 0x2000, PgOff: 0x1000, Filename: "/usr/bin/target"},
		{Kind: engine.SideMmap2, Time: 1005, PID: 12, TID: 12, Addr: 0x7f0000, Len: 0x1000, Filename: "/lib/x.so"},
		{Kind: engine.SideSwitchOut, Time: 1006, PID: 10, TID: 10, NextPID: 20, NextTID: 21},
		{Kind: engine.SideSwitchIn, Time: 1007, PID: 20, TID: 20, NextPID: -1, NextTID: -1},
		{Kind: engine.SideSwitchOut, Time: 1008, PID: 20, TID: 20, NextPID: -1, NextTID: -1},
		{Kind: engine.SideExit, Time: 1009, PID: 10, TID: 11},
		{Kind: engine.SideComm, Time: 1010, PID: 10, TID: 11, Comm: "target"},
	}
	if len(s.side) != len(want) {
		t.Fatalf("%d side events, want %d: %+v", len(s.side), len(want), s.side)
	}
	for i := range want {
		if s.side[i] != want[i] {
			t.Errorf("side %d:\n %+v\nwant\n %+v", i, s.side[i], want[i])
		}
	}
	if unsafe.StringData(s.side[1].Comm) != unsafe.StringData(s.side[9].Comm) {
		t.Error("a repeated comm allocated a new string")
	}
}

// TestAuxReaderTimeConv checks when TimeConv is passed: only with
// cap_user_time_zero, before the first Trace, again when it changes, and
// never from a page whose seqlock does not settle.
func TestAuxReaderTimeConv(t *testing.T) {
	f := newFakeAux(4096, 64)
	r, s, cnt := newTestReader(t, f)
	tc := perfdata.TimeConv{Shift: 10, Mult: 500, Zero: 12345}
	f.setTime(1<<3, tc) // cap_user_time only: no time_zero
	f.trace([]byte("a"), 0)
	r.drain(s)
	if got := joinLog(s.take()); got != "trace 0 1" {
		t.Errorf("without time_zero: %s", got)
	}
	f.setTime(capUserTimeZero, tc)
	f.trace([]byte("b"), 0)
	r.drain(s)
	want := fmt.Sprintf("time 0 %+v; trace 0 1", tc)
	if got := joinLog(s.take()); got != want {
		t.Errorf("with time_zero: %s, want %s", got, want)
	}
	f.trace([]byte("c"), 0)
	r.drain(s)
	if got := joinLog(s.take()); got != "trace 0 1" {
		t.Errorf("unchanged: %s", got)
	}
	short := perfdata.TimeConv{Shift: 10, Mult: 500, Zero: 999, Short: true, Cycles: 1 << 40, Mask: 1<<32 - 1}
	f.setTime(capUserTimeZero|capUserTimeShort, short)
	r.drain(s)
	if got, want := joinLog(s.take()), fmt.Sprintf("time 0 %+v", short); got != want {
		t.Errorf("short: %s, want %s", got, want)
	}
	f.page.Lock = 7 // an update that never ends
	f.page.Time_zero = 1
	r.drain(s)
	if got := joinLog(s.take()); got != "" || cnt.errors.Load() != 1 {
		t.Errorf("odd lock: %q, errors %d", got, cnt.errors.Load())
	}
}

// TestNewAuxReaderLayout checks that a mapping not laid out like a perf
// mmap is refused.
func TestNewAuxReaderLayout(t *testing.T) {
	f := newFakeAux(4096, 64)
	cnt := new(ptCounters)
	if _, err := newAuxReader(0, f.mem, f.aux[:48], fakePage, cnt); err == nil {
		t.Error("aux size not a power of two accepted")
	}
	f.page.Aux_size = 128
	if _, err := newAuxReader(0, f.mem, f.aux, fakePage, cnt); err == nil {
		t.Error("aux size unlike the page's accepted")
	}
	if _, err := newAuxReader(0, f.mem[:100], f.aux, fakePage, cnt); err == nil {
		t.Error("short mapping accepted")
	}
}

// TestAuxReaderNoAlloc checks that draining trace and side band allocates
// nothing per record.
func TestAuxReaderNoAlloc(t *testing.T) {
	f := newFakeAux(1<<16, 1<<12)
	r, _, _ := newTestReader(t, f)
	var sink auxNopSink
	chunk := make([]byte, 100)
	comm := append(append(le(4, 1), le(4, 1)...), "same\x00\x00\x00\x00"...)
	allocs := testing.AllocsPerRun(100, func() {
		for range 10 {
			f.trace(chunk, 0)
			f.record(unix.PERF_RECORD_COMM, 0, comm)
		}
		r.drain(sink)
	})
	// The test's own record building allocates; the reader must add
	// nothing: measure that part alone.
	base := testing.AllocsPerRun(100, func() {
		for range 10 {
			f.trace(chunk, 0)
			f.record(unix.PERF_RECORD_COMM, 0, comm)
		}
		atomic.StoreUint64(&f.page.Data_tail, f.page.Data_head)
		atomic.StoreUint64(&f.page.Aux_tail, f.page.Aux_head)
		r.pos = f.page.Aux_head
	})
	if allocs > base {
		t.Errorf("%.0f allocations per drain of 20 records, %.0f of them the test's", allocs, base)
	}
}

// auxNopSink discards everything.
type auxNopSink struct{}

func (auxNopSink) TimeConv(int, perfdata.TimeConv)   {}
func (auxNopSink) Trace(int, []byte)                 {}
func (auxNopSink) Loss(int, engine.LossKind, uint64) {}
func (auxNopSink) Side(int, *engine.SideEvent)       {}
func (auxNopSink) Round(bool)                        {}

// FuzzAuxReader fills the data ring, AUX ring and heads with arbitrary
// bytes: the reader must not panic, hang, or pass bytes from outside the
// AUX mapping.
func FuzzAuxReader(f *testing.F) {
	k := newFakeAux(256, 64)
	k.trace([]byte("abc"), unix.PERF_AUX_FLAG_PARTIAL)
	k.record(unix.PERF_RECORD_COMM, 0, append(le(8, 1), "x\x00"...))
	k.record(unix.PERF_RECORD_LOST, 0, append(le(8, 1), le(8, 2)...))
	f.Add(slices.Clone(k.data), k.page.Data_head, k.page.Aux_head, uint64(0))
	f.Add(make([]byte, 256), uint64(300), uint64(70), uint64(3))
	f.Fuzz(func(t *testing.T, ring []byte, dataHead, auxHead, auxTail uint64) {
		k := newFakeAux(256, 64)
		copy(k.data, ring)
		k.page.Data_head, k.page.Aux_head, k.page.Aux_tail = dataHead, auxHead, auxTail
		cnt := new(ptCounters)
		r, err := newAuxReader(0, k.mem, k.aux, fakePage, cnt)
		if err != nil {
			t.Fatal(err)
		}
		s := newAuxLogSink(t)
		s.within = inMem(k.aux)
		for range 3 {
			r.drain(s)
		}
		if s.traced != cnt.bytes.Load() {
			t.Errorf("%d bytes traced, %d counted", s.traced, cnt.bytes.Load())
		}
	})
}

// BenchmarkAuxReader measures the reader on PERF_RECORD_AUX records of 4
// KiB + 8 (so that they wrap around the AUX ring now and then), with a
// minimal fake kernel: one memmove of the trace and a prebuilt record per
// iteration.
func BenchmarkAuxReader(b *testing.B) {
	f := newFakeAux(1<<16, 1<<16)
	r, _, _ := newTestReader(b, f)
	var sink auxNopSink
	chunk := make([]byte, 4096+8)
	rec := f.auxRecordBytes(0, uint64(len(chunk)), 0)
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		head := f.page.Aux_head
		start := head % uint64(len(f.aux))
		n := copy(f.aux[start:], chunk)
		copy(f.aux, chunk[n:])
		binary.LittleEndian.PutUint64(rec[headerSize:], head)
		f.write(rec)
		atomic.StoreUint64(&f.page.Aux_head, head+uint64(len(chunk)))
		r.drain(sink)
	}
}
