package flow

import (
	"errors"
	"io"

	"ptfs/decode"
	"ptfs/x86insn"
)

// Options select decoder behaviour that libipt makes optional.
type Options struct {
	// ResyncOnError resumes after an error at the next packet that gives
	// an IP (TIP, TIP.PGE, FUP, PSB+) instead of at the next PSB.
	ResyncOnError bool
	// Iflags reports changes of RFLAGS.IF (MODE.Exec) as EvIflags.
	Iflags bool
	// MaxInsns bounds the instructions executed without consuming a
	// packet (a loop in the image that the trace never leaves); 0 means
	// the default, 1<<20. Exceeding it is an ErrBadQuery error.
	MaxInsns int
	// NoInsns does not call the Handler's Insn (a reader of branches
	// only): the plain instructions of a block are then stepped over at
	// once while nothing can stop the flow among them; Counters.Insns
	// still counts them.
	NoInsns bool
	// Stubs are the probes' code that no file holds (see Stub).
	Stubs []Stub
	// Time, when set, estimates the time from the trace's timing
	// packets (configured so): events carry it in TSC.
	Time *decode.ClockConfig
	// Ticks reports an EvTick at a branch decided by trace when the time
	// changed since the last event, as libipt's tick events (with Time).
	Ticks bool
}

// bind says when a queued event takes effect.
type bind uint8

const (
	bindNow    bind = iota // before the next instruction
	bindIP                 // before the instruction at the event's IP
	bindBranch             // at the next branch (TIP.PGD, a deferred status)
	bindPTW                // after the next ptwrite (at the event's IP when it has one)
	bindStatus             // PSB+ status: silently at the event's IP
	bindTIP                // after the next TIP is taken (paging, MODE.Exec)
	bindCount              // after count more instructions (TRIG's icnt)
)

type queued struct {
	ev    Event
	bind  bind
	count uint32
	// look is 1 + the offset of the packet that completes the event
	// (the TIP after its FUP, the FUP after MODE.TSX or MODE.Exec,
	// PSBEND), 0 for none: libipt's event decoder keeps that packet as
	// its lookahead until the event is delivered
	// (pt_evt_decode_fup, pt_evt_get_offset), so an error meanwhile is
	// reported at its offset.
	look uint64
}

// evStatus is a PSB+ status update: it checks the IP and is not reported.
const evStatus EventKind = 255

// retStackSize is libipt's return stack depth: older entries are overwritten.
const retStackSize = 64

// Decoder reconstructs the flow of one trace. It is not safe for concurrent
// use; Decode may be called again for another trace (the block cache is kept).
// Close ends it, handing its memory to the next New.
type Decoder struct {
	mem  Memory
	gen  Generationer
	view Viewer // mem's, when it has one
	opts Options
	h    Handler
	eh   EdgeHandler // h's, when it has Edges
	pd   decode.PacketDecoder
	pb   packetBatch
	pk   decode.Packet
	// back is a packet read ahead and pushed back.
	back    decode.Packet
	hasBack bool

	ip      uint64
	enabled bool
	// inStub: the flow is inside a trap or call stub (Stub), waiting
	// for the packet that leaves it.
	inStub bool
	mode   Mode
	// stash is a MODE.Exec waiting for the IP packet it binds to, with
	// its IF bit.
	stash   Mode
	stashIF bool
	iflag   int8 // RFLAGS.IF: -1 unknown
	inTX    bool
	// held are MWAIT and PWRE events waiting for their EXSTOP, which
	// gives MWAIT its IP and is reported between them (libipt's order).
	held  [2]Event
	nHeld int
	// evd is the event data (EVD) waiting for its CFE.
	evd    [3]uint64
	evdHas uint8

	tnt     uint64 // pending TNT bits, the oldest in bit tntN-1
	tntN    uint8
	tip     uint64
	tipOK   bool
	tipSupp bool
	eos     bool

	q   []queued
	qEv Event
	// unnamed are PTWRITEs of a stub that no Stub names, waiting for the
	// next branch (or any other event) to be reported after it.
	unnamed []Event
	ins     Insn
	errv    Event

	stack [retStackSize]uint64
	sp    int // entries in use (≤ retStackSize)
	top   int // index of the next push

	// resumeIP is where tracing went off (resumeOK): an enable there
	// is a resume.
	resumeIP uint64
	resumeOK bool

	steps int
	// sinceRef counts the instructions executed since the last IP
	// reference: an IP packet the flow reached, or a TRIG, from which
	// the next TRIG's icnt counts.
	sinceRef uint32
	// resyncing: after an error, a TIP (or other IP) resumes the flow
	// (ResyncOnError). resyncOn: tracing was on where the error was, so
	// a TIP.PGE while resynchronising first ends it (libipt's order).
	resyncing bool
	resyncOn  bool
	// errPos is the stream position of the last error (errSeen).
	errPos  uint64
	errSeen bool
	// errIP is the IP of the last instruction decoded or tried since the
	// sync, 0 before one: what ptxed reports with an error.
	errIP uint64
	// clock estimates the time (Options.Time); lastTSC is the time of
	// the last event, against which ticks are told.
	clock   *decode.Clock
	lastTSC uint64
	cache   blockCache
	buf     [x86insn.MaxLen]byte
	c       Counters
	fp      fastState

	// src is the Stream feeding the packet decoder (nil in Decode), base
	// the stream offset of the first byte the packet decoder holds.
	src  *Stream
	base uint64
	// closed: Close handed the cache's memory on.
	closed bool
}

// New returns a decoder that reads code from mem; its cache is empty, made
// over a closed decoder's memory when Close kept some.
func New(mem Memory, opts Options) *Decoder {
	d := &Decoder{mem: mem, opts: opts}
	d.fp.wndAt = wndWarm
	if opts.Time != nil {
		d.clock = decode.NewClock(*opts.Time)
	}
	d.gen, _ = mem.(Generationer)
	d.view, _ = mem.(Viewer)
	if d.opts.MaxInsns <= 0 {
		d.opts.MaxInsns = 1 << 20
	}
	takeSpare(&d.cache)
	d.cache.init()
	if d.gen != nil {
		// The empty cache is the memory's as it is now: the first
		// Decode does not drop it (clearing the table it just got).
		d.cache.gen = d.gen.Generation()
	}
	return d
}

// Counters returns what the decoder counted so far.
func (d *Decoder) Counters() Counters { return d.c }

// errStop ends a segment after an error was reported.
var errStop = errors.New("stop")

// Decode decodes trace from its first PSB to its end, calling h. Errors are
// reported to h as EvError events (and counted); decoding resynchronises
// after each.
func (d *Decoder) Decode(trace []byte, h Handler) {
	d.src, d.base = nil, 0
	d.decode(trace, h)
}

// decode is Decode's loop; a Stream runs it over its window.
func (d *Decoder) decode(trace []byte, h Handler) {
	if d.closed {
		panic("flow: Decoder used after Close")
	}
	d.h = h
	d.eh, _ = h.(EdgeHandler)
	defer d.flushUnnamed()
	d.resetPackets(trace)
	d.resetState()
	// A new trace starts as a new decoder would: only the caches carry
	// over (the mode outlives a sync within one trace, as libipt's).
	d.mode, d.sinceRef = ModeUnknown, 0
	if d.clock != nil {
		d.clock.Reset()
		d.lastTSC = 0
	}
	if d.gen != nil {
		d.cache.check(d.gen.Generation())
	}
	resync := false
	for {
		if !resync {
			if err := d.syncForward(); err != nil {
				return
			}
			d.resetState()
			d.hasBack, d.errIP, d.errSeen = false, 0, false
			if err := d.next(); err != nil {
				if d.fail(err) {
					continue
				}
				return
			}
			if d.pk.Kind != decode.PSB {
				continue
			}
			if err := d.psb(true); err != nil {
				if d.fail(err) {
					continue
				}
				return
			}
		}
		resync = false
		err := d.run()
		if err == nil {
			return
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if !d.fail(err) {
			return
		}
		if d.opts.ResyncOnError && errors.Is(err, ErrBadStatus) {
			// libipt's resync takes the same PSB+ again and
			// fails the same way; it goes on at the next PSB.
			d.errv.Flags |= ResyncFailed
			d.c.Errors++
			d.h.Event(&d.errv)
			continue
		}
		if d.opts.ResyncOnError && !errors.Is(err, ErrLost) && d.progressed() {
			// Go on from here with tracing off: the next packet
			// that gives an IP turns it on again. As libipt's
			// resync, it goes on with the events already read: an
			// interrupt or a disable takes effect at once; a
			// status or an event at an IP (TSX, MODE.Exec with its
			// FUP) is where the flow goes on.
			mode, on, q := d.mode, d.enabled, d.q
			d.resetState()
			d.mode, d.resyncing, resync = mode, true, true
			d.resyncOn = on
			d.q = q
			if len(q) > 0 && (q[0].bind == bindIP && q[0].ev.HasIP || q[0].bind == bindStatus) &&
				q[0].ev.Kind != EvInterrupt && q[0].ev.Kind != EvAsyncDisabled {
				d.ip, d.enabled = q[0].ev.IP, true
			}
		}
	}
}

// progressed tells whether the stream moved since the last error, so that
// an error that leaves its packet unread cannot repeat forever.
func (d *Decoder) progressed() bool {
	pos := d.unconsumed()
	ok := !d.errSeen || pos != d.errPos
	d.errPos, d.errSeen = pos, true
	return ok
}

// unconsumed is the stream offset of the next packet the flow did not
// consume: the one read ahead and pushed back, if any, else pos.
func (d *Decoder) unconsumed() uint64 {
	if d.hasBack {
		return d.base + d.back.Offset
	}
	return d.pos()
}

// fail reports err unless it already was; it tells whether decoding can go on.
func (d *Decoder) fail(err error) bool {
	if err == errStop {
		return true
	}
	if errors.Is(err, io.EOF) {
		return false
	}
	d.report(err)
	return true
}

// report sends an EvError for err at the current position.
func (d *Decoder) report(err error) {
	// The offset of the next packet not consumed, as libipt reports.
	off := d.unconsumed()
	for i := range d.q {
		if l := d.q[i].look; l > 0 && l-1 < off {
			off = l - 1
		}
	}
	var pe *decode.PacketError
	if errors.As(err, &pe) {
		off = d.base + pe.Offset
		switch {
		case errors.Is(err, decode.ErrBadOpcode):
			err = ErrBadOpcode
		case errors.Is(err, decode.ErrTruncated):
			err = ErrEOS
		default:
			err = ErrBadPacket
		}
	}
	d.flushUnnamed()
	d.c.Errors++
	d.errv = Event{Kind: EvError, IP: d.errIP, HasIP: true, Offset: off, Err: err}
	d.h.Event(&d.errv)
}

// resetState forgets the flow: after a PSB sync or an error.
func (d *Decoder) resetState() {
	d.enabled, d.ip, d.stash, d.iflag, d.inTX = false, 0, ModeUnknown, -1, false
	d.inStub = false
	d.resyncing, d.resyncOn = false, false
	d.nHeld, d.evdHas, d.evd = 0, 0, [3]uint64{}
	d.tnt, d.tntN, d.tipOK, d.eos = 0, 0, false, false
	d.q = d.q[:0]
	d.sp, d.top = 0, 0
	d.resumeOK = false
	d.steps = 0
}

// next reads the next packet into d.pk, skipping those that do not bear on
// the flow.
func (d *Decoder) next() error {
	if d.hasBack {
		d.hasBack = false
		d.pk = d.back
		return nil
	}
	return d.nextPacket()
}

// unread pushes d.pk back.
func (d *Decoder) unread() { d.back, d.hasBack = d.pk, true }

// setMode takes a MODE.Exec's mode and IF bit as the current state.
func (d *Decoder) setMode(m Mode, ifl bool) {
	d.mode, d.iflag = m, iflagOf(ifl)
}

func execMode(p *decode.Packet) Mode {
	switch {
	case p.Has(decode.FlagCSL):
		return Mode64
	case p.Has(decode.FlagCSD):
		return Mode32
	}
	return Mode16
}

// applyStash makes a waiting MODE.Exec current and queues its event when
// the mode changes.
func (d *Decoder) applyStash() {
	if d.stash == ModeUnknown {
		return
	}
	m, f := d.stash, d.stashIF
	d.stash = ModeUnknown
	d.modeEvents(m, f, d.ip, bindNow)
}

// modeEvents queues the events of a MODE.Exec taking effect at ip: the
// mode when it changed, IF when it changed and is asked for.
func (d *Decoder) modeEvents(m Mode, f bool, ip uint64, b bind) {
	if m != d.mode {
		d.push(Event{Kind: EvExecMode, Mode: m, IP: ip, HasIP: true}, b)
	}
	if fl := iflagOf(f); d.opts.Iflags && fl != d.iflag {
		d.push(Event{Kind: EvIflags, Payload: uint64(fl), IP: ip, HasIP: true}, b)
	}
}

// iflagOf is the iflag state of a MODE.Exec's IF bit.
func iflagOf(f bool) int8 {
	if f {
		return 1
	}
	return 0
}

func (d *Decoder) push(e Event, b bind) {
	d.stamp(&e)
	d.q = append(d.q, queued{ev: e, bind: b})
}

// completedBy notes that the packet at off completed the event queued
// last (queued.look).
func (d *Decoder) completedBy(off uint64) { d.q[len(d.q)-1].look = off + 1 }

// psbState is what the packets of a PSB+ told so far: the last FUP's IP
// and the last MODE.Exec.
type psbState struct {
	ip     uint64
	hasIP  bool
	mode   Mode
	modeIF bool
}

// psb reads a PSB+ (d.pk is the PSB). At a sync (first) it sets the state;
// later its IP binds silently as a status update.
func (d *Decoder) psb(first bool) error {
	s := psbState{mode: ModeUnknown}
	for {
		if err := d.next(); err != nil {
			return err
		}
		switch d.pk.Kind {
		case decode.PSBEnd:
			if d.psbEnd(&s, first) {
				d.push(Event{Kind: evStatus, IP: s.ip, HasIP: true}, bindStatus)
				d.completedBy(d.pk.Offset)
			}
			return nil
		case decode.OVF:
			// An overflow inside PSB+: what follows it decides.
			if s.mode != ModeUnknown {
				d.setMode(s.mode, s.modeIF)
			}
			return d.overflow()
		case decode.MNT:
			// Maintenance is an event even in PSB+.
			d.push(Event{Kind: EvMNT, Payload: d.pk.Payload}, bindNow)
		default:
			if ok, err := d.psbPacket(&s, &d.pk, first); err != nil {
				// The status contradicts the flow (libipt
				// reports it at the MODE.Exec).
				d.unread()
				d.errIP = d.ip
				return err
			} else if !ok {
				return ErrBadContext
			}
		}
	}
}

// psbPacket takes p, a packet inside a PSB+ other than its PSBEND, OVF and
// MNT, into s; it tells whether a PSB+ may hold p. A MODE.Exec that
// contradicts the flow later than the sync is ErrBadStatus.
func (d *Decoder) psbPacket(s *psbState, p *decode.Packet, first bool) (bool, error) {
	switch p.Kind {
	case decode.FUP:
		s.ip, s.hasIP = p.IP, !p.Suppressed()
	case decode.ModeExec:
		s.mode, s.modeIF = execMode(p), p.Has(decode.FlagIF)
		if !first && d.enabled && d.mode != ModeUnknown && s.mode != d.mode {
			return false, ErrBadStatus
		}
	case decode.ModeTSX:
		d.inTX = p.Has(decode.FlagInTX)
	case decode.PIP, decode.VMCS, decode.CBR:
		// Status; ptxed does not print status updates.
	default:
		return false, nil
	}
	return true, nil
}

// psbEnd takes the state of a PSB+ at its PSBEND: the mode, and tracing on
// at its IP at a sync or where tracing was off, off where it has none. It
// tells whether its IP remains, as a status update binding at s.ip.
func (d *Decoder) psbEnd(s *psbState, first bool) (status bool) {
	if s.mode != ModeUnknown {
		d.setMode(s.mode, s.modeIF)
	}
	if first || !d.enabled {
		d.enabled, d.ip = s.hasIP, s.ip
		d.entered()
		return false
	}
	if !s.hasIP {
		// Tracing went off without a TIP.PGD we saw.
		d.enabled = false
		return false
	}
	return true
}

// overflow handles OVF (d.pk): decoding resumes at the next FUP (or
// TIP/TIP.PGE), and the overflow is reported there.
func (d *Decoder) overflow() error {
	d.tnt, d.tntN, d.tipOK = 0, 0, false
	// Events waiting for the flow are lost with it; those due now stay.
	n := 0
	for _, q := range d.q {
		if q.bind == bindNow {
			d.q[n] = q
			n++
		}
	}
	d.q = d.q[:n]
	// Without a FUP to resume at, the overflow is reported before the
	// events in its shadow (libipt's order).
	lost := func() {
		d.enabled = false
		d.q = append(d.q, queued{})
		copy(d.q[n+1:], d.q[n:])
		d.q[n] = queued{ev: Event{Kind: EvOverflow}, bind: bindNow}
		d.stamp(&d.q[n].ev)
	}
	for {
		if err := d.next(); err != nil {
			if errors.Is(err, io.EOF) {
				lost()
				return nil
			}
			return err
		}
		if e, ok := simpleEvent(&d.pk); ok {
			// Events in the overflow's shadow come before it.
			d.push(e, bindNow)
			continue
		}
		switch d.pk.Kind {
		case decode.ModeExec:
			d.stash, d.stashIF = execMode(&d.pk), d.pk.Has(decode.FlagIF)
			continue
		case decode.FUP:
			if d.pk.Suppressed() {
				return ErrNoIP
			}
			d.push(Event{Kind: EvOverflow, IP: d.pk.IP, HasIP: true}, bindNow)
			d.enabled, d.ip = true, d.pk.IP
			d.applyStash()
			d.entered()
			return nil
		case decode.TIP:
			d.push(Event{Kind: EvOverflow, IP: d.pk.IP, HasIP: !d.pk.Suppressed()}, bindNow)
			d.enabled, d.ip = !d.pk.Suppressed(), d.pk.IP
			d.applyStash()
			d.entered()
			return nil
		default:
			d.unread()
		}
		lost()
		return nil
	}
}

// fupFor reads the FUP that gives an event its IP.
func (d *Decoder) fupFor(e *Event) error {
	if err := d.next(); err != nil {
		return err
	}
	if d.pk.Kind != decode.FUP {
		// The FUP was lost (an overflow came first): the event
		// has no IP.
		d.unread()
		return nil
	}
	e.IP, e.HasIP = d.pk.IP, !d.pk.Suppressed()
	return nil
}

// read reads packets until it has something for the walk: TNT bits, a
// TIP, or events. It sets eos at the end of the trace.
func (d *Decoder) read() error {
	if err := d.next(); err != nil {
		if errors.Is(err, io.EOF) {
			d.flushHeld(bindNow)
			d.eos = true
			return nil
		}
		return err
	}
	p := &d.pk
	if d.nHeld > 0 && p.Kind != decode.Mwait && p.Kind != decode.Pwre && p.Kind != decode.Exstop {
		// No EXSTOP came: the held events go as they are.
		d.flushHeld(bindNow)
	}
	switch p.Kind {
	case decode.TNT8, decode.TNT64:
		if int(d.tntN)+int(p.Bits) > 64 {
			return ErrBadQuery
		}
		d.tnt = d.tnt<<p.Bits | p.Payload
		d.tntN += p.Bits
	case decode.TIP:
		d.tip, d.tipOK, d.tipSupp = p.IP, true, p.Suppressed()
	case decode.TIPPGD:
		// A MODE.Exec before TIP.PGD has no code to apply to.
		d.stash = ModeUnknown
		d.push(Event{Kind: EvDisabled, IP: p.IP, HasIP: !p.Suppressed()}, bindBranch)
	case decode.TIPPGE:
		if p.Suppressed() {
			return ErrNoIP
		}
		if d.resyncing && d.resyncOn {
			d.resyncOn = false
			d.push(Event{Kind: EvDisabled}, bindNow)
		}
		d.push(Event{Kind: EvEnabled, IP: p.IP, HasIP: true}, bindNow)
	case decode.FUP:
		return d.fup()
	case decode.ModeExec:
		m, f := execMode(p), p.Has(decode.FlagIF)
		if err := d.next(); err != nil && !errors.Is(err, io.EOF) {
			return err
		} else if err == nil && d.pk.Kind == decode.FUP && !d.pk.Suppressed() {
			// MODE.Exec + FUP: the change happens at the FUP's IP
			// (while tracing is off, it is reported at once).
			b := bindIP
			if !d.enabled {
				b = bindNow
			}
			n := len(d.q)
			d.modeEvents(m, f, d.pk.IP, b)
			for i := n; i < len(d.q) && b == bindIP; i++ {
				d.q[i].look = d.pk.Offset + 1 // each completed by the FUP
			}
			return nil
		} else if err == nil {
			d.unread()
		}
		d.stash, d.stashIF = m, f
	case decode.ModeTSX:
		e := Event{Kind: EvTSX}
		if p.Has(decode.FlagAbort) {
			e.Flags |= Aborted
		} else if p.Has(decode.FlagInTX) {
			e.Flags |= Speculative
		}
		if !d.enabled {
			d.push(e, bindNow)
			return nil
		}
		if err := d.fupFor(&e); err != nil {
			return err
		}
		d.push(e, bindIP)
		if !d.hasBack && d.pk.Kind == decode.FUP {
			d.completedBy(d.pk.Offset)
		}
		if e.Flags&Aborted != 0 {
			// An abort is an asynchronous branch: a TIP (or
			// TIP.PGD) follows the FUP.
			return d.asyncAfter(e.IP)
		}
	case decode.PIP:
		e := Event{Kind: EvPaging, Payload: p.Payload}
		if p.Has(decode.FlagNR) {
			e.Flags |= NonRoot
		}
		d.push(e, bindTIP)
	case decode.VMCS:
		d.push(Event{Kind: EvVMCS, Payload: p.Payload}, bindTIP)
	case decode.OVF:
		return d.overflow()
	case decode.PSB:
		return d.psb(false)
	case decode.PSBEnd:
		return ErrBadContext
	case decode.PTW:
		e := Event{Kind: EvPTWrite, Payload: p.Payload, Aux: uint32(p.Bits)}
		if p.Has(decode.FlagIP) {
			if err := d.fupFor(&e); err != nil {
				return err
			}
		}
		if e.HasIP && d.outside(e.IP) {
			// A probe's record from its stub: not part of the
			// flow, which goes on as if the site's instruction ran.
			// It is reported before the site when the stub names it,
			// else now (after the last branch the trace showed).
			b := d.stubPTW(&e)
			if b == bindNow && d.enabled && !d.inStub && d.stub(e.IP) < 0 {
				if len(d.unnamed) >= maxQueued {
					d.flushUnnamed()
				}
				d.unnamed = append(d.unnamed, e)
				return nil
			}
			d.push(e, b)
			return nil
		}
		if !d.enabled && d.resyncing && e.HasIP {
			// Resynchronised: the flow goes on at the PTWRITE.
			d.ip, d.enabled = e.IP, true
		}
		if !d.enabled {
			d.push(e, bindNow)
			return nil
		}
		d.push(e, bindPTW)
	case decode.EVD:
		// CR2 goes with an interrupt, VMX data with a VM exit: data
		// of both cannot be for one event.
		if p.Type < uint8(len(d.evd)) && d.evdHas != 0 && (d.evdHas == 1) != (p.Type == 0) {
			d.unread()
			return ErrBadContext
		}
		if p.Type < uint8(len(d.evd)) {
			d.evd[p.Type] = p.Payload
			d.evdHas |= 1 << p.Type
		}
	case decode.CFE:
		e := Event{Kind: EvCFE, Type: p.Type, Payload: p.Payload, Data: d.evd, Has: d.evdHas}
		// Each event gets only its own data.
		d.evdHas, d.evd = 0, [3]uint64{}
		if e.Has&^cfeData(e.Type) != 0 {
			// Event data the event does not take: the CFE is
			// the error.
			d.unread()
			return ErrBadContext
		}
		if err := d.next(); err != nil && !errors.Is(err, io.EOF) {
			return err
		} else if err == nil && d.pk.Kind == decode.FUP && !d.pk.Suppressed() {
			// The event hit at the FUP's IP; the FUP also starts
			// the asynchronous branch or disable that follows.
			e.IP, e.HasIP = d.pk.IP, true
			if !cfeKnown(e.Type) {
				// libipt skips event types it does not know.
				return nil
			}
			if d.enabled && cfeAtInsn(e.Type) {
				// The FUP is the instruction's (iret, VM entry,
				// ...); the event comes with its branch, which
				// takes the TIP or TIP.PGD that follows.
				d.push(e, bindTIP)
				return nil
			}
			if !d.enabled {
				d.push(e, bindNow)
				return nil
			}
			d.push(e, bindIP)
			return d.fup()
		} else if err == nil {
			d.unread()
		}
		if !cfeKnown(e.Type) {
			return nil
		}
		if d.enabled {
			// It binds to the branch that takes the next TIP (iret).
			d.push(e, bindTIP)
			return nil
		}
		d.push(e, bindNow)
	case decode.Mwait, decode.Pwre:
		if d.nHeld == len(d.held) {
			d.flushHeld(bindNow)
		}
		d.held[d.nHeld], _ = simpleEvent(p)
		d.nHeld++
	case decode.Exstop, decode.Trig:
		e := Event{Kind: EvExstop}
		if p.Kind == decode.Trig {
			e = Event{Kind: EvTrig, Payload: p.Payload}
			if p.Has(decode.FlagMult) {
				e.Flags |= Mult
			}
		}
		if !p.Has(decode.FlagIP) {
			if p.Kind == decode.Trig && p.Has(decode.FlagICNTV) && d.enabled {
				// The trigger hit icnt instructions after the last
				// IP reference (which the flow may have passed:
				// packets are read lazily); it gets that IP.
				if p.Aux > d.sinceRef {
					d.stamp(&e)
					d.q = append(d.q, queued{ev: e, bind: bindCount, count: p.Aux - d.sinceRef})
					return nil
				}
				e.IP, e.HasIP = d.ip, true
			}
			d.pushExstop(e, bindNow)
			return nil
		}
		if err := d.fupFor(&e); err != nil {
			return err
		}
		if !e.HasIP {
			d.pushExstop(e, bindNow)
			return nil
		}
		d.pushExstop(e, bindIP)
	default:
		if e, ok := simpleEvent(p); ok {
			d.push(e, bindNow)
			return nil
		}
		// BBP/BIP/BEP (PEBS) carry no flow.
	}
	return nil
}

// cfeKnown tells whether libipt knows a CFE type (it skips the others).
func cfeKnown(typ uint8) bool {
	return typ >= CFEIntr && typ <= CFESyscall && typ != 11
}

// cfeAtInsn tells whether a CFE type is the event of an instruction (its
// FUP gives the instruction's IP) rather than asynchronous (the FUP gives
// the IP where it hit).
func cfeAtInsn(typ uint8) bool {
	switch typ {
	case CFEIret, CFEVMEntry, CFEUiret, CFESyscall:
		return true
	}
	return false
}

// cfeData is the event data (EVD types, a bit each) a CFE type takes: CR2
// for an interrupt, VMX qualification and reason for a VM exit.
func cfeData(typ uint8) uint8 {
	switch typ {
	case CFEIntr:
		return 1 << 0
	case CFEVMExit, CFEVMExitIntr:
		return 1<<1 | 1<<2
	}
	return 0
}

// pushExstop queues e; for an EXSTOP, with the MWAIT held before it (at
// its IP) and the PWRE after it.
func (d *Decoder) pushExstop(e Event, b bind) {
	if e.Kind != EvExstop {
		d.push(e, b)
		return
	}
	for i := range d.held[:d.nHeld] {
		if d.held[i].Kind == EvMwait {
			d.held[i].IP, d.held[i].HasIP = e.IP, e.HasIP
			d.push(d.held[i], b)
		}
	}
	d.push(e, b)
	for i := range d.held[:d.nHeld] {
		if d.held[i].Kind != EvMwait {
			// Bound where the EXSTOP is; PWRE shows no IP.
			d.held[i].IP = e.IP
			d.push(d.held[i], b)
		}
	}
	d.nHeld = 0
}

// flushHeld queues the held events as they are.
func (d *Decoder) flushHeld(b bind) {
	for i := range d.held[:d.nHeld] {
		d.push(d.held[i], b)
	}
	d.nHeld = 0
}

// simpleEvent makes the event of a packet that takes effect where it
// stands and needs no other packet.
func simpleEvent(p *decode.Packet) (Event, bool) {
	switch p.Kind {
	case decode.Stop:
		return Event{Kind: EvStop}, true
	case decode.MNT:
		return Event{Kind: EvMNT, Payload: p.Payload}, true
	case decode.CBR:
		return Event{Kind: EvCBR, Payload: p.Payload}, true
	case decode.Mwait:
		return Event{Kind: EvMwait, Payload: p.Payload, Aux: p.Aux}, true
	case decode.Pwre:
		e := Event{Kind: EvPwre, Payload: uint64(p.Type)}
		if p.Has(decode.FlagHW) {
			e.Flags |= HW
		}
		return e, true
	case decode.Pwrx:
		return Event{Kind: EvPwrx, Payload: uint64(p.Type), Aux: p.Aux}, true
	}
	return Event{}, false
}

// asyncAfter reads what follows an asynchronous event's FUP at ip: a TIP
// (the branch it caused) or TIP.PGD; anything else is left for later.
func (d *Decoder) asyncAfter(ip uint64) error {
	if err := d.next(); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	switch d.pk.Kind {
	case decode.TIP:
		d.push(Event{Kind: EvInterrupt, At: ip, IP: d.pk.IP, HasIP: !d.pk.Suppressed()}, bindIP)
	case decode.TIPPGD:
		d.push(Event{Kind: EvAsyncDisabled, At: ip, IP: d.pk.IP, HasIP: !d.pk.Suppressed()}, bindIP)
	default:
		d.unread()
		return nil
	}
	d.completedBy(d.pk.Offset)
	return nil
}

// fup handles a FUP (d.pk) outside PSB+: an asynchronous event at its IP,
// what follows says which.
func (d *Decoder) fup() error {
	at, supp := d.pk.IP, d.pk.Suppressed()
	if supp {
		return ErrNoIP
	}
	// PIP and VMCS between the FUP and its TIP are reported after the
	// branch, the last first (libipt's order).
	var side [4]Event
	n := 0
	for {
		if err := d.next(); err != nil {
			if errors.Is(err, io.EOF) {
				return ErrBadContext
			}
			return err
		}
		p := &d.pk
		switch p.Kind {
		case decode.ModeExec:
			d.stash, d.stashIF = execMode(p), p.Has(decode.FlagIF)
			continue
		case decode.TIP, decode.TIPPGD:
			kind := EvInterrupt
			if p.Kind == decode.TIPPGD {
				kind = EvAsyncDisabled
			}
			d.push(Event{Kind: kind, At: at, IP: p.IP, HasIP: !p.Suppressed()}, bindIP)
			d.completedBy(p.Offset)
			// Queued behind the branch, they follow it.
			for i := n - 1; i >= 0; i-- {
				d.push(side[i], bindNow)
			}
			return nil
		case decode.PIP, decode.VMCS:
			if n == len(side) {
				return ErrBadContext
			}
			e := Event{Kind: EvPaging, Payload: p.Payload, IP: at, HasIP: true}
			if p.Kind == decode.VMCS {
				e.Kind = EvVMCS
			} else if p.Has(decode.FlagNR) {
				e.Flags |= NonRoot
			}
			side[n] = e
			n++
			continue
		}
		d.unread()
		return ErrBadContext
	}
}

// eventIP is the IP a queued event waits for.
func (q *queued) eventIP() uint64 {
	if q.ev.Kind == EvInterrupt || q.ev.Kind == EvAsyncDisabled {
		return q.ev.At
	}
	return q.ev.IP
}

// deliver fires the queued events that are due before the instruction at
// d.ip; it tells whether any bound event still waits.
func (d *Decoder) deliver() {
	for len(d.q) > 0 {
		q := &d.q[0]
		switch q.bind {
		case bindIP, bindStatus:
			if d.enabled && d.ip != q.eventIP() {
				return
			}
		case bindBranch, bindPTW, bindTIP:
			if d.enabled {
				return
			}
		case bindCount:
			if d.enabled && q.count > 0 {
				return
			}
		}
		d.fire(0)
	}
}

// fire takes effect of and reports the queued event i.
func (d *Decoder) fire(i int) {
	d.qEv = d.q[i].ev
	if d.q[i].bind == bindCount {
		d.qEv.IP, d.qEv.HasIP = d.ip, true
	}
	d.q = append(d.q[:i], d.q[i+1:]...)
	d.fireEv()
}

// fireEv takes effect of and reports d.qEv, an event due now.
func (d *Decoder) fireEv() {
	e := &d.qEv
	d.steps = 0
	if e.HasIP && e.Kind != EvPTWrite {
		d.sinceRef = 0
	}
	switch e.Kind {
	case EvEnabled:
		if d.resumeOK && d.resumeIP == e.IP {
			e.Flags |= Resumed
		}
		d.enabled, d.ip = true, e.IP
		d.resumeOK = false
		// Tested here first: the fast path enables often, with
		// neither a MODE.Exec waiting nor stubs.
		if d.stash != ModeUnknown {
			d.applyStash()
		}
		if len(d.opts.Stubs) > 0 {
			d.entered()
		}
	case EvDisabled:
		// d.ip is the fall-through of the branch that disabled.
		d.enabled, d.resumeIP, d.resumeOK = false, d.ip, d.enabled
		if e.HasIP {
			d.resumeIP = e.IP
		}
	case EvAsyncDisabled:
		d.enabled, d.resumeIP, d.resumeOK = false, e.At, d.enabled
	case EvInterrupt:
		if e.HasIP {
			d.branch(e.At, e.IP, BrInterrupt)
			d.ip, d.enabled = e.IP, true
			d.applyStash()
		} else {
			d.enabled = false
		}
	case EvOverflow:
		d.sp, d.top = 0, 0
		d.inTX = false
	case EvTSX:
		d.inTX = e.Flags&Speculative != 0
	case EvExecMode:
		d.mode = e.Mode
	case EvIflags:
		d.iflag = int8(e.Payload)
	case evStatus:
		return
	}
	d.emit(e)
}

// branch reports a branch, then the unnamed stubs' PTWRITEs read before
// it: the trace names no site for them, and the branch that the trace
// showed last before the probe hit is the one into the site.
func (d *Decoder) branch(from, to uint64, k BranchKind) {
	d.h.Branch(from, to, k)
	if len(d.unnamed) > 0 {
		d.flushUnnamed()
	}
}

// flushUnnamed reports the unnamed stubs' PTWRITEs read so far.
func (d *Decoder) flushUnnamed() {
	for i := range d.unnamed {
		d.c.Events++
		d.h.Event(&d.unnamed[i])
	}
	d.unnamed = d.unnamed[:0]
}

// emit reports e.
func (d *Decoder) emit(e *Event) {
	if len(d.unnamed) > 0 {
		d.flushUnnamed()
	}
	d.c.Events++
	d.lastTSC = e.TSC
	d.h.Event(e)
}

// newEv makes d.qEv a new event: kind at ip (hasIP), stamped, every other
// field zero. One struct store: fewer instructions than field by field
// (DESIGN §7's sixteenth pass), at the cost of a bulk write barrier
// (wbZero, for Err) while the collector marks.
func (d *Decoder) newEv(kind EventKind, ip uint64, hasIP bool) *Event {
	e := &d.qEv
	*e = Event{Kind: kind, HasIP: hasIP, IP: ip}
	d.stamp(e)
	return e
}

// stamp gives e the time now (Options.Time).
func (d *Decoder) stamp(e *Event) {
	if d.clock != nil {
		e.TSC = d.clock.TSC()
	}
}

// TSC returns the estimated time stamp counter at the packet decoded last
// (the clock is advanced per timing packet, so this costs no work per
// branch); ok is false without Options.Time or before the trace's first
// TSC.
func (d *Decoder) TSC() (tsc uint64, ok bool) {
	if d.clock == nil || !d.clock.HasTSC() {
		return 0, false
	}
	return d.clock.TSC(), true
}

// tick reports an EvTick at the branch at ip when the time changed since
// the last event (Options.Ticks), as libipt does after each query for a
// branch.
func (d *Decoder) tick(ip uint64) {
	if !d.opts.Ticks || d.clock == nil || d.clock.TSC() == d.lastTSC {
		return
	}
	d.emit(d.newEv(EvTick, ip, true))
}
