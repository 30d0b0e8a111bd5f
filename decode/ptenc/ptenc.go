// Package ptenc encodes Intel Processor Trace packets. It exists for tests and
// benchmarks: it builds streams with exactly the packets a test needs (probe
// records, overflows, PSB+ in awkward places) and large random streams, so
// that decoders can be checked without PT hardware.
//
// Encodings follow the Intel SDM, Vol. 3C, "Trace Packets and Data Types".
// The package does not import decode so that decode's own tests can use it.
package ptenc

import "encoding/binary"

// Magic is the low 40 bits of a ptwrite uprobe header word ("PTRW1").
const Magic = 0x5054525731

// Header returns the ptwrite uprobe header word for event id with nargs
// argument words.
func Header(id uint16, nargs int) uint64 {
	return uint64(id)<<48 | uint64(uint8(nargs))<<40 | Magic
}

// IPKind selects one of the four packets that carry an IP.
type IPKind byte

// The opcodes (low five bits of the first byte) of the IP packets.
const (
	TIP    IPKind = 0x0d
	TIPPGE IPKind = 0x11
	TIPPGD IPKind = 0x01
	FUP    IPKind = 0x1d
)

// Encoder appends packets to a byte stream. It tracks the last IP the way a
// decoder does, so that IP packets can be compressed against it.
type Encoder struct {
	buf    []byte
	lastIP uint64
}

// New returns an empty encoder.
func New() *Encoder { return &Encoder{} }

// Bytes returns the stream built so far; it aliases the encoder's buffer.
func (e *Encoder) Bytes() []byte { return e.buf }

// Len returns the number of bytes encoded so far.
func (e *Encoder) Len() int { return len(e.buf) }

// Raw appends arbitrary bytes, e.g. a deliberately broken packet.
func (e *Encoder) Raw(b ...byte) { e.buf = append(e.buf, b...) }

// Pad appends a PAD packet.
func (e *Encoder) Pad() { e.buf = append(e.buf, 0x00) }

// PSB appends a PSB packet. Decoders forget the last IP at a PSB, so the
// encoder does too.
func (e *Encoder) PSB() {
	for i := 0; i < 8; i++ {
		e.buf = append(e.buf, 0x02, 0x82)
	}
	e.lastIP = 0
}

// PSBEnd appends a PSBEND packet.
func (e *Encoder) PSBEnd() { e.buf = append(e.buf, 0x02, 0x23) }

// OVF appends an OVF (internal buffer overflow) packet.
func (e *Encoder) OVF() { e.buf = append(e.buf, 0x02, 0xf3) }

// Stop appends a TraceStop packet.
func (e *Encoder) Stop() { e.buf = append(e.buf, 0x02, 0x83) }

// TNT appends n (1 to 47) conditional branch outcomes, the oldest in bit
// n-1 of bits, as a short TNT when n <= 6 and a long TNT otherwise. Other n
// panic: that is a bug in the calling test, not input.
func (e *Encoder) TNT(bits uint64, n int) {
	if n < 1 || n > 47 {
		panic("ptenc: TNT needs 1 to 47 bits")
	}
	bits &= 1<<uint(n) - 1
	if n <= 6 {
		e.buf = append(e.buf, byte(1<<uint(n+1)|bits<<1))
		return
	}
	p := 1<<uint(n) | bits
	e.buf = append(e.buf, 0x02, 0xa3)
	e.buf = appendLE(e.buf, p, 6)
}

// IP appends an IP packet of the given kind, compressed as much as the last
// IP allows.
func (e *Encoder) IP(kind IPKind, ip uint64) {
	ipc := 6
	switch {
	case e.lastIP>>16 == ip>>16:
		ipc = 1
	case e.lastIP>>32 == ip>>32:
		ipc = 2
	case signExtend48(ip) == ip:
		ipc = 3
	}
	e.IPC(kind, ipc, ip)
}

// IPC appends an IP packet with an explicit IP compression: 0 suppressed, 1
// (2 bytes), 2 (4 bytes), 3 (6 bytes, sign-extended), 4 (6 bytes), 6 (8
// bytes). The reserved values panic (a bug in the calling test); write
// reserved encodings with Raw.
func (e *Encoder) IPC(kind IPKind, ipc int, ip uint64) {
	e.buf = append(e.buf, byte(kind)|byte(ipc)<<5)
	switch ipc {
	case 0:
		return
	case 1:
		e.buf = appendLE(e.buf, ip, 2)
		e.lastIP = e.lastIP&^0xffff | ip&0xffff
	case 2:
		e.buf = appendLE(e.buf, ip, 4)
		e.lastIP = e.lastIP&^0xffffffff | ip&0xffffffff
	case 3:
		e.buf = appendLE(e.buf, ip, 6)
		e.lastIP = signExtend48(ip)
	case 4:
		e.buf = appendLE(e.buf, ip, 6)
		e.lastIP = e.lastIP&^0xffffffffffff | ip&0xffffffffffff
	case 6:
		e.buf = appendLE(e.buf, ip, 8)
		e.lastIP = ip
	default:
		panic("ptenc: bad IP compression")
	}
}

// PTW appends a PTWRITE packet with a 4- or 8-byte payload; withIP sets the
// IP bit, which announces a FUP with the PTWRITE's address. Other sizes
// panic (a bug in the calling test).
func (e *Encoder) PTW(payload uint64, size int, withIP bool) {
	b := byte(0x12)
	switch size {
	case 4:
	case 8:
		b |= 1 << 5
	default:
		panic("ptenc: PTW payload must be 4 or 8 bytes")
	}
	if withIP {
		b |= 0x80
	}
	e.buf = append(e.buf, 0x02, b)
	e.buf = appendLE(e.buf, payload, size)
}

// Probe appends what one hit of a ptwrite uprobe produces: the header word
// and one 8-byte payload per argument, each followed by a FUP at stub+i when
// fup is set (fup_on_ptw).
func (e *Encoder) Probe(id uint16, stub uint64, fup bool, args ...uint64) {
	e.PTW(Header(id, len(args)), 8, fup)
	if fup {
		e.IP(FUP, stub)
	}
	for i, a := range args {
		e.PTW(a, 8, fup)
		if fup {
			e.IP(FUP, stub+uint64(i+1)*8)
		}
	}
}

// TSC appends a TSC packet (56 bits of the time stamp counter).
func (e *Encoder) TSC(tsc uint64) {
	e.buf = append(e.buf, 0x19)
	e.buf = appendLE(e.buf, tsc, 7)
}

// MTC appends an MTC packet.
func (e *Encoder) MTC(ctc byte) { e.buf = append(e.buf, 0x59, ctc) }

// TMA appends a TMA packet: 16 bits of CTC and the 9-bit fast counter.
func (e *Encoder) TMA(ctc uint16, fc uint16) {
	e.buf = append(e.buf, 0x02, 0x73, byte(ctc), byte(ctc>>8), 0, byte(fc), byte(fc>>8)&1)
}

// CYC appends a CYC packet with the given cycle count.
func (e *Encoder) CYC(cyc uint64) {
	b := byte(0x03) | byte(cyc&0x1f)<<3
	cyc >>= 5
	if cyc == 0 {
		e.buf = append(e.buf, b)
		return
	}
	e.buf = append(e.buf, b|0x04)
	for {
		b = byte(cyc&0x7f) << 1
		cyc >>= 7
		if cyc == 0 {
			e.buf = append(e.buf, b)
			return
		}
		e.buf = append(e.buf, b|1)
	}
}

// CBR appends a CBR (core:bus ratio) packet.
func (e *Encoder) CBR(ratio byte) { e.buf = append(e.buf, 0x02, 0x03, ratio, 0) }

// ModeExec appends MODE.Exec: csl is CS.L (64-bit code), csd CS.D.
func (e *Encoder) ModeExec(csl, csd bool) {
	var b byte
	if csl {
		b |= 1
	}
	if csd {
		b |= 2
	}
	e.buf = append(e.buf, 0x99, b)
}

// ModeTSX appends MODE.TSX.
func (e *Encoder) ModeTSX(intx, abort bool) {
	b := byte(0x20)
	if intx {
		b |= 1
	}
	if abort {
		b |= 2
	}
	e.buf = append(e.buf, 0x99, b)
}

// PIP appends a PIP packet for CR3 (bits 51..5 are kept) and the non-root
// flag.
func (e *Encoder) PIP(cr3 uint64, nonRoot bool) {
	p := cr3 >> 5 << 1
	if nonRoot {
		p |= 1
	}
	e.buf = append(e.buf, 0x02, 0x43)
	e.buf = appendLE(e.buf, p, 6)
}

// VMCS appends a VMCS packet for the VMCS pointer (bits 51..12 are kept).
func (e *Encoder) VMCS(ptr uint64) {
	e.buf = append(e.buf, 0x02, 0xc8)
	e.buf = appendLE(e.buf, ptr>>12, 5)
}

// MNT appends a maintenance packet.
func (e *Encoder) MNT(payload uint64) {
	e.buf = append(e.buf, 0x02, 0xc3, 0x88)
	e.buf = appendLE(e.buf, payload, 8)
}

// Exstop appends an EXSTOP packet; withIP announces a FUP.
func (e *Encoder) Exstop(withIP bool) {
	b := byte(0x62)
	if withIP {
		b |= 0x80
	}
	e.buf = append(e.buf, 0x02, b)
}

// Mwait appends an MWAIT packet.
func (e *Encoder) Mwait(hints, ext uint32) {
	e.buf = append(e.buf, 0x02, 0xc2)
	e.buf = appendLE(e.buf, uint64(hints), 4)
	e.buf = appendLE(e.buf, uint64(ext), 4)
}

// Pwre appends a PWRE packet: hw, and the raw 4-bit resolved thread C-state
// and sub-state fields (0xf encodes C0, n encodes C(n+1)). The HW flag goes
// to bit 7 of the first payload byte as the SDM says; libipt (and its pttc)
// use bit 3 instead.
func (e *Encoder) Pwre(hw bool, state, sub byte) {
	b := byte(0)
	if hw {
		b = 0x80
	}
	e.buf = append(e.buf, 0x02, 0x22, b, state<<4|sub&0xf)
}

// Pwrx appends a PWRX packet from its raw 4-bit fields: deepest and last
// core C-state (n encodes C(n+1)) and the wake reason bits.
func (e *Encoder) Pwrx(deepest, last, wake byte) {
	e.buf = append(e.buf, 0x02, 0xa2, deepest<<4|last&0xf, wake&0xf, 0, 0, 0)
}

func appendLE(b []byte, v uint64, n int) []byte {
	var t [8]byte
	binary.LittleEndian.PutUint64(t[:], v)
	return append(b, t[:n]...)
}

func signExtend48(ip uint64) uint64 {
	return uint64(int64(ip<<16) >> 16)
}
