package flow

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"ptfs/decode/ptenc"
)

// segCode is the code of the TIP.PGD/TIP.PGE tests, TestFastDisable's:
// 0x1000: jmp 0x1010; 0x1010: nop; 0x1011: jne 0x1010; 0x1013: ret.
func segCode() *blob {
	return &blob{base: 0x1000, code: []byte{0xeb, 0x0e, 15: 0, 16: 0x90, 0x75, 0xfd, 0xc3}}
}

// segTrace returns a trace of segments as kAFL's IP filter makes them, each
// a TIP.PGD and the TIP.PGE after it with between (PADs, timing packets,
// a PSB+, a MODE.Exec, or nothing) in between: a TIP.PGD with an IP (at
// the jump to it) and one without (at the return), each more than once (a
// walk kept and replayed), and a TIP.PGE at a block no IP reached before
// (0x1011). It ends in PADs unless end is false.
func segTrace(between func(e *ptenc.Encoder), end bool) []byte {
	e := ptenc.New()
	start(e, 0x1000)
	for i := range 3 {
		// An IP of 8 bytes (the longest packet) for the TIP.PGE the
		// second time, for both the third.
		pgd, pge := 1, 1
		if i > 0 {
			pge = 6
		}
		if i == 2 {
			pgd = 6
		}
		e.IPC(ptenc.TIPPGD, pgd, 0x1010) // at the jump to it
		between(e)
		e.IPC(ptenc.TIPPGE, pge, 0x1010)
		e.TNT(0b110, 3)
		e.IPC(ptenc.TIPPGD, 0, 0) // at the ret
		between(e)
		e.IP(ptenc.TIPPGE, 0x1000)
	}
	e.IP(ptenc.TIPPGD, 0x1010)
	between(e)
	e.IP(ptenc.TIPPGE, 0x1011) // not among the recent IP blocks
	e.TNT(0, 1)
	e.IPC(ptenc.TIPPGD, 0, 0)
	between(e)
	e.IP(ptenc.TIPPGE, 0x1000)
	e.IP(ptenc.TIPPGD, 0x1010)
	if end {
		for range 32 {
			e.Pad()
		}
	}
	return e.Bytes()
}

// segBetween are the packets segTrace puts between a TIP.PGD and its
// TIP.PGE.
var segBetween = []struct {
	name string
	put  func(e *ptenc.Encoder)
}{
	{"nothing", func(*ptenc.Encoder) {}},
	{"pads", func(e *ptenc.Encoder) {
		// kAFL's 9, past a word of them.
		for range 9 {
			e.Pad()
		}
	}},
	{"pad", func(e *ptenc.Encoder) { e.Pad() }},
	{"timing", func(e *ptenc.Encoder) {
		e.Pad()
		e.MTC(1)
		e.CYC(3)
		e.Pad()
		e.Pad()
		e.TSC(1 << 20)
		e.CYC(1)
	}},
	{"psb", func(e *ptenc.Encoder) {
		e.Pad()
		e.PSB()
		e.ModeExec(true, false)
		e.PSBEnd()
		e.Pad()
	}},
	{"mode.exec", func(e *ptenc.Encoder) { e.ModeExec(true, false) }},
	{"mode.exec pads", func(e *ptenc.Encoder) {
		e.Pad()
		e.ModeExec(true, false)
		for range 9 {
			e.Pad()
		}
	}},
}

// segOpts are the options the segment tests decode with.
var segOpts = []Options{{}, {ResyncOnError: true}, {Time: &timeConfig}}

// TestFastSegments holds the fast path's TIP.PGD and TIP.PGE (fastSeg)
// to the slow path's flow (sameFast: the branches, with Edges and
// one by one, then each event, every field, and the counters, cold and
// warm) with each kind of packet between them, and checks the fast path
// took the segments.
func TestFastSegments(t *testing.T) {
	mem := segCode()
	for _, bw := range segBetween {
		trace := segTrace(bw.put, true)
		for _, opts := range segOpts {
			c := sameFast(t, mem, trace, opts)
			// 3 segments of two TIP.PGD/TIP.PGE pairs, one more
			// of them, the last TIP.PGD. (The first PSB+ starts
			// tracing with no event; timing packets add none.)
			if c.Events != 2*(3*2+2)+1 || c.Errors != 0 {
				t.Errorf("%s, %+v: counters %+v, want 17 events and no error", bw.name, opts, c)
			}
			opts.NoInsns = true
			d := New(mem, opts)
			d.Decode(trace, &counter{})
			d.fp.bytes = 0
			d.Decode(trace, &counter{}) // warm
			// The slow path's: the first PSB+ and the last 16
			// bytes (with a clock also the timing packets).
			if slow := uint64(len(trace)) - d.fp.bytes; opts.Time == nil && slow > 48 {
				t.Errorf("%s, %+v: the fast path left %d of %d bytes", bw.name, opts, slow, len(trace))
			}
		}
	}
}

// spareFill are the bytes TestFastSpareCapacity puts past a trace's length:
// packets that would change the flow if they were read as trace.
var spareFill = func() [][]byte {
	var out [][]byte
	for _, put := range []func(e *ptenc.Encoder){
		func(e *ptenc.Encoder) { e.TNT(0b101, 3) },
		func(e *ptenc.Encoder) { e.IP(ptenc.TIP, 0x1000) },
		func(e *ptenc.Encoder) { e.IP(ptenc.TIPPGE, 0x1010) },
		func(e *ptenc.Encoder) { e.IP(ptenc.TIPPGD, 0x1010) },
		func(e *ptenc.Encoder) { start(e, 0x1010) },
		func(e *ptenc.Encoder) { e.Pad() },
		func(e *ptenc.Encoder) { e.MTC(9) },
	} {
		e := ptenc.New()
		for e.Len() < 64 {
			put(e)
		}
		out = append(out, e.Bytes())
	}
	return out
}()

// spareLines decodes trace with d twice (one by one, then in batches:
// Edges), and returns every branch and event, every field, and the
// counters.
func spareLines(t *testing.T, d *Decoder, trace []byte) string {
	var b strings.Builder
	for pass := range 2 {
		l := edgeLog{t: t}
		d.c = Counters{}
		if pass == 0 {
			d.Decode(trace, &l.fullLog)
		} else {
			d.Decode(trace, &l)
		}
		for i := range l.items {
			fmt.Fprintln(&b, l.line(i))
		}
		fmt.Fprintf(&b, "%+v\n", d.Counters())
	}
	return b.String()
}

// TestFastSpareCapacity: a trace is its length, not its capacity. Each trace
// cut at every length (mid-packet too: the damaged traces) and given as a
// slice of a larger buffer whose spare capacity holds packets decodes as
// the same bytes in a slice of exactly its length (slices.Clip), with the
// fast path on and off. (word reads buf[i:i+8], which the capacity
// bounds: a caller that reads past the length reads the spare bytes as
// trace.)
func TestFastSpareCapacity(t *testing.T) {
	// Synthetic traces, each fill at each cut: segTrace's, and a TIP.PGE
	// (an IP of 8 bytes) and a TIP.PGD each followed by PADs to the
	// end, which the fast path reads to its window's last byte.
	var traces []corpusTrace
	for _, bw := range segBetween {
		traces = append(traces, corpusTrace{"segments " + bw.name, segCode(), segTrace(bw.put, true)})
	}
	traces = append(traces, corpusTrace{"ends at a TIP.PGD", segCode(), segTrace(segBetween[1].put, false)})
	for _, ipc := range []int{1, 6} {
		e := ptenc.New()
		start(e, 0x1000)
		e.IPC(ptenc.TIPPGD, ipc, 0x1010)
		for range 3 {
			e.IPC(ptenc.TIPPGE, ipc, 0x1010)
			for range 20 {
				e.Pad()
			}
			e.TNT(0b110, 3)
			e.IPC(ptenc.TIPPGD, 0, 0)
			for range 20 {
				e.Pad()
			}
		}
		traces = append(traces, corpusTrace{fmt.Sprintf("PADs after, IP compression %d", ipc), segCode(), e.Bytes()})
	}
	synth, fills := len(traces), len(spareFill)
	// libipt's traces with a TIP.PGD or TIP.PGE in their names, a fill
	// at each cut in turn.
	for _, ft := range libiptTraces(t) {
		if strings.Contains(ft.name, "pge") || strings.Contains(ft.name, "pgd") {
			traces = append(traces, ft)
		}
	}
	cuts := 0
	for i, ft := range traces {
		for _, opts := range segOpts {
			opts.NoInsns = true
			for _, slow := range []bool{false, true} {
				// Two decoders fed the same cuts in the same order
				// (what a decoder keeps from one trace to the next
				// is the same in both).
				exact, spare := New(ft.mem, opts), New(ft.mem, opts)
				exact.fp.off, spare.fp.off = slow, slow
				for n := range len(ft.trace) + 1 {
					for j := range fills {
						if i >= synth && j != n%fills {
							continue
						}
						fill := spareFill[j]
						buf := append(slices.Clone(ft.trace[:n]), fill...)
						want := spareLines(t, exact, slices.Clip(slices.Clone(ft.trace[:n])))
						got := spareLines(t, spare, buf[:n])
						if got != want {
							t.Fatalf("%s, %+v, fast path off %v, cut at %d of %d, %x past it:\n%s\nwant (no capacity past it):\n%s",
								ft.name, opts, slow, n, len(ft.trace), fill[:16], got, want)
						}
						cuts++
					}
				}
			}
		}
	}
	t.Logf("%d traces, %d cuts", len(traces), cuts)
}

// TestFastSpareCapacityCorpus is TestFastSpareCapacity on kAFL's traces
// (libxdc's: a TIP.PGD and a TIP.PGE with PADs between every few bytes),
// cut at every length in their first KiBs, each spare fill in turn.
func TestFastSpareCapacityCorpus(t *testing.T) {
	for _, ft := range fastCorpus(t)[:4] {
		opts := Options{NoInsns: true}
		exact, spare := New(ft.mem, opts), New(ft.mem, opts)
		for n := range min(len(ft.trace), 1<<10) + 1 {
			fill := spareFill[n%len(spareFill)]
			buf := append(slices.Clone(ft.trace[:n]), fill...)
			want := spareLines(t, exact, slices.Clip(slices.Clone(ft.trace[:n])))
			if got := spareLines(t, spare, buf[:n]); got != want {
				t.Fatalf("%s: cut at %d, %x past it:\n%s\nwant (no capacity past it):\n%s", ft.name, n, fill[:16], got, want)
			}
		}
	}
}

// TestFastSegmentState holds what a TIP.PGE leaves for the packets after it
// (fastSeg) to the slow path's (sameFast): the count toward a TRIG starts
// at the TIP.PGE, not at the IP before the TIP.PGD (a TIP.PGD without one
// counts its walk's instructions on); an enable after tracing went off
// without a disable (an interrupt without an IP) is not a resume of the
// disable before the TIP.PGE.
func TestFastSegmentState(t *testing.T) {
	mem := segCode()
	for _, tc := range []struct {
		name  string
		after func(e *ptenc.Encoder)
	}{
		// The jump at 0x1000 and the nop at 0x1010, then the trigger
		// (instruction count 2, no IP).
		{"trig", func(e *ptenc.Encoder) { e.Raw(0xd9, 0x40, 0x02, 0x02, 0x00) }},
		// A TIP.PGD and its TIP.PGE at the same IP (0x1010), then an
		// interrupt without an IP (FUP, TIP suppressed: tracing goes
		// off without a disable) at the jne, and a TIP.PGE at the
		// same IP again: not a resume.
		{"interrupt", func(e *ptenc.Encoder) {
			e.IP(ptenc.TIPPGD, 0x1010)
			e.IP(ptenc.TIPPGE, 0x1010)
			e.IP(ptenc.FUP, 0x1011)
			e.IPC(ptenc.TIP, 0, 0)
			e.IP(ptenc.TIPPGE, 0x1010)
		}},
	} {
		e := ptenc.New()
		start(e, 0x1000)
		e.IP(ptenc.TIPPGD, 0x1010)
		e.IP(ptenc.TIPPGE, 0x1010)
		e.TNT(0b110, 3)
		e.IPC(ptenc.TIPPGD, 0, 0) // at the ret: no IP, the walk counts on
		e.IP(ptenc.TIPPGE, 0x1000)
		tc.after(e)
		e.TNT(0b110, 3)
		e.IPC(ptenc.TIPPGD, 0, 0)
		for range 32 {
			e.Pad()
		}
		for _, opts := range segOpts {
			if c := sameFast(t, mem, e.Bytes(), opts); c.Errors != 0 {
				t.Errorf("%s, %+v: counters %+v, want no error", tc.name, opts, c)
			}
		}
	}
}

// TestFastSegmentKeptPGE holds the TIP.PGEs a kept walk keeps and takes
// again (pgdWalk.pgeAt, keepPGE) to the slow path's flow (sameFast): the
// same walk (the jump at 0x1000 disabled to 0x1010) followed, in turn, by
// TIP.PGEs of each shape, each twice in a row (kept, then taken again by
// its bytes): 9 PADs and an IP of 6 bytes (kAFL's 16 bytes), the same to
// another IP (the first word alike), 6 PADs, IPs of 2 and 4 bytes (bytes
// past the TIP.PGE in the window, which differ), too few bytes to keep, a
// timing packet between; each after a varied number of branches, so that
// the TIP.PGD meets the batch at each fill, its end too.
func TestFastSegmentKeptPGE(t *testing.T) {
	pge := []struct {
		name string
		put  func(e *ptenc.Encoder)
	}{
		{"kafl", func(e *ptenc.Encoder) { pads(e, 9); e.IPC(ptenc.TIPPGE, 3, 0x1000) }},
		{"other IP", func(e *ptenc.Encoder) {
			pads(e, 9)
			e.IPC(ptenc.TIPPGE, 3, 0x1011)
			e.TNT(0, 1)
			e.IP(ptenc.TIP, 0x1000) // the ret
		}},
		{"6 PADs", func(e *ptenc.Encoder) { pads(e, 6); e.IPC(ptenc.TIPPGE, 3, 0x1000) }},
		{"2 bytes, PADs after", func(e *ptenc.Encoder) { pads(e, 9); e.IPC(ptenc.TIPPGE, 1, 0x1000); pads(e, 3) }},
		{"2 bytes", func(e *ptenc.Encoder) { pads(e, 9); e.IPC(ptenc.TIPPGE, 1, 0x1000) }},
		{"4 bytes", func(e *ptenc.Encoder) { pads(e, 9); e.IPC(ptenc.TIPPGE, 2, 0x1000) }},
		{"short", func(e *ptenc.Encoder) { pads(e, 2); e.IPC(ptenc.TIPPGE, 1, 0x1000) }},
		{"timing", func(e *ptenc.Encoder) { pads(e, 3); e.MTC(1); pads(e, 4); e.IPC(ptenc.TIPPGE, 3, 0x1000) }},
	}
	for before := range 40 {
		e := ptenc.New()
		start(e, 0x1000)
		// Each round: the jump, the nop's loop not taken, the ret (a
		// TIP): two branches a round.
		for range before {
			e.TNT(0, 1)
			e.IP(ptenc.TIP, 0x1000)
		}
		e.TNT(0, 1)
		e.IP(ptenc.TIP, 0x1000)
		for i := range 3 * len(pge) {
			p := pge[i%len(pge)]
			for range 2 {
				e.IPC(ptenc.TIPPGD, 3, 0x1010) // at the jump to it
				p.put(e)
			}
			if i%3 == 0 {
				e.TNT(0, 1)
				e.IP(ptenc.TIP, 0x1000)
			}
		}
		e.IP(ptenc.TIPPGD, 0x1010)
		pads(e, 32)
		trace := e.Bytes()
		for _, opts := range segOpts {
			if c := sameFast(t, segCode(), trace, opts); c.Errors != 0 {
				t.Fatalf("%d rounds before, %+v: counters %+v, want no error", before, opts, c)
			}
		}
	}
}

// pads appends n PADs.
func pads(e *ptenc.Encoder, n int) {
	for range n {
		e.Pad()
	}
}

// TestKeepPGE holds what a walk keeps of the TIP.PGE after its TIP.PGD:
// the bytes up to its end when they are 8 to 16 and within the trace's last
// 16, after a TIP.PGD with an IP only (the TIP.PGE's IP compression reads
// the last IP, which is then the TIP.PGD's); and what pgeAt takes again.
func TestKeepPGE(t *testing.T) {
	e := ptenc.New()
	pads(e, 9)
	e.IPC(ptenc.TIPPGE, 3, 0x1000) // 16 bytes
	e.TNT(0b11, 2)
	kafl := append(e.Bytes(), make([]byte, 16)...)
	for _, tc := range []struct {
		name     string
		hasIP    bool
		buf      []byte
		pos, end int
		kept     int
	}{
		{"kafl", true, kafl, 0, 16, 16},
		{"no IP", false, kafl, 0, 16, 0},
		{"8 bytes", true, kafl, 8, 16, 8},
		{"7 bytes", true, kafl, 9, 16, 0},
		{"17 bytes", true, kafl, 0, 17, 0},
		{"at the trace's end", true, kafl[:16], 0, 16, 16},
		{"past the trace's last 16", true, kafl[:15], 0, 15, 0},
	} {
		w := &pgdWalk{hasIP: tc.hasIP, ip: 0x1010}
		w.keepPGE(tc.buf, tc.pos, tc.end, 0x1000)
		if int(w.pgeLen) != tc.kept {
			t.Errorf("%s: kept %d bytes, want %d", tc.name, w.pgeLen, tc.kept)
			continue
		}
		ip, end, ok := w.pgeAt(tc.buf, tc.pos)
		if want := tc.kept > 0; ok != want || ok && (ip != 0x1000 || end != tc.end) {
			t.Errorf("%s: pgeAt %#x, %d, %v; want %#x, %d, %v", tc.name, ip, end, ok, 0x1000, tc.end, want)
		}
		if tc.kept == 0 {
			continue
		}
		// Any byte of the kept ones changed, it takes nothing; the
		// bytes after them do not matter.
		for i := tc.pos; i < tc.pos+16 && i < len(tc.buf); i++ {
			b := slices.Clone(tc.buf)
			b[i] ^= 0x40
			if _, _, ok := w.pgeAt(b, tc.pos); ok != (i >= tc.end) {
				t.Errorf("%s: byte %d changed, pgeAt took it: %v", tc.name, i, ok)
			}
		}
	}
}

// TestFastSegmentMemoryChanged: a Handler that changes the memory and drops
// the block cache at a TIP.PGE's event (an enable) or at a TIP.PGD's (a
// disable, of a walk replayed or walked) gets from the fast path the slow
// path's flow: the TIP.PGE taken again from its kept bytes goes on in the
// new code's block, and the walks kept before are not replayed.
func TestFastSegmentMemoryChanged(t *testing.T) {
	// Old: 3000: jmp 3010; 3010: nop; ret
	// New: 3000: jmp 3020; 3010: ret; 3020: nop; ret
	old := &blob{base: 0x3000, code: []byte{0xeb, 0x0e, 16: 0x90, 0xc3}}
	new := &blob{base: 0x3000, code: []byte{0xeb, 0x1e, 16: 0xc3, 32: 0x90, 0xc3}}
	const rounds = 6
	e := ptenc.New()
	start(e, 0x3000)
	for range rounds {
		e.IPC(ptenc.TIPPGD, 3, 0x3010)
		pads(e, 9)
		e.IPC(ptenc.TIPPGE, 3, 0x3000)
	}
	// The new code: the jump to 3020, its ret.
	for range 3 {
		e.IP(ptenc.TIP, 0x3000)
	}
	pads(e, 32)
	for _, kind := range []EventKind{EvEnabled, EvDisabled} {
		for at := 1; at <= rounds; at++ {
			var logs [2]*eventSwap
			var decs [2]*Decoder
			for i := range logs {
				mem := &swapBlob{old: old, new: new}
				decs[i] = New(mem, Options{NoInsns: true})
				decs[i].fp.off = i == 0
				logs[i] = &eventSwap{swapLog{edgeLog: edgeLog{t: t}, d: decs[i], mem: mem, enable: true, at: at}, kind}
				decs[i].Decode(e.Bytes(), logs[i])
				if !mem.swapped {
					t.Fatalf("event %d, at %d: the memory did not change", kind, at)
				}
			}
			sameLogs(t, at, decs[0], decs[1], &logs[0].fullLog, &logs[1].fullLog)
		}
	}
}

// eventSwap is a swapLog that changes the memory and drops the block cache
// at the at-th event of its kind.
type eventSwap struct {
	swapLog
	kind EventKind
}

func (l *eventSwap) Event(e *Event) {
	l.edgeLog.Event(e)
	l.saw(e.Kind == l.kind)
}

// TestFastSegmentBudget holds a TIP.PGD the kernel meets after steps (the
// IP and the MaxInsns budget it leaves for the TIP.PGD's walk are where
// they took it, not where it started) to the slow path's flow, MaxInsns
// met in the loop, in the walk's first block and after it.
func TestFastSegmentBudget(t *testing.T) {
	// 1000: nop; 1001: jne 1000; 1003: nop; nop; jmp 1010; 1010: nop;
	// nop; nop; 1013: jmp 1020; 1020: ret. At MaxInsns 2 the TIP.PGD's
	// walk stops in its first block, at 1003, where the kernel left it.
	mem := &blob{base: 0x1000, code: []byte{0x90, 0x75, 0xfd, 0x90, 0x90, 0xeb, 0x09, 16: 0x90, 0x90, 0x90, 0xeb, 0x0b, 32: 0xc3}}
	e := ptenc.New()
	start(e, 0x1000)
	for range 3 {
		e.TNT(0b1110, 4)          // the loop three times, then on to the ret
		e.IPC(ptenc.TIPPGD, 0, 0) // at the ret
		pads(e, 9)
		e.IP(ptenc.TIPPGE, 0x1000)
	}
	pads(e, 32)
	for maxInsns := 1; maxInsns <= 12; maxInsns++ {
		sameFast(t, mem, e.Bytes(), Options{MaxInsns: maxInsns})
	}
}

// TestFastSegmentExitBudget holds the MaxInsns budget the kernel's exit at
// a TIP.PGD leaves (its own stores, not out's) to the slow path's flow: the
// kernel entered with a budget short of MaxInsns (an exit at a direct
// jump's successor not known yet, a TIP pending), a step that takes the
// TIP (the budget whole again), then the TIP.PGD, whose kept walk MaxInsns
// binds: below, at and above it.
func TestFastSegmentExitBudget(t *testing.T) {
	// 2000: jmp 2010; 2010: jmp *%rax; 2020: nop; nop; 2022: jmp 2030;
	// 2030: ret. The TIP.PGD at the jump to 2030: a walk of 3.
	mem := &blob{base: 0x2000, code: []byte{0xeb, 0x0e, 16: 0xff, 0xe0, 32: 0x90, 0x90, 0xeb, 0x0c, 48: 0xc3}}
	e := ptenc.New()
	start(e, 0x2020)
	for range 3 {
		e.IPC(ptenc.TIPPGD, 3, 0x2030)
		pads(e, 9)
		e.IPC(ptenc.TIPPGE, 3, 0x2000)
		e.IP(ptenc.TIP, 0x2020) // the jmp *%rax
	}
	e.IPC(ptenc.TIPPGD, 3, 0x2030)
	pads(e, 32)
	for maxInsns := 1; maxInsns <= 5; maxInsns++ {
		c := sameFast(t, mem, e.Bytes(), Options{MaxInsns: maxInsns})
		if want := maxInsns >= 3; (c.Errors == 0) != want {
			t.Errorf("MaxInsns %d: counters %+v, want no error %v", maxInsns, c, want)
		}
	}
}

// TestFastSegmentRandom holds random chains of TIP.PGD/TIP.PGE pairs to
// the slow path's flow (sameFast), so that kept TIP.PGEs (pgeAt) meet what
// a fixed trace does not put after a TIP.PGD: TIP.PGDs with and without an
// IP and at each compression (the last IP the TIP.PGE's compression reads),
// TIP.PGEs of each compression to each block, PADs of every count, timing
// packets, an OVF, a PSB+, a MODE.Exec between, MaxInsns at and around the
// walks, and the trace's end anywhere in or after the last pair's bytes.
func TestFastSegmentRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 2026))
	pgeIPs := []uint64{0x1000, 0x1010, 0x1011}
	ipcs := []int{1, 2, 3, 4, 6}
	for round := range 400 {
		e := ptenc.New()
		start(e, 0x1000)
		at := uint64(0x1000) // where the flow is, tracing on
		for range 2 + r.IntN(12) {
			if r.IntN(6) == 0 {
				// Tracing off without a TIP.PGD (a PSB+ without a
				// FUP), PADs, then on again at a PSB+'s FUP.
				e.PSB()
				e.ModeExec(true, false)
				e.PSBEnd()
				pads(e, r.IntN(12))
				start(e, 0x1000)
				at = 0x1000
			}
			switch at {
			case 0x1000:
				// At the jump to 0x1010: a TIP.PGD there, or
				// without an IP at the jne (after the jump and the
				// nop).
				if r.IntN(4) == 0 {
					e.IPC(ptenc.TIPPGD, 0, 0)
				} else {
					e.IPC(ptenc.TIPPGD, ipcs[r.IntN(len(ipcs))], 0x1010)
				}
			default:
				// The loop some times, then the ret: disabled at it
				// (no IP), or back to 0x1000 and disabled there.
				n := r.IntN(3)
				e.TNT(1<<(n+1)-2, n+1)
				if r.IntN(2) == 0 {
					e.IPC(ptenc.TIPPGD, 0, 0)
				} else {
					e.IP(ptenc.TIP, 0x1000)
					e.IPC(ptenc.TIPPGD, ipcs[r.IntN(len(ipcs))], 0x1010)
				}
			}
			switch r.IntN(8) {
			case 0:
				e.MTC(byte(r.IntN(256)))
			case 1:
				e.OVF()
			case 2:
				e.PSB()
				e.ModeExec(true, false)
				e.PSBEnd()
			case 3:
				e.ModeExec(true, false)
			}
			pads(e, r.IntN(20))
			at = pgeIPs[r.IntN(len(pgeIPs))]
			e.IPC(ptenc.TIPPGE, ipcs[r.IntN(len(ipcs))], at)
			pads(e, r.IntN(4))
			if at == 0x1011 {
				e.TNT(0, 1) // on to the ret
				e.IP(ptenc.TIP, 0x1000)
				at = 0x1000
			}
		}
		trace := e.Bytes()
		trace = trace[:len(trace)-r.IntN(min(len(trace), 12))]
		trace = append(trace, make([]byte, r.IntN(20))...)
		opts := segOpts[r.IntN(len(segOpts))]
		opts.MaxInsns = r.IntN(6)
		sameFast(t, segCode(), trace, opts)
		if t.Failed() {
			t.Fatalf("round %d: % x, %+v", round, trace, opts)
		}
	}
}

// TestFastSegmentKeptPGEAtEnd holds a kept TIP.PGE taken again at the
// trace's end (its bytes the last 16, the TIP.PGE past the window's last
// 16 bytes where the kernel reads no packet) and with each count of bytes
// after it to the slow path's flow.
func TestFastSegmentKeptPGEAtEnd(t *testing.T) {
	for tail := range 18 {
		e := ptenc.New()
		start(e, 0x1000)
		for range 4 {
			e.IPC(ptenc.TIPPGD, 3, 0x1010) // at the jump to it
			pads(e, 9)
			e.IPC(ptenc.TIPPGE, 3, 0x1000)
		}
		pads(e, tail)
		// The walk from the jump keeps the TIP.PGE after it: kAFL's 16
		// bytes, 9 PADs and the packet.
		d := New(segCode(), Options{NoInsns: true})
		d.Decode(e.Bytes(), &fullLog{})
		if w := keptWalk(d, 0x1010); w == nil || w.pgeLen != 16 {
			t.Errorf("%d bytes after: kept walk %+v, want one with 16 bytes of TIP.PGE", tail, w)
		}
		for _, opts := range segOpts {
			if c := sameFast(t, segCode(), e.Bytes(), opts); c.Events != 9 || c.Errors != 0 {
				t.Errorf("%d bytes after, %+v: counters %+v, want 9 events (8 and the end) and no error", tail, opts, c)
			}
		}
	}
}

// keptWalk is d's kept TIP.PGD walk to ip, or nil.
func keptWalk(d *Decoder, ip uint64) *pgdWalk {
	for i := range d.cache.runs.pgds {
		if w := &d.cache.runs.pgds[i]; w.b != nil && w.hasIP && w.ip == ip {
			return w
		}
	}
	return nil
}
