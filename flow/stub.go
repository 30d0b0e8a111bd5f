package flow

import (
	"errors"
	"io"
)

// StubKind says how a probe's stub is entered and left, which decides the
// packets it leaves in the trace.
type StubKind uint8

// Stub kinds.
const (
	// StubJump is ptfs's ptw probe: the site is patched with a jmp into
	// the stub, which writes the arguments (PTW, FUP at the stub), runs
	// the displaced instruction and jumps back to the site's successor.
	// Direct jumps leave no packet: only the PTW/FUP records show it.
	StubJump StubKind = iota
	// StubTrap is a classic uprobe: the site's int3 enters the kernel
	// (TIP.PGD without an IP), which single-steps the original
	// instruction out of line in the [uprobes] page (TIP.PGE there, then
	// TIP.PGD) and resumes at the site's successor (TIP.PGE).
	StubTrap
	// StubCall is the kernel's nop5 optimisation: the site's nop5 is a
	// call into [uprobes-trampoline], whose syscall enters the kernel
	// (TIP.PGD) and whose ret comes back to the site's successor (a
	// compressed return, or a TIP).
	StubCall
)

// Stub is code of a probe that no file holds: the decoder walks the code on
// disk, so through a probed site it goes on as if the original instruction
// ran, and a trace that resumes inside a stub goes on at the site's
// successor.
type Stub struct {
	// Start and End bound the stub's code: [Start, End).
	Start, End uint64
	// Site is the probed instruction; 0 when unknown (a page shared by
	// several sites): then a StubCall returns where its ret says, and a
	// StubTrap's successor is where tracing resumes.
	Site uint64
	// Next is the site's successor; 0 with Site.
	Next uint64
	// Kind says how the stub is entered and left.
	Kind StubKind
}

// stub returns the index of the stub holding ip, or -1.
func (d *Decoder) stub(ip uint64) int {
	for i := range d.opts.Stubs {
		if s := &d.opts.Stubs[i]; ip >= s.Start && ip < s.End {
			return i
		}
	}
	return -1
}

// outside tells whether ip is code of no file the decoder knows: a stub,
// or memory not mapped at all (a ptw stub the caller did not name). A
// PTWRITE there is a probe's record, not part of the flow.
func (d *Decoder) outside(ip uint64) bool {
	if d.stub(ip) >= 0 {
		return true
	}
	n, _ := d.mem.ReadAt(d.buf[:1], ip)
	return n <= 0
}

// stubPTW binds the ptwrite e from a stub: to the site, when the stub
// names it (e's IP becomes the site's) and the flow is not past it already
// (resumed in the stub), else now.
func (d *Decoder) stubPTW(e *Event) bind {
	i := d.stub(e.IP)
	if i < 0 || !d.enabled || d.inStub || d.opts.Stubs[i].Site == 0 || d.ip == d.opts.Stubs[i].Next {
		return bindNow
	}
	e.IP = d.opts.Stubs[i].Site
	return bindIP
}

// entered handles the flow arriving at d.ip (an enable, a TIP, a PSB+ or
// an overflow's FUP): inside a jump stub it goes on at the site's
// successor; inside a trap or call stub it waits in the stub (inStub) for
// the packet that leaves it.
func (d *Decoder) entered() {
	if len(d.opts.Stubs) == 0 {
		return
	}
	i := d.stub(d.ip)
	if i < 0 {
		return
	}
	s := &d.opts.Stubs[i]
	if s.Kind == StubJump && s.Next != 0 {
		d.ip = s.Next
		return
	}
	d.inStub = true
}

// atSite handles the instruction in at a trap or call site whose entry into
// the kernel (a TIP.PGD without an IP) is queued: tracing stops there, as
// the int3 or the trampoline's syscall stopped it. The site's original
// instruction is reported here, once, as if it ran (out of line, or the
// trampoline did its work); a call site pushes its successor, which the
// trampoline's ret pops. It tells whether it did.
func (d *Decoder) atSite(in *insn) bool {
	i := d.blocker()
	if i < 0 || d.q[i].bind != bindBranch || d.q[i].ev.HasIP {
		return false
	}
	for j := range d.opts.Stubs {
		s := &d.opts.Stubs[j]
		if s.Site != in.ip || s.Kind == StubJump {
			continue
		}
		d.c.Insns++
		d.ins = Insn{IP: in.ip, Len: in.len, Mode: d.mode, Class: in.class, Speculative: d.inTX}
		d.h.Insn(&d.ins)
		if s.Kind == StubCall {
			d.pushRet(s.Next)
		}
		d.ip = s.Next
		return d.disabledAt()
	}
	return false
}

// stubStep goes on inside a stub whose code no file holds: it takes the
// packet that leaves it (a TIP.PGD, the ret's TNT bit or TIP) and delivers
// the events that come on the way.
func (d *Decoder) stubStep() error {
	if i := d.blocker(); i >= 0 && d.q[i].bind == bindBranch {
		d.inStub = false
		d.disabledAt()
		return nil
	}
	if i := d.blocker(); i >= 0 {
		// An event at an IP in the stub, or a ptwrite bound to the
		// flow: the stub's own, delivered now.
		d.fire(i)
		return nil
	}
	switch {
	case d.tntN > 0:
		// The trampoline's compressed ret.
		if !d.takeTNT() || d.sp == 0 {
			d.inStub = false
			return ErrRetComp
		}
		d.inStub = false
		d.ip = d.popRet()
		return nil
	case d.tipOK:
		d.inStub = false
		d.tipOK = false
		if d.tipSupp {
			return ErrNoIP
		}
		d.ip = d.tip
		d.applyStash()
		d.fireTIPBound(len(d.q))
		d.entered()
		return nil
	case d.eos:
		d.inStub = false
		return io.EOF
	}
	if err := d.read(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
