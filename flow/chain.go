package flow

import (
	"ptfs/decode"
	"ptfs/x86insn"
)

// chain goes from block to block while pending TNT bits decide the flow and
// nothing else can happen (no queued event, tracing on, the Handler takes
// no instructions): the walk of run and exec reduced, per block, to its
// branch (a TNT bit for a conditional branch or a compressed return, the
// target of a direct jump or call), a Branch call when taken, and a
// successor pointer instead of a lookup where the target is fixed. TNT
// packets that come next are read on the way. It returns nil when the next
// branch needs what run decides (the end, a TIP, an event packet) or an
// error, else the block at d.ip for walk to go on with.
func (d *Decoder) chain(b *block) (*block, error) {
	for len(d.q) == 0 && d.enabled && d.tntN > 0 {
		n := len(b.insns) - 1
		if n < 0 || b.insns[0].ip != d.ip || d.steps+n+1 > d.opts.MaxInsns {
			return b, nil
		}
		last := &b.insns[n]
		var next **block
		switch last.class {
		case x86insn.CondJump:
			if d.takeTNT() {
				d.h.Branch(last.ip, last.target, BrCond)
				d.ip, next = last.target, &b.taken
			} else {
				d.ip, next = last.ip+uint64(last.len), &b.fall
			}
		case x86insn.Jump:
			d.steps += n + 1
			d.h.Branch(last.ip, last.target, BrJump)
			d.ip, next = last.target, &b.taken
		case x86insn.Call:
			d.steps += n + 1
			// As exec: a call to the next instruction pushes nothing.
			if ret := last.ip + uint64(last.len); last.target != ret {
				d.pushRet(ret)
			}
			d.h.Branch(last.ip, last.target, BrCall)
			d.ip, next = last.target, &b.taken
		case x86insn.Ret:
			// A compressed return; anything else is exec's to report.
			if d.tnt>>(d.tntN-1)&1 == 0 || d.sp == 0 {
				return b, nil
			}
			d.takeTNT()
			to := d.popRet()
			d.h.Branch(last.ip, to, BrReturn)
			d.ip = to
		default:
			return b, nil
		}
		d.c.Insns += uint64(n + 1)
		d.errIP = last.ip
		if d.tntN == 0 {
			// What run does next, without a lookup: a TNT packet
			// next is taken at once; anything else is run's.
			if err := d.peek(); err != nil {
				return nil, err
			}
			if d.eos || d.back.Kind != decode.TNT8 && d.back.Kind != decode.TNT64 {
				return nil, nil
			}
			if err := d.read(); err != nil {
				return nil, err
			}
		}
		// A successor is decoded in the same mode: the mode changes
		// only through a queued event.
		switch {
		case next == nil:
			b = d.block(d.ip, d.mode)
		case *next == nil:
			*next = d.block(d.ip, d.mode)
			b = *next
		default:
			b = *next
		}
	}
	return b, nil
}
