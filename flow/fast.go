package flow

import (
	"encoding/binary"
	"math/bits"

	"ptfs/decode"
	"ptfs/x86insn"
)

// The fast path: while the decoder's state is simple (a reader of branches,
// tracing plainly on or off, nothing queued, held or stashed, no stubs, no
// ticks), the flow is driven from the trace bytes themselves instead of
// decoded packets: PAD, TNT.8, TNT.64, TIP, TIP.PGD and TIP.PGE (and the
// timing packets without a clock, which the slow path skips too), with
// the packet decoder's last-IP rule (decode.ApplyIP). It does what chain,
// walk and run do for them, in their order, and hands anything else over to
// them in exactly the state they would have reached: pending TNT bits in
// tnt/tntN, a TIP read ahead in back, a TIP.PGD queued, the packet decoder
// at the first packet not taken.

// fastState is the fast path's own state.
type fastState struct {
	// off turns the fast path off: tests hold it to the slow path.
	off bool
	// noPos and noIP are where it last found nothing to do: it does not
	// try again before the flow moved.
	noPos int
	noIP  uint64
	// bytes counts the trace bytes it took: tests check that it takes
	// the bulk of a trace.
	bytes uint64
	// edges are the branches taken one by one and not yet handed to the
	// Handler: a batch for Edges, sent before a run's edges, an event,
	// and when the fast path stops.
	edges [edgeBatch]Edge
}

// edgeBatch is the most branches the fast path hands over at once, but
// for a run's.
const edgeBatch = 64

// sendEdges hands e to the Handler: at once to Edges (its capacity cut to
// its length: a run keeps its return addresses after its edges), else one
// by one.
func (d *Decoder) sendEdges(e []Edge) {
	if d.eh != nil {
		d.eh.Edges(e[:len(e):len(e)])
		return
	}
	for i := range e {
		d.h.Branch(e[i].From, e[i].To, e[i].Kind)
	}
}

// fastTIP is a TIP the fast path read ahead and the flow has not taken yet.
type fastTIP struct {
	ok, supp bool
	// back: it is d.back (the slow path's read-ahead); else it starts at
	// pos, after the last IP last.
	back bool
	ip   uint64
	pos  int
	last uint64
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

// fast runs the flow from the trace bytes until it meets what it leaves to
// the slow path; it returns an error only where the slow path would have
// (none it finds itself).
func (d *Decoder) fast() error {
	buf, pos, last, ok := d.rawCursor()
	if !ok || pos == d.fp.noPos && d.ip == d.fp.noIP {
		return nil
	}
	// Packets are read from 16-byte windows, as the packet decoder's
	// fast loop reads them; the last ones are the slow path's.
	end := len(buf) - 16
	pos0, insns0 := pos, d.c.Insns
	var tip fastTIP
	if d.hasBack {
		tip = fastTIP{ok: true, back: true, ip: d.back.IP, supp: d.back.Suppressed()}
		d.hasBack = false
	}
	tnt, nb := d.tnt, uint(d.tntN)
	steps, ip, errIP := d.steps, d.ip, d.errIP
	maxInsns := d.opts.MaxInsns
	// b is the block at ip, once known.
	var b *block
	// The branches are batched in eb[:ne]; on is d.enabled, kept in a
	// register across the calls, and so is its table of packet actions.
	eb, ne := &d.fp.edges, 0
	on := d.enabled
	ops := d.opsFor(on)
loop:
	for {
		for nb == 0 && !tip.ok {
			// Nothing pending: the next packet, as chain's and run's
			// read-ahead takes it; what to do with it from its first
			// byte, one load (fastOps).
			if pos > end {
				break loop
			}
			c := buf[pos]
			switch ops[c] {
			case opPad:
				pos = padRun(buf, pos)
			case opMTC, opTSC, opCYC:
				pos = skipPad(buf, pos, end, ops)
			case opTNT8:
				p := c >> 1
				nb = uint(bits.Len8(p) - 1)
				tnt = uint64(p) &^ (1 << nb)
				pos++
			case opExt:
				if buf[pos+1] != 0xa3 {
					break loop
				}
				v := binary.LittleEndian.Uint64(buf[pos+2:]) & (1<<48 - 1)
				if v <= 1 {
					break loop // no stop bit, or no bits: the slow path's
				}
				nb = uint(bits.Len64(v) - 1)
				tnt = v &^ (1 << nb)
				pos += 8
			case opTIP:
				n := decode.IPSize(c)
				if n < 0 {
					break loop
				}
				tip = fastTIP{ok: true, supp: n == 0, pos: pos, last: last}
				last = decode.ApplyIP(c, binary.LittleEndian.Uint64(buf[pos+1:]), last)
				tip.ip = last
				pos += 1 + n
			case opPGE:
				// Tracing is off: a TIP.PGE turns it on, as read
				// and fire do.
				n := decode.IPSize(c)
				if n <= 0 {
					break loop // suppressed (ErrNoIP) or reserved
				}
				last = decode.ApplyIP(c, binary.LittleEndian.Uint64(buf[pos+1:]), last)
				pos += 1 + n
				// As read queues it and deliver fires it.
				if ne > 0 {
					d.sendEdges(eb[:ne])
					ne = 0
				}
				d.qEv = Event{Kind: EvEnabled, IP: last, HasIP: true}
				d.stamp(&d.qEv)
				d.fireEv()
				ip, steps, b, on = d.ip, d.steps, nil, d.enabled
				ops = d.opsFor(on)
			case opPGD:
				n := decode.IPSize(c)
				if n < 0 {
					break loop
				}
				// run decodes the instruction at the IP before it
				// reads an event packet: code that is not there is
				// the error.
				if b == nil {
					b, ne = d.tipBlock(ip, ne)
				}
				if b.count() == 0 {
					break loop
				}
				pgd := decode.ApplyIP(c, binary.LittleEndian.Uint64(buf[pos+1:]), last)
				last, pos = pgd, pos+1+n
				if n == 0 {
					pgd = 0
				}
				d.ip, d.steps, d.errIP = ip, steps, errIP
				if ne > 0 {
					d.sendEdges(eb[:ne])
					ne = 0
				}
				ev := Event{Kind: EvDisabled, IP: pgd, HasIP: n > 0}
				d.stamp(&ev)
				fired := d.fastDisable(b, &ev)
				ip, steps, errIP, b, on = d.ip, d.steps, d.errIP, nil, d.enabled
				ops = d.opsFor(on)
				if !fired {
					// Queued as read queues it.
					d.q = append(d.q, queued{ev: ev, bind: bindBranch})
					break loop
				}
			default:
				break loop
			}
		}
		if b == nil {
			b, ne = d.tipBlock(ip, ne)
		}
		// The last instruction's index and class, from the block's
		// header: a run leads to the next without a look at the
		// block's instructions.
		n, class := b.count()-1, b.class
		if n < 0 || steps+n+1 > maxInsns {
			break
		}
		if c := class; nb > 0 && (c == x86insn.CondJump || c == x86insn.Jump || c == x86insn.Call) {
			// The next bits' run, worked out once (tntrun.go).
			k := min(nb, runBits)
			pat := uint8(1<<k | tnt>>(nb-k))
			r := d.cache.runs.find(b, pat)
			if r == nil {
				// Working the run out reads memory: the branches
				// before it go first (succ).
				d.flushEdges(ne)
				ne = 0
				r = d.tntRun(b, pat, k)
			}
			if steps+int(r.pre) <= maxInsns && int(r.post) <= maxInsns {
				// The run's edges as they are, after the
				// branches before them (which wait for the next
				// edges when the run has none).
				if len(r.edges) > 0 {
					if ne > 0 {
						d.sendEdges(eb[:ne])
						ne = 0
					}
					d.sendEdges(r.edges)
				}
				if r.nrets > 0 {
					for _, ret := range r.rets() {
						d.pushRet(ret.From)
					}
				}
				nb -= uint(r.used)
				tnt &= 1<<nb - 1
				steps += int(r.steps)
				if r.bit {
					d.sinceRef, steps = 0, int(r.steps)
				}
				d.c.Insns += uint64(r.insns)
				errIP, ip, b = r.errIP, r.end.ip, r.end
				continue
			}
		}
		// The branch's address and the next instruction's, from the
		// header too: a return or an indirect branch needs no more.
		from, target := b.ip+uint64(b.lastOff), b.target
		next := from + uint64(b.lastLen)
		switch class {
		case x86insn.CondJump:
			if nb == 0 {
				break loop
			}
			nb--
			taken := tnt>>nb&1 == 1
			tnt &= 1<<nb - 1
			d.sinceRef, steps = 0, 0
			if taken {
				eb[ne] = Edge{from, target, BrCond}
				ne++
				ip = target
				b, ne = d.succ(&b.taken, ip, ne)
			} else {
				ip = next
				b, ne = d.succ(&b.fall, ip, ne)
			}
		case x86insn.Jump, x86insn.Call:
			if nb == 0 {
				// The TIP read ahead is not for this branch: walk
				// executes it, counting it for a TRIG.
				d.sinceRef++
			}
			steps += n + 1
			kind := BrJump
			if class == x86insn.Call {
				kind = BrCall
				d.pushCall(target, next)
			}
			eb[ne] = Edge{from, target, kind}
			ne++
			ip = target
			b, ne = d.succ(&b.taken, ip, ne)
		case x86insn.Ret:
			if nb > 0 {
				// A compressed return; anything else is exec's
				// to report.
				if tnt>>(nb-1)&1 == 0 || d.sp == 0 {
					break loop
				}
				nb--
				tnt &= 1<<nb - 1
				d.sinceRef, steps = 0, 0
				ip = d.popRet()
				eb[ne] = Edge{from, ip, BrReturn}
				ne++
				b, ne = d.tipBlock(ip, ne)
				break
			}
			if tip.supp {
				break loop
			}
			tip.ok, steps = false, 0
			eb[ne] = Edge{from, tip.ip, BrReturn}
			ne++
			ip = tip.ip
			b, ne = d.tipBlock(ip, ne)
		case x86insn.IndirectJump, x86insn.IndirectCall:
			if nb > 0 || tip.supp {
				break loop
			}
			tip.ok, steps = false, 0
			kind := BrIndirectJump
			if class == x86insn.IndirectCall {
				kind = BrIndirectCall
				d.pushRet(next)
			}
			eb[ne] = Edge{from, tip.ip, kind}
			ne++
			ip = tip.ip
			b, ne = d.tipBlock(ip, ne)
		default:
			break loop
		}
		d.c.Insns += uint64(n + 1)
		errIP = from
		if ne == len(eb) {
			d.sendEdges(eb[:ne])
			ne = 0
		}
	}
	if ne > 0 {
		d.sendEdges(eb[:ne])
	}
	if pos == pos0 && d.c.Insns == insns0 {
		// Nothing done: the state is as it was.
		d.hasBack = tip.back
		d.fp.noPos, d.fp.noIP = pos, d.ip
		return nil
	}
	d.ip, d.steps, d.errIP = ip, steps, errIP
	d.tnt, d.tntN = tnt, uint8(nb)
	d.fp.bytes += uint64(pos - pos0)
	// The packets decoded ahead are the fast path's now; few are
	// decoded ahead again, so that it can take over again soon.
	d.pb.i, d.pb.n, d.pb.err, d.pb.size = 0, 0, nil, 1
	d.pd.SetRaw(pos, last)
	if tip.ok {
		if tip.back {
			d.hasBack = true
		} else {
			// Read ahead, as the slow path would have it.
			d.pd.SetRaw(tip.pos, tip.last)
			return d.peek()
		}
	}
	return nil
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

// succ is fixedSucc for the fast loop, whose branches wait in
// fp.edges[:ne]: a miss decodes a block, which reads memory, and a Memory
// may apply side band as it is read (perfflow: a task's exit, a new
// mapping), so the branches before it are handed over first, as the slow
// path hands each over before its next block. It returns what is left
// waiting.
func (d *Decoder) succ(p **block, ip uint64, ne int) (*block, int) {
	if s := *p; s != nil {
		return s, ne
	}
	d.flushEdges(ne)
	return d.fixedSucc(p, ip), 0
}

// tipBlock is ipBlock for the fast loop, as succ is fixedSucc.
func (d *Decoder) tipBlock(ip uint64, ne int) (*block, int) {
	if s := d.ipHit(ip); s != nil {
		return s, ne
	}
	d.flushEdges(ne)
	return d.ipMiss(ip), 0
}

// flushEdges hands over the fast loop's first ne waiting branches.
func (d *Decoder) flushEdges(ne int) {
	if ne > 0 {
		d.sendEdges(d.fp.edges[:ne])
	}
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
		c.tips = make([]*block, recentTips)
	}
	c.tips[ipHash(ip)] = s
	return s
}

// fastDisable walks from block b with the TIP.PGD's event ev waiting for
// the branch it binds to, as walk and exec do with it queued: direct
// branches are taken until one to its IP, or a branch that needs trace,
// which it binds to. It tells whether it fired; else the walk is left, at
// a block's start, to the slow path.
func (d *Decoder) fastDisable(b *block, ev *Event) bool {
	for {
		// The block's header tells all but a direct branch's target,
		// which it holds too.
		n, class := b.count()-1, b.class
		if n < 0 || d.steps+n+1 > d.opts.MaxInsns {
			return false
		}
		switch class {
		case x86insn.CondJump, x86insn.Ret, x86insn.IndirectJump, x86insn.IndirectCall, x86insn.FarTransfer,
			x86insn.Jump, x86insn.Call:
		default:
			return false
		}
		from := b.ip + uint64(b.lastOff)
		next := from + uint64(b.lastLen)
		d.c.Insns += uint64(n + 1)
		d.sinceRef += uint32(n + 1)
		d.steps += n + 1
		d.errIP = from
		d.ip = next
		switch class {
		case x86insn.Jump, x86insn.Call:
			target := b.target
			if ev.HasIP && ev.IP == target {
				break // disabledDirect
			}
			kind := BrJump
			if class == x86insn.Call {
				kind = BrCall
				d.pushCall(target, next)
			}
			d.branch(from, target, kind)
			d.ip = target
			b = d.fixedSucc(&b.taken, target)
			continue
		case x86insn.IndirectCall:
			d.pushRet(next)
		}
		// disabledAt
		d.qEv = *ev
		d.fireEv()
		return true
	}
}

// Packet actions by first byte (fastOps): the fast loop's dispatch.
const (
	opOther uint8 = iota // the slow path's
	opPad
	opMTC // MTC, TSC and a one-byte CYC: skipped when no clock sees them
	opTSC
	opCYC
	opTNT8
	opExt // a TNT.64 if the second byte says so, else the slow path's
	opTIP
	opPGD
	opPGE
)

// fastOps maps a packet's first byte to its action, by whether tracing is
// on (2) and no clock sees timing packets (1): off, only a TIP.PGE is the
// fast path's; on, a TIP.PGE is not.
var fastOps = func() (t [4][256]uint8) {
	for k := range t {
		timing, on := k&1 == 1, k&2 == 2
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
			case !on:
				if c&0x1f == 0x11 {
					op = opPGE
				}
			case c&1 == 0 && c != 2:
				op = opTNT8
			case c == 2:
				op = opExt
			case c&0x1f == 0x0d:
				op = opTIP
			case c&0x1f == 0x01:
				op = opPGD
			}
			t[k][i] = op
		}
	}
	return t
}()

// opsFor returns the fast loop's table of packet actions (fastOps) for
// tracing on or off.
func (d *Decoder) opsFor(on bool) *[256]uint8 {
	k := 0
	if d.clock == nil {
		k = 1
	}
	if on {
		k |= 2
	}
	return &fastOps[k]
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

// padRun returns the position after the PADs at pos, up to 8 of them: runs
// of PADs are skipped a word at a time.
func padRun(buf []byte, pos int) int {
	return pos + min(bits.TrailingZeros64(binary.LittleEndian.Uint64(buf[pos:]))/8, 8)
}
