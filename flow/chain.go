package flow

import (
	"ptfs/decode"
	"ptfs/x86insn"
)

// chain follows conditional branches from block to block while the pending
// TNT bits decide them and nothing else can happen (no queued event,
// tracing on, the Handler takes no instructions): the walk of run and exec
// reduced to a TNT bit, a Branch call for a taken one and a successor
// pointer per block; TNT packets that come next are read on the way. It
// returns nil when the next branch needs what run decides (the end, a TIP,
// an event packet) or an error, else the block at d.ip for walk to go on
// with.
func (d *Decoder) chain(b *block) (*block, error) {
	for len(d.q) == 0 && d.enabled && d.tntN > 0 {
		n := len(b.insns) - 1
		if n < 0 || b.insns[0].ip != d.ip || b.insns[n].class != x86insn.CondJump || d.steps+n+1 > d.opts.MaxInsns {
			return b, nil
		}
		last := &b.insns[n]
		d.c.Insns += uint64(n + 1)
		d.errIP = last.ip
		next := &b.fall
		if d.takeTNT() {
			d.h.Branch(last.ip, last.target, BrCond)
			d.ip, next = last.target, &b.taken
		} else {
			d.ip = last.ip + uint64(last.len)
		}
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
			if d.tntN == 0 {
				return nil, nil
			}
		}
		// A successor is decoded in the same mode: the mode changes
		// only through a queued event.
		if *next == nil {
			*next = d.block(d.ip, d.mode)
		}
		b = *next
	}
	return b, nil
}
