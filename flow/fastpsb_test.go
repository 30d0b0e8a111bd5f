package flow

import (
	"testing"

	"ptfs/decode"
	"ptfs/decode/ptenc"
)

// TestFastPSB holds the fast path's PSB+ groups (fastPSB) and its MODE.Exec
// before a TIP.PGE (fastExecOff) to the slow path (sameFast: the same
// branches, events and counters), and to taking the groups it can: a
// status IP at the start of the current block, within it, at its last
// instruction, past its direct call, in the callee, and the groups while
// tracing is off; the others (a status past a conditional branch, a mode
// that contradicts the flow, an OVF or MNT inside) stay the slow path's;
// a clock changes nothing of that (TestFastTime has groups with timing
// packets a clock sees).
func TestFastPSB(t *testing.T) {
	// 1000: nop; nop; nop; call 1010; 1008: jmp 1000
	// 1010: nop; nop; 1012: jz 1000; 1014: ret
	code := []byte{0x90, 0x90, 0x90, 0xe8, 0x08, 0, 0, 0, 0xeb, 0xf6, 14: 0,
		16: 0x90, 0x90, 0x74, 0xec, 0xc3}
	mem := &blob{base: 0x1000, code: code}
	// loop is n rounds of the loop: a TNT each for the jz, taken. The
	// kernel waits at 1000 for the next packet after each.
	loop := func(e *ptenc.Encoder, n int) {
		for range n {
			e.TNT(1, 1)
		}
	}
	group := func(e *ptenc.Encoder, inner func()) {
		e.PSB()
		e.Pad()
		e.ModeTSX(false, false)
		inner()
		e.PIP(0x1234000, true)
		e.Pad()
		e.Pad()
		e.VMCS(0x5000)
		e.CBR(25)
		e.PSBEnd()
	}
	on := func(fup uint64, extra func(e *ptenc.Encoder)) func(e *ptenc.Encoder) {
		return func(e *ptenc.Encoder) {
			start(e, 0x1000)
			loop(e, 4)
			group(e, func() {
				e.ModeExec(true, false)
				if extra != nil {
					extra(e)
				}
				e.IP(ptenc.FUP, fup)
			})
			loop(e, 4)
		}
	}
	// off turns tracing off (a TIP.PGD), then has a PSB+ group with a
	// FUP at fup, if any, then the MODE.Exec bytes mode and a TIP.PGE, if
	// any.
	off := func(fup uint64, mode []byte) func(e *ptenc.Encoder) {
		return func(e *ptenc.Encoder) {
			start(e, 0x1000)
			loop(e, 2)
			e.IPC(ptenc.TIPPGD, 0, 0)
			group(e, func() {
				if fup != 0 {
					e.IP(ptenc.FUP, fup)
				}
			})
			if mode != nil {
				e.Raw(mode...)
				e.IP(ptenc.TIPPGE, 0x1000)
			}
			loop(e, 2)
		}
	}
	for _, tc := range []struct {
		name  string
		trace func(e *ptenc.Encoder)
		opts  Options
		fast  bool // the fast path takes the group and all after it
	}{
		{"status at the block", on(0x1000, nil), Options{}, true},
		{"status within the block", on(0x1002, nil), Options{}, true},
		{"status at the call", on(0x1003, nil), Options{}, true},
		{"status at the callee", on(0x1010, nil), Options{}, true},
		{"status within the callee", on(0x1011, nil), Options{}, true},
		{"status at the callee's jz", on(0x1012, nil), Options{}, true},
		{"status within the callee, then its return", func(e *ptenc.Encoder) {
			// The call the walk to the status takes pushes the
			// only return address.
			start(e, 0x1000)
			group(e, func() {
				e.ModeExec(true, false)
				e.IP(ptenc.FUP, 0x1011)
			})
			e.TNT(0b01, 2) // jz not taken, the return compressed
			loop(e, 2)
		}, Options{}, true},
		{"status, then a TRIG counting from it", func(e *ptenc.Encoder) {
			// The TRIG is the slow path's: not all is the fast path's.
			start(e, 0x1000)
			loop(e, 2)
			group(e, func() { e.IP(ptenc.FUP, 0x1011) })
			e.Raw(0xd9, 0x40, 0x01, 0x01, 0x00) // TRIG, icnt 1
			loop(e, 2)
		}, Options{}, false},
		{"status past the jz", on(0x1014, nil), Options{}, false},
		{"status nowhere on the way", on(0x1008, nil), Options{}, false},
		{"status with a timing packet", on(0x1002, func(e *ptenc.Encoder) { e.MTC(3) }), Options{}, true},
		{"status with a clock", on(0x1002, nil), Options{Time: &decode.ClockConfig{CPUID15EAX: 1, CPUID15EBX: 2}}, true},
		{"status with MNT", on(0x1002, func(e *ptenc.Encoder) { e.MNT(7) }), Options{}, false},
		{"status with OVF", on(0x1002, func(e *ptenc.Encoder) { e.OVF() }), Options{}, false},
		{"mode contradicts", func(e *ptenc.Encoder) {
			start(e, 0x1000)
			loop(e, 2)
			group(e, func() {
				e.ModeExec(false, true)
				e.IP(ptenc.FUP, 0x1000)
			})
			loop(e, 2)
		}, Options{}, false},
		{"tracing went off", func(e *ptenc.Encoder) {
			start(e, 0x1000)
			loop(e, 2)
			group(e, func() { e.ModeExec(true, false) })
			e.ModeExec(true, false)
			e.IP(ptenc.TIPPGE, 0x1010)
			loop(e, 2)
		}, Options{}, true},
		{"tracing off, on at the FUP", off(0x1010, nil), Options{}, true},
		{"tracing off, the TIP.PGE", off(0, []byte{0x99, 0x01}), Options{}, true},
		{"tracing off, a mode change at the TIP.PGE", off(0, []byte{0x99, 0x02}), Options{}, false},
		{"tracing off, IF at the TIP.PGE", off(0, []byte{0x99, 0x05}), Options{Iflags: true}, false},
		{"tracing off, IF at the TIP.PGE not told", off(0, []byte{0x99, 0x05}), Options{}, true},
		{"IF unknown after a resync, told at the TIP.PGE", func(e *ptenc.Encoder) {
			// The sync after the bad bytes forgets IF, not the mode.
			start(e, 0x1000)
			loop(e, 2)
			e.Raw(0x02, 0xff)
			e.PSB()
			e.PSBEnd()
			e.Raw(0x99, 0x01) // MODE.Exec: 64-bit, no IF
			e.IP(ptenc.TIPPGE, 0x1000)
			loop(e, 2)
		}, Options{Iflags: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sync := ptenc.New()
			start(sync, 0x1000)
			d, want := fastAfterSync(t, mem, tc.trace, sync.Len(), tc.opts)
			if got := d.fp.groups > 0 && d.fp.bytes == want; got != tc.fast {
				t.Errorf("the fast path took %d groups and %d bytes after the sync (all: %d); want all: %v",
					d.fp.groups, d.fp.bytes, want, tc.fast)
			}
		})
	}
}

// fastAfterSync encodes trace with PADs after it, holds the fast path to
// the slow path on it (sameFast), decodes it twice with the fast path (the
// second time warm: the call's successor known) and returns the decoder
// with its counts of the second time, and the bytes the fast path takes
// when it takes every byte after the sync (sync bytes long) up to its
// window's end: the PADs at the end a word at a time while one starts 16
// bytes or more before the end.
func fastAfterSync(t *testing.T, mem Memory, trace func(e *ptenc.Encoder), sync int, opts Options) (*Decoder, uint64) {
	t.Helper()
	e := ptenc.New()
	trace(e)
	body := e.Len()
	for range 32 {
		e.Pad()
	}
	sameFast(t, mem, e.Bytes(), opts)
	opts.NoInsns = true
	d := New(mem, opts)
	d.Decode(e.Bytes(), &counter{})
	d.fp.bytes, d.fp.groups = 0, 0
	d.Decode(e.Bytes(), &counter{})
	stop := body
	for stop <= e.Len()-16 {
		stop += 8
	}
	return d, uint64(stop - sync)
}

// TestFastPSBMruby: the fast path takes all of mruby's 349 PSB+ groups
// warm but the first (the sync) and the one after the OVF.
func TestFastPSBMruby(t *testing.T) {
	bt := loadBench(t, "mruby")
	d := New(bt.space, Options{NoInsns: true})
	d.Decode(bt.trace, &counter{})
	d.fp.groups = 0
	d.Decode(bt.trace, &counter{})
	if d.fp.groups < 347 {
		t.Errorf("the fast path took %d of mruby's 349 PSB+ groups warm", d.fp.groups)
	}
}

// TestStatusWalk holds statusWalk to the walk's instructions and direct
// branches up to a status IP, within MaxInsns.
func TestStatusWalk(t *testing.T) {
	// 1000: nop; nop; nop; call 1010; 1008: jmp 1000
	// 1010: nop; nop; 1012: jz 1000; 1014: ret
	code := []byte{0x90, 0x90, 0x90, 0xe8, 0x08, 0, 0, 0, 0xeb, 0xf6, 14: 0,
		16: 0x90, 0x90, 0x74, 0xec, 0xc3}
	d := New(&blob{base: 0x1000, code: code}, Options{NoInsns: true})
	d.mode = Mode64
	b := d.block(0x1000, Mode64)
	for _, tc := range []struct {
		to      uint64
		budget  int
		known   bool // the callee decoded
		n, left int
		last    uint64
		ok      bool
	}{
		{0x1000, 0, false, 0, 0, 0, true},
		{0x1002, 5, false, 2, 0, 0x1001, true},
		{0x1002, 1, false, 0, 0, 0, false},
		{0x1003, 3, false, 3, 0, 0x1002, true},
		{0x1010, 4, false, 0, 0, 0, false}, // the callee not decoded yet
		{0x1010, 4, true, 4, 1, 0x1003, true},
		{0x1010, 3, true, 0, 0, 0, false},
		{0x1012, 6, true, 6, 1, 0x1011, true},
		{0x1014, 100, true, 0, 0, 0, false}, // past the jz
		{0x1001 + 1<<20, 100, true, 0, 0, 0, false},
	} {
		b.taken = nil
		if tc.known {
			d.block(b.target, Mode64)
		}
		n, left, last, ok := d.statusWalk(b, 0x1000, tc.to, tc.budget)
		if ok != tc.ok || ok && (n != tc.n || left != tc.left || last != tc.last) {
			t.Errorf("to %#x, budget %d, callee known %v: %d instructions, %d blocks left, last %#x, %v; want %d, %d, %#x, %v",
				tc.to, tc.budget, tc.known, n, left, last, ok, tc.n, tc.left, tc.last, tc.ok)
		}
	}
	if _, _, _, ok := d.statusWalk(b, 0x1001, 0x1002, 10); ok {
		t.Error("a walk from an IP not the block's start went on")
	}
	if _, _, _, ok := d.statusWalk(nil, 0x1000, 0x1000, 10); ok {
		t.Error("a walk without a block went on")
	}
}

// TestFastPSBSinceRef: a status update is an IP reference, as its event is
// on the slow path (fireEv): a TRIG after the group counts its instructions
// from the status IP, not from before the group, whether the walk to the
// status executed instructions or none.
func TestFastPSBSinceRef(t *testing.T) {
	// 2000: jmp 2010; 2010: ret
	code := []byte{0xeb, 0x0e, 16: 0xc3}
	mem := &blob{base: 0x2000, code: code}
	for _, status := range []uint64{0x2000, 0x2010} {
		e := ptenc.New()
		start(e, 0x2000)
		// Each round's jump is executed with no TNT bit to reset
		// the count: the kernel stops at 2000 with it at 8.
		for range 8 {
			e.IP(ptenc.TIP, 0x2000)
		}
		e.PSB()
		e.IP(ptenc.FUP, status)
		e.PSBEnd()
		e.Raw(0xd9, 0x40, 0x02, 0x01, 0x00) // TRIG, icnt 2
		for range 4 {
			e.IP(ptenc.TIP, 0x2000)
		}
		for range 32 {
			e.Pad()
		}
		sameFast(t, mem, e.Bytes(), Options{})
		d := New(mem, Options{NoInsns: true})
		d.Decode(e.Bytes(), &counter{})
		if d.fp.groups == 0 {
			t.Errorf("status at %#x: the fast path took no PSB+ group", status)
		}
	}
}

// swapBlob is code memory that a Handler changes (swapped), as perfflow's
// side band does.
type swapBlob struct {
	old, new *blob
	swapped  bool
}

func (m *swapBlob) ReadAt(dst []byte, addr uint64) (int, error) {
	if m.swapped {
		return m.new.ReadAt(dst, addr)
	}
	return m.old.ReadAt(dst, addr)
}

// swapLog is an edgeLog that changes its decoder's memory and drops its
// block cache (MemoryChanged) at the at-th return it reads (in Branch or
// in a batch of Edges), or at the at-th enable (an Event).
type swapLog struct {
	edgeLog
	d      *Decoder
	mem    *swapBlob
	enable bool // at an enable, else at a return
	at, n  int
}

func (l *swapLog) Branch(from, to uint64, k BranchKind) {
	l.edgeLog.Branch(from, to, k)
	l.saw(k == BrReturn && !l.enable)
}

func (l *swapLog) Edges(batch [][]Edge) {
	l.edgeLog.Edges(batch)
	for _, e := range batch {
		for i := range e {
			l.saw(e[i].Kind == BrReturn && !l.enable)
		}
	}
}

func (l *swapLog) Event(e *Event) {
	l.edgeLog.Event(e)
	l.saw(e.Kind == EvEnabled && l.enable)
}

func (l *swapLog) saw(counted bool) {
	if counted {
		if l.n++; l.n == l.at {
			l.mem.swapped = true
			l.d.MemoryChanged()
		}
	}
}

// TestFastPSBMemoryChanged: a Handler that changes the memory and drops the
// block cache right before a PSB+ group gets from the fast path the slow
// path's flow: after a drop in the batch handed over before the group (the
// kernel's block is the old code's) the group is the slow path's, whose
// walk to the status looks its blocks up again; after a drop at an enable
// (an Event) too, the status walk going through the new code's blocks.
func TestFastPSBMemoryChanged(t *testing.T) {
	// Old: 3000: jmp 3010; 3010: nop; ret
	// New: 3000: jmp 3020; 3010: ret; 3020: nop; ret
	old := &blob{base: 0x3000, code: []byte{0xeb, 0x0e, 16: 0x90, 0xc3}}
	new := &blob{base: 0x3000, code: []byte{0xeb, 0x1e, 16: 0xc3, 32: 0x90, 0xc3}}
	const rounds = 8
	for _, tc := range []struct {
		name   string
		enable bool // the Handler changes the memory at an enable
		status uint64
		trace  func(e *ptenc.Encoder)
		group  bool // the fast path takes the group
	}{
		{"at the return before the group", false, 0x3010, func(e *ptenc.Encoder) {
			start(e, 0x3000)
			for range rounds {
				e.IP(ptenc.TIP, 0x3000)
			}
		}, false},
		{"at the enable before the group", true, 0x3020, func(e *ptenc.Encoder) {
			start(e, 0x3000)
			for range rounds - 1 {
				e.IP(ptenc.TIP, 0x3000)
			}
			e.IPC(ptenc.TIPPGD, 0, 0)
			e.IP(ptenc.TIPPGE, 0x3000)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := ptenc.New()
			tc.trace(e)
			e.PSB()
			e.IP(ptenc.FUP, tc.status)
			e.PSBEnd()
			for range 4 {
				e.IP(ptenc.TIP, 0x3000)
			}
			for range 32 {
				e.Pad()
			}
			at := rounds
			if tc.enable {
				at = 1
			}
			var logs [2]*swapLog
			var decs [2]*Decoder
			for i := range logs {
				mem := &swapBlob{old: old, new: new}
				decs[i] = New(mem, Options{NoInsns: true})
				decs[i].fp.off = i == 0
				logs[i] = &swapLog{edgeLog: edgeLog{t: t}, d: decs[i], mem: mem, enable: tc.enable, at: at}
				decs[i].Decode(e.Bytes(), logs[i])
				if !mem.swapped {
					t.Fatal("the memory did not change")
				}
			}
			sameLogs(t, 0, decs[0], decs[1], &logs[0].fullLog, &logs[1].fullLog)
			if got := decs[1].fp.groups > 0; got != tc.group {
				t.Errorf("the fast path took %d groups; want some: %v", decs[1].fp.groups, tc.group)
			}
		})
	}
}
