package flow

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"ptfs/decode"
	"ptfs/decode/ptenc"
)

// timeConfig is the clock the timing tests decode with: MTC every 2^3
// crystal clocks, calibrated from the CBR (nominal ratio 4) and the
// crystal's ratio.
var timeConfig = decode.ClockConfig{MTCFreq: 3, NomFreq: 4, CPUID15EAX: 1, CPUID15EBX: 2}

// timed returns trace with timing packets put in at packet boundaries, as
// a live trace carries them: after each PSB the header's TSC, TMA and CBR
// (the clock starts and calibrates from them), and an MTC every `every`
// bytes outside PSB+ groups, its CTC counting up; with cyc also a CYC
// after each MTC, of one byte or (every fourth) more. From the first bad
// packet on the bytes are copied as they are.
func timed(trace []byte, every int, cyc bool) []byte {
	pd := decode.NewPacketDecoder(trace)
	e := ptenc.New()
	var p decode.Packet
	tsc, ctc, n, since, inPSB := uint64(1<<20), uint16(0), 0, 0, false
	for {
		err := pd.Next(&p)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				e.Raw(trace[pd.Pos():]...)
			}
			return e.Bytes()
		}
		e.Raw(trace[p.Offset : p.Offset+uint64(p.Size)]...)
		switch p.Kind {
		case decode.PSB:
			tsc += 1 << 12
			e.TSC(tsc)
			e.TMA(ctc, 3)
			e.CBR(4)
			inPSB, since = true, 0
			continue
		case decode.PSBEnd:
			inPSB = false
		}
		since += int(p.Size)
		if inPSB || since < every {
			continue
		}
		since = 0
		ctc++
		e.MTC(byte(ctc))
		if cyc {
			n++
			if n%4 == 0 {
				e.CYC(uint64(40 + n%200))
			} else {
				e.CYC(uint64(1 + n%31))
			}
		}
	}
}

// TestTimed: timed keeps the trace's own packets and puts in the timing
// packets (a CBR, a TMA each group, an MTC and a CYC every 64 bytes or
// so); that a clock's times move with them is TestFastTimeSameFlow's.
func TestTimed(t *testing.T) {
	bt := loadBench(t, "mruby")
	tr := timed(bt.trace, 64, true)
	var kinds [2]map[decode.Kind]int
	for i, b := range [][]byte{bt.trace, tr} {
		kinds[i] = map[decode.Kind]int{}
		pd := decode.NewPacketDecoder(b)
		var p decode.Packet
		for pd.Next(&p) == nil {
			kinds[i][p.Kind]++
		}
	}
	for k, n := range kinds[0] {
		if k == decode.CBR {
			n += kinds[0][decode.PSB] // one put in each group
		}
		if kinds[1][k] != n {
			t.Errorf("%v: %d packets, %d in the trace", k, kinds[1][k], n)
		}
	}
	if m := kinds[1][decode.MTC]; m < len(bt.trace)/64/2 || kinds[1][decode.CYC] != m || kinds[1][decode.TMA] == 0 {
		t.Errorf("%d MTC, %d CYC, %d TMA put in a trace of %d bytes", m, kinds[1][decode.CYC], kinds[1][decode.TMA], len(bt.trace))
	}
}

// timedCorpus is the fast path's corpus traces with timing packets put in
// (timed): mruby's, the ptsim runs' and the other libxdc traces'.
func timedCorpus(t *testing.T) []corpusTrace {
	var out []corpusTrace
	for _, ct := range fastCorpus(t) {
		if len(ct.trace) < 1<<12 {
			continue // libipt's: crafted, most already with timing
		}
		for _, c := range []struct {
			every int
			cyc   bool
		}{{64, false}, {24, true}} {
			out = append(out, corpusTrace{ct.name, ct.mem, timed(ct.trace, c.every, c.cyc)})
		}
	}
	return out
}

// TestFastTimeSameFlow holds the fast path with a clock to the slow path
// on the corpus traces with timing packets put in, whole and damaged: the
// same branches with the same times, events and counters; the times move,
// and the fast path takes the bulk of the bytes.
func TestFastTimeSameFlow(t *testing.T) {
	opts := Options{Time: &timeConfig}
	fastBytes = 0
	var size uint64
	for _, ct := range timedCorpus(t) {
		t.Run(ct.name, func(t *testing.T) {
			sameFast(t, ct.mem, ct.trace, opts)
			size += 2 * uint64(len(ct.trace))
			// Times that move along the branches: a clock that saw
			// no timing packet would pass the comparison too.
			var l fullLog
			d := New(ct.mem, Options{Time: &timeConfig, NoInsns: true})
			l.clock = d
			d.Decode(ct.trace, &l)
			seen := map[uint64]bool{}
			for _, it := range l.items {
				seen[it.tsc] = true
			}
			if len(l.items) > 1000 && len(seen) < 5 {
				t.Errorf("%d times over %d branches", len(seen), len(l.items))
			}
		})
	}
	if fastBytes < size*9/10 {
		t.Errorf("the fast path took %d of %d bytes", fastBytes, size)
	}
	t.Logf("the fast path took %d of %d bytes", fastBytes, size)
	r := rand.New(rand.NewPCG(11, 64))
	for _, ct := range timedCorpus(t)[:4] {
		for range 4 {
			sameFast(t, ct.mem, mutate(r, ct.trace), opts)
		}
	}
}

// TestFastTimeBranches holds the branch lines with times (Branches, the
// live mount's output) of mruby with MTCs to the slow path's, and the warm
// fast path to taking nearly all of its bytes and allocating nothing.
func TestFastTimeBranches(t *testing.T) {
	bt := loadBench(t, "mruby")
	tr := timed(bt.trace, 64, false)
	var out [2]bytes.Buffer
	for i := range out {
		d := New(bt.space, Options{Time: &timeConfig, NoInsns: true})
		d.fp.off = i == 0
		b := NewBranches(&out[i], bt.space, nil, nil)
		b.SetClock(d)
		b.TimeConv = func(tsc uint64) uint64 { return tsc }
		d.Decode(tr, b)
		b.Flush()
		out[i].Reset()
		d.fp.bytes = 0
		d.Decode(tr, b) // warm
		b.Flush()
		if i == 1 && d.fp.bytes < uint64(len(tr))*99/100 {
			t.Errorf("the fast path took %d of %d bytes warm", d.fp.bytes, len(tr))
		}
	}
	d := New(bt.space, Options{Time: &timeConfig, NoInsns: true})
	var c counter
	d.Decode(tr, &c)
	warmWnds(d, tr)
	if a := testing.AllocsPerRun(3, func() { d.Decode(tr, &c) }); a != 0 {
		t.Errorf("%v allocations per warm decode with a clock, want 0", a)
	}
	if out[0].Len() == 0 || !bytes.Contains(out[0].Bytes(), []byte(" time=")) {
		t.Fatalf("no branch lines with times: %.200q", out[0].String())
	}
	if !bytes.Equal(out[0].Bytes(), out[1].Bytes()) {
		a, b := bytes.Split(out[0].Bytes(), []byte("\n")), bytes.Split(out[1].Bytes(), []byte("\n"))
		for i := range min(len(a), len(b)) {
			if !bytes.Equal(a[i], b[i]) {
				t.Fatalf("line %d: %q with the fast path, %q without", i, b[i], a[i])
			}
		}
		t.Fatalf("%d lines with the fast path, %d without", len(b), len(a))
	}
}

// TestFastTime holds the fast path with a clock to the slow path on small
// traces (sameFast: the same branches with their times, events and
// counters), and to taking all of a trace after its sync where it can:
// timing packets between TNTs, runs of them, a CYC of more bytes, a TMA
// after a TSC, timing while tracing is off, up to the window's end, in
// PSB+ groups; the rest stays the slow path's (bad bytes after an MTC, a
// bad CYC, a group it leaves, ticks).
func TestFastTime(t *testing.T) {
	// 1000: nop; nop; nop; call 1010; 1008: jmp 1000
	// 1010: nop; nop; 1012: jz 1000; 1014: ret
	mem := &blob{base: 0x1000, code: []byte{0x90, 0x90, 0x90, 0xe8, 0x08, 0, 0, 0, 0xeb, 0xf6, 14: 0,
		16: 0x90, 0x90, 0x74, 0xec, 0xc3}}
	loop := func(e *ptenc.Encoder, n int) {
		for range n {
			e.TNT(0b11, 2) // two rounds of the loop: branches to hand over
		}
	}
	// group is a PSB+ with the header's timing, the extra packets and a
	// status at fup.
	group := func(e *ptenc.Encoder, fup uint64, extra func()) {
		e.PSB()
		e.TSC(1 << 30)
		e.TMA(0x120, 7)
		e.CBR(4)
		e.ModeExec(true, false)
		if extra != nil {
			extra()
		}
		e.IP(ptenc.FUP, fup)
		e.PSBEnd()
	}
	// flow is a trace whose timing starts in its sync's header, then mid.
	flow := func(mid func(e *ptenc.Encoder)) func(e *ptenc.Encoder) {
		return func(e *ptenc.Encoder) {
			group(e, 0x1000, nil)
			loop(e, 2)
			e.MTC(1)
			loop(e, 2)
			mid(e)
			loop(e, 2)
		}
	}
	clock := Options{Time: &timeConfig}
	for _, tc := range []struct {
		name  string
		trace func(e *ptenc.Encoder)
		opts  Options
		fast  bool // the fast path takes all after the sync
	}{
		{"MTCs", flow(func(e *ptenc.Encoder) { e.MTC(2) }), clock, true},
		{"a run of timing packets", flow(func(e *ptenc.Encoder) {
			e.MTC(2)
			e.Pad()
			e.CYC(9)
			e.MTC(3)
			e.TSC(1<<30 + 5000)
			e.CYC(1)
		}), clock, true},
		{"a CYC", flow(func(e *ptenc.Encoder) { e.CYC(5) }), clock, true},
		{"a CYC of more bytes", flow(func(e *ptenc.Encoder) { e.CYC(1000) }), clock, true},
		{"a TMA after a TSC", flow(func(e *ptenc.Encoder) {
			e.TSC(1<<30 + 9000)
			e.TMA(0x180, 9)
		}), clock, true},
		{"tracing off, timing before the TIP.PGE", flow(func(e *ptenc.Encoder) {
			e.IPC(ptenc.TIPPGD, 0, 0)
			e.MTC(2)
			e.CYC(300)
			e.MTC(3)
			e.IP(ptenc.TIPPGE, 0x1000)
		}), clock, true},
		{"tracing off, a CYC of more bytes, no clock", flow(func(e *ptenc.Encoder) {
			e.IPC(ptenc.TIPPGD, 0, 0)
			e.CYC(300)
			e.IP(ptenc.TIPPGE, 0x1000)
		}), Options{}, false},
		{"timing up to the end", func(e *ptenc.Encoder) {
			group(e, 0x1000, nil)
			loop(e, 2)
			e.MTC(1)
		}, clock, true},
		{"bad bytes after an MTC", flow(func(e *ptenc.Encoder) {
			e.MTC(2)
			e.Raw(0x02, 0xff)
		}), clock, false},
		{"a bad CYC after an MTC", flow(func(e *ptenc.Encoder) {
			e.MTC(2)
			e.Raw(0x07)
			e.Raw(bytes.Repeat([]byte{1}, 20)...) // its bytes never end
		}), clock, false},
		{"an MTC after bits the slow path takes", func(e *ptenc.Encoder) {
			// The return at 1014 with a bit not taken: the kernel
			// stops before it, a bit pending and the MTC next; the
			// error is the slow path's, at the time before the MTC.
			group(e, 0x1000, nil)
			loop(e, 2)
			e.TNT(0b00, 2)
			e.MTC(2)
			loop(e, 2)
		}, clock, false},
		{"a group", flow(func(e *ptenc.Encoder) { group(e, 0x1002, func() { e.MTC(5) }) }), clock, true},
		{"a group left to the slow path", flow(func(e *ptenc.Encoder) {
			// Read up to the MNT, then left: its CYC is not to be
			// counted twice (no TSC in it sets the time again).
			e.PSB()
			e.ModeExec(true, false)
			e.CYC(20)
			e.MNT(7)
			e.IP(ptenc.FUP, 0x1000)
			e.PSBEnd()
		}), clock, false},
		{"a group whose status the walk does not reach", flow(func(e *ptenc.Encoder) {
			// Read whole, then left at the status past the jz
			// (the slow path's error, at the time after the CYC
			// counted once).
			e.PSB()
			e.ModeExec(true, false)
			e.CYC(20)
			e.IP(ptenc.FUP, 0x1014)
			e.PSBEnd()
		}), clock, false},
		{"a group with OVF", flow(func(e *ptenc.Encoder) { group(e, 0x1002, func() { e.MTC(5); e.OVF() }) }), clock, false},
		{"ticks", flow(func(e *ptenc.Encoder) { e.MTC(2) }), Options{Time: &timeConfig, Ticks: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sync := ptenc.New()
			group(sync, 0x1000, nil)
			d, want := fastAfterSync(t, mem, tc.trace, sync.Len(), tc.opts)
			if got := d.fp.bytes == want; got != tc.fast {
				t.Errorf("the fast path took %d bytes after the sync (all: %d); want all: %v", d.fp.bytes, want, tc.fast)
			}
		})
	}
}
