package flow

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"ptfs/decode/ptenc"
	"ptfs/images"
	"ptfs/internal/testkit"
)

// blob is code memory: one byte slice at base.
type blob struct {
	base uint64
	code []byte
}

func (m *blob) ReadAt(dst []byte, addr uint64) (int, error) {
	if addr < m.base || addr-m.base >= uint64(len(m.code)) {
		return 0, errors.New("unmapped")
	}
	return copy(dst, m.code[addr-m.base:]), nil
}

// recorder keeps the flow as text lines.
type recorder struct {
	lines    []string
	branches int
}

func (r *recorder) Insn(in *Insn) { r.lines = append(r.lines, fmt.Sprintf("%x", in.IP)) }
func (r *recorder) Branch(from, to uint64, kind BranchKind) {
	r.branches++
}
func (r *recorder) Event(e *Event) {
	if e.Kind == EvError {
		r.lines = append(r.lines, fmt.Sprintf("error %x %x: %v", e.Offset, e.IP, e.Err))
		return
	}
	if e.Kind == EvEnd {
		r.lines = append(r.lines, "end")
		return
	}
	r.lines = append(r.lines, fmt.Sprintf("ev%d", e.Kind))
}

// start encodes a PSB+ that starts tracing at ip in 64-bit mode.
func start(e *ptenc.Encoder, ip uint64) {
	e.PSB()
	e.IP(ptenc.FUP, ip)
	e.ModeExec(true, false)
	e.PSBEnd()
}

func TestDecodeFlows(t *testing.T) {
	// 1000: nop; 1001: jne 1000; 1003: call 1009; 1008: nop; 1009: ret
	code := []byte{0x90, 0x75, 0xfd, 0xe8, 0x01, 0, 0, 0, 0x90, 0xc3}
	mem := &blob{base: 0x1000, code: code}
	for _, tc := range []struct {
		name   string
		trace  func(e *ptenc.Encoder)
		want   string
		errors uint64
	}{{
		name: "loop with TNT, then an asynchronous disable",
		trace: func(e *ptenc.Encoder) {
			start(e, 0x1000)
			e.TNT(0b110, 3)
			e.IP(ptenc.FUP, 0x1003)
			e.IPC(ptenc.TIPPGD, 0, 0)
		},
		want: "1000 1001 1000 1001 1000 1001 ev2",
	}, {
		name: "compressed return, then a disable at the return",
		trace: func(e *ptenc.Encoder) {
			start(e, 0x1003)
			e.TNT(1, 1)
			e.IPC(ptenc.TIPPGD, 0, 0)
		},
		want: "1003 1009 1008 1009 ev1",
	}, {
		name: "a TIP where a TNT is due: error, then the next PSB",
		trace: func(e *ptenc.Encoder) {
			start(e, 0x1001)
			e.IP(ptenc.TIP, 0x1000)
			start(e, 0x1008)
			e.IP(ptenc.TIP, 0x1000)
		},
		want:   "1001 error 17 1001: trace stream does not match query 1008 1009 end",
		errors: 1,
	}, {
		name: "an IP outside the image",
		trace: func(e *ptenc.Encoder) {
			start(e, 0x5000)
			e.TNT(1, 1)
		},
		want:   "error 18 5000: no memory mapped at this address",
		errors: 1,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := ptenc.New()
			tc.trace(e)
			var r recorder
			d := New(mem, Options{})
			d.Decode(e.Bytes(), &r)
			if got := strings.Join(r.lines, " "); got != tc.want {
				t.Errorf("flow\n got %s\nwant %s", got, tc.want)
			}
			if c := d.Counters(); c.Errors != tc.errors {
				t.Errorf("errors counted %d, want %d", c.Errors, tc.errors)
			}
		})
	}
}

// nopHandler drops the flow.
type nopHandler struct{ n uint64 }

func (h *nopHandler) Insn(*Insn)                              { h.n++ }
func (h *nopHandler) Branch(from, to uint64, kind BranchKind) {}
func (h *nopHandler) Event(e *Event)                          {}

// loopTrace is a loop (nop; jne back) and a trace that takes its branch 47
// times per TNT packet, n packets, then disables.
func loopTrace(n int) (*blob, []byte) {
	e := ptenc.New()
	start(e, 0x1000)
	for range n {
		e.TNT(1<<47-1, 47)
	}
	e.IPC(ptenc.TIPPGD, 0, 0)
	return &blob{base: 0x1000, code: []byte{0x90, 0x75, 0xfd, 0xc3}}, e.Bytes()
}

// TestDecodeAllocs: a hot loop costs no allocation per instruction once the
// block cache holds it.
func TestDecodeAllocs(t *testing.T) {
	mem, trace := loopTrace(1000)
	d := New(mem, Options{})
	var h nopHandler
	d.Decode(trace, &h)
	if h.n != 2*47*1000+2 {
		t.Fatalf("%d instructions, want %d", h.n, 2*47*1000+2)
	}
	if a := testing.AllocsPerRun(5, func() { d.Decode(trace, &h) }); a != 0 {
		t.Errorf("%v allocations per decode of %d instructions, want 0", a, 2*47*1000)
	}
}

// TestDecodeBoundedLoop: code that loops without consuming trace ends in
// an error, not a hang.
func TestDecodeBoundedLoop(t *testing.T) {
	mem := &blob{base: 0x1000, code: []byte{0xeb, 0xfe}} // jmp .
	e := ptenc.New()
	start(e, 0x1000)
	e.TNT(1, 1)
	var r recorder
	d := New(mem, Options{MaxInsns: 100})
	d.Decode(e.Bytes(), &r)
	if c := d.Counters(); c.Errors != 1 || c.Insns != 100 {
		t.Errorf("counters %+v, want 1 error after 100 instructions", c)
	}
}

// TestDecodeBoundedEvents: a flood of events is reported as it comes, not
// queued: the queue stays small.
func TestDecodeBoundedEvents(t *testing.T) {
	mem := &blob{base: 0x1000, code: []byte{0x75, 0xfe}} // jne .
	e := ptenc.New()
	start(e, 0x1000)
	for range 2 * maxQueued {
		e.MNT(0xa000)
	}
	var r recorder
	d := New(mem, Options{})
	d.Decode(e.Bytes(), &r)
	if c := d.Counters(); c.Errors != 0 || c.Events != 2*maxQueued+1 {
		t.Errorf("counters %+v, want %d events (and the end), no error", c, 2*maxQueued)
	}
	if c := cap(d.q); c > 16 {
		t.Errorf("event queue grew to %d", c)
	}
}

var fuzzOrg = regexp.MustCompile(`(?m)^org\s+(\S+)`)

// FuzzDecode: random and mutated traces over a code image never panic or
// hang (work is bounded by MaxInsns per packet) and every error is counted.
func FuzzDecode(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, trace, code []byte, base uint64) {
		if len(trace) > 1<<16 || len(code) > 1<<16 {
			return
		}
		var r nopHandler
		var stubs []Stub
		if len(trace)%2 == 1 {
			// A stub page after the code, its site in the code.
			end := base + uint64(len(code))
			stubs = []Stub{{Start: end, End: end + 0x1000, Site: base + 1, Next: base + 2, Kind: StubKind(len(trace) / 2 % 3)}}
		}
		d := New(&blob{base: base, code: code}, Options{MaxInsns: 1 << 12, ResyncOnError: len(code)%2 == 1, Stubs: stubs})
		testkit.Bounded(t, 3*time.Second, fmt.Sprintf("decode of %d bytes", len(trace)), func() { d.Decode(trace, &r) })
		c := d.Counters()
		if c.Insns != r.n {
			t.Fatalf("counted %d instructions, reported %d", c.Insns, r.n)
		}
		if c.Insns > uint64(len(trace)+1)*(1<<12)*64 {
			t.Fatalf("%d instructions for %d bytes of trace: unbounded", c.Insns, len(trace))
		}
		// The same flow over an images.Space of the same bytes cut in
		// two adjacent mappings: the decoder steps through View's bytes
		// in place and reads across the cut with ReadAt.
		s := images.NewSpace()
		half := len(code) / 2
		for _, part := range [][2]int{{0, half}, {half, len(code)}} {
			if part[0] < part[1] && s.Map(base+uint64(part[0]), uint64(part[1]-part[0]), images.NewBlob(code[part[0]:part[1]]), 0, "part") != nil {
				return // wraps the address space
			}
		}
		opts := Options{MaxInsns: 1 << 12, ResyncOnError: len(code)%2 == 1, Stubs: stubs}
		var viewed, read digest
		New(s, opts).Decode(trace, &viewed)
		New(&blob{base: base, code: code}, opts).Decode(trace, &read)
		if viewed != read {
			t.Fatalf("flow through View %+v, through ReadAt %+v", viewed, read)
		}
	})
}

// digest is a Handler that folds the flow into a hash and counts.
type digest struct{ hash, insns, branches, events uint64 }

func (h *digest) mix(v uint64) { h.hash = (h.hash ^ v) * 0x100000001b3 }
func (h *digest) Insn(in *Insn) {
	h.insns++
	h.mix(in.IP)
	h.mix(uint64(in.Len)<<8 | uint64(in.Class))
}
func (h *digest) Branch(from, to uint64, kind BranchKind) {
	h.branches++
	h.mix(from)
	h.mix(to)
	h.mix(uint64(kind))
}
func (h *digest) Event(e *Event) {
	h.events++
	h.mix(uint64(e.Kind))
	h.mix(e.IP)
	h.mix(e.Offset)
}

// fuzzSeeds adds the flow fuzz targets' seeds (trace, code, base): a small
// loop and every libipt test trace with its code.
func fuzzSeeds(f *testing.F) {
	code := []byte{0x90, 0x75, 0xfd, 0xe8, 0x01, 0, 0, 0, 0x90, 0xc3, 0xff, 0xe0, 0xf3, 0x0f, 0xae, 0xe0}
	e := ptenc.New()
	start(e, 0x1000)
	e.TNT(0b1011, 4)
	e.IP(ptenc.TIP, 0x1008)
	f.Add(e.Bytes(), code, uint64(0x1000))
	if dir := testkit.CorpusPath(f); dir != "" {
		pts, _ := filepath.Glob(filepath.Join(dir, "libipt", "*.pt"))
		for _, pt := range pts {
			name := strings.TrimSuffix(pt, ".pt")
			trace, err1 := os.ReadFile(pt)
			bin, err2 := os.ReadFile(name + ".bin")
			ptt, err3 := os.ReadFile(name + ".ptt")
			if err1 != nil || err2 != nil || err3 != nil {
				continue
			}
			m := fuzzOrg.FindSubmatch(ptt)
			if m == nil {
				continue
			}
			org, err := strconv.ParseUint(string(m[1]), 0, 64)
			if err != nil {
				continue
			}
			f.Add(trace, bin, org)
		}
	}
}

// BenchmarkDecodeLoop: a two-instruction loop driven by long TNTs, the
// block cache warm: the cost per instruction of the walk.
func BenchmarkDecodeLoop(b *testing.B) {
	mem, trace := loopTrace(10000)
	d := New(mem, Options{})
	var h nopHandler
	b.ReportAllocs()
	b.SetBytes(int64(len(trace)))
	for b.Loop() {
		d.Decode(trace, &h)
	}
	b.ReportMetric(float64(h.n)/b.Elapsed().Seconds()/1e6, "Minsn/s")
}

// swapMem is code memory that changes under the decoder on its first
// read of the second code's address, as a side band applied on a read that
// missed does (perfflow): the cache is dropped in the middle of a block.
type swapMem struct {
	d        *Decoder
	old, new *blob
	swapped  bool
}

func (m *swapMem) ReadAt(dst []byte, addr uint64) (int, error) {
	if !m.swapped && addr >= m.new.base {
		m.swapped = true
		m.d.MemoryChanged()
	}
	if m.swapped {
		return m.new.ReadAt(dst, addr)
	}
	return m.old.ReadAt(dst, addr)
}

// TestMemoryChangedInBlock: a block whose read changes the memory is
// decoded again from the new bytes, with and without NoInsns.
func TestMemoryChangedInBlock(t *testing.T) {
	for _, noInsns := range []bool{false, true} {
		// 1000: nop x4, then (new memory) 1004: nop; 1005: jne 1000;
		// 1007: nop
		mem := &swapMem{
			old: &blob{base: 0x1000, code: []byte{0x90, 0x90, 0x90, 0x90}},
			new: &blob{base: 0x1000, code: []byte{0x90, 0x90, 0x90, 0x90, 0x90, 0x75, 0xf9, 0x90}},
		}
		d := New(mem, Options{NoInsns: noInsns})
		mem.d = d
		e := ptenc.New()
		start(e, 0x1000)
		e.TNT(0, 1)
		e.IP(ptenc.FUP, 0x1007)
		e.IPC(ptenc.TIPPGD, 0, 0)
		var r recorder
		d.Decode(e.Bytes(), &r)
		if c := d.Counters(); c.Errors != 0 || r.branches != 0 || c.Insns != 6 {
			t.Errorf("noInsns=%v: %+v, %d branches: %q", noInsns, c, r.branches, r.lines)
		}
	}
}
