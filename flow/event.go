package flow

import (
	"errors"
	"strconv"

	"ptfs/x86insn"
)

// Memory is the traced code's memory. ReadAt reads up to len(dst) bytes at
// addr and returns how many it read; fewer than asked (or 0 and an error)
// means the rest is not mapped.
type Memory interface {
	ReadAt(dst []byte, addr uint64) (int, error)
}

// Viewer is an optional interface of a Memory that shows its bytes in
// place (images.Space): View returns the known bytes of the mapping that
// holds addr without copying, from the mapping's start base on (addr-base <
// len(b)), perhaps fewer than ReadAt reads (they may stop at a mapping's
// end, where ReadAt goes on into the next); the decoder keeps them for the
// blocks in the mapping, steps through them and reads with ReadAt only
// near their end.
type Viewer interface {
	View(addr uint64) (base uint64, b []byte, err error)
}

// Generationer is an optional interface of a Memory whose contents change
// (code loaded or unloaded): the block cache is dropped when the generation
// changes.
type Generationer interface {
	Generation() uint64
}

// Mode is the processor's execution mode, from MODE.Exec.
type Mode uint8

// Execution modes.
const (
	ModeUnknown Mode = iota
	Mode16
	Mode32
	Mode64
)

var modeNames = [...]string{"<unknown>", "16-bit", "32-bit", "64-bit"}

// String names the mode as ptxed does.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "<invalid>"
}

// bits is the operand size x86insn decodes the mode with.
func (m Mode) bits() int {
	switch m {
	case Mode16:
		return 16
	case Mode32:
		return 32
	}
	return 64
}

// EventKind is the type of an Event.
type EventKind uint8

// Event kinds, after libipt's pt_event types.
const (
	// EvEnabled: tracing starts at IP (TIP.PGE); Resumed when it starts
	// again where an asynchronous disable stopped it.
	EvEnabled EventKind = iota
	// EvDisabled: tracing stopped at a branch (TIP.PGD); IP is the
	// branch target when HasIP.
	EvDisabled
	// EvAsyncDisabled: tracing stopped before the instruction at At
	// (FUP + TIP.PGD); IP when HasIP.
	EvAsyncDisabled
	// EvInterrupt: an asynchronous branch from At to IP (FUP + TIP).
	EvInterrupt
	// EvOverflow: the processor lost trace; decoding resumes at IP
	// when HasIP, else tracing is disabled.
	EvOverflow
	// EvExecMode: the execution mode changed to Mode at IP.
	EvExecMode
	// EvPTWrite: a PTWRITE wrote Payload of Aux bytes (4 or 8); at
	// IP when HasIP. One whose IP holds no code (a probe stub's page)
	// is reported before the next instruction, not bound to the flow.
	EvPTWrite
	// EvPaging: CR3 changed to Payload; NonRoot for a VMX guest.
	EvPaging
	// EvVMCS: the VMCS base changed to Payload.
	EvVMCS
	// EvStop: TraceStop.
	EvStop
	// EvMNT: a maintenance packet with Payload.
	EvMNT
	// EvTSX: a transaction began (Speculative), committed, or aborted
	// (Aborted); at IP when HasIP.
	EvTSX
	// EvExstop: execution stopped; at IP when HasIP.
	EvExstop
	// EvMwait: MWAIT with hints Payload and extensions Aux; at IP when HasIP.
	EvMwait
	// EvPwre: power entry to C-state Payload>>4 . Payload&15; HW if hardware-initiated.
	EvPwre
	// EvPwrx: power exit, last C-state Payload>>4, deepest Payload&15,
	// wake reason Aux (1 interrupt, 4 store, 8 hardware).
	EvPwrx
	// EvTrig: a trigger with trigger bits Payload; Mult; at IP when HasIP.
	EvTrig
	// EvCBR: the core:bus ratio changed to Payload.
	EvCBR
	// EvIflags: RFLAGS.IF changed to Payload (0 or 1); at IP when HasIP.
	EvIflags
	// EvCFE: an event trace control-flow event (CFE) of Type with
	// vector Payload; Data holds its event data (EVD) where Has says.
	EvCFE
	// EvEnd: the trace ended while tracing was enabled at IP.
	EvEnd
	// EvError: decoding failed at stream Offset and IP with Err; the
	// decoder resynchronises and goes on.
	EvError
	// EvTick: the time (TSC) changed at the branch at IP since the last
	// event (Options.Ticks).
	EvTick
)

// Event is one event of the flow. Fields a kind does not use are zero.
type Event struct {
	Kind   EventKind
	HasIP  bool
	Mode   Mode
	Flags  uint8
	Aux    uint32
	IP     uint64
	At     uint64
	Offset uint64
	// Payload is the kind's value (see the kinds).
	Payload uint64
	// Type is an EvCFE's event type (the CFE packet's).
	Type uint8
	// Has says which of Data an EvCFE has: bit i for EVD type i.
	Has uint8
	// Data is an EvCFE's event data: CR2, VMX qualification, VMX reason.
	Data [3]uint64
	// Err is an EvError's error: one of the sentinel errors below, for
	// errors.Is.
	Err error
	// TSC is the estimated time stamp counter when the event's packet
	// was decoded (Options.Time; 0 without).
	TSC uint64
}

// CFE event types.
const (
	CFEIntr       = 1
	CFEIret       = 2
	CFESMI        = 3
	CFERSM        = 4
	CFESIPI       = 5
	CFEInit       = 6
	CFEVMEntry    = 7
	CFEVMExit     = 8
	CFEVMExitIntr = 9
	CFEShutdown   = 10
	CFEUintr      = 12
	CFEUiret      = 13
	CFESwintr     = 14
	CFESyscall    = 15
)

// Event flags.
const (
	Resumed     uint8 = 1 << iota // EvEnabled
	NonRoot                       // EvPaging
	Speculative                   // EvTSX: a transaction began
	Aborted                       // EvTSX
	HW                            // EvPwre
	Mult                          // EvTrig
	// ResyncFailed marks an EvError of resynchronising after an error
	// (ResyncOnError) that failed the same way: decoding goes on at
	// the next PSB.
	ResyncFailed // EvError
)

// Sentinel errors of an EvError. Their texts are libipt's (pt_errstr), so
// that ptfs decode --insns prints what ptxed prints.
var (
	ErrNoMap      = errors.New("no memory mapped at this address")
	ErrBadQuery   = errors.New("trace stream does not match query")
	ErrBadContext = errors.New("unexpected packet context")
	ErrNoIP       = errors.New("no ip")
	ErrBadInsn    = errors.New("bad instruction")
	ErrBadOpcode  = errors.New("unknown opcode")
	ErrBadPacket  = errors.New("unknown packet")
	ErrEOS        = errors.New("end of stream")
	ErrRetComp    = errors.New("bad return compression")
	// ErrBadStatus: a PSB+ gives an execution mode other than the
	// flow's.
	ErrBadStatus = errors.New("bad status update")
)

// Insn is an executed instruction.
type Insn struct {
	IP    uint64
	Len   uint8
	Mode  Mode
	Class x86insn.Class
	// Speculative: it ran inside a transaction (TSX) not yet committed.
	Speculative bool
}

// Handler receives the flow. Its methods are called synchronously and must
// not keep e past the call.
type Handler interface {
	// Insn is called for every executed instruction.
	Insn(in *Insn)
	// Branch is called for every taken control transfer, from the
	// instruction at from (or the interrupted IP) to to.
	Branch(from, to uint64, kind BranchKind)
	// Event is called for every event and error.
	Event(e *Event)
}

// Edge is a taken control transfer, as Handler.Branch gets it.
type Edge struct {
	From, To uint64
	Kind     BranchKind
}

// EdgeHandler is a Handler that also takes branches in batches: where the
// decoder has several in a row (its fast path), it calls Edges with them
// instead of Branch for each: the edges of batch[0] in order, then those of
// batch[1], and so on; no slice is empty. An interface call per branch, or
// per run of branches, is a large share of a warm decode. Events come
// between batches, never within one. Edges must neither keep the slices
// past the call nor write to them: a slice may be a TNT run's edges, which
// the decoder keeps and hands over again each time the run recurs.
type EdgeHandler interface {
	Handler
	Edges(batch [][]Edge)
}

// BranchKind says how control moved.
type BranchKind uint8

// Branch kinds.
const (
	BrCond BranchKind = iota
	BrJump
	BrCall
	BrReturn
	BrIndirectJump
	BrIndirectCall
	BrFar
	BrInterrupt
)

var branchNames = [...]string{"cond", "jump", "call", "return", "ijump", "icall", "far", "interrupt"}

// String names the kind.
func (k BranchKind) String() string {
	if int(k) < len(branchNames) {
		return branchNames[k]
	}
	return "branch(" + strconv.Itoa(int(k)) + ")"
}

// Counters count what the decoder did.
type Counters struct {
	Insns  uint64
	Events uint64
	// Errors counts decoding errors; each was reported as an EvError
	// and skipped trace up to the next resynchronisation point.
	Errors uint64
}
