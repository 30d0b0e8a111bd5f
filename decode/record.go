package decode

import (
	"bytes"
	"encoding/binary"
	"io"
)

// HeaderMagic is the low 40 bits of a ptwrite uprobe header word ("PTRW1").
const HeaderMagic = 0x5054525731

// Output receives what an Assembler produces. The pointers it is given are
// only valid during the call: the assembler reuses them.
type Output interface {
	// Record is called for each complete probe record.
	Record(r *Record)
	// Manual is called for each PTWRITE payload outside a probe record.
	Manual(m *Manual)
}

// Manual is one PTWRITE payload that is not part of a probe record.
type Manual struct {
	Payload uint64
	// IP is the address of the PTWRITE, known (HasIP) only when the packet
	// announced a FUP and the FUP followed.
	IP    uint64
	HasIP bool
	CPU   int32
	Time  uint64 // nanoseconds, 0 when unknown
}

// Assembler turns the PT packets of one CPU's stream into probe records and
// manual ptwrites, per DESIGN §1 and §5:
//
//   - An 8-byte PTW payload whose low 40 bits are HeaderMagic is a header: it
//     ends any open record (its missing words count as dropped) and, when the
//     event id is known, opens a record of nargs words. An empty record
//     (nargs 0) is complete at once.
//   - Each following payload (4 or 8 bytes, zero-extended) fills the next
//     argument slot; words beyond the event's declared arguments count as
//     unknown and are not printed; fewer words than arguments print as many
//     as arrived in the header's count.
//   - A header with an id not in the table counts as stray and is printed as
//     a manual ptwrite; so are the nargs words it announces (counted stray
//     too), since without the event they cannot be interpreted.
//   - Any other payload is a manual ptwrite and counts as stray.
//
// A record never spans an OVF, a decoder error (after which the decoder
// resynchronizes at the next PSB), a Gap or a ContextSwitch, nor a PIP (CR3
// change) outside PSB+: each ends the open record and counts its missing
// words as dropped. A plain PSB+ does not: the hardware inserts one every few
// KiB regardless of what the program does, so it can fall between the words
// of one probe hit. A PSB reached by resynchronization after an OVF or error
// therefore never finds an open record: the OVF or error already dropped it.
//
// Time comes from the last TSC packet, advanced by the MTC packets since
// when SetTiming describes them, and converted by the function given to
// SetTimeConv (none: Time 0). The assembler allocates nothing per packet or
// record.
type Assembler struct {
	events eventTable
	out    Output
	conv   func(tsc uint64) uint64
	cpu    int32
	tid    int32
	pid    int32

	dec PacketDecoder
	pkt Packet
	c   Counters

	rec       Record
	open      bool // rec holds an incomplete record
	want, got int  // announced and received words of the open record

	man     Manual
	manPend bool // man waits for the FUP its PTW announced

	tsc     uint64
	haveTSC bool
	// timing, when on, estimates the TSC between TSC packets from MTC
	// packets, as libipt does (ptTime).
	timing PtdumpOptions
	mtcOn  bool
	tm     ptTime
	lastIP uint64
	inPSB  bool

	// carry holds the start of a packet cut by the end of a Feed buffer,
	// or, while unsynced, the tail in which a PSB may begin.
	carry    [maxPacket - 1]byte
	ncarry   int
	scratch  [maxPacket - 1 + 2*maxPacket]byte
	unsynced bool
}

// maxPacket is the longest packet (PSB); a longer CYC is an error.
const maxPacket = 16

// NewAssembler returns an assembler for one CPU's stream that looks event
// ids up in events and writes to out. CPU and TID start unknown (-1).
// The assembler keeps its own copy of the table; see SetEvents.
func NewAssembler(events map[uint16]*Event, out Output) *Assembler {
	a := &Assembler{out: out, cpu: -1, tid: -1}
	a.dec.reuseErr = true
	a.SetEvents(events)
	return a
}

// SetEvents replaces the event table, e.g. after a probe was added. Records
// already open keep their event.
func (a *Assembler) SetEvents(events map[uint16]*Event) { a.events.build(events) }

// eventTable is an open-addressing hash table from event id to event: a
// lookup per record header must cost less than a Go map access, which was a
// quarter of records-only decoding.
type eventTable struct {
	slots []eventSlot
	mask  uint32
}

type eventSlot struct {
	ev *Event
	id uint16
}

func (t *eventTable) build(events map[uint16]*Event) {
	size := 8
	for size < 2*len(events) {
		size *= 2
	}
	t.slots = make([]eventSlot, size)
	t.mask = uint32(size - 1)
	for id, ev := range events {
		if ev == nil {
			continue
		}
		i := t.hash(id)
		for t.slots[i].ev != nil {
			i = (i + 1) & t.mask
		}
		t.slots[i] = eventSlot{ev: ev, id: id}
	}
}

func (t *eventTable) hash(id uint16) uint32 { return uint32(id) * 0x9e3779b1 >> 16 & t.mask }

// get returns the event with the id, or nil. The table is never full (at
// most half its slots are used), so the probe ends at an empty slot.
func (t *eventTable) get(id uint16) *Event {
	for i := t.hash(id); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.ev == nil || s.id == id {
			return s.ev
		}
	}
}

// SetCPU sets the CPU that records and manual ptwrites report.
func (a *Assembler) SetCPU(cpu int32) { a.cpu = cpu }

// SetTID sets the thread id that records report (-1: unknown).
func (a *Assembler) SetTID(tid int32) { a.tid = tid }

// SetPID sets the process id that records report (0: unknown).
func (a *Assembler) SetPID(pid int32) { a.pid = pid }

// SetTimeConv sets the conversion from raw TSC values to nanoseconds; nil
// leaves Time 0.
func (a *Assembler) SetTimeConv(conv func(tsc uint64) uint64) { a.conv = conv }

// Timing describes the MTC packets of a stream so that time advances
// between TSC packets: MTCPeriod is IA32_RTIT_CTL.MTCFreq (the intel_pt
// mtc_period field), and TSC = ART * ARTNum / ARTDen (CPUID leaf 0x15 EBX
// and EAX; sysfs intel_pt/tsc_art_ratio "NUM:DEN").
type Timing struct {
	MTCPeriod      uint8
	ARTNum, ARTDen uint32
}

// SetTiming makes MTC packets advance the time between TSC packets; the
// zero Timing (or a zero ratio) keeps the time of the last TSC packet.
func (a *Assembler) SetTiming(t Timing) {
	a.mtcOn = t.ARTNum != 0 && t.ARTDen != 0
	a.timing = PtdumpOptions{MTCFreq: t.MTCPeriod, CPUID15EAX: t.ARTDen, CPUID15EBX: t.ARTNum}
	a.tm = ptTime{}
	if a.haveTSC {
		a.tm.updateTSC(a.tsc)
	}
}

// Counters returns the counters so far.
func (a *Assembler) Counters() Counters { return a.c }

// Feed decodes the next chunk of the stream. A packet cut by the end of buf
// is completed by the next Feed; bytes that cannot be decoded count as
// errors and the assembler resumes at the next PSB, in this chunk or a later
// one. Chunking does not change the result, with two exceptions: the packet
// decoder's block context (BBP, PEBS via PT) is not carried from one Feed to
// the next, so block items right after a boundary decode as TNT; and after a
// decoder error in the first bytes of a chunk, the PSB found to resume may
// differ from the one found in one piece (the decoder also considers a PSB
// overlapping up to 15 bytes before the error, which may lie in the previous
// chunk). Records never span an error either way.
func (a *Assembler) Feed(buf []byte) {
	if a.ncarry > 0 || a.unsynced {
		buf = a.feedBoundary(buf)
	}
	if len(buf) > 0 {
		a.run(buf)
	}
}

// Gap marks lost data before the next Feed (AUX loss, a hole in the
// buffer offsets): it counts one error, ends the open record, and makes the
// assembler resynchronize at the next PSB, since the next chunk need not
// start at a packet boundary.
func (a *Assembler) Gap() {
	a.c.Errors++
	a.breakRecord()
	a.ncarry = 0
	a.unsynced = true
}

// ContextSwitch marks a switch to another thread known from side band: it
// ends the open record (its missing words count as dropped) but is no loss.
func (a *Assembler) ContextSwitch() { a.breakRecord() }

// End marks the end of the stream: an open record is dropped, a manual
// ptwrite waiting for its FUP is delivered without IP, and a packet cut by
// the end counts as an error. The assembler may be fed again afterwards as
// if after a Gap without the error.
func (a *Assembler) End() {
	if a.ncarry > 0 && !a.unsynced {
		a.c.Errors++
	}
	a.breakRecord()
	a.ncarry = 0
	a.unsynced = true
}

// run decodes buf, which starts at a packet boundary. The hot packets are
// decoded inline (scan); whatever scan leaves, rare packets and every
// error, goes through the packet decoder one packet at a time, so that
// packet validity has one definition. After a BBP the decoder decodes the
// rest of buf itself, since only it keeps the block-item context.
func (a *Assembler) run(buf []byte) {
	a.dec.Reset(buf)
	pos := 0
	for {
		pos = a.scan(buf, pos)
		if pos >= len(buf) {
			return
		}
		if err := a.dec.SyncSet(uint64(pos)); err != nil {
			return // pos < len(buf): cannot happen
		}
		err := a.dec.Next(&a.pkt)
		if err == nil {
			a.packet(&a.pkt)
			pos += int(a.pkt.Size)
			if a.pkt.Kind != BBP {
				continue
			}
			for err == nil {
				if err = a.dec.Next(&a.pkt); err == nil {
					a.packet(&a.pkt)
				}
			}
			if err == io.EOF {
				return
			}
		}
		off := errOffset(err)
		if isTruncated(err) && len(buf)-off < maxPacket {
			a.ncarry = copy(a.carry[:], buf[off:])
			return
		}
		a.fail()
		// Resume where decoding buf in one pass would: SyncForward
		// searches from 15 bytes before the position (decoding may have
		// landed inside a PSB) unless the position is its sync point,
		// which SyncSet made it; one PSB length earlier it is not.
		if a.dec.SyncSet(uint64(max(0, off-maxPacket))) != nil || a.dec.SyncForward() != nil {
			a.keepTail(buf[max(0, off-(maxPacket-1)):])
			return
		}
		pos = int(a.dec.Pos())
	}
}

// scan decodes the packets that records depend on or that are frequent,
// from pos, and returns the offset of the first packet it leaves to the
// packet decoder (len(buf) when none). Its checks are the packet decoder's:
// anything they do not accept is left to it, errors included.
func (a *Assembler) scan(buf []byte, pos int) int {
	n := len(buf)
	for pos < n {
		b := buf[pos]
		switch {
		case b == 0: // PAD
			pos++
		case b == 2:
			if pos+2 > n {
				return pos
			}
			switch e := buf[pos+1]; e {
			case 0x32, 0xb2: // PTW, 8 bytes
				if pos+10 > n {
					return pos
				}
				a.flushManual()
				v := binary.LittleEndian.Uint64(buf[pos+2:])
				if a.open && a.got < a.rec.N && v&(1<<40-1) != HeaderMagic {
					// An argument of the open record, the commonest word:
					// what word does, without the call.
					a.rec.Args[a.got] = v
					a.got++
					if a.got == a.want {
						a.emit()
					}
				} else {
					a.word(v, 8, e&0x80 != 0)
				}
				pos += 10
				if e&0x80 != 0 && pos < n && buf[pos]&0x1f == 0x1d && !a.manPend {
					// The FUP that a record word's IP bit announces, in the
					// same turn: with no manual ptwrite waiting for it, a FUP
					// only sets the last IP.
					c := buf[pos] >> 5
					if c == IPCUpdate16 && pos+3 <= n {
						// The words of a record share their IP: the
						// commonest compression as a branch, so that the
						// next packet's start is predicted, not waited for
						// on the load of the size.
						a.ip(IPCUpdate16, uint64(binary.LittleEndian.Uint16(buf[pos+1:])))
						pos += 3
						if a.open {
							pos = a.args(buf, pos)
						}
						continue
					}
					sz := int(ipCompressions[c].size)
					if sz < 0 || pos+1+sz > n {
						return pos
					}
					a.ip(c, le(buf, pos+1, sz))
					pos += 1 + sz
				}
			case 0x12, 0x92: // PTW, 4 bytes
				if pos+6 > n {
					return pos
				}
				a.flushManual()
				a.word(uint64(binary.LittleEndian.Uint32(buf[pos+2:])), 4, e&0x80 != 0)
				pos += 6
			case 0x82: // PSB
				if pos+16 > n || string(buf[pos:pos+16]) != string(psbPattern[:]) {
					return pos
				}
				a.flushManual()
				a.lastIP = 0
				a.inPSB = true
				pos += 16
			case 0x23: // PSBEND
				a.flushManual()
				a.inPSB = false
				pos += 2
			case 0xf3: // OVF
				a.c.Errors++
				a.breakRecord()
				pos += 2
			case 0xa3: // TNT64
				if pos+8 > n || binary.LittleEndian.Uint64(buf[pos:])>>16 == 0 {
					return pos
				}
				a.flushManual()
				pos += 8
			default:
				return pos
			}
		case b&1 == 0: // TNT8
			a.flushManual()
			pos++
		case b&7 == 3: // one-byte CYC
			pos++
		case b&0x1f == 0x1d, b&0x1f == 0x0d, b&0x1f == 0x11, b&0x1f == 0x01: // FUP, TIP*
			sz := int(ipCompressions[b>>5].size)
			if sz < 0 || pos+1+sz > n {
				return pos
			}
			// One load masked to the payload, no branch on its size (the
			// IP compression varies from packet to packet).
			v := le(buf, pos+1, sz)
			ip := a.ip(b>>5, v)
			if b&0x1f == 0x1d {
				a.fup(ip, b>>5 != IPCSuppressed)
			} else {
				a.flushManual()
			}
			pos += 1 + sz
		case b == 0x19: // TSC
			if pos+8 > n {
				return pos
			}
			a.setTSC(binary.LittleEndian.Uint64(buf[pos:]) >> 8)
			pos += 8
		case b == 0x59: // MTC
			if pos+2 > n {
				return pos
			}
			if a.mtcOn {
				// An MTC the estimate cannot use leaves it as it was.
				_ = a.tm.updateMTC(uint64(buf[pos+1]), &a.timing)
			}
			pos += 2
		case b == 0x99: // MODE
			if pos+2 > n || buf[pos+1]>>5 > 1 {
				return pos
			}
			a.flushManual()
			pos += 2
		default:
			return pos
		}
	}
	return pos
}

// recordWord is the size of a record's argument word in its commonest
// shape: a PTW of 8 bytes with its IP bit (02 b2, the payload) and the FUP
// that the bit announces with a 16-bit IP update (3d, two bytes).
const recordWord = 13

// args takes the open record's argument words from pos while they have
// the commonest shape (recordWord) and returns where it stopped: what
// scan does with such a PTW and its FUP, with the word count and the last
// IP kept in registers, not stored and reloaded a word at a time (scan
// calls out). It leaves the rest to scan: another packet, a header, a word
// past the event's arguments. The caller has no manual ptwrite waiting
// for a FUP.
func (a *Assembler) args(buf []byte, pos int) int {
	got, ip := a.got, a.lastIP
	for got < a.rec.N && pos+recordWord <= len(buf) {
		w := (*[recordWord]byte)(buf[pos:])
		v := binary.LittleEndian.Uint64(w[2:])
		if binary.LittleEndian.Uint16(w[:]) != 0xb202 || w[10] != 0x1d|IPCUpdate16<<5 || v&(1<<40-1) == HeaderMagic {
			break
		}
		a.rec.Args[got&7] = v
		got++
		ip = ip&^0xffff | uint64(binary.LittleEndian.Uint16(w[11:])) // IPCUpdate16
		pos += recordWord
	}
	a.got, a.lastIP = got, ip
	if got == a.want {
		a.emit()
	}
	return pos
}

// feedBoundary decodes the packets that begin in the carried bytes, then
// returns the rest of buf to decode from a packet boundary, or nil when
// nothing remains.
func (a *Assembler) feedBoundary(buf []byte) []byte {
	n := a.ncarry
	copy(a.scratch[:n], a.carry[:n])
	m := copy(a.scratch[n:], buf)
	scr := a.scratch[:n+m]
	start := 0
	if a.unsynced {
		i := bytes.Index(scr, psbPattern[:])
		if i < 0 || i >= n {
			j := bytes.Index(buf, psbPattern[:])
			if j < 0 {
				if m == len(buf) {
					a.keepTail(scr)
				} else {
					a.keepTail(buf)
				}
				return nil
			}
			a.unsynced = false
			a.ncarry = 0
			return buf[j:]
		}
		a.unsynced = false
		start = i
	}
	a.dec.Reset(scr[start:])
	for {
		pos := start + int(a.dec.Pos())
		if pos >= n {
			a.ncarry = 0
			return buf[pos-n:]
		}
		err := a.dec.Next(&a.pkt)
		if err == nil {
			a.packet(&a.pkt)
			continue
		}
		if err == io.EOF {
			a.ncarry = 0
			return nil
		}
		off := start + errOffset(err)
		if isTruncated(err) && m == len(buf) && len(scr)-off < maxPacket {
			// All of buf was too short to complete the packet.
			a.ncarry = copy(a.carry[:], scr[off:])
			return nil
		}
		// The bad packet began in the carry: look for a PSB after it.
		a.fail()
		a.ncarry = copy(a.carry[:], scr[off+1:n])
		a.unsynced = true
		return a.feedBoundary(buf)
	}
}

// keepTail keeps the last bytes of b, where a PSB may begin that the next
// Feed completes, and marks the assembler unsynced.
func (a *Assembler) keepTail(b []byte) {
	if len(b) > len(a.carry) {
		b = b[len(b)-len(a.carry):]
	}
	a.ncarry = copy(a.carry[:], b)
	a.unsynced = true
}

func errOffset(err error) int {
	if pe, ok := err.(*PacketError); ok {
		return int(pe.Offset)
	}
	return 0
}

func isTruncated(err error) bool {
	pe, ok := err.(*PacketError)
	return ok && pe.Err == ErrTruncated
}

// fail handles a decoder error: it counts, and nothing spans it.
func (a *Assembler) fail() {
	a.c.Errors++
	a.breakRecord()
}

// breakRecord ends whatever is open: the partial record (its missing words
// count as dropped), an unknown event's remaining words, a manual ptwrite
// waiting for its FUP (delivered without IP).
func (a *Assembler) breakRecord() {
	a.flushManual()
	if a.open {
		a.c.Dropped += uint64(a.want - a.got)
		a.open = false
	}
	a.inPSB = false
}

func (a *Assembler) flushManual() {
	if a.manPend {
		a.manPend = false
		a.out.Manual(&a.man)
	}
}

func (a *Assembler) now() uint64 {
	if a.conv == nil || !a.haveTSC {
		return 0
	}
	if a.mtcOn {
		return a.conv(a.tm.tsc)
	}
	return a.conv(a.tsc)
}

// setTSC takes the value of a TSC packet.
func (a *Assembler) setTSC(tsc uint64) {
	a.tsc, a.haveTSC = tsc, true
	if a.mtcOn {
		a.tm.updateTSC(tsc)
	}
}

// packet handles one decoded packet.
func (a *Assembler) packet(p *Packet) {
	switch p.Kind {
	case PTW:
		a.flushManual()
		a.word(p.Payload, p.Bits, p.Has(FlagIP))
		return
	case FUP:
		a.fup(a.ip(p.IPC, p.Payload), p.IPC != IPCSuppressed)
		return
	case TSC:
		a.setTSC(p.Payload)
		return
	case MTC, TMA:
		if a.mtcOn {
			if p.Kind == MTC {
				_ = a.tm.updateMTC(p.Payload, &a.timing)
			} else {
				_ = a.tm.updateTMA(p.Payload, uint64(p.Aux), &a.timing)
			}
		}
		// Timing packets may sit between a PTW and its FUP.
		return
	case Pad, CYC, CBR:
		// Timing packets may sit between a PTW and its FUP.
		return
	case TIP, TIPPGE, TIPPGD:
		a.ip(p.IPC, p.Payload)
	case PSB:
		a.lastIP = 0
		a.inPSB = true
	case PSBEnd:
		a.inPSB = false
	case OVF:
		a.c.Errors++
		a.breakRecord()
		return
	case PIP:
		if !a.inPSB {
			a.breakRecord()
			return
		}
	}
	a.flushManual()
}

// ip decompresses an IP packet's payload against the last IP, which the
// assembler tracks itself so that it carries across Feed calls, and returns
// the full IP (0 when suppressed).
func (a *Assembler) ip(ipc uint8, v uint64) uint64 {
	if ipc == IPCSuppressed {
		return 0
	}
	a.lastIP = ipCompressions[ipc&7].apply(a.lastIP, v)
	return a.lastIP
}

// PTWrite feeds one PTWRITE that a control-flow decoder found, with its
// FUP's IP when hasIP: records and manual ptwrites go to the Output as
// from Feed, so that they interleave with the decoder's other output.
func (a *Assembler) PTWrite(payload uint64, bits uint8, ip uint64, hasIP bool) {
	a.flushManual()
	a.word(payload, bits, hasIP)
	if hasIP {
		a.fup(ip, true)
	}
}

// fup gives a manual ptwrite waiting for its FUP the FUP's IP.
func (a *Assembler) fup(ip uint64, valid bool) {
	if a.manPend {
		a.man.IP, a.man.HasIP = ip, valid
		a.manPend = false
		a.out.Manual(&a.man)
	}
}

// word handles one PTW payload of size bytes; withIP is the PTW's IP bit.
func (a *Assembler) word(v uint64, size uint8, withIP bool) {
	if size == 8 && v&(1<<40-1) == HeaderMagic {
		a.header(v, withIP)
		return
	}
	if a.open {
		if a.got < a.rec.N {
			a.rec.Args[a.got] = v
		} else {
			a.c.Unknown++
		}
		a.got++
		if a.got == a.want {
			a.emit()
		}
		return
	}
	a.stray(v, withIP)
}

func (a *Assembler) header(v uint64, withIP bool) {
	// A record word's FUP needs no handling: with no manual ptwrite
	// pending, FUPs are only tracked for the last IP.
	a.breakRecord()
	id := uint16(v >> 48)
	nargs := int(v >> 40 & 0xff)
	ev := a.events.get(id)
	if ev == nil {
		a.stray(v, withIP)
		return
	}
	a.rec.Event = ev
	a.rec.N = min(nargs, len(ev.Args), len(a.rec.Args))
	a.rec.TID, a.rec.PID, a.rec.CPU, a.rec.Time = a.tid, a.pid, a.cpu, a.now()
	a.want, a.got = nargs, 0
	a.open = true
	if nargs == 0 {
		a.emit()
	}
}

func (a *Assembler) emit() {
	a.open = false
	a.c.Records++
	a.out.Record(&a.rec)
}

func (a *Assembler) stray(v uint64, withIP bool) {
	a.c.Stray++
	a.man = Manual{Payload: v, CPU: a.cpu, Time: a.now()}
	if withIP {
		a.manPend = true
		return
	}
	a.out.Manual(&a.man)
}
