package flow

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	"ptfs/decode"
	"ptfs/x86insn"
)

// The fast path: while the decoder's state is simple (a reader of branches,
// tracing plainly on or off, nothing queued, held or stashed, no stubs, no
// ticks), the flow is driven from the trace bytes themselves instead of
// decoded packets: PAD, TNT.8, TNT.64, TIP, TIP.PGD and TIP.PGE (and the
// timing packets: skipped without a clock, as the slow path skips them,
// handed to the clock between the kernel's runs with one, fastTime), with
// the packet decoder's last-IP rule (decode.ApplyIP). It does what chain,
// walk and run do for them, in their order, and hands anything else over to
// them in exactly the state they would have reached: pending TNT bits in
// tnt/tntN, a TIP read ahead in back, a TIP.PGD queued, the packet decoder
// at the first packet not taken.

// fastState is the fast path's own state.
type fastState struct {
	// off turns the fast path off: tests hold it to the slow path.
	// noWnd has the packet windows take nothing (wndFill): tests hold
	// the kernel to its tracelets and packets.
	off, noWnd bool
	// wndOn has the kernel look packet windows up (window.go): set by
	// fast once the fast path took wndAt bytes (wndWarm; tests set 0).
	wndOn bool
	wndAt uint64
	// noPos and noIP are where it last found nothing to do: it does not
	// try again before the flow moved.
	noPos int
	noIP  uint64
	// bytes counts the trace bytes it took: tests check that it takes
	// the bulk of a trace.
	bytes uint64
	// groups counts the PSB+ groups it took (fastPSB): tests check that
	// it takes them.
	groups uint64
	// The branches taken and not yet handed to the Handler, in order:
	// batch[:n], each a run's edges as they are (their capacity cut to
	// their length: a run keeps its return addresses after its edges)
	// or the one branch edges[i] of entry i, as plain words (edgeRef).
	// The kernel only writes them (stores, no call); they are handed
	// over, in one call, before a block or run is worked out, an event,
	// and when the fast path stops (flush).
	n     int
	batch [edgeBatch]edgeRef
	edges [edgeBatch]Edge
	// k is the kernel's state between its runs.
	k kern
	// pd and pk read the packets fastPSB, fastExecOff and fastTime take
	// and clockPackets hands to the clock (the slow path's decoder stays
	// where it is until the hand-over).
	pd decode.PacketDecoder
	pk decode.Packet
}

// edgeRef is a batch entry: a []Edge's header as plain words, which the
// collector neither scans nor write-barriers (a pointer store a run or
// branch while it marks cost a cold pass more than its share). It keeps
// nothing alive: its edges are a run's (listed by a block in the cache's
// chunks, kept across drops while the fast path runs: blockCache.pinned),
// a kept walk's, a tracelet's room's or the batch's own buffer's, none of
// which moves.
type edgeRef struct {
	p    uintptr
	n, c int
}

// An edgeRef is a slice header's size (slices casts the batch): the
// index below is a compile-time constant 0 only then.
var _ = [1]struct{}{}[unsafe.Sizeof(edgeRef{})-unsafe.Sizeof([]Edge(nil))]

// refOf returns e's header as an edgeRef, its capacity cut to its length.
func refOf(e []Edge) edgeRef {
	return edgeRef{uintptr(unsafe.Pointer(unsafe.SliceData(e))), len(e), len(e)}
}

// slices returns the batch as the slices it holds (the same layout).
func (f *fastState) slices() *[edgeBatch][]Edge {
	return (*[edgeBatch][]Edge)(unsafe.Pointer(&f.batch))
}

// edgeBatch is the most entries (runs or single branches) the fast path
// gathers before it hands them over.
const edgeBatch = 64

// flush hands the gathered branches over: at once to Edges, else one by
// one.
func (d *Decoder) flush() {
	f := &d.fp
	n := f.n
	if n == 0 {
		return
	}
	f.n = 0
	batch := f.slices()[:n]
	if d.eh != nil {
		d.eh.Edges(batch)
		return
	}
	for _, e := range batch {
		for i := range e {
			d.h.Branch(e[i].From, e[i].To, e[i].Kind)
		}
	}
}

// fastOK tells whether the fast path can take the flow from here.
func (d *Decoder) fastOK() bool {
	if d.fp.off || !d.opts.NoInsns || d.opts.Ticks || len(d.opts.Stubs) > 0 || len(d.q) > 0 || d.inStub ||
		d.stash != ModeUnknown || d.nHeld > 0 || len(d.unnamed) > 0 || d.resyncing || d.eos || d.tipOK {
		return false
	}
	if d.enabled {
		return !d.hasBack || d.back.Kind == decode.TIP
	}
	return !d.hasBack && d.tntN == 0
}

// A TIP the fast path read ahead (kern.tip), which the flow has not taken
// yet.
const (
	tipNone = iota
	// tipRaw: the TIP at kern.pos, not decoded past: taking it decodes
	// its IP (the bytes are in the cache) and moves pos and last on, and
	// a hand-over with it pending leaves the packet decoder before it.
	tipRaw
	// tipBack: d.back (the slow path's read-ahead), whose IP is the
	// last IP already.
	tipBack
)

// kern is the fast loop's state, which the kernel holds in registers
// while it runs and leaves here when it exits.
type kern struct {
	buf  []byte
	pos  int
	last uint64 // the last IP, before a tipRaw
	tnt  uint64 // pending TNT bits, the oldest in bit nb-1 (as d.tnt)
	nb   uint
	tip  uint8
	// b is the block at ip; nil after a successor or IP block the
	// kernel did not find (missP: the successor pointer; nil for an IP
	// block).
	b     *block
	ip    uint64
	missP **block
	// budget is what MaxInsns leaves to the walk before an IP reference
	// resets it (MaxInsns - steps).
	budget int
	// pat and bits are the run kern.b did not find (exitRun).
	pat  uint8
	bits uint
}

// Why the kernel stopped.
const (
	// exitStop: a packet or a state that is the slow path's (or the
	// trace window's end); the step before it is done.
	exitStop = iota
	// exitFlush: the branches gathered fill the batch.
	exitFlush
	// exitMiss: the step is done, its block (kern.ip) is not known yet.
	exitMiss
	// exitRun: the run from kern.b with kern.pat is not among the
	// recent ones; nothing of the step is done.
	exitRun
	// exitPGD: a TIP.PGD at kern.pos, with instructions at kern.b.
	exitPGD
	// exitTlet: the tracelet from kern.b of the TNT.8 packets at
	// kern.pos is not among the recent ones; nothing of it is done.
	exitTlet
	// exitWnd: the packet window from kern.b at kern.pos is not among
	// the recent ones; nothing of it is done.
	exitWnd
)

// fast runs the flow from the trace bytes until it meets what it leaves to
// the slow path; it returns an error only where the slow path would have
// (none it finds itself). The common steps are the kernel's; fastLoop
// handles what the kernel exits for (a miss, a full batch, TIP.PGD and
// TIP.PGE, tracing off) and goes back in, and fast, between fastLoop's
// runs, takes PSB+ groups, a MODE.Exec before a TIP.PGE and the timing
// packets a clock sees.
func (d *Decoder) fast() error {
	buf, pos, last, ok := d.rawCursor()
	if !ok || pos == d.fp.noPos && d.ip == d.fp.noIP {
		return nil
	}
	if d.hasBack && (d.back.Suppressed() || d.back.IP != last) {
		// A suppressed TIP waits for the slow path (and the kernel
		// takes a TIP read ahead for the last IP).
		d.fp.noPos, d.fp.noIP = pos, d.ip
		return nil
	}
	d.runCaches()
	d.cache.pinned = true
	if d.fp.wndOn = d.fp.bytes >= d.fp.wndAt; d.fp.wndOn {
		d.wndCaches()
	}
	pos0, insns0 := pos, d.c.Insns
	maxInsns := d.opts.MaxInsns
	k := &d.fp.k
	// Clipped to its length: word reads buf[i:i+8], which only the
	// capacity bounds, so that a read past the trace's end (a caller's
	// Decode(b[:n]), a Stream's window) would take the bytes after it as
	// trace; clipped, it is out of range.
	buf = buf[:len(buf):len(buf)]
	*k = kern{buf: buf, pos: pos, last: last, tnt: d.tnt, nb: uint(d.tntN), ip: d.ip, budget: maxInsns - d.steps}
	d.fp.pd.Reset(buf) // fastTime's (fastPSB and fastExecOff reset it too)
	if d.hasBack {
		k.tip = tipBack
		d.hasBack = false
	}
	drops := d.cache.drops
	for {
		d.fastLoop()
		d.flush()
		// A PSB+ group, or tracing's MODE.Exec before a TIP.PGE, is
		// taken here (fastpsb.go) and the loop goes on: no hand-over
		// to the slow path and back for each. Not after a Handler
		// dropped the block cache (MemoryChanged) while it read a
		// batch: the slow path's walk looks the block up again.
		if k.nb != 0 || k.tip != tipNone || len(d.q) > 0 || d.cache.drops != drops {
			break
		}
		// Timing packets a clock sees, with nothing pending (bits
		// or a TIP pending: the kernel stopped in a step, the slow
		// path's, before them), are taken here too, after the
		// branches before them went (flush); the flow goes on from
		// the same block (here, not in fastLoop: its code is as
		// without a clock).
		if d.clock != nil && d.fastTime(k) {
			continue
		}
		if !d.fastPSB(k) && !d.fastExecOff(k) {
			break
		}
		k.ip, k.b, k.missP, k.budget = d.ip, nil, nil, maxInsns-d.steps
	}
	// Nothing kept past the call: the runs' slabs may be dropped.
	k.buf, k.b, k.missP = nil, nil, nil
	d.cache.pinned = false
	d.cache.unpin()
	pos = k.pos
	if pos == pos0 && d.c.Insns == insns0 {
		// Nothing done: the state is as it was.
		d.hasBack = k.tip == tipBack
		d.fp.noPos, d.fp.noIP = pos, d.ip
		return nil
	}
	d.ip, d.steps = k.ip, maxInsns-k.budget
	d.tnt, d.tntN = k.tnt, uint8(k.nb)
	d.fp.bytes += uint64(pos - pos0)
	// The packets decoded ahead are the fast path's now; few are
	// decoded ahead again, so that it can take over again soon.
	d.pb.i, d.pb.n, d.pb.err, d.pb.size = 0, 0, nil, 1
	d.pd.SetRaw(pos, k.last)
	switch k.tip {
	case tipBack:
		d.hasBack = true
	case tipRaw:
		// Read ahead, as the slow path would have it.
		return d.peek()
	}
	return nil
}

// fastLoop runs the kernel and what it exits for, until a packet or a
// state of the slow path's (fast's own state is in d.fp.k: few values are
// live across its calls).
func (d *Decoder) fastLoop() {
	k := &d.fp.k
	// Tracing is off: only a TIP.PGE is the fast path's. It turns on
	// only there (fastSeg) and off only at a TIP.PGD (fastSeg).
	if !d.enabled && !d.fastSeg(k, false) {
		return
	}
	for {
		if k.b == nil {
			// The block the flow goes to. Nothing is gathered
			// here (a miss, an event or the start handed it
			// over): looking it up may read memory, which a
			// Memory may apply side band at (perfflow). No old
			// block is held either (k.missP keeps its own).
			if len(d.cache.old) > 0 && d.fp.n == 0 {
				d.cache.unpin()
			}
			if k.missP != nil {
				k.b = d.fixedSucc(k.missP, k.ip)
				k.missP = nil
			} else {
				k.b = d.ipBlock(k.ip)
			}
		}
		switch d.kernel() {
		case exitFlush, exitMiss:
			// After a miss the branches before it go first.
			d.flush()
		case exitRun:
			// Working the run out reads memory: the branches
			// before it go first.
			d.flush()
			d.tntRun(k.b, k.pat, k.bits)
		case exitTlet:
			// As a run's.
			d.flush()
			d.tletFill(k.b, k.buf, k.pos)
		case exitWnd:
			// As a run's.
			d.flush()
			d.wndFill(k.b, k.buf, k.pos, k.last)
		case exitPGD:
			// A TIP.PGD and the TIP.PGE after it (kAFL's IP filter: a
			// call out of the traced range and its return, with
			// PADs between) are one step here, the kernel's state
			// left in k between them.
			if !d.fastSeg(k, true) {
				return
			}
		case exitStop:
			return
		}
	}
}

// fastSeg takes a TIP.PGD and the TIP.PGE after it as one step (kAFL's IP
// filter: a call out of the traced range and its return, with PADs
// between), one call with the kernel's state in k; at the fast path's
// start with tracing off (pgd false), the TIP.PGE alone. It tells whether
// both were taken; the flow goes on at the TIP.PGE's IP's block.
//
// The TIP.PGD at k.pos, with instructions at k.b, is taken as walk and
// exec do with its event queued: the walk from k.b that fired before from
// the same block to the same IP replayed (pgdWalk), else walked
// (fastDisable); if that leaves it queued, the walk is left, at a
// block's start, to the slow path. The TIP.PGE comes after PADs (and
// timing packets no clock sees), and the PADs after it are taken too
// (kAFL's traces have them after every TIP.PGE: a dispatch of the
// kernel's less); the bytes up to the TIP.PGE that came after the same
// walk last time are taken again by two compares (pgdWalk.pgeAt), and
// new ones kept (keepPGE).
func (d *Decoder) fastSeg(k *kern, pgd bool) bool {
	var w *pgdWalk
	if pgd {
		// The kernel stopped at it within its 16-byte window: one
		// bounds test for the packet's bytes.
		pos := k.pos
		p := k.buf[pos : pos+16 : pos+16]
		c := p[0]
		n := decode.IPSize(c)
		ip := decode.ApplyIP(c, binary.LittleEndian.Uint64(p[1:9]), k.last)
		k.last, k.pos = ip, pos+1+n
		hasIP := n > 0
		if !hasIP {
			ip = 0
		}
		b := k.b
		w = &d.cache.runs.pgds[pgdHash(b, ip)] // made by runCaches before the kernel ran
		// The walk's MaxInsns check at its last block is the one that
		// binds: the counts only grow along it.
		if w.b != b || w.ip != ip || w.hasIP != hasIP || int(w.steps) > k.budget {
			d.ip, d.steps = k.ip, d.opts.MaxInsns-k.budget
			if !d.fastDisable(b, w, ip, hasIP) {
				// Queued as read queues it; the walk goes on at a
				// block's start.
				k.ip, k.b, k.budget = d.ip, nil, d.opts.MaxInsns-d.steps
				d.q = append(d.q, queued{ev: d.qEv, bind: bindBranch})
				return false
			}
		} else {
			// The kept walk, replayed: its branches, after those
			// gathered before, handed over (the batch has room: the
			// kernel exits for a full one before it reads a packet;
			// the walk reads no memory), its returns pushed and its
			// counts added, then the event, made and fired: fireEv's
			// and emit's work for an EvDisabled with tracing on, less
			// what fastOK rules out (unnamed PTWRITEs; ticks, the
			// only reader of lastTSC).
			f := &d.fp
			if w.n > 0 {
				f.batch[f.n&(edgeBatch-1)] = refOf(w.edges[:w.n])
				f.n++
			}
			d.pushRets(w.rets[:w.nrets])
			d.c.Insns += uint64(w.steps)
			if !hasIP {
				// An event with an IP resets it, and any event
				// the steps (fireEv).
				d.sinceRef += w.steps
			}
			d.errIP, d.ip = w.errIP, w.next
			if n := f.n; n > 0 && d.eh != nil {
				f.n = 0
				d.eh.Edges(f.slices()[:n])
			} else {
				d.flush()
			}
			// d.ip is the fall-through of the branch that disabled.
			e := d.newEv(EvDisabled, ip, hasIP)
			d.steps, d.enabled, d.resumeIP, d.resumeOK = 0, false, d.ip, true
			if hasIP {
				d.sinceRef, d.resumeIP = 0, ip
			}
			d.c.Events++
			d.h.Event(e)
		}
	}
	buf, end := k.buf, len(k.buf)-16
	ip, pos, ok := w.pgeAt(buf, k.pos)
	if !ok {
		// kAFL's traces have 9 PADs before a TIP.PGE: skipped a word
		// at a time first, without skipPad's dispatch per packet.
		pos = k.pos
		for pos <= end {
			if x := word(buf, pos); x != 0 {
				pos += bits.TrailingZeros64(x) / 8
				break
			}
			pos += 8
		}
		// With an IP (the table's opPGE): a suppressed or a reserved
		// one is the slow path's.
		ops := d.offOps()
		pads := pos <= end && ops[buf[pos]] == opPGE
		if !pads {
			if pos = skipPad(buf, pos, end, ops); pos > end || ops[buf[pos]] != opPGE {
				// As the fast path's start or the TIP.PGD left it.
				k.pos, k.ip, k.b, k.budget = pos, d.ip, nil, d.opts.MaxInsns-d.steps
				return false
			}
		}
		c := buf[pos]
		ip = decode.ApplyIP(c, word(buf, pos+1), k.last)
		pos += 1 + decode.IPSize(c)
		if pads && w != nil {
			w.keepPGE(buf, k.pos, pos, ip)
		}
	}
	if pos <= len(buf)-8 {
		pos = padRun(buf, pos)
	}
	k.pos, k.last = pos, ip
	// As read queues it and deliver fires it (the batch is empty: a
	// TIP.PGD's event or the fast path's start handed it over), made
	// and fired here: fireEv's and emit's work for an EvEnabled, less
	// what fastOK rules out (stubs, a MODE.Exec stashed, unnamed
	// PTWRITEs; ticks, the only reader of lastTSC).
	e := d.newEv(EvEnabled, ip, true)
	if d.resumeOK && d.resumeIP == ip {
		e.Flags = Resumed
	}
	d.steps, d.sinceRef, d.enabled, d.ip, d.resumeOK = 0, 0, true, ip, false
	d.c.Events++
	d.h.Event(e)
	// Its block, as after any IP, from the recent IP blocks here; a miss
	// is fastLoop's (ipBlock). No old block is held: the batch is empty.
	if len(d.cache.old) > 0 {
		d.cache.unpin()
	}
	k.ip, k.b, k.missP, k.budget = ip, d.ipHit(ip), nil, d.opts.MaxInsns
	return true
}

// runCaches makes the recent runs and IP blocks, which the kernel reads
// without a test.
func (d *Decoder) runCaches() {
	c := &d.cache.runs
	if c.recent == nil {
		c.recent = new([recentRuns]runRef)
	}
	if c.tips == nil {
		c.tips = new([recentTips]*block)
	}
	if c.pgds == nil {
		c.pgds = new([recentPGDs]pgdWalk)
	}
	if c.tlets == nil {
		c.tlets = new([recentTlets]tlet)
		c.tletSeen = new([recentTlets / 2]uint64)
		c.tletRoom = new([recentTlets][]Edge)
	}
}

// wndCaches makes the packet windows' tables (or takes the zero ones a
// closed decoder handed on), which the kernel reads without a test once it
// looks windows up (wndOn): a decoder that never does (one that takes less
// than wndWarm) neither makes nor clears them.
func (d *Decoder) wndCaches() {
	c := &d.cache.runs
	if c.wnds == nil {
		c.wndKeys = new([recentWnds / 2]wndKeys)
		c.wnds = new([recentWnds]wnd)
		c.wndSeen = new([recentWnds / 2]uint64)
		c.wndRoom = new([recentWnds][]Edge)
	}
	c.wndUsed = true
}

// kernel is the fast loop's common steps: PADs (and timing packets no
// clock sees), TNT.8, TNT.64 and TIP packets, and the steps from block to
// block they drive, as chain, walk and run do with them, in their order:
// a TNT taken as soon as it is next, a TIP read ahead when nothing is
// pending and taken by the branch that needs it, a run per block and
// pending bits (tntrun.go), the block at a direct branch's target from
// its successor pointer, at a return's or an IP packet's from the recent
// IP blocks. It calls nothing (a call would have the compiler spill and
// reload the loop's state around it): it gathers branches by a store
// each (fastState), pushes and pops the return stack in place, and
// exits, with a reason, for whatever needs more: a lookup that misses, a
// full batch, a packet or a state of the slow path's.
func (d *Decoder) kernel() (why int) {
	// Only what every step needs is held in locals (the last IP only
	// where a TIP is taken, the TIP read ahead in tnt while no bits
	// are pending); the rest is read from d where it is used, so that
	// the loop's values fit in the registers.
	k := &d.fp.k
	// Its capacity its length: a slice of buf needs no other register.
	buf, pos := k.buf[:len(k.buf):len(k.buf)], k.pos
	// The pending bits are held from the top of tnt down, the oldest in
	// bit 63: a bit or a run's pattern is a shift by a constant, taking
	// bits a shift, with no mask (the bits past the last are zero, and
	// tnt is tipNone once they are all taken).
	tnt, nb, b, budget := k.tnt<<((64-k.nb)&63), k.nb, k.b, k.budget
	if nb == 0 {
		tnt = uint64(k.tip)
	}
	f := &d.fp
	nf := f.n
	for {
		if nb == 0 && tnt == tipNone {
			// Nothing pending: the next packet, as chain's and run's
			// read-ahead takes it; what to do with it from its first
			// byte, one load (onOps). Tested once: a packet that
			// leaves nothing pending (a PAD, a timing packet) goes on
			// to the next without the test, one that does leaves.
		read:
			for {
				if pos > len(buf)-16 {
					// Packets are read from 16-byte windows, as the
					// packet decoder's fast loop reads them; the last
					// ones are the slow path's.
					goto out
				}
				c := buf[pos]
				op := onOps[c]
				// A TNT.8 or a TIP: first the packet window at pos
				// (window.go), with a budget that passes its
				// MaxInsns checks unread (as a tracelet's): its
				// packets taken by one lookup.
				if f.wndOn && (op == opTNT8 || op == opTIP) && budget >= tletBudget {
					w0, w1 := word(buf, pos), word(buf, pos+8)
					h := wndHash(b, w0, w1)
					set := wndSet(h)
					// The last IP's bits its first TIP keeps are
					// part of the key: two ways can hold a window
					// for two of them.
					ks, way := &d.cache.runs.wndKeys[set], uint64(0)
					if kk := &ks[0]; kk.b != b || kk.w0 != w0 || kk.w1 != w1 || !lastMatch(kk.last, k.last) {
						way = 1
						if kk := &ks[1]; kk.b != b || kk.w0 != w0 || kk.w1 != w1 || !lastMatch(kk.last, k.last) {
							// Made the second time in a row its
							// set misses it (as a tracelet).
							if s := &d.cache.runs.wndSeen[set]; *s != h {
								*s = h
							} else {
								why = exitWnd
								goto out
							}
							way = 2
						}
					}
					if t := &d.cache.runs.wnds[(2*set+way)&(recentWnds-1)]; way < 2 && t.m > 0 {
						// Its edges as one entry (the batch has room
						// for one), its pushes, its counts; it ends
						// after a TNT bit or a TIP taken: the budget
						// is whole.
						if t.ne > 0 {
							f.batch[nf&(edgeBatch-1)] = t.edges()
							nf++
						}
						if t.nrets > 0 {
							d.pushRets(t.rets[:t.nrets])
						}
						// The flags as masks: no branch.
						d.sinceRef = d.sinceRef&(uint32(t.flags&wndBit)-1) + t.sinceRef
						budget = d.opts.MaxInsns
						d.c.Insns += uint64(t.insns)
						d.errIP = t.errIP
						k.last = k.last&(uint64(t.flags>>1&1)-1) | t.lastOut
						b = t.end
						pos += int(t.m)
						if nf == edgeBatch {
							why = exitFlush
							goto out
						}
						continue
					}
				}
				// The commonest two, TNT.8 and TIP, are tested first: a
				// conditional branch follows the flow's history (which
				// block comes before, which packet after), where a jump
				// table's single indirect branch mispredicts more. Either
				// leaves the loop: the step is next.
				if op == opTNT8 {
					// TNT.8 packets standing together, with a budget that
					// passes their runs' checks unread: their tracelet
					// (tntrun.go); else, or when it takes no byte, byte
					// by byte.
					if onOps[buf[pos+1]] == opTNT8 && budget >= tletBudget {
						w := word(buf, pos)
						m := tnt8Count(w)
						key := w & (^uint64(0) >> ((64 - 8*m) & 63))
						h := tletHash(b, key)
						set := tletSet(h)
						t := &d.cache.runs.tlets[2*set]
						if t.b != b || t.key != key {
							t = &d.cache.runs.tlets[2*set+1]
						}
						if t.b != b || t.key != key {
							// Made the second time in a row its
							// set misses it; the first, byte by
							// byte.
							if s := &d.cache.runs.tletSeen[set]; *s != h {
								*s = h
							} else {
								why = exitTlet
								goto out
							}
						} else if tm := int(t.m); tm > 0 {
							// Its runs' edges as one entry (the batch
							// has room for one: the kernel exits for a
							// full one before it reads a packet).
							if t.ne > 0 {
								f.batch[nf&(edgeBatch-1)] = t.edges()
								nf++
							}
							if t.nrets > 0 {
								d.pushRets(t.rets[:t.nrets])
							}
							// Its last run ends at its last bit (a run
							// taking its bits whole walks no step
							// after them): the budget is whole.
							d.sinceRef, budget = 0, d.opts.MaxInsns
							d.c.Insns += uint64(t.insns)
							d.errIP = t.errIP
							b = t.end
							pos += tm
							if nf == edgeBatch {
								why = exitFlush
								goto out
							}
							continue
						}
					}
					nb, tnt = uint(tnt8Lens[c]), tnt8Words[c]
					pos++
					break
				}
				if op == opTIP {
					// With an IP: a suppressed or reserved one is
					// opOther, the slow path's.
					tnt = tipRaw
					break
				}
				switch op {
				case opPad:
					pos = padRun(buf, pos)
					continue
				case opMTC:
					if d.clock == nil {
						pos += 2
						continue
					}
				case opTSC:
					if d.clock == nil {
						pos += 8
						continue
					}
				case opCYC:
					if d.clock == nil {
						pos++
						continue
					}
				case opExt:
					if buf[pos+1] != 0xa3 {
						break
					}
					v := word(buf, pos+2) & (1<<48 - 1)
					if v <= 1 {
						break // no stop bit, or no bits: the slow path's
					}
					nb = uint(bits.Len64(v) - 1)
					tnt = v << ((64 - nb) & 63)
					pos += 8
					break read
				case opPGD:
					// run decodes the instruction at the IP before it
					// reads an event packet: code that is not there is
					// the error. (A reserved IP compression is
					// opOther, the slow path's.)
					if b.count() > 0 {
						// out's stores without its tests: nothing is
						// pending at a packet's read, and b is known
						// (14,148 exits a mruby pass).
						k.pos, k.tnt, k.nb, k.tip, k.b, k.ip, k.budget = pos, 0, 0, tipNone, b, b.ip, budget
						f.n = nf
						return exitPGD
					}
				}
				goto out
			}
		}
		{
			// The last instruction's class, from the block's header: a
			// run leads to the next without a look at the block's
			// instructions.
			class := b.class
			if c := class; nb > 0 && (c == x86insn.CondJump || c == x86insn.Jump || c == x86insn.Call) {
				// The next bits' run, worked out once (tntrun.go).
				kb := min(nb, runBits)
				pat := uint8(1<<kb | tnt>>((64-kb)&63))
				r := b.runs
				if r == nil || r.pat != pat {
					ref := &d.cache.runs.recent[runHash(b, pat)]
					r = ref.r
					if ref.b != b || r.pat != pat {
						// The bits from the pattern's stop bit: kb is
						// not kept live to here.
						k.pat, k.bits, why = pat, uint(bits.Len8(pat)-1), exitRun
						goto out
					}
				}
				// A budget of a run's largest count or more (the
				// counts are 16 bits) passes both checks unread:
				// MaxInsns is at least the budget.
				if budget >= 1<<16-1 || int(r.pre) <= budget && int(r.post) <= d.opts.MaxInsns {
					// The run's edges as they are, after the
					// branches before them.
					if e := r.edges; len(e) > 0 {
						f.batch[nf&(edgeBatch-1)] = refOf(e)
						nf++
					}
					if r.nrets > 0 {
						for _, ret := range r.rets() {
							d.pushRet(ret.From)
						}
					}
					nb -= uint(r.used)
					tnt <<= r.used & 63
					budget -= int(r.steps)
					if r.bit {
						d.sinceRef, budget = 0, d.opts.MaxInsns-int(r.steps)
					}
					d.c.Insns += uint64(r.insns)
					d.errIP = r.errIP
					b = r.end
					if nf == edgeBatch {
						why = exitFlush
						goto out
					}
					continue
				}
			}
			// One step, the walk's MaxInsns check before it (a run's
			// pre covers its first block).
			n := b.count() - 1
			if n < 0 || n+1 > budget {
				goto out
			}
			// The branch's address and the next instruction's, from
			// the header too: a return or an indirect branch needs no
			// more. to is where the flow goes, s its block: from the
			// successor *p of a direct branch, else from the recent IP
			// blocks (p nil).
			from := b.ip + uint64(b.lastOff)
			next := from + uint64(b.lastLen)
			var to uint64
			var p **block
			switch class {
			case x86insn.CondJump:
				if nb == 0 {
					goto out
				}
				nb--
				taken := tnt>>63 == 1
				tnt <<= 1
				d.sinceRef, budget = 0, d.opts.MaxInsns
				to, p = next, &b.fall
				if taken {
					to, p = b.target, &b.taken
					i := nf & (edgeBatch - 1) // nf < edgeBatch: masked, Go tests no bounds
					f.edges[i] = Edge{from, to, BrCond}
					f.batch[i] = refOf(f.edges[i : i+1])
					nf++
				}
			case x86insn.Jump, x86insn.Call:
				if nb == 0 {
					// The TIP read ahead is not for this branch:
					// walk executes it, counting it for a TRIG.
					d.sinceRef++
				}
				budget -= n + 1
				to, p = b.target, &b.taken
				kind := BrJump
				if class == x86insn.Call {
					kind = BrCall
					d.pushCall(to, next)
				}
				i := nf & (edgeBatch - 1)
				f.edges[i] = Edge{from, to, kind}
				f.batch[i] = refOf(f.edges[i : i+1])
				nf++
			case x86insn.Ret:
				if nb > 0 {
					// A compressed return; anything else is exec's
					// to report.
					if tnt>>63 == 0 || d.sp == 0 {
						goto out
					}
					nb--
					tnt <<= 1
					d.sinceRef, budget = 0, d.opts.MaxInsns
					to = d.popRet()
				} else {
					// The TIP read ahead (nb == 0: one is
					// pending).
					if tnt == tipRaw {
						c := buf[pos]
						k.last = decode.ApplyIP(c, word(buf, pos+1), k.last)
						pos += 1 + decode.IPSize(c)
					}
					tnt, budget, to = tipNone, d.opts.MaxInsns, k.last
				}
				i := nf & (edgeBatch - 1)
				f.edges[i] = Edge{from, to, BrReturn}
				f.batch[i] = refOf(f.edges[i : i+1])
				nf++
			case x86insn.IndirectJump, x86insn.IndirectCall:
				if nb > 0 {
					goto out
				}
				if tnt == tipRaw {
					c := buf[pos]
					k.last = decode.ApplyIP(c, word(buf, pos+1), k.last)
					pos += 1 + decode.IPSize(c)
				}
				tnt, budget, to = tipNone, d.opts.MaxInsns, k.last
				kind := BrIndirectJump
				if class == x86insn.IndirectCall {
					kind = BrIndirectCall
					d.pushRet(next)
				}
				i := nf & (edgeBatch - 1)
				f.edges[i] = Edge{from, to, kind}
				f.batch[i] = refOf(f.edges[i : i+1])
				nf++
			default:
				goto out
			}
			d.c.Insns += uint64(n + 1)
			d.errIP = from
			var s *block
			if p != nil {
				s = *p
			} else if s = d.cache.runs.tips[ipHash(to)]; s != nil && (s.ip != to || s.mode != d.mode) {
				s = nil
			}
			if s == nil {
				// Not known yet: fast looks it up.
				k.ip, k.missP, b, why = to, p, nil, exitMiss
				goto out
			}
			b = s
			if nf == edgeBatch {
				why = exitFlush
				goto out
			}
		}
	}
out:
	k.pos, k.tnt, k.nb, k.tip, k.b, k.budget = pos, tnt>>((64-nb)&63), nb, tipNone, b, budget
	if nb == 0 {
		k.tnt, k.tip = 0, uint8(tnt)
	}
	if b != nil {
		k.ip = b.ip
	}
	f.n = nf
	return why
}

// fixedSucc is the block at ip, the fixed target of a branch whose
// successor *p keeps it (a block of the same mode: the mode changes only
// through an event, never on the fast path).
func (d *Decoder) fixedSucc(p **block, ip uint64) *block {
	if s := *p; s != nil {
		return s
	}
	s := d.block(ip, d.mode)
	*p = s
	return s
}

// lastSucc is chain's block at ip, the varying target of the return or
// indirect branch ending b, whose successors keep the last two targets'
// blocks: taken the last, fall (which such a branch has no use for) the
// one before. The fast path goes to ipBlock at once: which of the three
// finds a target is not predictable, a hit in ipBlock is.
func (d *Decoder) lastSucc(b *block, ip uint64) *block {
	if s := b.taken; s != nil && s.ip == ip {
		return s
	}
	s := b.fall
	if s == nil || s.ip != ip {
		s = d.ipBlock(ip)
	}
	b.taken, b.fall = s, b.taken
	return s
}

// ipBlock is the block at ip where the flow came by an IP packet or a
// return: a TIP's target (a return to one of a function's many callers or
// an interpreter's dispatch misses the two targets a block keeps), a
// TIP.PGE's, a compressed return's.
// A small direct-mapped cache of the recent ones costs a load where the
// block cache's table costs a probe of a large table.
func (d *Decoder) ipBlock(ip uint64) *block {
	if s := d.ipHit(ip); s != nil {
		return s
	}
	return d.ipMiss(ip)
}

// ipHit is the block at ip among the recent ones, or nil.
func (d *Decoder) ipHit(ip uint64) *block {
	if t := d.cache.runs.tips; t != nil {
		if s := t[ipHash(ip)]; s != nil && s.ip == ip && s.mode == d.mode {
			return s
		}
	}
	return nil
}

// ipHash is the index in runCache.tips of the block at ip.
func ipHash(ip uint64) uint64 { return ip * 0x9e3779b97f4a7c15 >> 52 & (recentTips - 1) }

// ipMiss is ipBlock's miss (not inlined): the block from the block cache,
// kept in the recent ones.
func (d *Decoder) ipMiss(ip uint64) *block {
	s := d.block(ip, d.mode)
	c := &d.cache.runs
	if c.tips == nil {
		c.tips = new([recentTips]*block)
	}
	c.tips[ipHash(ip)] = s
	return s
}

// fastDisable walks from block b with a TIP.PGD's event (EvDisabled at
// ip, hasIP) waiting for the branch it binds to, as walk and exec do with
// it queued: direct branches are taken until one to its IP, or a branch
// that needs trace, which it binds to. It tells whether it fired; else the
// walk is left, at a block's start, to the slow path, with the event in
// d.qEv. A walk that fired is kept in w, pgds' slot for b and ip, and
// replayed (fastSeg) the next time the same block meets a TIP.PGD with the
// same IP.
func (d *Decoder) fastDisable(b *block, w *pgdWalk, ip uint64, hasIP bool) bool {
	ev := d.newEv(EvDisabled, ip, hasIP)
	// Walked block by block: a successor not known yet reads memory, so
	// the branches before go first. Drops are counted from before them:
	// a Handler that drops the cache as it reads them leaves b a dropped
	// block, which no walk is kept from (dropWalks cleared the cache
	// before w is written).
	drops := d.cache.drops
	d.flush()
	*w = pgdWalk{b: b, ip: ev.IP, hasIP: ev.HasIP}
	keep := true
	for {
		// The block's header tells all but a direct branch's target,
		// which it holds too.
		n, class := b.count()-1, b.class
		if n < 0 || d.steps+n+1 > d.opts.MaxInsns {
			w.b = nil
			return false
		}
		switch class {
		case x86insn.CondJump, x86insn.Ret, x86insn.IndirectJump, x86insn.IndirectCall, x86insn.FarTransfer,
			x86insn.Jump, x86insn.Call:
		default:
			w.b = nil
			return false
		}
		from := b.ip + uint64(b.lastOff)
		next := from + uint64(b.lastLen)
		d.c.Insns += uint64(n + 1)
		d.sinceRef += uint32(n + 1)
		d.steps += n + 1
		d.errIP = from
		d.ip = next
		w.steps += uint32(n + 1)
		w.errIP = from
		switch class {
		case x86insn.Jump, x86insn.Call:
			target := b.target
			if ev.HasIP && ev.IP == target {
				break // disabledDirect
			}
			kind := BrJump
			if class == x86insn.Call {
				kind = BrCall
				if d.pushCall(target, next) {
					keep = keep && w.push(next)
				}
			}
			d.branch(from, target, kind)
			keep = keep && w.edge(from, target, kind)
			d.ip = target
			b = d.fixedSucc(&b.taken, target)
			continue
		case x86insn.IndirectCall:
			d.pushRet(next)
			keep = keep && w.push(next)
		}
		// disabledAt
		w.next = d.ip
		if !keep || d.cache.drops != drops {
			// Too long to keep, or blocks it went through are
			// gone.
			w.b = nil
		}
		d.fireEv()
		return true
	}
}

// pgdWalk is a TIP.PGD's walk from block b that fired (fastDisable): the
// same block and TIP.PGD IP walk the same way every time (direct
// branches, then the branch the event binds to), which kAFL's traces
// do thousands of times a pass (a call into a library outside the
// traced range: a TIP.PGD, a TIP.PGE at the return). Kept in a
// direct-mapped cache dropped with the block cache, replayed as its
// edges in the batch, its pushes and its counts.
type pgdWalk struct {
	b     *block
	ip    uint64 // the TIP.PGD's IP (0 without one)
	errIP uint64 // the last branch walked
	next  uint64 // the flow's IP after it: the disabling branch's fall-through
	steps uint32 // instructions walked
	n     uint8  // edges
	nrets uint8
	hasIP bool
	// pgeLen is the length of the TIP.PGE kept after the walk's
	// TIP.PGD (keepPGE), PADs before it included; 0 if none.
	pgeLen uint8
	edges  [pgdEdges]Edge
	// rets are the return addresses the walk pushes, in order.
	rets [pgdEdges + 1]uint64
	// The kept TIP.PGE: its bytes from the TIP.PGD's end (the second
	// word's past pgeLen masked off by pgeMask) and its IP.
	pge     [2]uint64
	pgeMask uint64
	pgeIP   uint64
}

// pgeAt returns the IP and the end of the TIP.PGE at pos (after PADs) when
// the bytes there are those kept (keepPGE); ok false otherwise (w nil too).
func (w *pgdWalk) pgeAt(buf []byte, pos int) (ip uint64, end int, ok bool) {
	if w == nil || w.pgeLen == 0 || pos > len(buf)-16 {
		return 0, 0, false
	}
	s := buf[pos : pos+16 : pos+16]
	if binary.LittleEndian.Uint64(s) != w.pge[0] || binary.LittleEndian.Uint64(s[8:])&w.pgeMask != w.pge[1] {
		return 0, 0, false
	}
	return w.pgeIP, pos + int(w.pgeLen), true
}

// keepPGE keeps the TIP.PGE from pos to end, PADs and the packet, whose IP
// is ip. Its IP is a function of these bytes and the last IP before them
// (its compression), which is the walk's TIP.PGD's IP: kept only after a
// TIP.PGD with an IP, and only when the bytes are 8 to 16, within the
// trace's last 16.
func (w *pgdWalk) keepPGE(buf []byte, pos, end int, ip uint64) {
	n := end - pos
	if !w.hasIP || n < 8 || n > 16 || pos > len(buf)-16 {
		return
	}
	mask := ^uint64(0) >> ((16 - n) * 8) // n == 8: none of the second word
	w.pge = [2]uint64{word(buf, pos), word(buf, pos+8) & mask}
	w.pgeMask, w.pgeIP, w.pgeLen = mask, ip, uint8(n)
}

// pgdEdges is the most edges a kept walk has (a walk takes 1.1 on
// average on mruby's trace: a call to a PLT entry).
const pgdEdges = 3

// recentPGDs is the size of runCache.pgds (176 bytes an entry).
const recentPGDs = 1 << 9

// pgdHash is the index in runCache.pgds of the walk from b to a TIP.PGD's
// IP.
func pgdHash(b *block, ip uint64) uint64 {
	return (b.ip ^ ip<<7) * 0x9e3779b97f4a7c15 >> 55 & (recentPGDs - 1)
}

// dropWalks forgets the kept walks with the blocks they start from. Their
// edges stay as they are: a batch being handed over may hold them, and a
// Handler may drop the cache (MemoryChanged) while it reads the batch.
func (c *runCache) dropWalks() {
	if c.pgds != nil {
		for i := range c.pgds {
			c.pgds[i].b = nil
		}
	}
}

// edge adds a branch to the walk kept; false when it has no room.
func (w *pgdWalk) edge(from, to uint64, k BranchKind) bool {
	if int(w.n) == len(w.edges) {
		return false
	}
	w.edges[w.n] = Edge{from, to, k}
	w.n++
	return true
}

// push adds a return address the walk pushes; false when it has no room.
func (w *pgdWalk) push(ret uint64) bool {
	if int(w.nrets) == len(w.rets) {
		return false
	}
	w.rets[w.nrets] = ret
	w.nrets++
	return true
}

// Packet actions by first byte (opsTable): the fast loop's dispatch.
const (
	opOther uint8 = iota // the slow path's
	opPad
	opMTC // MTC, TSC and a one-byte CYC: skipped when no clock sees them
	opTSC
	opCYC
	opCYCX // a CYC of more bytes: the slow path's when no clock sees it
	// (opMTC to opCYCX are the timing packets' actions: fastTime tests
	// the range.)
	opTNT8
	opExt // a TNT.64 if the second byte says so, else the slow path's
	opTIP
	opPGD
	opPGE
)

// opsTable maps a packet's first byte to its action. With timing, MTC,
// TSC and a CYC have their own actions (skipped when no clock sees them,
// but a CYC of more bytes; taken by fastTime when one does), else they
// are the slow path's; off, only a TIP.PGE is the fast path's, on, a
// TIP.PGE is not. The IP's compression is in the byte too: a TIP or TIP.PGE without an IP (suppressed) and an IP packet
// of a reserved compression are the slow path's (a TIP.PGD without an
// IP is the fast path's), so that taking one tests nothing more.
func opsTable(timing, on bool) (t [256]uint8) {
	for i := range 256 {
		c, op := uint8(i), opOther
		switch {
		case c == 0:
			op = opPad
		case timing && c == 0x59:
			op = opMTC
		case timing && c == 0x19:
			op = opTSC
		case timing && c&7 == 3:
			op = opCYC
		case timing && c&7 == 7:
			op = opCYCX
		case !on:
			if c&0x1f == 0x11 && decode.IPSize(c) > 0 {
				op = opPGE
			}
		case c&1 == 0 && c != 2:
			op = opTNT8
		case c == 2:
			op = opExt
		case c&0x1f == 0x0d && decode.IPSize(c) > 0:
			op = opTIP
		case c&0x1f == 0x01 && decode.IPSize(c) >= 0:
			op = opPGD
		}
		t[i] = op
	}
	return t
}

// tnt8Words and tnt8Lens are a TNT.8's pending bits by its byte, as the
// kernel holds them (from the word's top down, the stop bit shifted out),
// and their count: two loads where a bit scan and shifts were.
var tnt8Words, tnt8Lens = tnt8Tables()

func tnt8Tables() (words [256]uint64, lens [256]uint8) {
	for i := range 256 {
		c := uint8(i)
		if c&1 != 0 || c < 4 {
			continue // not a TNT.8, or one without bits
		}
		p := c >> 1
		nb := bits.Len8(p) - 1
		words[i], lens[i] = uint64(p)<<(64-nb), uint8(nb)
	}
	return words, lens
}

// onOps is the kernel's table (tracing on): it tests the clock itself
// before it skips a timing packet.
var onOps = opsTable(true, true)

// offTables are fastLoop's tables while tracing is off, by whether timing
// packets are skipped (no clock sees them).
var offTables = [2][256]uint8{opsTable(false, false), opsTable(true, false)}

// offOps returns the fast loop's table of packet actions while tracing is
// off.
func (d *Decoder) offOps() *[256]uint8 {
	if d.clock == nil {
		return &offTables[1]
	}
	return &offTables[0]
}

// skipPad returns the position of the first packet at or after pos that is
// not a PAD (nor, with ops for no clock, a TSC, MTC or one-byte CYC, which
// the slow path skips when no clock sees them); beyond end when none is up
// to end.
func skipPad(buf []byte, pos, end int, ops *[256]uint8) int {
	for pos <= end {
		switch ops[buf[pos]] {
		case opPad:
			pos = padRun(buf, pos)
		case opMTC:
			pos += 2
		case opTSC:
			pos += 8
		case opCYC:
			pos++
		default:
			return pos
		}
	}
	return pos
}

// word is the 8 bytes of buf at i, little-endian; every caller has them
// within len(buf) (a 16-byte window's). Sliced to 8 bytes: the slice's
// start needs no mask against an empty tail (buf[i:] cost 7 instructions
// more a load).
func word(buf []byte, i int) uint64 { return binary.LittleEndian.Uint64(buf[i : i+8]) }

// padRun returns the position after the PADs at pos, up to 8 of them: runs
// of PADs are skipped a word at a time.
func padRun(buf []byte, pos int) int {
	return pos + min(bits.TrailingZeros64(word(buf, pos))/8, 8)
}
