package flow

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"ptfs/decode"
	"ptfs/decode/ptenc"
	"ptfs/images"
	"ptfs/internal/testkit"
)

// fullLog keeps every branch, and every field of every event.
type fullLog struct {
	// items are the branches in order; an event is an item whose ev is
	// its line in events plus one.
	items  []logItem
	events []string
	// clock, if set, gives each branch its time when it is handed over
	// (what a branch line's time= is).
	clock TimeSource
}

type logItem struct {
	from, to uint64
	kind     BranchKind
	ev       int
	tsc      uint64
}

func (l *fullLog) Insn(*Insn) {}
func (l *fullLog) Branch(from, to uint64, kind BranchKind) {
	it := logItem{from: from, to: to, kind: kind}
	if l.clock != nil {
		it.tsc, _ = l.clock.TSC()
	}
	l.items = append(l.items, it)
}
func (l *fullLog) Event(e *Event) {
	l.events = append(l.events, fmt.Sprintf("ev %+v", *e))
	l.items = append(l.items, logItem{ev: len(l.events)})
}

// edgeLog is a fullLog that takes branches in batches too.
type edgeLog struct {
	fullLog
	t *testing.T
}

func (l *edgeLog) Edges(batch [][]Edge) {
	if len(batch) == 0 {
		l.t.Errorf("an empty batch")
	}
	for _, e := range batch {
		if len(e) == 0 || cap(e) != len(e) {
			// A slice's capacity is its length: an append cannot
			// write over what the decoder keeps after it.
			l.t.Errorf("a slice of %d edges, capacity %d", len(e), cap(e))
		}
		for _, e := range e {
			l.Branch(e.From, e.To, e.Kind)
		}
	}
}

func (l *fullLog) line(i int) string {
	if it := l.items[i]; it.ev > 0 {
		return l.events[it.ev-1]
	}
	it := l.items[i]
	if l.clock != nil {
		return fmt.Sprintf("%x %x %v tsc %#x", it.from, it.to, it.kind, it.tsc)
	}
	return fmt.Sprintf("%x %x %v", it.from, it.to, it.kind)
}

// sameFast decodes trace for a reader of branches with the fast path off
// and on, fails t where the branches (with a clock, their times too),
// events or counters differ, and
// returns the counters. Each decoder decodes twice, the second time with
// its caches warm (and what a decoder keeps from one trace to the next);
// the fast path's Handler takes branches one by one the first time, in
// batches (EdgeHandler) the second.
func sameFast(t *testing.T, mem Memory, trace []byte, opts Options) Counters {
	t.Helper()
	opts.NoInsns = true
	ds, df := New(mem, opts), New(mem, opts)
	ds.fp.off = true
	df.fp.wndAt = 0 // windows from the first byte
	defer func() { fastBytes += df.fp.bytes }()
	for pass := range 2 {
		var slow fullLog
		fast := edgeLog{t: t}
		if opts.Time != nil {
			slow.clock, fast.clock = ds, df
		}
		ds.c, df.c = Counters{}, Counters{}
		ds.Decode(trace, &slow)
		if pass == 0 {
			df.Decode(trace, &fast.fullLog)
		} else {
			df.Decode(trace, &fast)
		}
		sameLogs(t, pass, ds, df, &slow, &fast.fullLog)
	}
	return ds.Counters()
}

// sameLogs fails t unless df (the fast path) gave the branches, events and
// counters that ds (the slow path) gave.
func sameLogs(t *testing.T, pass int, ds, df *Decoder, slow, fast *fullLog) {
	t.Helper()
	if ds.Counters() != df.Counters() {
		t.Errorf("pass %d: counters %+v with the fast path, %+v without", pass, df.Counters(), ds.Counters())
	}
	if len(slow.items) != len(fast.items) {
		t.Errorf("pass %d: %d branches and events with the fast path, %d without", pass, len(fast.items), len(slow.items))
	}
	for i := range min(len(slow.items), len(fast.items)) {
		a, b := slow.items[i], fast.items[i]
		if a != b || a.ev > 0 && slow.events[a.ev-1] != fast.events[b.ev-1] {
			t.Fatalf("pass %d: line %d: %q with the fast path, %q without", pass, i, fast.line(i), slow.line(i))
		}
	}
}

// fastBytes counts the trace bytes sameFast's decoders took on the fast
// path.
var fastBytes uint64

// corpusTrace is a corpus trace and the memory it ran from.
type corpusTrace struct {
	name  string
	mem   Memory
	trace []byte
}

// fastCorpus returns the traces the fast path is held to: libxdc's four
// with their page dumps, the ptsim runs, and every libipt test trace with
// its code.
func fastCorpus(t *testing.T) []corpusTrace {
	t.Helper()
	corpus := testkit.Corpus(t)
	var out []corpusTrace
	for _, name := range []string{"foo", "mruby", "Unzip", "icelake_tip"} {
		dir := filepath.Join(corpus, "libxdc", name)
		addr, _ := filepath.Glob(filepath.Join(dir, "*.addr"))
		dump, _ := filepath.Glob(filepath.Join(dir, "*.dump"))
		if len(addr) != 1 || len(dump) != 1 {
			t.Fatalf("%s: page dump not found", dir)
		}
		s := images.NewSpace()
		if err := images.MapPageDump(s, addr[0], dump[0]); err != nil {
			t.Fatal(err)
		}
		file := "trace"
		if name == "icelake_tip" {
			file = "ptlog"
		}
		trace, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, corpusTrace{"libxdc/" + name, s, trace})
	}
	for _, run := range []string{"run-static", "run-static-ptw"} {
		dir := filepath.Join(corpus, "ptsim", run)
		trace, err := os.ReadFile(filepath.Join(dir, "trace.pt"))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, corpusTrace{"ptsim/" + run, ptsimSpace(t, dir), trace})
	}
	return append(out, libiptTraces(t)...)
}

// libiptTraces returns every libipt test trace that has its code.
func libiptTraces(t *testing.T) []corpusTrace {
	t.Helper()
	dir := filepath.Join(testkit.Corpus(t), "libipt")
	ptts, _ := filepath.Glob(filepath.Join(dir, "*.ptt"))
	if len(ptts) == 0 {
		testkit.Unavailable(t, "no libipt tests in %s", dir)
	}
	var out []corpusTrace
	for _, ptt := range ptts {
		base := strings.TrimSuffix(ptt, ".ptt")
		src, err := os.ReadFile(ptt)
		if err != nil {
			t.Fatal(err)
		}
		m := fuzzOrg.FindSubmatch(src)
		code, err1 := os.ReadFile(base + ".bin")
		trace, err2 := os.ReadFile(base + ".pt")
		if m == nil || err1 != nil || err2 != nil {
			continue // not assembled, or no code
		}
		org, err := strconv.ParseUint(string(m[1]), 0, 64)
		if err != nil {
			t.Fatalf("%s: org %s: %v", ptt, m[1], err)
		}
		out = append(out, corpusTrace{"libipt/" + filepath.Base(base), &blob{base: org, code: code}, trace})
	}
	return out
}

// mutate returns a damaged copy of trace: bytes flipped, cut short, or a
// piece of it spliced in elsewhere.
func mutate(r *rand.Rand, trace []byte) []byte {
	if len(trace) < 2 {
		return slices.Clone(trace)
	}
	out := slices.Clone(trace)
	switch r.IntN(3) {
	case 0:
		for range 1 + r.IntN(8) {
			out[r.IntN(len(out))] ^= byte(1 + r.IntN(255))
		}
	case 1:
		out = out[:r.IntN(len(out))]
	default:
		i, j := r.IntN(len(out)), r.IntN(len(out))
		n := r.IntN(min(len(out)-i, 4096) + 1)
		out = append(slices.Clone(out[:j]), append(slices.Clone(out[i:i+n]), out[j:]...)...)
	}
	return out
}

// TestFastSameFlow holds the fast path to the packet-by-packet flow: the
// same branches, events (every field) and counters on every corpus trace,
// whole and damaged, with and without ResyncOnError and a clock.
func TestFastSameFlow(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 500))
	var insns, errs, size uint64
	fastBytes = 0
	for _, ft := range fastCorpus(t) {
		t.Run(ft.name, func(t *testing.T) {
			// Fewer damaged copies of the large traces, with the
			// default options only: each is decoded four times.
			copies, large := 12, len(ft.trace) > 1<<16
			if large {
				copies = 2
			}
			for i := range 1 + copies {
				trace := ft.trace
				if i > 0 {
					trace = mutate(r, ft.trace)
				}
				for j, opts := range []Options{{}, {ResyncOnError: true}, {Time: &decode.ClockConfig{CPUID15EAX: 1, CPUID15EBX: 2}}} {
					if i > 0 && j > 0 && large {
						continue
					}
					size += 2 * uint64(len(trace))
					c := sameFast(t, ft.mem, trace, opts)
					insns += c.Insns
					errs += c.Errors
				}
			}
		})
	}
	if insns == 0 || errs == 0 {
		t.Errorf("%d instructions, %d errors: the flow or its error paths went untested", insns, errs)
	}
	if fastBytes < size/2 {
		t.Errorf("the fast path took %d of %d bytes: it went untested", fastBytes, size)
	}
	t.Logf("the fast path took %d of %d bytes", fastBytes, size)
}

// warmWnds decodes trace with d until its packet windows' rooms are
// warm: they take their chunks over mruby's first seven passes (16,384
// windows, 120 k edges), each pass with windows a few more.
func warmWnds(d *Decoder, trace []byte) {
	for range 8 {
		d.Decode(trace, &counter{})
	}
}

// TestFastTakesOver checks that the fast path takes the bulk of the
// benchmark trace, and allocates nothing once the caches are warm.
func TestFastTakesOver(t *testing.T) {
	bt := loadBench(t, "mruby")
	d := New(bt.space, Options{NoInsns: true})
	var c counter
	d.Decode(bt.trace, &c)
	if c.errors != 0 || d.fp.bytes < uint64(len(bt.trace))*95/100 {
		t.Errorf("%d errors; the fast path took %d of %d bytes", c.errors, d.fp.bytes, len(bt.trace))
	}
	warmWnds(d, bt.trace)
	if a := testing.AllocsPerRun(3, func() { d.Decode(bt.trace, &c) }); a != 0 {
		t.Errorf("%v allocations per warm decode, want 0", a)
	}
	mem, trace := loopTrace(1000)
	d = New(mem, Options{NoInsns: true})
	d.Decode(trace, &c)
	if d.fp.bytes < uint64(len(trace))*9/10 {
		t.Errorf("the fast path took %d of %d bytes of a loop", d.fp.bytes, len(trace))
	}
	if a := testing.AllocsPerRun(5, func() { d.Decode(trace, &c) }); a != 0 {
		t.Errorf("%v allocations per warm decode of a loop, want 0", a)
	}
}

// TestCacheLines holds blocks to a cache line at most and runs and
// tracelets to one each: the fast path loads one line per block, run or
// tracelet it goes through.
func TestCacheLines(t *testing.T) {
	if s := unsafe.Sizeof(block{}); s > 64 {
		t.Errorf("a block is %d bytes, more than a cache line", s)
	}
	if s := unsafe.Sizeof(tntRun{}); s != 64 {
		t.Errorf("a run is %d bytes, want 64", s)
	}
	if s := unsafe.Sizeof(tlet{}); s != 64 {
		t.Errorf("a tracelet is %d bytes, want 64", s)
	}
}

// TestFastBoundedLoop: a jump to itself while TNT bits wait (a run takes
// no bit there) ends in the walk's MaxInsns error, as without the fast
// path; also from a budget where the kernel skips a run's checks (65,535
// or more) down past it.
func TestFastBoundedLoop(t *testing.T) {
	mem := &blob{base: 0x1000, code: []byte{0xeb, 0xfe}} // jmp .
	e := ptenc.New()
	start(e, 0x1000)
	e.TNT(1, 1)
	for range 32 {
		e.Pad()
	}
	for _, maxInsns := range []int{100, 1<<16 - 1, 1<<16 + 100} {
		c := sameFast(t, mem, e.Bytes(), Options{MaxInsns: maxInsns})
		if c.Errors != 1 || c.Insns != uint64(maxInsns) {
			t.Errorf("counters %+v, want 1 error after %d instructions", c, maxInsns)
		}
		d := New(mem, Options{MaxInsns: maxInsns, NoInsns: true})
		d.Decode(e.Bytes(), &counter{})
		if d.fp.bytes == 0 {
			t.Errorf("MaxInsns %d: the fast path took no byte of the loop's trace", maxInsns)
		}
	}
}

// TestFastRunBudget holds a run's MaxInsns checks to the walk's where they
// bind: runs whose count before their first bit (pre) or after it (post)
// is a run's most (runJumps jumps through blocks of maxBlock
// instructions, then the conditional branch's block), decoded with
// MaxInsns one below, at and one above it. The kernel skips the checks
// for a budget of 65,535 or more; one that skipped them for a budget a
// run's counts pass ends without the walk's MaxInsns error.
func TestFastRunBudget(t *testing.T) {
	// jumps returns n blocks of maxBlock-1 NOPs and a jump to the
	// next, then one of maxBlock-1 NOPs and a je to the next.
	jumps := func(n int) []byte {
		var code []byte
		for i := range n + 1 {
			code = append(code, bytes.Repeat([]byte{0x90}, maxBlock-1)...)
			if i < n {
				code = append(code, 0xeb, 0) // jmp .+2
			} else {
				code = append(code, 0x74, 0) // je .+2
			}
		}
		return code
	}
	const most = (runJumps + 1) * maxBlock // the blocks' instructions
	for _, tc := range []struct {
		name string
		code []byte
		bits int
	}{
		{"pre", append(jumps(runJumps), 0xc3), 1},
		{"post", append(append([]byte{0x74, 0}, jumps(runJumps)...), 0xc3), 2},
	} {
		for _, maxInsns := range []int{most - 1, most, most + 1} {
			t.Run(fmt.Sprintf("%s/%d", tc.name, maxInsns), func(t *testing.T) {
				mem := &blob{base: 0x1000, code: tc.code}
				e := ptenc.New()
				start(e, 0x1000)
				e.TNT(1<<tc.bits-1, tc.bits)
				for range 32 {
					e.Pad()
				}
				c := sameFast(t, mem, e.Bytes(), Options{MaxInsns: maxInsns})
				if want := maxInsns < most; (c.Errors == 1) != want || c.Errors > 1 {
					t.Errorf("counters %+v, want the MaxInsns error %v", c, want)
				}
				d := New(mem, Options{MaxInsns: maxInsns, NoInsns: true})
				d.Decode(e.Bytes(), &counter{})
				d.Decode(e.Bytes(), &counter{})
				if b := d.cache.known(0x1000, Mode64); b == nil || b.runs == nil {
					t.Fatal("no run kept from the first block")
				} else if r := b.runs; int(max(r.pre, r.post)) != most {
					t.Errorf("the run's counts are %d before its first bit, %d after, want %d", r.pre, r.post, most)
				}
			})
		}
	}
}

// TestFastTrigCount: a direct jump taken while a TIP waits for a later
// branch counts toward a TRIG's instruction count as the walk counts it.
func TestFastTrigCount(t *testing.T) {
	// jmp 0x1002; jmp *%rax; ... 0x1010: nop; nop; nop; ret
	code := []byte{0xeb, 0x00, 0xff, 0xe0, 15: 0, 16: 0x90, 0x90, 0x90, 0xc3}
	mem := &blob{base: 0x1000, code: code}
	e := ptenc.New()
	start(e, 0x1000)
	e.IP(ptenc.TIP, 0x1010)
	e.Raw(0xd9, 0x40, 0x01, 0x01, 0x00) // TRIG, instruction count 1
	for range 32 {
		e.Pad()
	}
	sameFast(t, mem, e.Bytes(), Options{})
	d := New(mem, Options{NoInsns: true})
	d.Decode(e.Bytes(), &counter{})
	if d.fp.bytes == 0 {
		t.Error("the fast path took no byte of the trace")
	}
}

// TestFastDisable: a TIP.PGD binds to a direct jump to its IP, and to the
// branch that needs trace; tracing resumes where it stopped.
func TestFastDisable(t *testing.T) {
	// 0x1000: jmp 0x1010; 0x1010: nop; jne 0x1010; ret
	code := []byte{0xeb, 0x0e, 15: 0, 16: 0x90, 0x75, 0xfd, 0xc3}
	mem := &blob{base: 0x1000, code: code}
	e := ptenc.New()
	start(e, 0x1000)
	e.IP(ptenc.TIPPGD, 0x1010) // at the jump to it
	e.IP(ptenc.TIPPGE, 0x1010)
	e.TNT(0b110, 3)
	e.IPC(ptenc.TIPPGD, 0, 0) // at the ret
	e.IP(ptenc.TIPPGE, 0x1000)
	for range 32 {
		e.Pad()
	}
	if c := sameFast(t, mem, e.Bytes(), Options{}); c.Errors != 0 || c.Events != 5 {
		t.Errorf("counters %+v, want 4 events and the end", c)
	}
	d := New(mem, Options{NoInsns: true})
	d.Decode(e.Bytes(), &counter{})
	if d.fp.bytes == 0 {
		t.Error("the fast path took no byte of the trace")
	}
}

// TestFastReturnBound: a compressed return starts the count toward
// MaxInsns anew, as the walk's does.
func TestFastReturnBound(t *testing.T) {
	// 0x1000: call 0x1010; 0x1005: jmp .; 0x1010: 40 nops; ret
	code := make([]byte, 0x10+41)
	copy(code, []byte{0xe8, 0x0b, 0, 0, 0, 0xeb, 0xfe})
	for i := 0x10; i < len(code)-1; i++ {
		code[i] = 0x90
	}
	code[len(code)-1] = 0xc3
	mem := &blob{base: 0x1000, code: code}
	e := ptenc.New()
	start(e, 0x1000)
	e.TNT(0b11, 2) // the return, then a bit for nobody
	for range 32 {
		e.Pad()
	}
	if c := sameFast(t, mem, e.Bytes(), Options{MaxInsns: 60}); c.Errors != 1 || c.Insns != 1+41+60 {
		t.Errorf("counters %+v, want 1 error after %d instructions", c, 1+41+60)
	}
}

// TestDecodeReuse holds a decoder that decoded one trace to decoding the
// next as a new one does: only its caches carry over (a live mount and
// the warm benchmark reuse decoders). Each libipt trace is decoded after
// the one before it, with that one's code, both with and without the
// instructions.
func TestDecodeReuse(t *testing.T) {
	traces := libiptTraces(t)
	for _, noInsns := range []bool{false, true} {
		for i := 1; i < len(traces); i++ {
			prev, cur := traces[i-1], traces[i]
			if prev.mem != cur.mem {
				// Each trace has its own code: one memory serves
				// both, the later mapping winning as in Space.
				prev.mem = &twoBlobs{prev.mem.(*blob), cur.mem.(*blob)}
			}
			opts := Options{NoInsns: noInsns}
			reused := New(prev.mem, opts)
			reused.Decode(prev.trace, &fullLog{})
			reused.c = Counters{}
			var want, got fullLog
			New(prev.mem, opts).Decode(cur.trace, &want)
			reused.Decode(cur.trace, &got)
			if !slices.Equal(want.items, got.items) || !slices.Equal(want.events, got.events) {
				t.Errorf("%s after %s: %d items, a new decoder %d; first difference %s",
					cur.name, prev.name, len(got.items), len(want.items), firstDiff(&got, &want))
			}
		}
	}
}

// twoBlobs reads b, then a where b has no code.
type twoBlobs struct{ a, b *blob }

func (m *twoBlobs) ReadAt(p []byte, addr uint64) (int, error) {
	if n, err := m.b.ReadAt(p, addr); n > 0 {
		return n, err
	}
	return m.a.ReadAt(p, addr)
}

func firstDiff(got, want *fullLog) string {
	for i := range min(len(got.items), len(want.items)) {
		if got.line(i) != want.line(i) {
			return fmt.Sprintf("at %d: %q, want %q", i, got.line(i), want.line(i))
		}
	}
	return "in length"
}

// TestFastOps holds the fast loop's first-byte tables to the packet
// decoder: each byte's action is the kind the decoder reads from a packet
// starting with it, with and without a clock, tracing on and off.
func TestFastOps(t *testing.T) {
	tables := []struct {
		ops        *[256]uint8
		timing, on bool
	}{{&onOps, true, true}, {&offTables[0], false, false}, {&offTables[1], true, false}}
	for _, tab := range tables {
		timing, on := tab.timing, tab.on
		for i := range 256 {
			c := uint8(i)
			buf := bytes.Repeat([]byte{1}, 32)
			buf[0] = c
			if c&7 == 7 {
				// A CYC's bytes go on while their low bit is set:
				// one more ends it.
				buf[1] = 2
			}
			var p decode.Packet
			err := decode.NewPacketDecoder(buf).Next(&p)
			ip := map[decode.Kind]uint8{decode.TIP: opTIP, decode.TIPPGD: opPGD, decode.TIPPGE: opPGE}
			if on {
				delete(ip, decode.TIPPGE)
			} else {
				ip = map[decode.Kind]uint8{decode.TIPPGE: opPGE}
			}
			want := opOther
			switch {
			case err == nil && p.Kind == decode.Pad:
				want = opPad
			case err == nil && timing && p.Kind == decode.MTC:
				want = opMTC
			case err == nil && timing && p.Kind == decode.TSC:
				want = opTSC
			case err == nil && timing && p.Kind == decode.CYC && p.Size == 1:
				want = opCYC
			case err == nil && timing && p.Kind == decode.CYC:
				want = opCYCX
			case ip[p.Kind] != 0 && (err != nil || p.Suppressed() && p.Kind != decode.TIPPGD):
				// A reserved IP compression, or a TIP or TIP.PGE
				// without an IP: the slow path's.
			case !on:
				if op, ok := ip[p.Kind]; ok {
					want = op
				}
			case c == 2:
				want = opExt // the second byte decides
			case ip[p.Kind] != 0:
				want = ip[p.Kind]
			case err != nil:
			case p.Kind == decode.TNT8:
				want = opTNT8
			}
			if got := tab.ops[c]; got != want {
				t.Errorf("timing %v, on %v, first byte %#02x (%v, %v): action %d, want %d", timing, on, c, p.Kind, err, got, want)
			}
		}
	}
}

// TestTNT8Tables holds the kernel's TNT.8 tables, byte by byte, to the
// packet decoder's bits and count (as the kernel holds them: the oldest in
// bit 63).
func TestTNT8Tables(t *testing.T) {
	for i := range 256 {
		c := uint8(i)
		if onOps[c] != opTNT8 {
			if tnt8Lens[c] != 0 || tnt8Words[c] != 0 {
				t.Errorf("first byte %#02x: not a TNT.8, but %d bits %#x", c, tnt8Lens[c], tnt8Words[c])
			}
			continue
		}
		var p decode.Packet
		if err := decode.NewPacketDecoder([]byte{c, 0, 0, 0, 0, 0, 0, 0}).Next(&p); err != nil || p.Kind != decode.TNT8 {
			t.Fatalf("first byte %#02x: %v, %v", c, p.Kind, err)
		}
		nb, word := uint(tnt8Lens[c]), tnt8Words[c]
		if nb != uint(p.Bits) || nb == 0 || word>>(64-nb) != p.Payload || word<<nb != 0 {
			t.Errorf("first byte %#02x: %d bits %#x, want %d bits %#x from bit 63 down", c, nb, word, p.Bits, p.Payload)
		}
	}
}

// readMarks is a Memory that notes, at the first read of each address in
// watch, how many branches its log has been handed by then.
type readMarks struct {
	mem   Memory
	log   *fullLog
	watch map[uint64]bool
	marks []string
}

func (m *readMarks) ReadAt(dst []byte, addr uint64) (int, error) {
	if m.watch[addr] {
		m.watch[addr] = false
		m.marks = append(m.marks, fmt.Sprintf("%#x after %d branches", addr, len(m.log.items)))
	}
	return m.mem.ReadAt(dst, addr)
}

// TestFastHandsOverBeforeRead: a Memory may apply side band as it is read
// (perfflow), so the branches the fast path batched are handed over before
// it decodes a block it has not seen, as the slow path hands each over
// before its next block: a call and a jump to new code, and a TIP to new
// code, each read after the branches before it.
func TestFastHandsOverBeforeRead(t *testing.T) {
	code := make([]byte, 0x201)
	copy(code, []byte{0x75, 0xfe, 0xe8, 0xf9, 0, 0, 0, 0xc3}) // 1000: jne 1000; 1002: call 1100; 1007: ret
	copy(code[0x100:], []byte{0xe9, 0xfb, 0, 0, 0})           // 1100: jmp 1200
	code[0x200] = 0xc3                                        // 1200: ret
	e := ptenc.New()
	start(e, 0x1000)
	for range 40 {
		e.TNT(0x3f, 6)
	}
	e.TNT(0, 1)
	e.IP(ptenc.TIP, 0x1007)
	for range 32 {
		e.Pad()
	}
	var got [2][]string
	for i, off := range []bool{true, false} {
		h := &edgeLog{t: t}
		m := &readMarks{mem: &blob{base: 0x1000, code: code}, log: &h.fullLog, watch: map[uint64]bool{0x1100: true, 0x1200: true, 0x1007: true}}
		d := New(m, Options{NoInsns: true})
		d.fp.off = off
		d.Decode(e.Bytes(), h)
		got[i] = m.marks
		if !off && d.fp.bytes == 0 {
			t.Fatal("the fast path took no bytes")
		}
	}
	// 240 loop branches, then the call, the jump and the return, each
	// handed over before its target is read. The slow path reads the
	// return's target with the call's bytes, not at its address.
	want := []string{"0x1100 after 241 branches", "0x1200 after 242 branches", "0x1007 after 243 branches"}
	if fmt.Sprint(got[1]) != fmt.Sprint(want) || fmt.Sprint(got[0]) != fmt.Sprint(want[:2]) {
		t.Errorf("reads with the fast path: %q; without: %q; want %q", got[1], got[0], want)
	}
}

// TestPGDWalkKept: a warm decode replays the TIP.PGD walks a decode kept
// (a kept walk's edge, changed, shows in the branches of the next one),
// and MemoryChanged drops them, leaving their edges as they were.
func TestPGDWalkKept(t *testing.T) {
	bt := loadBench(t, "mruby")
	d := New(bt.space, Options{NoInsns: true})
	var c counter
	d.Decode(bt.trace, &c)
	pgds := d.cache.runs.pgds
	if pgds == nil {
		t.Fatal("no TIP.PGD walks kept")
	}
	// Every kept walk's first branch marked: the replays carry the mark.
	const mark = 0xdead
	orig := map[int]uint64{}
	for i := range pgds {
		if pgds[i].b != nil && pgds[i].n > 0 {
			orig[i], pgds[i].edges[0].To = pgds[i].edges[0].To, mark
		}
	}
	m := &markCounter{mark: mark}
	d.Decode(bt.trace, m)
	for i, to := range orig {
		pgds[i].edges[0].To = to
	}
	if m.n == 0 {
		t.Errorf("a warm decode replayed none of the %d walks kept with a branch", len(orig))
	}
	t.Logf("%d kept walks with a branch, replayed %d times", len(orig), m.n)
	// A Handler may drop the cache while it reads a batch that holds a
	// walk's edges: they stay as they were.
	edges := map[int]Edge{}
	for i := range orig {
		edges[i] = pgds[i].edges[0]
	}
	d.MemoryChanged()
	for i := range pgds {
		if pgds[i].b != nil {
			t.Fatalf("walk %d kept after MemoryChanged", i)
		}
		if e, ok := edges[i]; ok && pgds[i].edges[0] != e {
			t.Fatalf("walk %d's edge changed by MemoryChanged: %+v, was %+v", i, pgds[i].edges[0], e)
		}
	}
}

// markCounter counts the branches to mark.
type markCounter struct {
	counter
	mark uint64
	n    int
}

func (m *markCounter) Branch(_, to uint64, _ BranchKind) {
	if to == m.mark {
		m.n++
	}
}

func (m *markCounter) Edges(batch [][]Edge) {
	for _, e := range batch {
		for i := range e {
			m.Branch(e[i].From, e[i].To, e[i].Kind)
		}
	}
}

// pgdCode is the code the TIP.PGD walk tests walk: a call, a jump and an
// indirect jump (three edges at most: kept), five jumps to a return (too
// many edges to keep), and a call to the next instruction (no return
// pushed) before an indirect jump.
//
//	1000: call 1010
//	1010: nop; nop; nop; jmp 1020
//	1020: nop; jmp *%rax
//	1100: jmp 1102; jmp 1104; jmp 1106; jmp 1108; jmp 110a; ret
//	1200: call 1205; jmp *%rax
func pgdCode() *blob {
	code := make([]byte, 0x207)
	copy(code, []byte{0xe8, 0x0b, 0, 0, 0})
	copy(code[0x10:], []byte{0x90, 0x90, 0x90, 0xeb, 0x0b})
	copy(code[0x20:], []byte{0x90, 0xff, 0xe0})
	copy(code[0x100:], []byte{0xeb, 0, 0xeb, 0, 0xeb, 0, 0xeb, 0, 0xeb, 0, 0xc3})
	copy(code[0x200:], []byte{0xe8, 0, 0, 0, 0, 0xff, 0xe0})
	return &blob{base: 0x1000, code: code}
}

// pgdState is what a TIP.PGD's walk leaves of the decoder's state.
type pgdState struct {
	fired               bool
	ip, errIP, resumeIP uint64
	steps               int
	insns               uint64
	sinceRef            uint32
	enabled, resumeOK   bool
	sp, top             int
	stack               [retStackSize]uint64
	items               []logItem
	events              []string
	kept                bool
}

// pgdAt runs fastSeg on a TIP.PGD packet for ev (EvDisabled with its IP
// in full, or none) with the flow at block b after steps instructions: the
// fast path's way to a TIP.PGD's walk, replayed or walked (no TIP.PGE
// follows). It tells whether the event fired (none was queued).
func pgdAt(d *Decoder, b *block, ev Event, steps int) bool {
	buf := make([]byte, 32)
	buf[0] = decode.IPCSuppressed<<5 | 1
	if ev.HasIP {
		buf[0] = decode.IPCFull<<5 | 1
		binary.LittleEndian.PutUint64(buf[1:], ev.IP)
	}
	d.fp.k = kern{buf: buf, b: b, ip: b.ip, budget: d.opts.MaxInsns - steps}
	d.fastSeg(&d.fp.k, true)
	return len(d.q) == 0
}

// pgdWalkOnce runs fastSeg (pgdAt) from the block at start with a TIP.PGD
// (ev) after steps instructions, the return stack holding depth entries,
// on d (its Handler h), and returns the state it leaves.
func pgdWalkOnce(d *Decoder, h *edgeLog, start uint64, ev Event, steps, depth int) pgdState {
	h.items, h.events = nil, nil
	d.enabled, d.resumeOK, d.resumeIP, d.ip, d.errIP = true, false, 0, start, 0
	d.steps, d.sinceRef, d.c = steps, 5, Counters{}
	d.sp, d.top, d.stack = 0, 0, [retStackSize]uint64{}
	for i := range depth {
		d.pushRet(0xf000 + uint64(i))
	}
	b := d.block(start, d.mode)
	d.q = nil
	fired := pgdAt(d, b, ev, steps)
	w := &d.cache.runs.pgds[pgdHash(b, ev.IP)]
	return pgdState{
		fired: fired, ip: d.ip, errIP: d.errIP, resumeIP: d.resumeIP, steps: d.steps, insns: d.c.Insns,
		sinceRef: d.sinceRef, enabled: d.enabled, resumeOK: d.resumeOK, sp: d.sp, top: d.top, stack: d.stack,
		items: h.items, events: h.events, kept: w.b == b,
	}
}

// TestPGDWalkReplay holds a kept TIP.PGD walk's replay to the walk it
// stands for, block by block from the same state: the MaxInsns limit met
// before, at and after the walk's last block, the return stack empty and
// full (its oldest entries overwritten), a TIP.PGD with an IP bound to the
// indirect jump, one bound to the direct jump to it, one without an IP, a
// walk too long to keep, and a call that pushes nothing.
func TestPGDWalkReplay(t *testing.T) {
	const maxInsns = 100
	mem := pgdCode()
	for _, tc := range []struct {
		name  string
		start uint64
		ev    Event
		total int // instructions walked
		keep  bool
	}{
		{"indirect", 0x1000, Event{Kind: EvDisabled, IP: 0x5000, HasIP: true}, 7, true},
		{"direct", 0x1000, Event{Kind: EvDisabled, IP: 0x1020, HasIP: true}, 5, true},
		{"no IP", 0x1000, Event{Kind: EvDisabled}, 7, true},
		{"long", 0x1100, Event{Kind: EvDisabled, IP: 0x5000, HasIP: true}, 6, false},
		{"call next", 0x1200, Event{Kind: EvDisabled, IP: 0x5000, HasIP: true}, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, steps := range []int{0, maxInsns - tc.total - 1, maxInsns - tc.total, maxInsns - tc.total + 1, maxInsns - 2, maxInsns} {
				for _, depth := range []int{0, 3, retStackSize - 1, retStackSize, retStackSize + 5} {
					// warm kept the walk from the same block
					// and IP first; cold walks it block by block.
					opts := Options{NoInsns: true, MaxInsns: maxInsns}
					cold, warm := New(mem, opts), New(mem, opts)
					hc, hw := &edgeLog{t: t}, &edgeLog{t: t}
					for _, d := range []*Decoder{cold, warm} {
						d.mode = Mode64
						d.runCaches()
					}
					cold.h, cold.eh = hc, hc
					warm.h, warm.eh = hw, hw
					if first := pgdWalkOnce(warm, hw, tc.start, tc.ev, 0, 0); !first.fired || first.kept != tc.keep {
						t.Fatalf("the first walk fired %v, kept %v; want fired, kept %v", first.fired, first.kept, tc.keep)
					}
					want := pgdWalkOnce(cold, hc, tc.start, tc.ev, steps, depth)
					got := pgdWalkOnce(warm, hw, tc.start, tc.ev, steps, depth)
					if want.fired != (steps+tc.total <= maxInsns) {
						t.Errorf("%d steps before: the walk fired %v", steps, want.fired)
					}
					got.kept, want.kept = false, false // the cold one kept it now, the warm one before
					if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
						t.Errorf("%d steps before, %d returns: replayed\n%+v\nwalked\n%+v", steps, depth, got, want)
					}
				}
			}
		})
	}
}

// dropLog is an edgeLog whose Edges drops the decoder's block cache
// (MemoryChanged) before it reads the batch, as a Handler may.
type dropLog struct {
	edgeLog
	d *Decoder
}

func (l *dropLog) Edges(batch [][]Edge) {
	l.d.MemoryChanged()
	l.edgeLog.Edges(batch)
}

// TestPGDWalkDropped: a Handler that drops the block cache while it reads
// the branches handed over before a TIP.PGD's walk still reads them and
// the walk's as they are (a replayed walk's edges are in that batch), and
// no walk is kept from the block dropped under it.
func TestPGDWalkDropped(t *testing.T) {
	mem := pgdCode()
	ev := Event{Kind: EvDisabled, IP: 0x5000, HasIP: true}
	// The branch gathered before the TIP.PGD, then the walk's and its
	// event.
	want := []string{"1 2 jump", "1000 1010 call", "1013 1020 jump", fmt.Sprintf("ev %+v", ev)}
	for _, replay := range []bool{false, true} {
		d := New(mem, Options{NoInsns: true})
		h := &dropLog{edgeLog: edgeLog{t: t}, d: d}
		d.h, d.eh, d.mode = h, h, Mode64
		d.runCaches()
		b := d.block(0x1000, d.mode)
		if replay {
			d.h, d.eh = &h.fullLog, nil
			// Kept by a walk whose Handler does not drop.
			if w := pgdWalkOnce(d, &h.edgeLog, 0x1000, ev, 0, 0); !w.kept {
				t.Fatal("the walk was not kept")
			}
			d.h, d.eh = h, h
		}
		h.items, h.events = nil, nil
		d.enabled = true
		f := &d.fp
		f.edges[0] = Edge{1, 2, BrJump}
		f.batch[0], f.n = refOf(f.edges[0:1]), 1
		if !pgdAt(d, b, ev, 0) {
			t.Fatalf("replay %v: the walk did not fire", replay)
		}
		var got []string
		for i := range h.items {
			got = append(got, h.line(i))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("replay %v: %q, want %q", replay, got, want)
		}
		for i, w := range d.cache.runs.pgds {
			if w.b != nil {
				t.Errorf("replay %v: walk %d from %#x kept, its block dropped under its walk", replay, i, w.b.ip)
			}
		}
	}
}
