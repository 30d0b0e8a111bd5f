package flow

import (
	"errors"
	"io"

	"ptfs/decode"

	"ptfs/x86insn"
)

// run walks the flow of one synchronised stretch of trace until its end
// (io.EOF) or an error.
func (d *Decoder) run() error {
	for {
		if d.fastOK() {
			if err := d.fast(); err != nil {
				return err
			}
		}
		d.deliver()
		if d.enabled {
			d.resyncing = false
		}
		if !d.enabled {
			if len(d.q) > 0 {
				continue
			}
			if d.tipOK && d.resyncing && !d.tipSupp {
				// Resynchronised: the flow goes on at the TIP.
				d.tipOK, d.resyncing = false, false
				d.tnt, d.tntN = 0, 0
				d.ip, d.enabled = d.tip, true
				d.applyStash()
				d.entered()
				continue
			}
			if d.tntN > 0 || d.tipOK {
				if d.resyncing {
					// Flow packets without an IP to go from.
					d.tnt, d.tntN, d.tipOK = 0, 0, false
					continue
				}
				return ErrBadContext
			}
			if d.eos {
				return io.EOF
			}
			if err := d.read(); err != nil {
				return err
			}
			continue
		}
		if d.inStub {
			if err := d.stubStep(); err != nil {
				return err
			}
			continue
		}
		if len(d.q) == 0 && d.tntN == 0 && !d.tipOK && !d.flowNext() {
			// Like libipt, look at the next packet: the end of
			// the trace ends the flow now; a TNT (into the cache)
			// or an event packet is taken before the instruction at
			// the IP is decoded, as libipt's event decoder reads on
			// to the next event; a TIP waits for the branch that
			// needs it, once the code at the IP is known to be
			// there (else that is the error).
			if err := d.peek(); err != nil {
				return err
			}
			if d.eos {
				d.emit(d.newEv(EvEnd, d.ip, true))
				return io.EOF
			}
			if !d.flowNext() {
				if err := d.read(); err != nil {
					return err
				}
				continue
			}
			if b := d.block(d.ip, d.mode); b.n == 0 {
				d.errIP = d.ip
				return b.err()
			}
			continue
		}
		if err := d.walk(); err != nil {
			return err
		}
	}
}

// peek reads the next packet ahead (pushed back), or sets eos.
func (d *Decoder) peek() error {
	if d.hasBack {
		return nil
	}
	if err := d.next(); err != nil {
		if errors.Is(err, io.EOF) {
			d.eos = true
			return nil
		}
		return err
	}
	d.unread()
	return nil
}

// flowNext tells whether the packet read ahead is a TIP, which waits for
// the branch that takes it (a TNT is taken into the cache at once, as
// libipt's read-ahead does).
func (d *Decoder) flowNext() bool {
	if !d.hasBack {
		return false
	}
	return d.back.Kind == decode.TIP
}

// due tells whether a queued event must be delivered before the
// instruction at d.ip.
func (d *Decoder) due() bool {
	if len(d.q) == 0 {
		return false
	}
	q := &d.q[0]
	switch q.bind {
	case bindNow:
		return true
	case bindIP, bindStatus:
		return q.eventIP() == d.ip
	case bindCount:
		return q.count == 0
	}
	return false
}

// walk executes instructions from d.ip through cached blocks until an
// event is due, more trace is needed, or the flow leaves the block.
func (d *Decoder) walk() error {
	b := d.block(d.ip, d.mode)
	if d.opts.NoInsns {
		var err error
		if b, err = d.chain(b); b == nil {
			return err
		}
	}
	start, ip := 0, b.ip
	if n := int(b.n) - 1; d.opts.NoInsns && n > 0 && len(d.q) == 0 && d.enabled && b.ip == d.ip &&
		(d.tntN > 0 || d.tipOK || d.flowNext()) && d.steps+n <= d.opts.MaxInsns {
		// No event is queued and the trace for the block's branch is
		// there: nothing stops the flow before that branch.
		d.c.Insns += uint64(n)
		d.steps += n
		ip = b.ip + uint64(b.lastOff)
		// The last stepped over is the last tried, as the walk's
		// (an error at the branch is reported after it).
		d.errIP = ip - uint64(b.lens[n-1])
		d.ip, start = ip, n
	}
	for i := start; i < int(b.n); i++ {
		in := b.at(i, ip)
		ip += uint64(in.len)
		if in.ip != d.ip || !d.enabled {
			return nil
		}
		if i > 0 && (d.due() || (len(d.q) == 0 && d.tntN == 0 && !d.tipOK && !d.flowNext())) {
			return nil
		}
		if d.steps++; d.steps > d.opts.MaxInsns {
			return ErrBadQuery
		}
		if len(d.opts.Stubs) > 0 && d.atSite(&in) {
			return nil
		}
		d.errIP = in.ip
		if err := d.exec(&in); err != nil {
			// Errors are reported at the instruction.
			d.ip = in.ip
			return err
		}
	}
	if d.enabled && b.n > 0 && d.ip == b.ip+uint64(b.lastOff)+uint64(b.lastLen) && b.err() != nil {
		if d.due() {
			return nil
		}
		d.errIP = d.ip
		return b.err()
	}
	if b.n == 0 {
		d.errIP = d.ip
		return b.err()
	}
	return nil
}

// maxQueued bounds the events queued while a branch waits for trace.
const maxQueued = 1 << 12

// blocker returns the index of the first queued event that waits for the
// flow (not one to deliver now), or -1.
func (d *Decoder) blocker() int {
	for i := range d.q {
		if b := d.q[i].bind; b != bindNow && b != bindTIP && b != bindCount {
			return i
		}
	}
	return -1
}

// await reads trace until the next branch can be decided: TNT bits, a TIP
// or an event that waits for the flow.
func (d *Decoder) await(tip bool) error {
	for d.tntN == 0 && !d.tipOK && d.blocker() < 0 {
		if d.eos {
			return io.EOF
		}
		if len(d.q) >= maxQueued {
			// Events without end where a branch needs trace:
			// bounded memory, the stream does not match.
			return ErrBadQuery
		}
		if err := d.peek(); err != nil {
			return err
		}
		if !tip && d.hasBack && d.back.Kind == decode.TIP {
			// A conditional branch does not take a TIP: libipt
			// leaves it unread.
			return nil
		}
		if err := d.read(); err != nil {
			return err
		}
	}
	return nil
}

// disabledAt fires a TIP.PGD that binds to the branch just executed; it
// tells whether there was one.
func (d *Decoder) disabledAt() bool {
	i := d.blocker()
	if i < 0 || d.q[i].bind != bindBranch {
		return false
	}
	d.fireTIPBound(i)
	d.fire(d.blocker())
	return true
}

// fireTIPBound fires the events that wait for the branch among the first
// n queued.
func (d *Decoder) fireTIPBound(n int) {
	for i := 0; i < n; {
		if d.q[i].bind == bindTIP {
			d.fire(i)
			n--
			continue
		}
		i++
	}
}

// takeTNT consumes the oldest TNT bit; the instruction after its branch is
// an IP reference for TRIG's icnt, as libipt counts it.
func (d *Decoder) takeTNT() bool {
	d.sinceRef = 0
	d.tntN--
	taken := d.tnt>>d.tntN&1 == 1
	d.tnt &= 1<<d.tntN - 1
	d.steps = 0
	return taken
}

// takeTIP consumes the pending TIP as the target of the branch at from; a
// TIP that the TNT bits of later branches came before (deferred) is read
// past them.
func (d *Decoder) takeTIP(from uint64, kind BranchKind) error {
	for !d.tipOK {
		if d.tntN == 0 {
			if d.disabledAt() {
				return nil
			}
			return ErrBadQuery
		}
		if err := d.next(); err != nil {
			if errors.Is(err, io.EOF) {
				return ErrBadQuery
			}
			return err
		}
		d.unread()
		switch d.pk.Kind {
		case decode.TNT8, decode.TNT64, decode.TIP:
			if err := d.read(); err != nil {
				return err
			}
			continue
		}
		return ErrBadQuery
	}
	d.tipOK = false
	d.steps = 0
	if d.tipSupp {
		return ErrNoIP
	}
	d.tick(from)
	d.branch(from, d.tip, kind)
	d.ip, d.sinceRef = d.tip, 0
	d.applyStash()
	d.fireTIPBound(len(d.q))
	d.entered()
	return nil
}

// disabledDirect fires a TIP.PGD bound to the direct branch just executed
// when its IP is the branch's target (libipt ignores direct branches
// elsewhere); it tells whether it did.
func (d *Decoder) disabledDirect(target uint64) bool {
	i := d.blocker()
	if i < 0 || d.q[i].bind != bindBranch || !d.q[i].ev.HasIP || d.q[i].ev.IP != target || d.tntN > 0 || d.tipOK {
		return false
	}
	d.fire(i)
	return true
}

// exec executes one instruction.
func (d *Decoder) exec(in *insn) error {
	d.c.Insns++
	d.sinceRef++
	if !d.opts.NoInsns {
		d.ins = Insn{IP: in.ip, Len: in.len, Mode: d.mode, Class: in.class, Speculative: d.inTX}
		d.h.Insn(&d.ins)
	}
	for i := range d.q {
		if d.q[i].bind == bindCount && d.q[i].count > 0 {
			d.q[i].count--
		}
	}
	next := in.ip + uint64(in.len)
	d.ip = next
	switch in.class {
	case x86insn.PTWrite:
		if i := d.blocker(); i >= 0 && d.q[i].bind == bindPTW && (!d.q[i].ev.HasIP || d.q[i].ev.IP == in.ip) {
			d.fire(i)
		}
	case x86insn.MovCR3:
		d.movCR3()
	case x86insn.Jump:
		if d.disabledDirect(in.target) {
			return nil
		}
		d.branch(in.ip, in.target, BrJump)
		d.ip = in.target
	case x86insn.Call:
		if d.disabledDirect(in.target) {
			return nil
		}
		d.pushCall(in.target, next)
		d.branch(in.ip, in.target, BrCall)
		d.ip = in.target
	case x86insn.CondJump:
		if err := d.await(false); err != nil {
			return err
		}
		if d.tntN == 0 {
			if d.disabledAt() {
				return nil
			}
			return ErrBadQuery
		}
		taken := d.takeTNT()
		d.tick(in.ip)
		if taken {
			d.branch(in.ip, in.target, BrCond)
			d.ip = in.target
		} else {
			d.ip = next
		}
	case x86insn.Ret:
		if err := d.await(true); err != nil {
			return err
		}
		if d.tntN > 0 {
			// A compressed return: the TNT bit says "taken", the
			// target is the return address of the matching call.
			taken := d.takeTNT()
			d.tick(in.ip)
			if !taken || d.sp == 0 {
				return ErrRetComp
			}
			to := d.popRet()
			d.branch(in.ip, to, BrReturn)
			d.ip = to
			return nil
		}
		return d.takeTIP(in.ip, BrReturn)
	case x86insn.IndirectJump, x86insn.IndirectCall, x86insn.FarTransfer:
		if err := d.await(true); err != nil {
			return err
		}
		kind := BrIndirectJump
		switch in.class {
		case x86insn.IndirectCall:
			kind = BrIndirectCall
			d.pushRet(next)
		case x86insn.FarTransfer:
			kind = BrFar
		}
		return d.takeTIP(in.ip, kind)
	}
	return nil
}

// movCR3 fires what binds to a MOV to CR3 just executed, as libipt binds
// it: a TIP.PGD without an IP (tracing stops with the address space), else
// the first queued paging event (PIP), at most one.
func (d *Decoder) movCR3() {
	if i := d.blocker(); i >= 0 && !d.q[i].ev.HasIP && d.disabledAt() {
		return
	}
	for i := range d.q {
		if d.q[i].bind == bindTIP && d.q[i].ev.Kind == EvPaging {
			d.fire(i)
			return
		}
	}
}

// pushCall pushes the return address ret of a direct call to target; a
// call to the next instruction only reads the IP (position-independent
// code): it pushes no return. It tells whether it pushed (a kept TIP.PGD
// walk records what it pushes).
func (d *Decoder) pushCall(target, ret uint64) bool {
	if target != ret {
		d.pushRet(ret)
		return true
	}
	return false
}

// pushRet and popRet wrap the ring's index by a mask (retStackSize is a
// power of two): the kernel pushes a return for most calls, and a signed
// remainder costs a correction and an index its bounds test.
func (d *Decoder) pushRet(ip uint64) {
	t := d.top & (retStackSize - 1)
	d.stack[t] = ip
	d.top = (t + 1) & (retStackSize - 1)
	d.sp = min(d.sp+1, retStackSize)
}

// pushRets pushes the return addresses a kept walk, tracelet or window
// replays, in order.
func (d *Decoder) pushRets(rets []uint64) {
	for _, ret := range rets {
		d.pushRet(ret)
	}
}

func (d *Decoder) popRet() uint64 {
	t := (d.top - 1) & (retStackSize - 1)
	d.top = t
	d.sp--
	return d.stack[t]
}
