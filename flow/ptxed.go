package flow

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"ptfs/decode"
	"ptfs/x86insn"
)

// PtxedOptions are libipt ptxed's options, as ptfs decode --insns takes
// them. Files (--raw, --pt) are collected for the caller to load.
type PtxedOptions struct {
	// Raws are the --raw arguments: FILE[:START[-END]]:BASE.
	Raws []Raw
	// PT is the trace file (--pt or the trailing argument).
	PT string
	// CPU is the --cpu argument (f/m[/s], "none" or "auto").
	CPU string

	NoInst bool // --no-inst: addresses only (ptfs prints no disassembly either way)
	Quiet  bool // --quiet: errors only
	// Check is --check: ptxed's consistency checks of its disassembler,
	// which print only when they fail; ptfs has no second decoder to
	// check against.
	Check       bool
	EventIP     bool // --event:ip: the IP of events
	EventIflags bool // --event:iflags
	Stat        bool // --stat
	StatInsn    bool // --stat:insn
	StatBlocks  bool // --stat:blocks
	// Block is set by --block-decoder (ptxed's default) and cleared by
	// --insn-decoder; it changes only the statistics printed.
	Block         bool
	ShowBlocks    bool // --block:show-blocks
	EndOnCall     bool // --block:end-on-call
	EndOnJump     bool // --block:end-on-jump
	ResyncOnError bool // --resync-on-error
	EventTime     bool // --event:time: the time of events
	EventTick     bool // --event:tick: tick events when the time changed
	// Clock is the timing configuration (--mtc-freq, --nom-freq,
	// --cpuid-0x15.eax/ebx); KeepTcalOnOvf is the chosen decoder's
	// --insn:/--block:keep-tcal-on-ovf.
	Clock                       decode.ClockConfig
	insnKeepTcal, blockKeepTcal bool
}

// FlowOptions returns the flow decoder's options for o.
func (o *PtxedOptions) FlowOptions() Options {
	f := Options{ResyncOnError: o.ResyncOnError, Iflags: o.EventIflags, Ticks: o.EventTick}
	if o.EventTime || o.EventTick {
		c := o.Clock
		c.KeepTcalOnOvf = o.insnKeepTcal
		if o.Block {
			c.KeepTcalOnOvf = o.blockKeepTcal
		}
		f.Time = &c
	}
	return f
}

// Raw is one --raw argument: the bytes [Start, End) of File (End 0: to its
// end) at address Base.
type Raw struct {
	File       string
	Start, End uint64
	Base       uint64
}

// ErrBadOption is returned for arguments ptxed rejects.
var ErrBadOption = errors.New("bad ptxed option")

// ptxedValueOpts are the options that take a value, with whether ptfs acts
// on it (the others are timing and filter settings the flow does not use).
var ptxedValueOpts = map[string]bool{
	"--raw": true, "--pt": true, "--cpu": true, "--mtc-freq": true, "--nom-freq": true,
	"--cpuid-0x15.eax": true, "--cpuid-0x15.ebx": true, "--iscache-limit": false,
}

// clockOptBits are the widths of the timing options' values.
var clockOptBits = map[string]uint{"--mtc-freq": 8, "--nom-freq": 8, "--cpuid-0x15.eax": 32, "--cpuid-0x15.ebx": 32}

// PtxedOptionTakesValue tells whether ptxed option opt takes a value.
func PtxedOptionTakesValue(opt string) bool {
	_, ok := ptxedValueOpts[opt]
	return ok || isFilterOpt(opt)
}

// isFilterOpt matches --filter:addrN_cfg/_a/_b.
func isFilterOpt(opt string) bool {
	rest, ok := strings.CutPrefix(opt, "--filter:addr")
	if !ok || len(rest) < 2 || rest[0] < '0' || rest[0] > '3' {
		return false
	}
	switch rest[1:] {
	case "_cfg", "_a", "_b":
		return true
	}
	return false
}

// ParsePtxedArgs parses ptxed's command line (without the program name).
func ParsePtxedArgs(args []string) (PtxedOptions, error) {
	o := PtxedOptions{Block: true}
	flags := map[string]*bool{
		"--no-inst": &o.NoInst, "--quiet": &o.Quiet, "-q": &o.Quiet, "--check": &o.Check,
		"--event:ip": &o.EventIP, "--event:iflags": &o.EventIflags,
		"--stat": &o.Stat, "--stat:insn": &o.StatInsn, "--stat:blocks": &o.StatBlocks,
		"--block:show-blocks": &o.ShowBlocks, "--block:end-on-call": &o.EndOnCall,
		"--block:end-on-jump": &o.EndOnJump, "--resync-on-error": &o.ResyncOnError,
		"--event:time": &o.EventTime, "--event:tick": &o.EventTick,
		"--insn:keep-tcal-on-ovf": &o.insnKeepTcal, "--block:keep-tcal-on-ovf": &o.blockKeepTcal,
	}
	// Options that would change the listing in ways ptfs does not model
	// are refused rather than ignored.
	ignored := map[string]bool{"--verbose": true, "-v": true}
	unsupported := map[string]bool{"--att": true, "--raw-insn": true, "--offset": true,
		"--time": true}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if f, ok := flags[a]; ok {
			*f = true
			continue
		}
		switch {
		case ignored[a]:
			continue
		case unsupported[a]:
			return o, fmt.Errorf("%s: not supported by ptfs decode --insns: %w", a, ErrBadOption)
		case a == "--insn-decoder":
			o.Block = false
			continue
		case a == "--block-decoder":
			o.Block = true
			continue
		case !PtxedOptionTakesValue(a):
			if !strings.HasPrefix(a, "-") && o.PT == "" {
				o.PT = a
				continue
			}
			return o, fmt.Errorf("unknown option %s: %w", a, ErrBadOption)
		}
		if i+1 >= len(args) {
			return o, fmt.Errorf("%s: missing argument: %w", a, ErrBadOption)
		}
		i++
		val := args[i]
		switch a {
		case "--raw":
			r, err := parseRaw(val)
			if err != nil {
				return o, err
			}
			o.Raws = append(o.Raws, r)
		case "--pt":
			if o.PT != "" {
				return o, fmt.Errorf("--pt %s: only one trace file: %w", val, ErrBadOption)
			}
			o.PT = val
		case "--cpu":
			if val != "auto" {
				if _, err := decode.CPUKnown(val); err != nil {
					return o, fmt.Errorf("%w: %w", ErrBadOption, err)
				}
			}
			o.CPU = val
		default:
			n, err := strconv.ParseUint(val, 0, 64)
			if err != nil {
				return o, fmt.Errorf("%s %q: not a number: %w", a, val, ErrBadOption)
			}
			if b, ok := clockOptBits[a]; ok && n>>b != 0 {
				return o, fmt.Errorf("%s %q: too big: %w", a, val, ErrBadOption)
			}
			switch a {
			case "--mtc-freq":
				o.Clock.MTCFreq = uint8(n)
			case "--nom-freq":
				o.Clock.NomFreq = uint8(n)
			case "--cpuid-0x15.eax":
				o.Clock.CPUID15EAX = uint32(n)
			case "--cpuid-0x15.ebx":
				o.Clock.CPUID15EBX = uint32(n)
			}
		}
	}
	if o.PT == "" {
		return o, fmt.Errorf("no trace file (--pt): %w", ErrBadOption)
	}
	if len(o.Raws) == 0 {
		return o, fmt.Errorf("no code (--raw FILE:BASE): %w", ErrBadOption)
	}
	return o, nil
}

// parseRaw parses FILE[:START[-END]]:BASE, splitting at the last colons as
// ptxed does (a file name may hold one).
func parseRaw(arg string) (Raw, error) {
	bad := func() (Raw, error) {
		return Raw{}, fmt.Errorf("--raw %q: want FILE[:START[-END]]:BASE: %w", arg, ErrBadOption)
	}
	i := strings.LastIndexByte(arg, ':')
	if i <= 0 {
		return bad()
	}
	base, err := strconv.ParseUint(arg[i+1:], 0, 64)
	if err != nil {
		return bad()
	}
	r := Raw{File: arg[:i], Base: base}
	j := strings.LastIndexByte(r.File, ':')
	if j < 0 {
		return r, nil
	}
	from, to, isRange := strings.Cut(r.File[j+1:], "-")
	start, err := strconv.ParseUint(from, 0, 64)
	if err != nil {
		// The colon is part of the file name.
		return r, nil
	}
	r.Start = start
	if isRange {
		end, err := strconv.ParseUint(to, 0, 64)
		if err != nil || end <= start {
			return bad()
		}
		r.End = end
	}
	r.File = r.File[:j]
	return r, nil
}

// CPUDiag is the line ptxed prints for a --cpu whose errata libipt does not
// know, or "" (ptxed decodes on).
func CPUDiag(cpu string) string {
	if cpu == "auto" {
		return ""
	}
	if known, err := decode.CPUKnown(cpu); err != nil || !known {
		return "[0, 0: config error: unknown cpu]\n"
	}
	return ""
}

// Ptxed is a Handler that prints the flow as ptxed prints it with the
// options given. Lines go to an internal buffer flushed to the writer when
// it grows, so that an instruction costs no allocation.
type Ptxed struct {
	o     *PtxedOptions
	w     io.Writer
	buf   []byte
	err   error
	insns uint64
	// blocks counts the block decoder's blocks: an event, or a branch
	// that needs trace (conditional, indirect, return, far; direct
	// calls and jumps with end-on-call, end-on-jump) ends one.
	blocks   uint64
	newBlock bool
}

// NewPtxed returns a printer to w.
func NewPtxed(w io.Writer, o *PtxedOptions) *Ptxed {
	return &Ptxed{o: o, w: w, buf: make([]byte, 0, 64<<10), newBlock: true}
}

func (p *Ptxed) flushIfFull() {
	if len(p.buf) > 60<<10 {
		p.Flush()
	}
}

// Flush writes the buffered lines; it returns the first write error.
func (p *Ptxed) Flush() error {
	if p.err == nil && len(p.buf) > 0 {
		_, p.err = p.w.Write(p.buf)
	}
	p.buf = p.buf[:0]
	return p.err
}

// appendHex16 appends v as %016x.
func appendHex16(b []byte, v uint64) []byte { return decode.AppendHex(b, v, 16) }

// Insn prints an instruction address.
func (p *Ptxed) Insn(in *Insn) {
	p.insns++
	if p.newBlock {
		p.blocks++
		p.newBlock = false
		if p.o.Block && p.o.ShowBlocks && !p.o.Quiet {
			p.buf = append(p.buf, "[block]\n"...)
		}
	}
	switch in.Class {
	case x86insn.CondJump, x86insn.Ret, x86insn.IndirectJump, x86insn.IndirectCall, x86insn.FarTransfer:
		p.newBlock = true
	case x86insn.Jump:
		p.newBlock = p.o.EndOnJump
	case x86insn.Call:
		p.newBlock = p.o.EndOnCall
	}
	if p.o.Quiet {
		return
	}
	if in.Speculative {
		p.buf = append(p.buf, "? "...)
	}
	p.buf = appendHex16(p.buf, in.IP)
	p.buf = append(p.buf, '\n')
	p.flushIfFull()
}

// Branch is not printed by ptxed.
func (p *Ptxed) Branch(from, to uint64, kind BranchKind) {}

// Event prints an event line, or an error line.
func (p *Ptxed) Event(e *Event) {
	p.newBlock = true
	if e.Kind == EvError {
		what := "error"
		if e.Flags&ResyncFailed != 0 {
			what = "resync error"
		}
		p.buf = fmt.Appendf(p.buf, "[%x, %x: %s: %v]\n", e.Offset, e.IP, what, e.Err)
		p.flushIfFull()
		return
	}
	if p.o.Quiet {
		return
	}
	if e.Kind == EvEnd {
		p.buf = append(p.buf, "[end of trace]\n"...)
		return
	}
	p.buf = append(p.buf, '[')
	if p.o.EventTime {
		p.buf = append(appendHex16(p.buf, e.TSC), "  "...)
	}
	ip := func(b []byte, name string, v uint64) []byte {
		return appendHex16(append(b, ", "+name+": "...), v)
	}
	withIP := p.o.EventIP && e.HasIP
	b := p.buf
	switch e.Kind {
	case EvEnabled:
		if e.Flags&Resumed != 0 {
			b = append(b, "resumed"...)
		} else {
			b = append(b, "enabled"...)
		}
		if p.o.EventIP {
			b = ip(b, "ip", e.IP)
		}
		withIP = false
	case EvDisabled:
		b = append(b, "disabled"...)
	case EvAsyncDisabled:
		b = append(b, "disabled"...)
		if p.o.EventIP {
			b = ip(b, "at", e.At)
		}
	case EvInterrupt:
		b = append(b, "interrupt"...)
		if p.o.EventIP {
			b = ip(b, "from", e.At)
			if e.HasIP {
				b = ip(b, "to", e.IP)
			}
		}
		withIP = false
	case EvOverflow:
		b = append(b, "overflow"...)
	case EvExecMode:
		b = append(b, "exec mode: "+e.Mode.String()...)
	case EvPTWrite:
		b = fmt.Appendf(b, "ptwrite: %x", e.Payload)
	case EvPaging:
		b = append(b, "paging, cr3: "...)
		b = appendHex16(b, e.Payload)
		if e.Flags&NonRoot != 0 {
			b = append(b, ", nr"...)
		}
	case EvVMCS:
		b = append(b, "vmcs, base: "...)
		b = appendHex16(b, e.Payload)
	case EvStop:
		b = append(b, "stopped"...)
	case EvMNT:
		b = fmt.Appendf(b, "mnt: %x", e.Payload)
	case EvTSX:
		switch {
		case e.Flags&Aborted != 0:
			b = append(b, "aborted"...)
		case e.Flags&Speculative != 0:
			b = append(b, "begin transaction"...)
		default:
			b = append(b, "committed"...)
		}
	case EvExstop:
		b = append(b, "exstop"...)
	case EvMwait:
		b = fmt.Appendf(b, "mwait %x %x", e.Payload, e.Aux)
	case EvPwre:
		b = fmt.Appendf(b, "pwre c%d.%d", (e.Payload>>4+1)&15, (e.Payload+1)&15)
		if e.Flags&HW != 0 {
			b = append(b, " hw"...)
		}
	case EvPwrx:
		b = append(b, "pwrx "...)
		if e.Aux&1 != 0 {
			b = append(b, "int: "...)
		}
		if e.Aux&4 != 0 {
			b = append(b, "st: "...)
		}
		if e.Aux&8 != 0 {
			b = append(b, "hw: "...)
		}
		b = fmt.Appendf(b, "c%d (c%d)", (e.Payload>>4+1)&15, (e.Payload+1)&15)
	case EvCBR:
		b = fmt.Appendf(b, "cbr: %x", e.Payload)
	case EvIflags:
		if e.Payload != 0 {
			b = append(b, "interrupts enabled"...)
		} else {
			b = append(b, "interrupts disabled"...)
		}
	case EvCFE:
		b = appendCFE(b, e)
	case EvTick:
		b = append(b, "tick"...)
	case EvTrig:
		b = fmt.Appendf(b, "trig %02x", e.Payload)
		if e.Flags&Mult != 0 {
			b = append(b, ", mult"...)
		}
	}
	if withIP {
		b = ip(b, "ip", e.IP)
	}
	p.buf = append(b, "]\n"...)
	p.flushIfFull()
}

// appendCFE appends an event trace event as ptxed prints it.
func appendCFE(b []byte, e *Event) []byte {
	data := func(b []byte, i int, name string) []byte {
		if e.Has&(1<<i) == 0 {
			return b
		}
		return appendHex16(append(b, ", "+name+": "...), e.Data[i])
	}
	switch e.Type {
	case CFEIntr:
		b = data(fmt.Appendf(b, "interrupt %d", e.Payload), 0, "cr2")
	case CFEIret:
		b = append(b, "iret"...)
	case CFESMI:
		b = append(b, "smi"...)
	case CFERSM:
		b = append(b, "rsm"...)
	case CFESIPI:
		b = fmt.Appendf(b, "sipi: %x", e.Payload)
	case CFEInit:
		b = append(b, "init"...)
	case CFEVMEntry:
		b = append(b, "vmentry"...)
	case CFEVMExit, CFEVMExitIntr:
		b = append(b, "vmexit"...)
		if e.Type == CFEVMExitIntr {
			b = fmt.Appendf(b, ", intr: %d", e.Payload)
		}
		b = data(data(b, 2, "vmxr"), 1, "vmxq")
	case CFEShutdown:
		b = append(b, "shutdown"...)
	case CFEUintr:
		b = fmt.Appendf(b, "uintr %d", e.Payload)
	case CFEUiret:
		b = append(b, "uiret"...)
	case CFESwintr:
		b = fmt.Appendf(b, "swintr %d", e.Payload)
	case CFESyscall:
		b = append(b, "syscall"...)
	default:
		b = fmt.Appendf(b, "cfe %d", e.Type)
	}
	return b
}

// Stats prints the statistics ptxed prints with --stat.
func (p *Ptxed) Stats() {
	o := p.o
	if !o.Stat && !o.StatInsn && !o.StatBlocks {
		return
	}
	all := !o.StatInsn && !o.StatBlocks
	if all || o.StatInsn {
		p.buf = fmt.Appendf(p.buf, "insn: %d.\n", p.insns)
	}
	if o.Block && (all || o.StatBlocks) {
		p.buf = fmt.Appendf(p.buf, "blocks: %d.\n", p.blocks)
	}
}
