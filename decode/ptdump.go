package decode

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// PtdumpOptions are the options of libipt's ptdump that change its listing.
type PtdumpOptions struct {
	NoOffset      bool // --no-offset: no offset column
	Raw           bool // --raw: raw packet bytes column
	LastIP        bool // --lastip: last-IP column on IP packets
	ExecMode      bool // --exec-mode: execution mode on mode.exec
	NoPad         bool // --no-pad: hide PAD packets
	NoTiming      bool // --no-timing: hide timing packets
	NoCyc         bool // --no-cyc: hide CYC and ignore it for time
	Quiet         bool // --quiet: errors only
	NoSync        bool // --no-sync: start at offset 0 instead of the first PSB
	Time          bool // --time: estimated TSC on timing packets
	Tcal          bool // --tcal: calibration on timing packets
	TimeDelta     bool // --time-delta: time and calibration as deltas
	NoTcal        bool // --no-tcal: no calibration
	NoWallClock   bool // --no-wall-clock: relative time without a TSC
	KeepTcalOnOvf bool // --keep-tcal-on-ovf
	MTCFreq       uint8
	NomFreq       uint8
	CPUID15EAX    uint32
	CPUID15EBX    uint32
	// CPU is the --cpu argument ("f/m[/s]"), or "" or "none". Only
	// ptdump's diagnostic for a CPU libipt has no errata table for is
	// modelled; no errata workarounds are applied.
	CPU string
}

// ErrBadOption is returned by ParsePtdumpArgs for arguments ptdump rejects.
var ErrBadOption = errors.New("bad ptdump option")

// ptdumpValueOpts are the ptdump options that take a value.
var ptdumpValueOpts = map[string]bool{
	"--cpu": true, "--mtc-freq": true, "--nom-freq": true,
	"--cpuid-0x15.eax": true, "--cpuid-0x15.ebx": true,
}

// PtdumpOptionTakesValue tells whether ptdump option opt takes a value (the
// next argument).
func PtdumpOptionTakesValue(opt string) bool { return ptdumpValueOpts[opt] }

// ParsePtdumpArgs parses ptdump command-line options (without the file).
func ParsePtdumpArgs(args []string) (PtdumpOptions, error) {
	var o PtdumpOptions
	flags := map[string]*bool{
		"--no-offset": &o.NoOffset, "--raw": &o.Raw, "--lastip": &o.LastIP,
		"--exec-mode": &o.ExecMode, "--no-pad": &o.NoPad, "--no-timing": &o.NoTiming,
		"--no-cyc": &o.NoCyc, "--quiet": &o.Quiet, "--no-sync": &o.NoSync,
		"--time": &o.Time, "--tcal": &o.Tcal, "--time-delta": &o.TimeDelta,
		"--no-tcal": &o.NoTcal, "--no-wall-clock": &o.NoWallClock,
		"--keep-tcal-on-ovf": &o.KeepTcalOnOvf,
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if f, ok := flags[a]; ok {
			*f = true
			continue
		}
		if !ptdumpValueOpts[a] {
			return o, fmt.Errorf("unknown option %s: %w", a, ErrBadOption)
		}
		if i+1 >= len(args) {
			return o, fmt.Errorf("%s: missing argument: %w", a, ErrBadOption)
		}
		val := args[i+1]
		i++
		if a == "--cpu" {
			if _, err := CPUKnown(val); err != nil {
				return o, err
			}
			o.CPU = val
			continue
		}
		bits := 32
		if a == "--mtc-freq" || a == "--nom-freq" {
			bits = 8
		}
		n, err := strconv.ParseUint(val, 0, bits)
		if err != nil {
			return o, fmt.Errorf("%s %q: %w", a, val, ErrBadOption)
		}
		switch a {
		case "--mtc-freq":
			o.MTCFreq = uint8(n)
		case "--nom-freq":
			o.NomFreq = uint8(n)
		case "--cpuid-0x15.eax":
			o.CPUID15EAX = uint32(n)
		case "--cpuid-0x15.ebx":
			o.CPUID15EBX = uint32(n)
		}
	}
	if o.Time && o.Tcal {
		return o, fmt.Errorf("specify either --time or --tcal: %w", ErrBadOption)
	}
	return o, nil
}

// errataModels are the family 6 models libipt's pt_cpu_errata knows.
var errataModels = map[uint64]bool{0x3d: true, 0x47: true, 0x4f: true, 0x56: true,
	0x4e: true, 0x5e: true, 0x8e: true, 0x9e: true, 0x55: true, 0x66: true, 0x7d: true,
	0x7e: true, 0x5c: true, 0x5f: true, 0x7a: true, 0x86: true}

// CPUKnown parses a --cpu argument of libipt's tools and reports whether
// libipt knows the CPU's errata ("none" counts as known: nothing to look
// up); a malformed one is an ErrBadOption.
func CPUKnown(cpu string) (bool, error) {
	if cpu == "" || cpu == "none" {
		return true, nil
	}
	parts := strings.Split(cpu, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return false, fmt.Errorf("--cpu %q: cpu must be specified as f/m[/s]: %w", cpu, ErrBadOption)
	}
	var n [3]uint64
	for i, part := range parts {
		v, err := strconv.ParseUint(part, 0, 16)
		if err != nil {
			return false, fmt.Errorf("--cpu %q: cpu must be specified as f/m[/s]: %w", cpu, ErrBadOption)
		}
		n[i] = v
	}
	return n[0] == 6 && errataModels[n[1]], nil
}

// libipt error codes that ptdump prints, as pt_errstr spells them.
type ptErr uint8

const (
	pteOK ptErr = iota
	pteInternal
	pteBadOpc
	pteBadPacket
	pteBadContext
	pteBadConfig
	pteNoIP
	pteNoTime
	pteBadCPU
)

var pteStrings = [...]string{
	pteOK:         "OK",
	pteInternal:   "internal error",
	pteBadOpc:     "unknown opcode",
	pteBadPacket:  "unknown packet",
	pteBadContext: "unexpected packet context",
	pteBadConfig:  "bad configuration",
	pteNoIP:       "no ip",
	pteNoTime:     "no timing information",
	pteBadCPU:     "unknown cpu",
}

// Ptdump lists packets one a line exactly as libipt's ptdump prints them,
// tracking last IP and time like ptdump does. It allocates nothing per
// packet once its scratch buffers have grown.
type Ptdump struct {
	opts PtdumpOptions

	// last-IP tracking, libipt's struct pt_last_ip (not reset at PSB:
	// ptdump resets it only when it resynchronizes after an error).
	ip         uint64
	haveIP     bool
	suppressed bool

	time     ptTime
	tcal     ptTcal
	tsc      uint64 // last printed TSC, for --time-delta
	fcr      uint64 // last printed FCR, for --time-delta
	inHeader bool

	opcode, std, id, trk []byte
	skip, skipTime       bool
	skipTcal             bool
}

// NewPtdump returns a lister with the given options.
func NewPtdump(opts PtdumpOptions) *Ptdump {
	l := &Ptdump{opts: opts}
	l.Reset()
	return l
}

// Reset clears the tracked state, as ptdump does after resynchronizing.
func (l *Ptdump) Reset() {
	l.ip, l.haveIP, l.suppressed = 0, false, false
	l.time = ptTime{}
	l.tcal.init()
	l.tsc, l.fcr = 0, 0
	l.inHeader = false
}

func (l *Ptdump) trackTime() bool { return l.opts.Time || l.opts.Tcal }

// appendDiag appends ptdump's "[offset: what: error]" line.
func appendDiag(dst []byte, offset uint64, what string, e ptErr, withErr bool) []byte {
	dst = append(dst, '[')
	dst = strconv.AppendUint(dst, offset, 16)
	dst = append(dst, ": "...)
	dst = append(dst, what...)
	if withErr {
		dst = append(dst, ": "...)
		dst = append(dst, pteStrings[e]...)
	}
	return append(dst, "]\n"...)
}

// AppendError appends the line ptdump prints when decoding fails at offset.
func (l *Ptdump) AppendError(dst []byte, offset uint64, err error) []byte {
	e := pteInternal
	switch {
	case errors.Is(err, ErrBadOpcode):
		e = pteBadOpc
	case errors.Is(err, ErrBadPacket):
		e = pteBadPacket
	}
	return appendDiag(dst, offset, "error decoding packet", e, true)
}

// AppendHex appends v in lower-case hex, zero-padded to width digits
// (printf's %0*x), the one copy that libipt-style listings use.
func AppendHex(dst []byte, v uint64, width int) []byte { return appendHex(dst, v, width) }

// hexDigits are the lower-case hex digits, by value.
const hexDigits = "0123456789abcdef"

// appendHex appends v in lower-case hex, zero-padded to width digits.
func appendHex(dst []byte, v uint64, width int) []byte {
	// In place, where strconv formats into a scratch buffer and copies:
	// a record's event id through strconv took an eighth of its line's
	// formatting.
	n := max((bits.Len64(v)+3)/4, width, 1)
	l := len(dst)
	if cap(dst)-l < n {
		dst = slices.Grow(dst, n)
	}
	dst = dst[:l+n]
	b := dst[l:]
	for i := n - 1; i >= 0; i-- {
		b[i] = hexDigits[v&0xf]
		v >>= 4
	}
	return dst
}

// appendPad appends s, then spaces up to width (printf's %-*s).
func appendPad(dst, s []byte, width int) []byte {
	dst = append(dst, s...)
	for n := len(s); n < width; n++ {
		dst = append(dst, ' ')
	}
	return dst
}

// clip truncates a field as ptdump's snprintf into a fixed buffer does.
func clip(b []byte, size int) []byte {
	if len(b) > size-1 {
		return b[:size-1]
	}
	return b
}

// AppendPacket appends ptdump's line for p (plus any diagnostics ptdump
// prints before it); raw holds the packet's bytes for --raw.
func (l *Ptdump) AppendPacket(dst []byte, p *Packet, raw []byte) []byte {
	l.opcode, l.std, l.id, l.trk = l.opcode[:0], l.std[:0], l.id[:0], l.trk[:0]
	l.skip, l.skipTime, l.skipTcal = false, false, false
	dst = l.packet(dst, p)
	if l.skip || l.opts.Quiet {
		return dst
	}
	if !l.opts.NoOffset {
		dst = appendHex(dst, p.Offset, 16)
		dst = append(dst, "  "...)
	}
	if l.opts.Raw {
		start := len(dst)
		for _, b := range raw {
			dst = appendHex(dst, uint64(b), 2)
		}
		for n := len(dst) - start; n < 33; n++ {
			dst = append(dst, ' ')
		}
		dst = append(dst, ' ')
	}
	std := clip(l.std, 25)
	if p.Kind == TNT8 || p.Kind == TNT64 {
		std = clip(l.std, 49)
	}
	if len(std) > 0 {
		dst = appendPad(dst, clip(l.opcode, 10), 10)
	} else {
		dst = append(dst, clip(l.opcode, 10)...)
	}
	switch {
	case len(l.id) > 0:
		dst = append(dst, ' ')
		dst = appendPad(dst, std, 25)
		dst = append(dst, ' ')
		dst = appendPad(dst, clip(l.id, 5), 5)
		dst = append(dst, clip(l.trk, 17)...)
	case len(std) > 0:
		dst = append(dst, ' ')
		dst = append(dst, std...)
	}
	return append(dst, '\n')
}

var cfeNames = [16]string{1: "intr", 2: "iret", 3: "smi", 4: "rsm", 5: "sipi", 6: "init",
	7: "vmentry", 8: "vmexit", 9: "vmexit_intr", 10: "shutdown", 12: "uintr",
	13: "uiret", 14: "swintr", 15: "syscall"}

var evdNames = [3]string{"cr2", "vmxq", "vmxr"}

// packet fills the fields of p's line and returns dst with diagnostics.
func (l *Ptdump) packet(dst []byte, p *Packet) []byte {
	o := &l.opts
	l.opcode = append(l.opcode, p.Kind.String()...)
	switch p.Kind {
	case PSB:
		l.inHeader = true
	case PSBEnd:
		l.inHeader = false
	case Pad:
		l.skip = o.NoPad
	case OVF:
		if l.trackTime() {
			if o.KeepTcalOnOvf {
				l.tcal.updateOVF()
			} else {
				l.tcal.init()
			}
		}
	case FUP, TIP, TIPPGE, TIPPGD:
		l.std = appendIPPayload(l.std, p)
		if o.LastIP {
			dst = l.trackLastIP(dst, p)
		}
	case PIP:
		l.std = appendHex(l.std, p.Payload, 0)
		if p.Has(FlagNR) {
			l.std = append(l.std, ", nr"...)
		}
		l.id = append(l.id, "cr3"...)
		l.trk = appendHex(l.trk, p.Payload, 16)
	case VMCS:
		l.std = appendHex(l.std, p.Payload, 0)
		l.id = append(l.id, "vmcs"...)
		l.trk = appendHex(l.trk, p.Payload, 16)
	case TNT8, TNT64:
		for i := int(p.Bits) - 1; i >= 0; i-- {
			if p.Payload>>uint(i)&1 != 0 {
				l.std = append(l.std, '!')
			} else {
				l.std = append(l.std, '.')
			}
		}
	case ModeExec:
		l.std = appendJoin(l.std, p.Has(FlagCSD), "cs.d")
		l.std = appendJoin(l.std, p.Has(FlagCSL), "cs.l")
		l.std = appendJoin(l.std, p.Has(FlagIF), "if")
		if o.ExecMode {
			l.id = append(l.id, "em"...)
			switch {
			case p.Has(FlagCSL) && p.Has(FlagCSD):
				l.trk = append(l.trk, "unknown"...)
			case p.Has(FlagCSL):
				l.trk = append(l.trk, "64-bit"...)
			case p.Has(FlagCSD):
				l.trk = append(l.trk, "32-bit"...)
			default:
				l.trk = append(l.trk, "16-bit"...)
			}
		}
	case ModeTSX:
		l.std = appendJoin(l.std, p.Has(FlagInTX), "intx")
		l.std = appendJoin(l.std, p.Has(FlagAbort), "abrt")
	case TSC:
		l.std = appendHex(l.std, p.Payload, 0)
		if l.trackTime() {
			dst = l.trackTSC(dst, p)
		}
		l.skip = o.NoTiming
	case CBR:
		l.std = appendHex(l.std, p.Payload, 0)
		if l.trackTime() {
			dst = l.trackCBR(dst, p)
		}
		l.skip = o.NoTiming
	case TMA:
		l.std = appendHex(l.std, p.Payload, 0)
		l.std = append(l.std, ", "...)
		l.std = appendHex(l.std, uint64(p.Aux), 0)
		if l.trackTime() {
			dst = l.trackTMA(dst, p)
		}
		l.skip = o.NoTiming
	case MTC:
		l.std = appendHex(l.std, p.Payload, 0)
		if l.trackTime() {
			dst = l.trackMTC(dst, p)
		}
		l.skip = o.NoTiming
	case CYC:
		l.std = appendHex(l.std, p.Payload, 0)
		if l.trackTime() && !o.NoCyc {
			dst = l.trackCYC(dst, p)
		}
		l.skip = o.NoTiming || o.NoCyc
	case MNT:
		l.std = appendHex(l.std, p.Payload, 0)
	case Exstop:
		if p.Has(FlagIP) {
			l.std = append(l.std, "ip"...)
		}
	case Mwait:
		l.std = appendHex(l.std, p.Payload, 8)
		l.std = append(l.std, ", "...)
		l.std = appendHex(l.std, uint64(p.Aux), 8)
	case Pwre:
		l.std = append(l.std, 'c')
		l.std = strconv.AppendUint(l.std, uint64((p.Type>>4+1)&0xf), 10)
		l.std = append(l.std, '.')
		l.std = strconv.AppendUint(l.std, uint64((p.Type+1)&0xf), 10)
		if p.Has(FlagHW) {
			l.std = append(l.std, ", hw"...)
		}
	case Pwrx:
		// ptdump's own spelling, leading spaces included.
		switch p.Aux & 0xd {
		case 1:
			l.std = append(l.std, "int"...)
		case 4:
			l.std = append(l.std, " st"...)
		case 8:
			l.std = append(l.std, " hw"...)
		default:
			l.std = append(l.std, "bad"...)
		}
		l.std = append(l.std, ": c"...)
		l.std = strconv.AppendUint(l.std, uint64((p.Type>>4+1)&0xf), 10)
		l.std = append(l.std, ", c"...)
		l.std = strconv.AppendUint(l.std, uint64((p.Type+1)&0xf), 10)
	case PTW:
		if p.Bits == 8 {
			l.std = append(l.std, "1: "...)
		} else {
			l.std = append(l.std, "0: "...)
		}
		l.std = appendHex(l.std, p.Payload, 0)
		if p.Has(FlagIP) {
			l.std = append(l.std, ", ip"...)
		}
	case CFE:
		l.std = strconv.AppendUint(l.std, uint64(p.Type), 10)
		switch p.Type {
		case 1, 9, 12, 14:
			l.std = append(l.std, ": "...)
			l.std = strconv.AppendUint(l.std, p.Payload, 10)
		case 5:
			l.std = append(l.std, ": "...)
			l.std = appendHex(l.std, p.Payload, 0)
		}
		if p.Has(FlagIP) {
			l.std = append(l.std, ", ip"...)
		}
		l.id = append(l.id, "type"...)
		name := ""
		if int(p.Type) < len(cfeNames) {
			name = cfeNames[p.Type]
		}
		if name == "" {
			name = "unknown"
		}
		l.trk = append(l.trk, name...)
	case EVD:
		l.std = strconv.AppendUint(l.std, uint64(p.Type), 10)
		l.std = append(l.std, ": "...)
		l.std = appendHex(l.std, p.Payload, 0)
		l.id = append(l.id, "type"...)
		if int(p.Type) < len(evdNames) {
			l.trk = append(l.trk, evdNames[p.Type]...)
		} else {
			l.trk = append(l.trk, "unknown"...)
		}
	case Trig:
		l.std = appendHex(l.std, p.Payload, 2)
		if p.Has(FlagIP) {
			l.std = append(l.std, ", ip"...)
		}
		if p.Has(FlagMult) {
			l.std = append(l.std, ", mult"...)
		}
		if p.Has(FlagICNTV) {
			l.std = append(l.std, ", icnt: "...)
			l.std = strconv.AppendUint(l.std, uint64(p.Aux), 10)
		}
	// libipt does not know the PEBS block packets; these lines are ours.
	case BBP:
		l.std = append(l.std, "sz: "...)
		if p.Has(FlagSZ) {
			l.std = append(l.std, '4')
		} else {
			l.std = append(l.std, '8')
		}
		l.std = append(l.std, ", type: "...)
		l.std = appendHex(l.std, uint64(p.Type), 0)
	case BIP:
		l.std = appendHex(l.std, uint64(p.Type), 0)
		l.std = append(l.std, ": "...)
		l.std = appendHex(l.std, p.Payload, 0)
	case BEP:
		if p.Has(FlagIP) {
			l.std = append(l.std, "ip"...)
		}
	}
	return dst
}

// appendJoin appends s when on, after ", " when b already holds something.
func appendJoin(b []byte, on bool, s string) []byte {
	if !on {
		return b
	}
	if len(b) > 0 {
		b = append(b, ", "...)
	}
	return append(b, s...)
}

// appendIPPayload prints an IP packet's payload as ptdump's
// print_ip_payload does.
func appendIPPayload(b []byte, p *Packet) []byte {
	b = append(b, byte('0'+p.IPC))
	b = append(b, ": "...)
	// The digits the last IP would give are '?'; the rest is the IP with
	// no last IP (a sign-extended payload prints extended).
	c := &ipCompressions[p.IPC&7]
	unknown := c.unknownDigits()
	b = append(b, "????????????????"[:unknown]...)
	if unknown == 16 {
		return b
	}
	return appendHex(b, c.apply(0, p.Payload), 16-unknown)
}

// trackLastIP is libipt's pt_last_ip update and query, as ptdump uses them.
func (l *Ptdump) trackLastIP(dst []byte, p *Packet) []byte {
	l.id = append(l.id, "ip"...)
	// The same rule as the decoder's; what differs is the state around it,
	// as in libipt: l.ip survives a PSB (only Reset, after a decode
	// error, clears it), and a suppressed IP leaves it but marks it suppressed.
	l.ip = ipCompressions[p.IPC&7].apply(l.ip, p.Payload)
	if p.IPC == IPCSuppressed {
		l.suppressed = true
	} else {
		l.haveIP, l.suppressed = true, false
	}
	switch {
	case !l.haveIP:
		l.trk = append(l.trk, "<unavailable>"...)
		return appendDiag(dst, p.Offset, "error tracking last-ip", pteNoIP, true)
	case l.suppressed:
		l.trk = append(l.trk, "<suppressed>"...)
	default:
		l.trk = appendHex(l.trk, l.ip, 16)
	}
	return dst
}

func (l *Ptdump) trackTSC(dst []byte, p *Packet) []byte {
	if !l.opts.NoTcal {
		var e ptErr
		if l.inHeader {
			e = l.tcal.headerTSC(p.Payload)
		} else {
			l.tcal.updateTSC(p.Payload)
		}
		if e != pteOK {
			dst = appendDiag(dst, p.Offset, "error calibrating time", e, true)
		}
	}
	l.time.updateTSC(p.Payload)
	return l.showTime(dst, p.Offset)
}

func (l *Ptdump) trackCBR(dst []byte, p *Packet) []byte {
	if !l.opts.NoTcal {
		if !l.inHeader {
			l.tcal.init()
		}
		if e := l.tcal.headerCBR(p.Payload, &l.opts); e != pteOK {
			dst = appendDiag(dst, p.Offset, "error calibrating time", e, true)
		}
	}
	if e := l.time.updateCBR(p.Payload); e != pteOK {
		dst = appendDiag(dst, p.Offset, "error updating time", e, true)
	}
	l.skipTime = true
	return l.showTime(dst, p.Offset)
}

func (l *Ptdump) trackTMA(dst []byte, p *Packet) []byte {
	if e := l.time.updateTMA(p.Payload, uint64(p.Aux), &l.opts); e != pteOK {
		dst = appendDiag(dst, p.Offset, "error updating time", e, true)
	}
	l.skipTcal = true
	return l.showTime(dst, p.Offset)
}

func (l *Ptdump) trackMTC(dst []byte, p *Packet) []byte {
	if !l.opts.NoTcal {
		if e := l.tcal.updateMTC(p.Payload, &l.opts); e != pteOK {
			dst = appendDiag(dst, p.Offset, "error calibrating time", e, true)
		}
	}
	if e := l.time.updateMTC(p.Payload, &l.opts); e != pteOK {
		dst = appendDiag(dst, p.Offset, "error updating time", e, true)
	}
	return l.showTime(dst, p.Offset)
}

func (l *Ptdump) trackCYC(dst []byte, p *Packet) []byte {
	var fcr uint64
	if !l.opts.NoTcal {
		var e ptErr
		fcr, e = l.tcal.getFCR()
		if e != pteOK {
			dst = appendDiag(dst, p.Offset, "calibration error", e, true)
		}
		l.tcal.updateCYC(p.Payload)
	}
	if e := l.time.updateCYC(p.Payload, &l.opts, fcr); e != pteOK {
		dst = appendDiag(dst, p.Offset, "error updating time", e, true)
	} else if fcr == 0 {
		dst = appendDiag(dst, p.Offset, "error updating time: no calibration", pteOK, false)
	}
	l.skipTcal = true
	return l.showTime(dst, p.Offset)
}

// showTime is ptdump's track_time: the fcr and tsc columns.
func (l *Ptdump) showTime(dst []byte, offset uint64) []byte {
	if l.opts.Tcal && !l.skipTcal {
		l.id = append(l.id[:0], "fcr"...)
		fcr, e := l.tcal.getFCR()
		if e != pteOK {
			l.trk = append(l.trk[:0], "<unavailable>"...)
			return appendDiag(dst, offset, "error printing time", e, true)
		}
		d := float64(fcr) / 256
		if l.opts.TimeDelta {
			l.trk = appendFloat3(l.trk[:0], d-float64(l.fcr)/256, true)
			l.fcr = fcr
		} else {
			l.trk = appendFloat3(l.trk[:0], d, false)
		}
	}
	if l.opts.Time && !l.skipTime {
		l.id = append(l.id[:0], "tsc"...)
		tsc := l.time.tsc
		if !l.time.haveTSC && !l.opts.NoWallClock {
			l.trk = append(l.trk[:0], "<unavailable>"...)
			return appendDiag(dst, offset, "error printing time", pteNoTime, true)
		}
		l.trk = l.trk[:0]
		if l.opts.TimeDelta {
			if l.tsc <= tsc {
				l.trk = append(l.trk, '+')
				l.trk = appendHex(l.trk, tsc-l.tsc, 0)
			} else {
				l.trk = append(l.trk, '-')
				l.trk = appendHex(l.trk, l.tsc-tsc, 0)
			}
			l.tsc = tsc
		} else {
			l.trk = appendHex(l.trk, tsc, 16)
		}
	}
	return dst
}

// appendFloat3 formats like printf's "%.3f" (or "%+.3f" when sign).
func appendFloat3(b []byte, f float64, sign bool) []byte {
	if sign && (f > 0 || (f == 0 && !math.Signbit(f))) {
		b = append(b, '+')
	}
	return strconv.AppendFloat(b, f, 'f', 3, 64)
}

// WritePtdump writes the listing of the PT stream buf that libipt's
// `ptdump OPTIONS FILE` prints: from the first PSB (unless NoSync), one
// packet a line, an error line and a resynchronization at the next PSB
// after bytes that do not decode, and silence at a packet cut off by the
// end of the stream.
func WritePtdump(w io.Writer, buf []byte, opts PtdumpOptions) error {
	pw, err := NewPtdumpWriter(w, opts)
	if err != nil {
		return err
	}
	_, _ = pw.Write(buf) // its error is Close's
	return pw.Close()
}

// ptdumpWindow is the bytes of trace a PtdumpWriter holds.
const ptdumpWindow = 64 << 10

// PtdumpWriter lists a PT stream that arrives in pieces cut at any byte
// (a pipe, a perf.data AUX buffer) exactly as WritePtdump lists it whole,
// offsets counted from the stream's start, in a fixed window of memory
// whatever the stream's length: bytes before the first PSB (or between
// an error and the next PSB) are searched as they arrive and dropped.
// One difference: a search that meets a run of PSB-like bytes longer than
// a PSB cut by a piece's end syncs at the PSB that ends the run so far
// (libipt's search takes the last PSB of a run), not at the run's end.
type PtdumpWriter struct {
	bw      *bufio.Writer
	l       *Ptdump
	d       PacketDecoder
	p       Packet
	win     []byte
	base    uint64 // the stream offset of win[0]
	drop    int    // bytes moved out of win since the decoder last saw it
	line    []byte
	noSync  bool
	started bool
	err     error // the first write error; it ends the listing
}

// NewPtdumpWriter returns a writer that lists the stream written to it on
// w; Close ends the stream and flushes the listing.
func NewPtdumpWriter(w io.Writer, opts PtdumpOptions) (*PtdumpWriter, error) {
	known, err := CPUKnown(opts.CPU)
	if err != nil {
		return nil, fmt.Errorf("ptdump: %w", err)
	}
	pw := &PtdumpWriter{
		bw:     bufio.NewWriterSize(w, 64<<10),
		l:      NewPtdump(opts),
		win:    make([]byte, 0, ptdumpWindow),
		line:   make([]byte, 0, 512),
		noSync: opts.NoSync,
	}
	if !known {
		pw.line = appendDiag(pw.line, 0, "failed to determine errata", pteBadCPU, true)
	}
	return pw, nil
}

// Write lists the packets that b completes; a packet it cuts waits for
// the next Write or Close. It returns len(b), or the listing's write
// error.
func (pw *PtdumpWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 && pw.err == nil {
		if len(pw.win) == cap(pw.win) {
			// Keep what a resynchronisation searches again: from 16
			// bytes before the next packet (list leaves fewer than
			// maxPacket bytes undecoded, so this frees most of win).
			keep := max(0, int(pw.d.Pos())-pw.drop-maxPacket)
			pw.win = pw.win[:copy(pw.win, pw.win[keep:])]
			pw.base += uint64(keep)
			pw.drop += keep
		}
		m := min(len(b), cap(pw.win)-len(pw.win))
		pw.win = append(pw.win, b[:m]...)
		b = b[m:]
		pw.list(false)
	}
	return n, pw.err
}

// Close lists the rest of the stream and flushes the listing.
func (pw *PtdumpWriter) Close() error {
	if pw.err == nil {
		pw.list(true)
	}
	if pw.err == nil {
		if err := pw.bw.Flush(); err != nil {
			pw.err = fmt.Errorf("ptdump: write listing: %w", err)
		}
	}
	return pw.err
}

// list decodes the packets in the window; before the end it leaves the
// last maxPacket bytes, which may hold a packet cut by the window's end.
func (pw *PtdumpWriter) list(end bool) {
	d := &pw.d
	// The decoder sees the new bytes only when it can decode a packet:
	// Slide after a failed search must find it at its buffer's end.
	if !end && len(pw.win)-(int(d.Pos())-pw.drop) < maxPacket {
		return
	}
	if pw.started {
		d.Slide(pw.win, pw.drop)
		pw.drop = 0
	} else {
		pw.started = true
		d.Reset(pw.win)
		if pw.noSync {
			_ = d.SyncSet(0)
		} else {
			_ = d.SyncForward() // failed: Next searches on in what Write adds
		}
	}
	for pw.err == nil {
		if !end && len(pw.win)-int(d.Pos()) < maxPacket {
			break
		}
		err := d.Next(&pw.p)
		stop := false
		switch {
		case err == nil:
			p := &pw.p
			raw := pw.win[p.Offset : p.Offset+uint64(p.Size)]
			p.Offset += pw.base
			pw.line = pw.l.AppendPacket(pw.line, p, raw)
		case errors.Is(err, io.EOF) || errors.Is(err, ErrTruncated):
			// The end of the stream, or of the window: Write's Slide
			// decodes a cut packet again whole.
			stop = true
		default:
			var pe *PacketError
			if !errors.As(err, &pe) {
				pw.err = fmt.Errorf("ptdump: %w", err)
				return
			}
			pw.line = pw.l.AppendError(pw.line, pw.base+pe.Offset, err)
			_ = d.SyncForward() // failed: Next searches on
			pw.l.Reset()
		}
		if len(pw.line) > 256 || stop {
			if _, werr := pw.bw.Write(pw.line); werr != nil {
				pw.err = fmt.Errorf("ptdump: write listing: %w", werr)
			}
			pw.line = pw.line[:0]
		}
		if stop {
			break
		}
	}
}
