package flow

import (
	"ptfs/decode"
	"ptfs/x86insn"
)

// The fast path's share of the packets it otherwise hands over for: a PSB+
// group (kAFL's traces have one every few KiB, with tracing on or off) and,
// while tracing is off, a MODE.Exec right before a TIP.PGE (kAFL's traces
// have one after each PSB+ that found tracing off). Each is taken whole or
// not at all: the group is read first, with the packet decoder's own
// checks (fastState.pd, RawNext), and the state is changed only when it
// is the slow path's common case; anything else (an error, OVF, MNT, a
// window's end, a status the walk would not reach from the current block
// by plain instructions and direct branches) is left to the slow path
// where it stands.

// fastPSB takes the PSB+ at k.pos (nothing pending, nothing queued) as
// read and psb do, and, with tracing on, the walk to its status IP as walk
// and deliver do: it tells whether it did. The flow's IP and steps are k's
// (d's are set from them when it takes the group); k.pos and k.last move
// past the group. A clock sees the group's packets once it is taken
// (clockPackets), before anything is told: a group left to the slow path
// is handed to the clock there.
func (d *Decoder) fastPSB(k *kern) bool {
	buf, pos, last := k.buf, k.pos, k.last
	end := len(buf) - 16
	// A PSB starts with the escape and its second byte (the packet
	// decoder checks the rest).
	if pos > end || buf[pos] != 2 || buf[pos+1] != 0x82 {
		return false
	}
	pd, p := &d.fp.pd, &d.fp.pk
	pd.Reset(buf)
	// The PSB (or bad bytes), then the group up to its PSBEND.
	pos, last, err := pd.RawNext(pos, last, p)
	if err != nil {
		return false
	}
	s := psbState{mode: ModeUnknown}
	for {
		if pos > end {
			return false
		}
		if buf[pos] == 0 {
			pos = padRun(buf, pos)
			continue
		}
		if pos, last, err = pd.RawNext(pos, last, p); err != nil {
			return false
		}
		if p.Kind == decode.PSBEnd {
			break
		}
		if skipped(p.Kind) {
			continue
		}
		if ok, err := d.psbPacket(&s, p, false); !ok || err != nil {
			return false
		}
	}
	// The status update binds at its IP, which the walk reaches from the
	// start of the current block (the kernel stopped there) by plain
	// instructions and direct branches to known blocks, else the slow
	// path walks to it.
	var walked, left int
	var at uint64
	if d.enabled && s.hasIP {
		var ok bool
		walked, left, at, ok = d.statusWalk(k.b, k.ip, s.ip, k.budget)
		if !ok || s.mode != ModeUnknown && s.mode != d.mode {
			return false
		}
	}
	if d.clock != nil {
		d.clockPackets(buf, k.pos, pos, k.last)
	}
	d.ip, d.steps = k.ip, d.opts.MaxInsns-k.budget
	if d.psbEnd(&s, false) {
		// As walk executes the instructions before it (exec's direct
		// branches: a Branch each) and deliver fires it (fireEv's
		// evStatus: no report).
		for b := k.b; left > 0; left-- {
			from := b.ip + uint64(b.lastOff)
			kind := BrJump
			if b.class == x86insn.Call {
				kind = BrCall
				d.pushCall(b.target, from+uint64(b.lastLen))
			}
			d.branch(from, b.target, kind)
			b = b.taken
		}
		if walked > 0 {
			d.c.Insns += uint64(walked)
			d.errIP = at
		}
		d.ip, d.steps, d.sinceRef = s.ip, 0, 0
	}
	k.pos, k.last = pos, last
	d.fp.groups++
	return true
}

// statusBlocks bounds the blocks statusWalk goes through.
const statusBlocks = 4

// statusWalk tells how many instructions the walk executes from ip, the
// start of block b, to reach to, a status update's IP, how many blocks it
// leaves by their last instruction on the way, and the IP of the last
// instruction: plain instructions, and direct jumps and calls to blocks
// the cache holds (kept as the blocks' taken successors, which the walk
// after it follows), at most budget instructions in all (ok false else).
// It reads no memory.
func (d *Decoder) statusWalk(b *block, ip, to uint64, budget int) (n, left int, last uint64, ok bool) {
	if b == nil || b.ip != ip {
		return 0, 0, 0, false
	}
	for ; left < statusBlocks; left++ {
		c := b.count()
		for i := range c {
			if ip == to {
				return n, left, last, n <= budget
			}
			last = ip
			n++
			if i == c-1 {
				break
			}
			ip += uint64(b.lens[i])
		}
		// to is not in b: its last instruction leads on when it is a
		// direct jump or call (exec's disabledDirect finds no TIP.PGD
		// queued).
		if c == 0 || b.class != x86insn.Jump && b.class != x86insn.Call || b.err() != nil {
			break
		}
		if b.taken == nil {
			// A run went through b: the successor is in the cache,
			// if known.
			if b.taken = d.cache.known(b.target, d.mode); b.taken == nil {
				break
			}
		}
		ip, b = b.target, b.taken
	}
	return 0, 0, 0, false
}

// fastExecOff takes a MODE.Exec at k.pos while tracing is off when the
// packet after it is a TIP.PGE that fastLoop takes and the MODE.Exec
// changes nothing there: read stashes it, and the enable's applyStash
// queues no event for it (the same mode, and the same IF where Iflags
// reports it).
func (d *Decoder) fastExecOff(k *kern) bool {
	buf, pos := k.buf, k.pos
	end := len(buf) - 16
	if d.enabled || pos > end {
		return false
	}
	pd, p := &d.fp.pd, &d.fp.pk
	pd.Reset(buf)
	pos, _, err := pd.RawNext(pos, k.last, p)
	if err != nil || p.Kind != decode.ModeExec {
		return false
	}
	if execMode(p) != d.mode || d.opts.Iflags && iflagOf(p.Has(decode.FlagIF)) != d.iflag {
		return false
	}
	ops := d.offOps()
	pos = skipPad(buf, pos, end, ops)
	if pos > end || ops[buf[pos]] != opPGE {
		return false
	}
	k.pos = pos
	return true
}
