package decode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"unsafe"
)

// Kind is the type of an Intel PT packet.
type Kind uint8

// Packet kinds, following the Intel SDM Vol. 3 ch. 33 "Intel Processor
// Trace" packet formats. Invalid is the zero value and never returned by a
// successful Next.
const (
	Invalid  Kind = iota
	Pad           // PAD
	PSB           // packet stream boundary
	PSBEnd        // end of the PSB+ status block
	TNT8          // short taken/not-taken
	TNT64         // long taken/not-taken
	TIP           // target IP
	TIPPGE        // packet generation enable
	TIPPGD        // packet generation disable
	FUP           // flow update
	ModeExec      // MODE.Exec
	ModeTSX       // MODE.TSX
	PIP           // paging information (CR3)
	VMCS          // VMCS base address
	CBR           // core:bus ratio
	TSC           // time stamp counter
	TMA           // TSC/MTC alignment
	MTC           // mini time counter
	CYC           // cycle count
	OVF           // internal buffer overflow
	Stop          // TraceStop
	MNT           // maintenance
	PTW           // PTWRITE payload
	Exstop        // execution stop
	Mwait         // MWAIT hints
	Pwre          // power entry
	Pwrx          // power exit
	BBP           // block begin (PEBS via PT)
	BIP           // block item
	BEP           // block end
	CFE           // control flow event (event trace)
	EVD           // event data (event trace)
	Trig          // trigger tracing
	numKinds
)

var kindNames = [numKinds]string{
	Invalid: "invalid", Pad: "pad", PSB: "psb", PSBEnd: "psbend",
	TNT8: "tnt.8", TNT64: "tnt.64", TIP: "tip", TIPPGE: "tip.pge",
	TIPPGD: "tip.pgd", FUP: "fup", ModeExec: "mode.exec", ModeTSX: "mode.tsx",
	PIP: "pip", VMCS: "vmcs", CBR: "cbr", TSC: "tsc", TMA: "tma", MTC: "mtc",
	CYC: "cyc", OVF: "ovf", Stop: "stop", MNT: "mnt", PTW: "ptw",
	Exstop: "exstop", Mwait: "mwait", Pwre: "pwre", Pwrx: "pwrx", BBP: "bbp",
	BIP: "bip", BEP: "bep", CFE: "cfe", EVD: "evd", Trig: "trig",
}

// String returns libipt's (ptdump's) name of the packet kind.
func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Packet flags. Which ones a kind uses is listed on Packet.
const (
	FlagIP    uint16 = 1 << iota // PTW, Exstop, BEP, CFE, Trig: the IP bit (a FUP follows)
	FlagNR                       // PIP: non-root (VMX guest)
	FlagCSL                      // ModeExec: CS.L (64-bit)
	FlagCSD                      // ModeExec: CS.D
	FlagIF                       // ModeExec: RFLAGS.IF
	FlagInTX                     // ModeTSX: in transaction
	FlagAbort                    // ModeTSX: transaction aborted
	FlagHW                       // Pwre: hardware-initiated C-state (SDM bit 7; see decodeExt)
	FlagSZ                       // BBP: SZ set, block items are 4 bytes (else 8)
	FlagMult                     // Trig: more than one trigger
	FlagICNTV                    // Trig: Aux holds a valid instruction count
)

// IP compression values of TIP/TIP.PGE/TIP.PGD/FUP (the IPBytes field).
const (
	IPCSuppressed = 0 // no IP in the packet
	IPCUpdate16   = 1 // bits 15:0, rest from the last IP
	IPCUpdate32   = 2 // bits 31:0, rest from the last IP
	IPCSext48     = 3 // bits 47:0, sign-extended
	IPCUpdate48   = 4 // bits 47:0, rest from the last IP
	IPCFull       = 6 // all 64 bits
)

// Packet is one decoded Intel PT packet. Next and Decode overwrite every
// field.
//
// Field use by kind (fields not listed are zero):
//
//	TNT8, TNT64      Payload = the taken bits without the stop bit, the oldest
//	                 branch in bit Bits-1, the newest in bit 0; Bits = count (1..47)
//	TIP, TIPPGE,     IPC = compression (IPC* constants; IPCSuppressed = no IP);
//	TIPPGD, FUP      Payload = the IP bytes as they appear in the packet;
//	                 IP = the full IP after last-IP decompression (0 when
//	                 suppressed); Bits = number of IP bytes in the packet
//	PTW              Payload; Bits = payload bytes (4 or 8); FlagIP
//	TSC              Payload = 56-bit TSC value
//	MTC              Payload = 8-bit CTC value
//	TMA              Payload = CTC (16 bits); Aux = fast counter (9 bits)
//	CYC              Payload = cycle count (bits above 64 are dropped)
//	CBR              Payload = core:bus ratio
//	PIP              Payload = CR3 (payload bits 47:1 shifted into 51:5); FlagNR
//	VMCS             Payload = VMCS base (payload << 12)
//	MNT              Payload = 64-bit maintenance payload
//	ModeExec         Payload = mode bits 4:0; FlagCSL, FlagCSD, FlagIF
//	ModeTSX          Payload = mode bits 4:0; FlagInTX, FlagAbort
//	Mwait            Payload = hints (32 bits); Aux = extensions (32 bits)
//	Pwre             Payload = 16-bit payload; Type = C-state << 4 | sub-C-state; FlagHW
//	Pwrx             Payload = 40-bit payload; Type = last C-state << 4 | deepest C-state;
//	                 Aux = wake reason bits 3:0 (1 interrupt, 4 store, 8 hardware)
//	Exstop           FlagIP
//	BBP              Type = block type (5 bits); FlagSZ (4-byte items)
//	BIP              Type = item ID (5 bits); Payload; Bits = payload bytes (4 or 8)
//	BEP              FlagIP
//	CFE              Type = event type (5 bits); Payload = vector; FlagIP
//	EVD              Type = event data type (6 bits); Payload = 64-bit data
//	Trig             Payload = TRBV bits; Aux = instruction count if FlagICNTV;
//	                 FlagIP, FlagMult
//	Pad, PSB, PSBEnd, OVF, Stop   no fields
type Packet struct {
	// Offset is the byte offset of the packet's first byte in the stream.
	Offset  uint64
	Payload uint64
	IP      uint64
	Aux     uint32
	Flags   uint16
	Kind    Kind
	// Size is the packet's length in bytes.
	Size uint8
	Bits uint8
	IPC  uint8
	Type uint8
}

// Suppressed reports whether an IP packet carries no IP.
func (p *Packet) Suppressed() bool { return p.IPC == IPCSuppressed }

// Has reports whether flag f is set.
func (p *Packet) Has(f uint16) bool { return p.Flags&f != 0 }

// Sentinel errors of the packet decoder, for errors.Is.
var (
	// ErrBadOpcode: the bytes match no packet opcode.
	ErrBadOpcode = errors.New("unknown opcode")
	// ErrBadPacket: a known opcode with a malformed or reserved payload.
	ErrBadPacket = errors.New("unknown packet")
	// ErrTruncated: the packet extends past the end of the buffer.
	ErrTruncated = errors.New("unexpected end of stream")
)

// PacketError is the error Next returns for bytes it cannot decode.
type PacketError struct {
	Offset uint64 // stream offset of the first byte of the bad packet
	Err    error  // ErrBadOpcode, ErrBadPacket or ErrTruncated
}

// Error says where and what.
func (e *PacketError) Error() string {
	return fmt.Sprintf("packet at offset %#x: %v", e.Offset, e.Err)
}

// Unwrap returns the sentinel error.
func (e *PacketError) Unwrap() error { return e.Err }

// psbPattern is the 16-byte PSB packet.
var psbPattern = [16]byte{2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82}

// IndexPSB returns the offset of the first PSB packet in buf, or -1: every
// Intel PT stream starts at a PSB and repeats it.
func IndexPSB(buf []byte) int { return bytes.Index(buf, psbPattern[:]) }

// Block-item contexts: a BBP switches the meaning of bytes with bits 2:0 =
// 100b from TNT8 to BIP until a packet that ends the block (SDM, PEBS via PT).
const (
	ctxNone = iota
	ctxBlk4
	ctxBlk8
)

// PacketDecoder decodes a buffer of Intel PT bytes, one packet at a time
// (Next) or in batches (Decode). It allocates nothing after construction
// (errors aside); Reset reuses it.
type PacketDecoder struct {
	buf []byte
	// pos is the offset of the next packet; after an error, of the bad one.
	pos int
	// sync is the offset of the PSB of the last synchronization, or -1.
	sync   int
	lastIP uint64
	ctx    uint8
	// tail holds the last bytes of buf, zero-padded, for Next's reads.
	tail [16]byte
	// failed is set after an error so that the next Next resynchronizes
	// instead of failing at the same offset forever.
	failed bool
	// reuseErr makes every error the same value, errBuf, overwritten by
	// the next one: for the Assembler, which looks at an error only until
	// the next call and hits one at nearly every chunk boundary.
	reuseErr bool
	errBuf   PacketError
}

// NewPacketDecoder returns a decoder for buf, positioned at offset 0.
func NewPacketDecoder(buf []byte) *PacketDecoder {
	d := &PacketDecoder{}
	d.Reset(buf)
	return d
}

// Reset points d at buf, offset 0, with no last IP.
func (d *PacketDecoder) Reset(buf []byte) {
	*d = PacketDecoder{buf: buf, sync: -1, reuseErr: d.reuseErr}
}

// Slide points d at buf, which holds the bytes of the old buffer from
// offset drop on followed by more of the stream (a bounded window over a
// stream that arrives in pieces): positions move down by drop, the last
// IP and block context stay, a packet cut by the old buffer's end is
// decoded again whole (its failure is forgotten), and a search for a PSB
// that reached the end goes on in the new bytes.
func (d *PacketDecoder) Slide(buf []byte, drop int) {
	if d.pos < len(d.buf) {
		d.failed = false
	}
	d.buf, d.pos = buf, max(0, d.pos-drop)
	if d.sync -= drop; d.sync < 0 {
		d.sync = -1
	}
}

// Pos returns the offset of the next packet Next will decode, or of the
// packet that made the last Next fail.
func (d *PacketDecoder) Pos() uint64 { return uint64(d.pos) }

// SyncForward moves to the next PSB, as libipt's pt_pkt_sync_forward does:
// the search starts up to 15 bytes before the current position, so that a
// PSB partly swallowed by a bogus packet is found, and skips the PSB of the
// last synchronization. It resets the last IP. It returns io.EOF, leaving
// the decoder at the end, when there is no further PSB.
func (d *PacketDecoder) SyncForward() error {
	d.failed = false
	start := d.pos
	if start == d.sync {
		start += len(psbPattern)
	}
	if start > len(d.buf) {
		start = len(d.buf)
	}
	start -= min(start, len(psbPattern)-1)
	at := findPSB(d.buf, start)
	if at < 0 {
		// Failed: the next Next searches on (in what Slide adds).
		d.pos, d.failed = len(d.buf), true
		return io.EOF
	}
	d.pos, d.sync = at, at
	d.lastIP = 0
	d.ctx = ctxNone
	return nil
}

// SyncForwardFrom is SyncForward from offset instead of the current
// position: for a caller that decodes ahead in batches and has used the
// packets before offset only.
func (d *PacketDecoder) SyncForwardFrom(offset uint64) error {
	d.pos = int(min(offset, uint64(len(d.buf))))
	return d.SyncForward()
}

// SyncSet makes offset the synchronization point without checking for a PSB
// there (ptdump's --no-sync).
func (d *PacketDecoder) SyncSet(offset uint64) error {
	if offset > uint64(len(d.buf)) {
		return fmt.Errorf("sync offset %#x beyond %d bytes: %w", offset, len(d.buf), ErrTruncated)
	}
	d.failed = false
	d.pos, d.sync = int(offset), int(offset)
	d.lastIP = 0
	d.ctx = ctxNone
	return nil
}

// findPSB returns the offset of the first PSB that begins at or after start,
// or -1. Like libipt it looks at 8-byte aligned words for the PSB payload
// pattern and then walks to the end of the pattern run, which finds the
// last PSB of a run of PSB-like bytes.
func findPSB(buf []byte, start int) int {
	const lohi = 0x8202820282028202 // bytes 02 82 02 82 ...
	const hilo = 0x0282028202820282 // bytes 82 02 82 02 ...
	for w := (start + 7) &^ 7; w+8 <= len(buf); w += 8 {
		v := binary.LittleEndian.Uint64(buf[w:])
		if v != lohi && v != hilo {
			continue
		}
		p := w
		if buf[p] != 2 {
			p++
		}
		for p+1 < len(buf) && buf[p] == 2 && buf[p+1] == 0x82 {
			p += 2
		}
		p -= len(psbPattern)
		if p < 0 || p < start || p+len(psbPattern) > len(buf) {
			continue
		}
		if bytes.Equal(buf[p:p+len(psbPattern)], psbPattern[:]) {
			return p
		}
	}
	return -1
}

// fail records an error at the current packet and returns it. Kept out of
// line so that Next stays small.
//
//go:noinline
func (d *PacketDecoder) fail(err error) error {
	d.failed = true
	if d.reuseErr {
		d.errBuf = PacketError{Offset: uint64(d.pos), Err: err}
		return &d.errBuf
	}
	return &PacketError{Offset: uint64(d.pos), Err: err}
}

// le reads n (≤ 8) little-endian bytes at b[i:]; the caller checks bounds.
func le(b []byte, i, n int) uint64 {
	if i+8 <= len(b) {
		v := binary.LittleEndian.Uint64(b[i:])
		if n == 8 {
			return v
		}
		return v & (1<<(uint(n)*8) - 1)
	}
	var v uint64
	for k := n - 1; k >= 0; k-- {
		v = v<<8 | uint64(b[i+k])
	}
	return v
}

// Post-processing classes of the opcode table: what Next does after the
// generic, branch-free step that takes size, kind and payload from the table
// and the bytes (and decompresses IPs and counts TNT bits on the way).
const (
	postNone   = iota
	postBadOpc // no such opcode
	postBadPkt // known opcode, reserved encoding
	postCYC    // variable length
	postMode   // leaf and bits
	postTrig   // optional instruction count
	postPSB    // check the whole pattern; reset the last IP
	postPIP    // NR bit and CR3 shift
	postVMCS   // base shift
	postTMA    // CTC, FC and reserved bits
	postMNT    // third opcode byte
	postMwait  // hints and extensions
	postPwre   // C-states and HW bit
	postPwrx   // C-states and wake reason
	postBBP    // block size and type; enters block context
	postCFE    // type, IP bit and vector
	postEVD    // type byte before the payload
)

// opInfo describes one opcode: the packet it starts and its layout.
type opInfo struct {
	kind Kind
	size uint8 // packet size (the minimum for CYC and TRIG)
	hdr  uint8 // offset of the payload
	plen uint8 // payload bytes read generically (≤ 8)
	post uint8
	bits uint8 // Packet.Bits implied by the opcode (PTW, IP bytes)
	pl8  uint8 // constant payload bits (TNT8: the byte without bit 0)
	ipc  uint8 // IP packets: the IPBytes field
	// ipSel is all ones for IP packets that carry an IP (they update the
	// last IP); tntSel is all ones for TNT packets.
	ipSel, tntSel uint64
	flags         uint16 // flags implied by the opcode
	// keepsBlock: the packet may sit inside a PEBS block (SDM); all others
	// end the block context.
	keepsBlock bool
}

// Packet's layout from Aux on, which fastOp.img mirrors: each sum fails to
// compile (a negative uintptr constant) unless the offset is the expected one.
const (
	_ = (unsafe.Offsetof(Packet{}.Aux) - 24) + (24 - unsafe.Offsetof(Packet{}.Aux))
	_ = (unsafe.Offsetof(Packet{}.Flags) - 28) + (28 - unsafe.Offsetof(Packet{}.Flags))
	_ = (unsafe.Offsetof(Packet{}.Kind) - 30) + (30 - unsafe.Offsetof(Packet{}.Kind))
	_ = (unsafe.Offsetof(Packet{}.Size) - 31) + (31 - unsafe.Offsetof(Packet{}.Size))
	_ = (unsafe.Offsetof(Packet{}.Bits) - 32) + (32 - unsafe.Offsetof(Packet{}.Bits))
	_ = (unsafe.Offsetof(Packet{}.IPC) - 33) + (33 - unsafe.Offsetof(Packet{}.IPC))
	_ = (unsafe.Offsetof(Packet{}.Type) - 34) + (34 - unsafe.Offsetof(Packet{}.Type))
	_ = (unsafe.Sizeof(Packet{}) - 40) + (40 - unsafe.Sizeof(Packet{}))
)

// ops holds the first-byte opcodes at [0, 256) and the opcodes that follow
// the 0x02 escape at [256, 512).
var ops = buildOps()

func buildOps() (t [512]opInfo) {
	for b := 0; b < 256; b++ {
		o := &t[b]
		o.post = postBadOpc
		ip := func(k Kind) {
			n := int(ipCompressions[b>>5].size)
			if n < 0 {
				*o = opInfo{kind: k, post: postBadPkt}
				return
			}
			*o = opInfo{kind: k, size: uint8(1 + n), hdr: 1, plen: uint8(n), bits: uint8(n), ipc: uint8(b >> 5)}
			if n > 0 {
				o.ipSel = ^uint64(0)
			}
		}
		switch {
		case b == 0:
			*o = opInfo{kind: Pad, size: 1, keepsBlock: true}
		case b == 2:
			// Never used: Next indexes the 0x02 escape's second half.
		case b&1 == 0:
			*o = opInfo{kind: TNT8, size: 1, pl8: uint8(b >> 1), tntSel: ^uint64(0)}
		case b&3 == 3:
			*o = opInfo{kind: CYC, size: 1, post: postCYC, keepsBlock: true}
		case b&0x1f == 0x0d:
			ip(TIP)
		case b&0x1f == 0x11:
			ip(TIPPGE)
		case b&0x1f == 0x01:
			ip(TIPPGD)
		case b&0x1f == 0x1d:
			ip(FUP)
			o.keepsBlock = true
		case b == 0x99:
			*o = opInfo{kind: ModeExec, size: 2, hdr: 1, plen: 1, post: postMode}
		case b == 0x19:
			*o = opInfo{kind: TSC, size: 8, hdr: 1, plen: 7, keepsBlock: true}
		case b == 0x59:
			*o = opInfo{kind: MTC, size: 2, hdr: 1, plen: 1, keepsBlock: true}
		case b == 0xd9:
			*o = opInfo{kind: Trig, size: 3, hdr: 2, plen: 1, post: postTrig}
		}
	}
	ext := t[256:]
	for e := range ext {
		ext[e] = opInfo{post: postBadOpc}
	}
	ext[0x82] = opInfo{kind: PSB, size: 16, post: postPSB}
	ext[0x23] = opInfo{kind: PSBEnd, size: 2}
	ext[0xa3] = opInfo{kind: TNT64, size: 8, hdr: 2, plen: 6, tntSel: ^uint64(0)}
	ext[0x43] = opInfo{kind: PIP, size: 8, hdr: 2, plen: 6, post: postPIP}
	ext[0x03] = opInfo{kind: CBR, size: 4, hdr: 2, plen: 1, keepsBlock: true}
	ext[0xf3] = opInfo{kind: OVF, size: 2}
	ext[0xc8] = opInfo{kind: VMCS, size: 7, hdr: 2, plen: 5, post: postVMCS}
	ext[0x83] = opInfo{kind: Stop, size: 2}
	ext[0xc3] = opInfo{kind: MNT, size: 11, hdr: 3, plen: 8, post: postMNT, keepsBlock: true}
	ext[0x73] = opInfo{kind: TMA, size: 7, hdr: 2, plen: 5, post: postTMA, keepsBlock: true}
	ext[0x62] = opInfo{kind: Exstop, size: 2, keepsBlock: true}
	ext[0xe2] = opInfo{kind: Exstop, size: 2, flags: FlagIP, keepsBlock: true}
	ext[0xc2] = opInfo{kind: Mwait, size: 10, hdr: 2, plen: 8, post: postMwait}
	// The SDM and perf put PWRE's HW bit at bit 7 of the first payload
	// byte; libipt tests bit 3 (pt_pl_pwre_hw_mask = 0x8). We follow the
	// SDM (see postPwre).
	ext[0x22] = opInfo{kind: Pwre, size: 4, hdr: 2, plen: 2, post: postPwre, keepsBlock: true}
	ext[0xa2] = opInfo{kind: Pwrx, size: 7, hdr: 2, plen: 5, post: postPwrx, keepsBlock: true}
	for _, e := range []int{0x12, 0x32, 0x92, 0xb2} {
		n := 4 << (e >> 5 & 1)
		ext[e] = opInfo{kind: PTW, size: uint8(2 + n), hdr: 2, plen: uint8(n), bits: uint8(n), flags: uint16(e>>7) * FlagIP}
	}
	for _, e := range []int{0x52, 0x72, 0xd2, 0xf2} {
		ext[e] = opInfo{kind: PTW, post: postBadPkt}
	}
	ext[0x63] = opInfo{kind: BBP, size: 3, hdr: 2, plen: 1, post: postBBP, keepsBlock: true}
	ext[0x33] = opInfo{kind: BEP, size: 2}
	ext[0xb3] = opInfo{kind: BEP, size: 2, flags: FlagIP}
	ext[0x13] = opInfo{kind: CFE, size: 4, hdr: 2, plen: 2, post: postCFE}
	ext[0x53] = opInfo{kind: EVD, size: 11, hdr: 3, plen: 8, post: postEVD}
	return t
}

// fastOp is an opcode as fast uses it: one cache line of precomputed
// words, read as memory operands.
type fastOp struct {
	mask   uint64 // payload bytes
	ipMask uint64 // all ones for IP packets with an IP: v is (part of) an IP
	keep   uint64 // last-IP bits kept: all ones for packets without an IP
	sextHi uint64 // bits 63:48 for sign-extended IPs
	tntSel uint64 // all ones for TNT packets
	// img is Packet's bytes from Aux on as this opcode sets them (Aux,
	// Flags, Kind, Size; Bits, IPC, Type), stored in two words.
	img [2]uint64
	hdr uint8 // payload offset
	pl8 uint8 // constant payload bits (TNT8: the byte without bit 0)
	// A packet of class fastPost is finished by fastTab.post[pidx+the
	// leaf bit if leaf is 1] (MODE's leaf picks Exec or TSX).
	pidx, leaf uint8
}

// Classes of packets in fast (fastTables.class).
const (
	fastNone = iota // the generic step is all
	fastPost        // finished by a fastPostOp
	fastCYC         // cycExt
	fastOne         // left to one
)

// fastPostOp finishes a packet of a post class without branches: whatever
// post does for the class, as masks, multipliers and byte offsets. The
// fields a class does not use are zero.
type fastPostOp struct {
	chkMask, chkVal uint64 // valid: the first 8 bytes & chkMask == chkVal
	pm, pmul        uint64 // Payload = v & pm * pmul (a shift left)
	fm, fmul        uint64 // Flags = (v & fm) * fmul >> 7
	img0            uint64 // Kind and Size (Packet's bytes 24-31)
	am              uint64 // Aux = the 4 bytes at ahdr & am
	ahdr, thdr, tm  uint8  // Type = the byte at thdr & tm
}

// fastTab holds fast's tables. sizeClass has the size column of ops on its
// own: the size is what the next packet's position depends on, and a small
// table indexed by the opcode byte is the shortest way to it.
var fastTab = buildFastTab()

type fastTables struct {
	// ops: first bytes at [0, 256), the bytes after the 0x02 escape at
	// [256, 512).
	ops [512]fastOp
	// sizeClass is the size, and above it the class (fastNone...fastOne).
	sizeClass [512]uint16
	post      [16]fastPostOp
}

func buildFastTab() (t fastTables) {
	np := 1 // post[0] stays unused
	addPost := func(p fastPostOp) uint8 {
		t.post[np] = p
		np++
		return uint8(np - 1)
	}
	for i := range t.ops {
		o, f := &ops[i], &t.ops[i]
		t.sizeClass[i] = uint16(o.size)
		f.mask = lowMask[o.plen&15]
		f.pl8 = o.pl8
		// ipTNT's masks are ipCompression.apply split by what fast needs:
		// bits 47:0 of a sign-extended IP are the payload's already.
		f.keep = ^uint64(0)
		if o.ipSel != 0 {
			c := &ipCompressions[o.ipc&7]
			f.ipMask = ^uint64(0)
			f.keep = c.keep
			f.sextHi = c.sext &^ lowMask[6]
		}
		f.tntSel = o.tntSel
		f.img[0] = uint64(o.flags)<<32 | uint64(o.kind)<<48 | uint64(o.size)<<56
		f.img[1] = uint64(o.bits) | uint64(o.ipc)<<8
		f.hdr = o.hdr & 7
		if o.post == postNone {
			continue
		}
		img0 := uint64(o.kind)<<48 | uint64(o.size)<<56
		all := ^uint64(0)
		p := fastPostOp{pm: all, pmul: 1, img0: img0}
		// The classes below follow post, case by case.
		switch o.post {
		case postMode:
			// Leaf 0 (MODE.Exec) here, leaf 1 (MODE.TSX) in the next
			// entry; bits 7:6 set are a bad leaf.
			p.chkMask, p.pm, p.fm, p.fmul = 0xc0<<8, 0x1f, 7, 4<<7
			f.pidx, f.leaf = addPost(p), 1
			p.fm, p.fmul, p.img0 = 3, 32<<7, uint64(ModeTSX)<<48|uint64(o.size)<<56
			addPost(p)
		case postPIP:
			p.pm, p.pmul, p.fm, p.fmul = ^uint64(1), 16, 1, uint64(FlagNR)<<7
			f.pidx = addPost(p)
		case postVMCS:
			p.pmul = 1 << 12
			f.pidx = addPost(p)
		case postTMA:
			// Payload byte 2 and bits 15:9 of the fast counter are reserved.
			p.chkMask, p.pm, p.ahdr, p.am = 0xff<<32|0xfe<<48, 0xffff, 5, 0xffff
			f.pidx = addPost(p)
		case postMNT:
			p.chkMask, p.chkVal = 0xff<<16, 0x88<<16
			f.pidx = addPost(p)
		case postMwait:
			p.pm, p.ahdr, p.am = 0xffffffff, 6, 0xffffffff
			f.pidx = addPost(p)
		case postPwre:
			p.thdr, p.tm, p.fm, p.fmul = 3, 0xff, 0x80, uint64(FlagHW)
			f.pidx = addPost(p)
		case postPwrx:
			p.thdr, p.tm, p.ahdr, p.am = 2, 0xff, 3, 0xf
			f.pidx = addPost(p)
		case postEVD:
			p.thdr, p.tm = 2, 0x3f
			f.pidx = addPost(p)
		case postCYC:
			t.sizeClass[i] |= fastCYC << 8
			continue
		default:
			// TRIG varies in size, PSB checks 16 bytes, BBP enters
			// the block context, CFE's payload shifts right; the rest are
			// errors.
			t.sizeClass[i] |= fastOne << 8
			continue
		}
		t.sizeClass[i] |= fastPost << 8
	}
	// The escape's class and size are in the other half (see fast).
	t.sizeClass[2] = 0
	return t
}

// lowMask[n] keeps the low n bytes of a word.
var lowMask = [16]uint64{0, 0xff, 0xffff, 0xffffff, 0xffffffff, 0xffffffffff,
	0xffffffffffff, 0xffffffffffffff, 0xffffffffffffffff}

// Next decodes the packet at the current position into p and advances past
// it. It returns io.EOF at the end of the buffer and a *PacketError for bytes
// it cannot decode; after an error the following Next first resynchronizes
// at the next PSB (as SyncForward), so a loop that keeps calling Next always
// terminates.
func (d *PacketDecoder) Next(p *Packet) error {
	_, err := d.Decode(unsafe.Slice(p, 1))
	return err
}

// Decode decodes up to len(out) packets into out and returns how many it
// decoded. It stops early, returning n and the reason, at the end of the
// buffer (io.EOF, only when n is 0) or at bytes it cannot decode (a
// *PacketError, as Next). Decoding a batch keeps the decoder state in
// registers; it is the fast way through a large buffer.
func (d *PacketDecoder) Decode(out []Packet) (int, error) {
	if d.failed {
		if err := d.SyncForward(); err != nil {
			return 0, err
		}
	}
	i := 0
	for i < len(out) {
		if d.ctx == ctxNone {
			i += d.fast(out[i:])
			if i == len(out) {
				break
			}
		}
		if err := d.one(&out[i]); err != nil {
			if i > 0 && errors.Is(err, io.EOF) {
				return i, nil
			}
			return i, err
		}
		i++
	}
	return i, nil
}

// fast decodes packets into out until it meets one it leaves to one (bad
// bytes, the last 16 bytes of the buffer, PSB, BBP, TRIG, CFE, a CYC longer
// than 9 bytes) and returns how many it decoded. It makes no calls, so its
// state stays in registers.
//
// Its step has no data-dependent branches (a random packet mix would
// mispredict every one of them): a table lookup on the opcode, an 8-byte
// load masked to the payload, and IP decompression and TNT bit counting
// done for every packet and kept or dropped by masks. Only the packets of a
// post class (a fifth of a mixed stream) branch off, to be finished by a
// fastPostOp's masks and multipliers, or by cycGroups for CYC.
func (d *PacketDecoder) fast(out []Packet) int {
	buf, pos, last := d.buf, d.pos, d.lastIP
	end := len(buf) - 16
	base := unsafe.Pointer(unsafe.SliceData(buf))
	// The loops walk out by pointer, counting down the packets left (two
	// registers, not three; pp never goes past the last element), and read
	// buf at pos ≤ len(buf)-16 without bounds checks (no register for
	// len(buf)).
	const psize = unsafe.Sizeof(Packet{})
	pp, left := unsafe.Pointer(unsafe.SliceData(out)), len(out)
	for left > 0 && pos <= end {
		// The inner loop decodes the packets that need nothing beyond
		// fastOp; it leaves the others to the outer one, so that their
		// work does not take registers from it.
		for {
			win := (*[16]byte)(unsafe.Add(base, pos))
			// m is all ones for the 0x02 escape, a third of a mixed
			// stream: a branch would mispredict, and the compiler makes no
			// conditional move for what feeds a load address.
			b0, b1 := int(win[0]), int(win[1])
			m := (b0 ^ 2 - 1) >> 63
			o := &fastTab.ops[(b0+m&(254+b1))&511]
			// The next packet's position is the critical path: two loads
			// of the size in parallel, from both table halves (the first
			// half has 0 for the escape), the escape's picked by m. Early,
			// so that b0, b1 and m are dead before the rest.
			sc := int(fastTab.sizeClass[b0]) + int(fastTab.sizeClass[256+b1])&m
			next := pos + sc
			// The class, above the size, is known as early: when the branch
			// mispredicts (a fifth of a mixed stream), it resolves early.
			// next is wrong then, but unused.
			if sc > 0xff {
				break
			}
			v := binary.LittleEndian.Uint64(win[o.hdr&7:])&o.mask | uint64(o.pl8)
			if v|^o.tntSel == 0 {
				break // TNT without a stop bit: one reports it
			}
			ip, n := o.ipTNT(v, last)
			p := (*Packet)(pp)
			p.Offset, p.Payload, p.IP = uint64(pos), v^n.stop&o.tntSel, ip&o.ipMask
			// The small fields in two stores instead of seven.
			img := (*[2]uint64)(unsafe.Pointer(&p.Aux))
			img[0], img[1] = o.img[0], o.img[1]|n.n&o.tntSel
			last, pos = ip, next
			if left--; left == 0 || pos > end {
				break
			}
			pp = unsafe.Add(pp, psize)
		}
		if left == 0 || pos > end {
			break
		}
		// A packet of a post class, or a TNT without a stop bit (class
		// fastNone): the latter and fastOne's are one's.
		win := (*[16]byte)(unsafe.Add(base, pos))
		b0, b1 := int(win[0]), int(win[1])
		m := (b0 ^ 2 - 1) >> 63
		sc := int(fastTab.sizeClass[b0]) + int(fastTab.sizeClass[256+b1])&m
		size, class := sc&0xff, sc>>8
		if class != fastPost && class != fastCYC {
			break
		}
		o := &fastTab.ops[(b0+m&(254+b1))&511]
		p := (*Packet)(pp)
		// No post class has an IP or TNT bits: IP 0, the last IP kept.
		p.Offset, p.IP = uint64(pos), 0
		if class == fastCYC {
			// Without a loop: the extension bytes end at the first with
			// bit 0 clear; up to 8 of them are one word.
			c, k := uint64(win[0]>>3), 0
			if win[0]&4 != 0 {
				x := binary.LittleEndian.Uint64(win[1:])
				t := ^x & 0x0101010101010101
				if t == 0 {
					break // longer than 9 bytes: one decides
				}
				k = bits.TrailingZeros64(t)/8 + 1
				c |= cycGroups(x, t) << 5
			}
			img := (*[2]uint64)(unsafe.Pointer(&p.Aux))
			img[0], img[1] = o.img[0], o.img[1]
			p.Payload, p.Size = c, uint8(1+k)
			size += k // the table's size is 1
		} else {
			v := binary.LittleEndian.Uint64(win[o.hdr&7:]) & o.mask
			q := &fastTab.post[(int(o.pidx)+int(v>>5&uint64(o.leaf)))&15]
			if binary.LittleEndian.Uint64(win[:])&q.chkMask != q.chkVal {
				break // reserved bits: one reports the error
			}
			p.Payload = v & q.pm * q.pmul
			aux := uint64(binary.LittleEndian.Uint32(win[q.ahdr&7:])) & q.am
			img := (*[2]uint64)(unsafe.Pointer(&p.Aux))
			img[0] = q.img0 | (v&q.fm*q.fmul)>>7<<32 | aux
			img[1] = uint64(win[q.thdr&15]&q.tm) << 16
		}
		pos += size
		if left--; left > 0 {
			pp = unsafe.Add(pp, psize)
		}
	}
	d.pos, d.lastIP = pos, last
	return len(out) - left
}

// tntStop is a TNT packet's stop bit: its number and the bit.
type tntStop struct{ n, stop uint64 }

// ipTNT is the branch-free middle of fast's step: the last IP after the
// packet with payload v, and, for TNT packets, the stop bit (for the others
// it is computed and dropped by the caller's masks).
func (o *fastOp) ipTNT(v, last uint64) (uint64, tntStop) {
	// ipCompression.apply by the masks buildFastTab takes from it. No
	// variable shifts: they need CX, and the register allocator spilled
	// loop state to free it.
	ip := v&o.ipMask | last&o.keep | uint64(int64(v<<16)>>16)&o.sextHi
	// n is the highest set bit, which the payload drops (BTR).
	n := uint(bits.Len64(v|1) - 1)
	return ip, tntStop{uint64(n), v ^ v&^(1<<(n&63))}
}

// cycGroups is the cycle count bits of a CYC packet's extension bytes
// (fast decodes CYC without a loop): x holds the 8 bytes after the first,
// t has bit 0 of each byte whose bit 0 is clear (the last extension byte is
// the first such). It packs the 7-bit groups in bits 7:1 of the extension
// bytes, as cyc does, by pairs, quads, then all eight.
func cycGroups(x, t uint64) uint64 {
	y := x >> 1 & 0x7f7f7f7f7f7f7f7f & ((t&-t)<<8 - 1)
	y = y&0x007f007f007f007f | y&0x7f007f007f007f00>>1
	y = y&0x00003fff00003fff | y&0x3fff00003fff0000>>2
	return y&0x000000000fffffff | y&0x0fffffff00000000>>4
}

// one decodes a single packet of any kind, anywhere in the buffer.
func (d *PacketDecoder) one(p *Packet) error {
	pos, last := d.pos, d.lastIP
	rem := len(d.buf) - pos
	if rem <= 0 {
		return io.EOF
	}
	// win is the next 16 bytes, zero-padded near the end of the buffer, so
	// that every read below stays in bounds (no packet but CYC is longer,
	// and CYC checks rem).
	var win *[16]byte
	if rem >= 16 {
		win = (*[16]byte)(d.buf[pos : pos+16])
	} else {
		d.tail = [16]byte{}
		copy(d.tail[:], d.buf[pos:])
		win = &d.tail
		if rem == 1 && win[0] == 2 {
			return d.fail(ErrTruncated)
		}
	}
	b := win[0]
	if d.ctx != ctxNone && b&7 == 4 {
		return d.bip(p, b, rem)
	}
	idx := int(b)
	if b == 2 {
		idx = 256 + int(win[1])
	}
	o := &ops[idx]
	size := int(o.size)
	if size > rem {
		if o.post == postMNT && rem >= 3 && win[2] != 0x88 {
			return d.fail(ErrBadOpcode)
		}
		return d.fail(ErrTruncated)
	}
	v := binary.LittleEndian.Uint64(win[o.hdr&7:])&lowMask[o.plen&15] | uint64(o.pl8)
	if v|^o.tntSel == 0 {
		return d.fail(ErrBadPacket) // TNT without a stop bit
	}
	ip := ipCompressions[o.ipc&7].apply(last, v)
	n := bits.Len64(v|1) - 1
	p.Offset, p.Payload, p.IP, p.Aux = uint64(pos), v&^(o.tntSel&(1<<uint(n))), ip&o.ipSel, 0
	p.Flags, p.Kind, p.Size, p.Bits, p.IPC, p.Type = o.flags, o.kind, uint8(size), o.bits|uint8(n)&uint8(o.tntSel), o.ipc, 0
	d.lastIP = last&^o.ipSel | ip&o.ipSel
	if d.ctx != ctxNone && !o.keepsBlock {
		d.ctx = ctxNone
	}
	if o.post != postNone {
		return d.post(p, o.post, win, v, rem)
	}
	d.pos = pos + size
	return nil
}

// post finishes the less common packets and advances past them.
func (d *PacketDecoder) post(p *Packet, post uint8, win *[16]byte, v uint64, rem int) error {
	switch post {
	case postCYC:
		return d.cyc(p, win, rem)
	case postMode:
		switch v >> 5 {
		case 0:
			p.Flags = uint16(v&1)*FlagCSL | uint16(v>>1&1)*FlagCSD | uint16(v>>2&1)*FlagIF
		case 1:
			p.Kind = ModeTSX
			p.Flags = uint16(v&1)*FlagInTX | uint16(v>>1&1)*FlagAbort
		default:
			return d.fail(ErrBadPacket)
		}
		p.Payload = v & 0x1f
	case postTrig:
		f := win[1]
		p.Flags = uint16(f>>7&1)*FlagIP | uint16(f>>5&1)*FlagMult
		if f&0x40 != 0 {
			if rem < 5 {
				return d.fail(ErrTruncated)
			}
			p.Flags |= FlagICNTV
			p.Aux = uint32(win[3]) | uint32(win[4])<<8
			p.Size = 5
		}
	case postPSB:
		if *win != psbPattern {
			return d.fail(ErrBadPacket)
		}
		d.lastIP = 0
	case postPIP:
		p.Flags = uint16(v&1) * FlagNR
		p.Payload = v >> 1 << 5
	case postVMCS:
		p.Payload = v << 12
	case postTMA:
		fc := uint32(v >> 24)
		if fc&^0x1ff != 0 || v>>16&0xff != 0 {
			return d.fail(ErrBadPacket)
		}
		p.Payload = v & 0xffff
		p.Aux = fc
	case postMNT:
		if win[2] != 0x88 {
			return d.fail(ErrBadOpcode)
		}
	case postMwait:
		p.Payload = v & 0xffffffff
		p.Aux = uint32(v >> 32)
	case postPwre:
		p.Type = uint8(v >> 8)
		p.Flags = uint16(v>>7&1) * FlagHW
	case postPwrx:
		p.Type = uint8(v)
		p.Aux = uint32(v >> 8 & 0xf)
	case postBBP:
		p.Type = uint8(v & 0x1f)
		if v&0x80 != 0 {
			p.Flags = FlagSZ
			d.ctx = ctxBlk4
		} else {
			d.ctx = ctxBlk8
		}
		p.Payload = 0
	case postCFE:
		p.Type = uint8(v & 0x1f)
		p.Flags = uint16(v>>7&1) * FlagIP
		p.Payload = v >> 8
	case postEVD:
		p.Type = win[2] & 0x3f
	case postBadPkt:
		return d.fail(ErrBadPacket)
	default:
		return d.fail(ErrBadOpcode)
	}
	d.pos += int(p.Size)
	return nil
}

// cycMaxSize bounds a CYC packet like libipt does (15 bytes); the SDM sets
// no bound, but longer ones cannot carry more than 64 bits of count.
const cycMaxSize = 15

func (d *PacketDecoder) cyc(p *Packet, win *[16]byte, rem int) error {
	b := win[0]
	v := uint64(b >> 3)
	size := 1
	if b&4 != 0 {
		shift := uint(5)
		for {
			if size >= rem {
				return d.fail(ErrTruncated)
			}
			if size >= cycMaxSize {
				return d.fail(ErrBadPacket)
			}
			x := win[size]
			size++
			if shift < 64 {
				v |= uint64(x>>1) << shift
			}
			shift += 7
			if x&1 == 0 {
				break
			}
		}
	}
	p.Payload = v
	p.Size = uint8(size)
	d.pos += size
	return nil
}

func (d *PacketDecoder) bip(p *Packet, b byte, rem int) error {
	n := 4
	if d.ctx == ctxBlk8 {
		n = 8
	}
	if rem < n+1 {
		return d.fail(ErrTruncated)
	}
	*p = Packet{Offset: uint64(d.pos), Kind: BIP, Type: b >> 3, Bits: uint8(n),
		Payload: le(d.buf, d.pos+1, n), Size: uint8(n + 1)}
	d.pos += n + 1
	return nil
}
