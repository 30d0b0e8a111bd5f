package flow

import (
	"io"
	"strconv"

	"ptfs/decode"
	"ptfs/x86insn"
)

// Symbolizer names an address as SYM+OFF in DSO; images.Space is one (its
// Symbolize reads the ELF symbols through objfile, demangled).
type Symbolizer interface {
	Symbolize(addr uint64) (sym string, off uint64, dso string, ok bool)
}

// BranchKindName is a branch line's kind word (DESIGN §5): jcc, jmp, call,
// ret, ijmp, icall, far, async; a far transfer that is a syscall or
// sysenter is "syscall" (AppendBranch's caller decides, from the code).
func BranchKindName(k BranchKind) string {
	if int(k) < len(branchWords) {
		return branchWords[k]
	}
	return "branch(" + strconv.Itoa(int(k)) + ")"
}

var branchWords = [...]string{
	BrCond: "jcc", BrJump: "jmp", BrCall: "call", BrReturn: "ret",
	BrIndirectJump: "ijmp", BrIndirectCall: "icall", BrFar: "far", BrInterrupt: "async",
}

// symCacheMax bounds the symbol cache; it is dropped whole when full.
const symCacheMax = 1 << 16

type symEntry struct {
	name, dso string
	off       uint64
	ok        bool
}

// BranchCounters count what a Branches printed.
type BranchCounters struct {
	Branches uint64
	// Gaps counts the places where the path is unknown: decoding
	// errors and overflows.
	Gaps uint64
	// PTWrites counts the manual ptwrite lines.
	PTWrites uint64
}

// TimeSource gives the trace's time at the packet decoded last; Decoder is
// one (with Options.Time).
type TimeSource interface {
	TSC() (tsc uint64, ok bool)
}

// Branches is a Handler that prints the flow as `branch:`, `trace:`,
// `gap:` and `manual ptwrite:` lines (DESIGN §5) to a writer. Lines are
// appended to one reused buffer and symbols are cached per address, so a
// line costs no allocation once its addresses were seen.
type Branches struct {
	w     io.Writer
	mem   Memory
	sym   Symbolizer
	cache map[uint64]symEntry
	buf   []byte
	code  [2]byte
	err   error

	tid, cpu int32
	// recs assembles the ptwrites into probe records and manual
	// ptwrites, which come back through Record and Manual.
	recs *decode.Assembler
	seq  uint64

	// last is the last executed instruction; off says that the path is
	// not known since the last line (tracing off, before the first sync,
	// after a gap).
	last    Insn
	hasLast bool
	off     bool
	// stop is where tracing stopped without a line yet, in user-only
	// tracing the kernel having run: at a far transfer (a syscall) or
	// before an interrupted instruction (FUP + TIP.PGD without an IP: a
	// signal, an exception). An enable elsewhere is where it went, a
	// branch of stopKind; anything else gets the stop's trace line
	// (stopWhat).
	stop     uint64
	stopKind string
	stopWhat string
	stopOK   bool

	c BranchCounters

	// clock and TimeConv make the ` time=` of each line: perf time
	// (SEC.NSEC) of the clock's TSC. Without either (raw PT has no TSC
	// conversion) lines carry no time: never a guessed one.
	clock TimeSource
	// TimeConv converts a TSC to perf time in nanoseconds
	// (perfdata.TimeConv.NS); nil: no time= on lines.
	TimeConv func(tsc uint64) uint64
}

// NewBranches returns a Branches printing to w; mem is the traced code
// (to tell a syscall from other far transfers), sym names addresses (nil:
// every address is "[unknown]"), events the probe events whose records
// the ptwrites carry (nil: every ptwrite is a manual one).
func NewBranches(w io.Writer, mem Memory, sym Symbolizer, events map[uint16]*decode.Event) *Branches {
	b := &Branches{w: w, mem: mem, sym: sym, cache: make(map[uint64]symEntry), buf: make([]byte, 0, 64<<10), tid: -1, cpu: -1, off: true}
	b.recs = decode.NewAssembler(events, b)
	return b
}

// SetContext sets the thread and CPU printed with each line; negative
// means unknown (left out). A change ends a probe record (its words do
// not continue in another thread), and a stop that no enable resumed
// yet is told as a stop in the old context: the thread
// that made the syscall is not the one that goes on.
func (b *Branches) SetContext(tid, cpu int32) {
	if tid == b.tid && cpu == b.cpu {
		return
	}
	b.flushStop()
	b.recs.ContextSwitch()
	b.tid, b.cpu = tid, cpu
	b.recs.SetTID(tid)
	b.recs.SetCPU(cpu)
}

// SetEvents replaces the probe events whose records the ptwrites carry
// (a live mount adds and removes probes while it decodes).
func (b *Branches) SetEvents(events map[uint16]*decode.Event) { b.recs.SetEvents(events) }

// SymbolsChanged is called before the memory and the Symbolizer change
// (a context switch, an exec, an mmap): a stop that no enable resumed
// yet is told as a stop, named in the old memory (an
// exec's syscall does not return to its own code), and the names looked
// up so far are forgotten.
func (b *Branches) SymbolsChanged() {
	b.flushStop()
	clear(b.cache)
}

// SetClock sets where the lines' time comes from (the Decoder, decoding
// with Options.Time); with TimeConv set, lines carry ` time=`.
func (b *Branches) SetClock(c TimeSource) { b.clock = c }

// Record prints a probe record line (decode.Output).
func (b *Branches) Record(r *decode.Record) {
	b.seq++
	b.buf = decode.AppendRecord(b.buf, b.seq, r)
	b.flushIfFull()
}

// Manual prints a manual ptwrite line (decode.Output).
func (b *Branches) Manual(m *decode.Manual) {
	b.c.PTWrites++
	// AppendManual ends its line: the context goes before the newline.
	b.buf = decode.AppendManual(b.buf, m.Payload, m.IP, m.HasIP)
	b.buf = b.buf[:len(b.buf)-1]
	b.line()
}

// Finish ends the listing: a record cut short by the end of the trace is
// counted (not printed), a pending ptwrite printed, and a stop that
// nothing resumed gets its line.
func (b *Branches) Finish() {
	b.recs.End()
	b.flushStop()
}

// flushStop prints the line of a stop that no enable followed.
func (b *Branches) flushStop() {
	if b.stopOK {
		b.stopOK = false
		b.trace(b.stopWhat, b.stop)
	}
}

// stopped keeps a stop's line until what follows says whether it was a
// branch (stopped at ip, of kind, else the line `trace: what ip`).
func (b *Branches) stopped(ip uint64, kind, what string) {
	b.off = true
	b.stop, b.stopKind, b.stopWhat, b.stopOK = ip, kind, what, true
}

// RecordCounters returns the counters of the records and ptwrites
// assembled (the summary line's).
func (b *Branches) RecordCounters() decode.Counters { return b.recs.Counters() }

// Counters returns what b printed so far.
func (b *Branches) Counters() BranchCounters { return b.c }

// Flush writes out the buffered lines and returns the first write error.
func (b *Branches) Flush() error {
	if b.err == nil && len(b.buf) > 0 {
		_, b.err = b.w.Write(b.buf)
	}
	b.buf = b.buf[:0]
	return b.err
}

func (b *Branches) line() {
	b.buf = b.appendContext(b.buf)
	b.buf = append(b.buf, '\n')
	b.flushIfFull()
}

func (b *Branches) flushIfFull() {
	if len(b.buf) >= cap(b.buf)-512 {
		_ = b.Flush()
	}
}

func (b *Branches) appendContext(dst []byte) []byte {
	if b.tid >= 0 {
		dst = append(dst, " tid="...)
		dst = strconv.AppendInt(dst, int64(b.tid), 10)
	}
	if b.cpu >= 0 {
		dst = append(dst, " cpu="...)
		dst = strconv.AppendInt(dst, int64(b.cpu), 10)
	}
	if b.clock != nil && b.TimeConv != nil {
		if tsc, ok := b.clock.TSC(); ok {
			dst = append(dst, " time="...)
			dst = decode.AppendTime(dst, b.TimeConv(tsc))
		}
	}
	return dst
}

// appendAddr appends `0xADDR SYM+0xOFF (DSO)`.
func (b *Branches) appendAddr(dst []byte, addr uint64) []byte {
	dst = append(dst, "0x"...)
	dst = strconv.AppendUint(dst, addr, 16)
	dst = append(dst, ' ')
	e, hit := b.cache[addr]
	if !hit {
		if b.sym != nil {
			e.name, e.off, e.dso, e.ok = b.sym.Symbolize(addr)
		}
		if len(b.cache) >= symCacheMax {
			clear(b.cache)
		}
		b.cache[addr] = e
	}
	if e.ok {
		dst = append(dst, e.name...)
		dst = append(dst, "+0x"...)
		dst = strconv.AppendUint(dst, e.off, 16)
	} else {
		dst = append(dst, "[unknown]"...)
	}
	dst = append(dst, " ("...)
	if e.dso != "" {
		dst = append(dst, e.dso...)
	} else {
		dst = append(dst, "[unknown]"...)
	}
	return append(dst, ')')
}

// farKindAt tells a syscall/sysenter at ip from other far transfers.
func (b *Branches) farKindAt(ip uint64) string {
	if b.mem != nil {
		if n, _ := b.mem.ReadAt(b.code[:], ip); n == 2 && b.code[0] == 0x0f && (b.code[1] == 0x05 || b.code[1] == 0x34) {
			return "syscall"
		}
	}
	return "far"
}

func (b *Branches) branch(from, to uint64, kind string) {
	b.c.Branches++
	b.buf = append(b.buf, "branch: "...)
	b.buf = b.appendAddr(b.buf, from)
	b.buf = append(b.buf, " => "...)
	b.buf = b.appendAddr(b.buf, to)
	b.buf = append(b.buf, ' ')
	b.buf = append(b.buf, kind...)
	b.line()
}

// trace appends a `trace: WHAT 0xIP SYM (DSO)` line.
func (b *Branches) trace(what string, ip uint64) {
	b.buf = append(b.buf, "trace: "...)
	b.buf = append(b.buf, what...)
	b.buf = append(b.buf, ' ')
	b.buf = b.appendAddr(b.buf, ip)
	b.line()
}

// Insn notes the instruction; the first one after a gap that no enable
// announced (a resynchronisation at a PSB) gets a `trace: sync at` line.
func (b *Branches) Insn(in *Insn) {
	if b.off {
		b.off = false
		b.trace("sync at", in.IP)
	}
	b.last, b.hasLast = *in, true
}

// Branch prints a `branch:` line.
func (b *Branches) Branch(from, to uint64, kind BranchKind) {
	k := BranchKindName(kind)
	if kind == BrFar {
		k = b.farKindAt(from)
	}
	b.branch(from, to, k)
}

// Edges prints a `branch:` line for each edge of the batch (EdgeHandler).
func (b *Branches) Edges(batch [][]Edge) {
	for _, e := range batch {
		for i := range e {
			b.Branch(e[i].From, e[i].To, e[i].Kind)
		}
	}
}

// Event prints the lines of the events that start, stop or break the path,
// and ptwrites.
func (b *Branches) Event(e *Event) {
	switch e.Kind {
	case EvEnabled:
		if b.stopOK && (b.stopKind != "async" || e.Flags&Resumed == 0) {
			// Tracing stopped at a far transfer or an interrupt
			// (user-only tracing: the kernel ran) and starts again
			// where it went: a handler, the syscall's return. An
			// interrupted instruction resumed is no branch.
			b.stopOK = false
			b.branch(b.stop, e.IP, b.stopKind)
		} else if e.Flags&Resumed != 0 {
			b.flushStop()
			b.trace("resume at", e.IP)
		} else {
			b.trace("start at", e.IP)
		}
		b.off = false
	case EvDisabled:
		b.flushStop()
		b.off = true
		if b.hasLast && b.last.Class == x86insn.FarTransfer && !e.HasIP {
			b.stopped(b.last.IP, b.farKindAt(b.last.IP), "stop after")
			return
		}
		if e.HasIP {
			b.trace("stop at", e.IP)
		} else if b.hasLast {
			b.trace("stop after", b.last.IP)
		}
	case EvAsyncDisabled, EvInterrupt:
		if e.Kind == EvInterrupt && e.HasIP {
			return // its Branch
		}
		b.flushStop()
		if e.HasIP {
			b.off = true
			b.trace("stop at", e.At)
		} else {
			b.stopped(e.At, "async", "stop at")
		}
	case EvOverflow:
		b.gap()
		b.buf = append(b.buf, "overflow"...)
		if e.HasIP {
			b.buf = append(b.buf, " resume="...)
			b.buf = b.appendAddr(b.buf, e.IP)
			b.off = false
		}
		b.line()
	case EvError:
		b.gap()
		b.buf = append(b.buf, "error offset=0x"...)
		b.buf = strconv.AppendUint(b.buf, e.Offset, 16)
		if e.HasIP && e.IP != 0 {
			b.buf = append(b.buf, " ip="...)
			b.buf = b.appendAddr(b.buf, e.IP)
		}
		b.buf = append(b.buf, " err="...)
		b.buf = append(b.buf, e.Err.Error()...)
		b.line()
	case EvEnd:
		b.flushStop()
		if !b.off {
			b.trace("end at", e.IP)
		}
		b.off = true
	case EvPTWrite:
		b.recs.PTWrite(e.Payload, uint8(e.Aux), e.IP, e.HasIP)
	}
}

// gap starts a `gap:` line: the path between the last line and the next is
// unknown.
func (b *Branches) gap() {
	b.flushStop()
	b.c.Gaps++
	b.off = true
	// A record open across the gap lost words: dropped, never printed.
	b.recs.End()
	b.buf = append(b.buf, "gap: "...)
}
