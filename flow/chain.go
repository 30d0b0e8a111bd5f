package flow

import (
	"ptfs/decode"
	"ptfs/x86insn"
)

// chain goes from block to block while pending TNT bits decide the flow and
// nothing else can happen (no queued event, tracing on, the Handler takes
// no instructions): the walk of run and exec reduced, per block, to its
// branch (a TNT bit for a conditional branch or a compressed return, the
// target of a direct jump or call, a TIP for an indirect branch or a
// return), a Branch call when taken, and a successor pointer instead of a
// lookup (fixedSucc; for a varying target, the last two targets' blocks:
// lastSucc). TNT and TIP packets that come next are read on the way, as
// run and exec read them. It
// returns nil when what comes next is run's (an event to deliver, trace to
// read) or on an error, else the block at d.ip for walk to go on with.
func (d *Decoder) chain(b *block) (*block, error) {
	for moved := false; ; moved = true {
		if len(d.q) > 0 || !d.enabled || d.tntN == 0 && !d.tipOK && !d.flowNext() {
			if moved {
				// An event to deliver, or trace to read: run's.
				return nil, nil
			}
			return b, nil
		}
		n := int(b.n) - 1
		if n < 0 || b.ip != d.ip || d.steps+n+1 > d.opts.MaxInsns {
			return b, nil
		}
		last := b.last()
		// next is the successor of a fixed target; nil for a varying
		// one.
		var next **block
		switch last.class {
		case x86insn.CondJump:
			if d.tntN == 0 {
				return b, nil
			}
			next = &b.fall
			if d.takeTNT() {
				d.branch(last.ip, last.target, BrCond)
				d.ip, next = last.target, &b.taken
			} else {
				d.ip = last.ip + uint64(last.len)
			}
		case x86insn.Jump:
			if d.tntN == 0 && !d.tipOK {
				// A TIP next: run reads on when the trace is
				// needed.
				return b, nil
			}
			d.steps += n + 1
			d.branch(last.ip, last.target, BrJump)
			d.ip, next = last.target, &b.taken
		case x86insn.Call:
			if d.tntN == 0 && !d.tipOK {
				return b, nil
			}
			d.steps += n + 1
			d.pushCall(last.target, last.ip+uint64(last.len))
			d.branch(last.ip, last.target, BrCall)
			d.ip, next = last.target, &b.taken
		case x86insn.Ret:
			if d.tntN == 0 {
				if ok, err := d.tip1(); !ok {
					return d.chainStop(b, err)
				}
				d.branch(last.ip, d.tip, BrReturn)
				d.ip = d.tip
				break
			}
			// A compressed return; anything else is exec's to report.
			if d.tnt>>(d.tntN-1)&1 == 0 || d.sp == 0 {
				return b, nil
			}
			d.takeTNT()
			to := d.popRet()
			d.branch(last.ip, to, BrReturn)
			d.ip = to
		case x86insn.IndirectJump, x86insn.IndirectCall:
			if d.tntN > 0 {
				return b, nil
			}
			if ok, err := d.tip1(); !ok {
				return d.chainStop(b, err)
			}
			kind := BrIndirectJump
			if last.class == x86insn.IndirectCall {
				kind = BrIndirectCall
				d.pushRet(last.ip + uint64(last.len))
			}
			d.branch(last.ip, d.tip, kind)
			d.ip = d.tip
		default:
			return b, nil
		}
		d.c.Insns += uint64(n + 1)
		d.errIP = last.ip
		if d.tntN == 0 && !d.tipOK {
			// What run does next: a TNT packet next is taken at
			// once, a TIP waits for the branch that takes it;
			// anything else is run's.
			if err := d.peek(); err != nil {
				return nil, err
			}
			if d.eos {
				return nil, nil
			}
			switch d.back.Kind {
			case decode.TNT8, decode.TNT64:
				if err := d.read(); err != nil {
					return nil, err
				}
			case decode.TIP:
			default:
				return nil, nil
			}
		}
		// A successor is decoded in the same mode: the mode changes
		// only through a queued event. Where the target varies (a
		// return, an indirect branch), the successors keep the last
		// targets' blocks (the fast path looks those up in ipBlock).
		if next != nil {
			b = d.fixedSucc(next, d.ip)
		} else {
			b = d.lastSucc(b, d.ip)
		}
	}
}

// chainStop leaves block b, whose branch chain cannot take, to walk; an
// error reading the TIP for it is reported at its branch, as exec's are.
func (d *Decoder) chainStop(b *block, err error) (*block, error) {
	if err == nil {
		return b, nil
	}
	last := b.last()
	d.c.Insns += uint64(b.n)
	d.errIP, d.ip = last.ip, last.ip
	return nil, err
}

// tip1 takes the TIP that the indirect branch or return ending a chained
// block needs, reading it when it is the next packet, as exec's await and
// takeTIP do; it tells whether chain can go on with it (an IP, no MODE.Exec
// or held event waiting for it). When not, the block is left to walk,
// which finds the same state: the TIP, if read, pending.
func (d *Decoder) tip1() (bool, error) {
	if !d.tipOK {
		if !d.flowNext() || d.nHeld > 0 {
			return false, nil
		}
		if err := d.read(); err != nil || !d.tipOK {
			return false, err
		}
	}
	if d.tipSupp || d.stash != ModeUnknown {
		return false, nil
	}
	d.tipOK, d.steps = false, 0
	return true, nil
}
