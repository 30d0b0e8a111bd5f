package engine

import (
	"ptfs/perfdata"
)

// TraceSink consumes the raw Intel PT trace of a TraceSource: per CPU, the
// PT bytes in the order the hardware wrote them, the losses between them,
// and the side band that says which thread ran when. Calls for one CPU come
// in the order the kernel wrote the records; all calls come from one
// goroutine at a time (the source's reader).
type TraceSink interface {
	// TimeConv gives the conversion of cpu's TSC values to perf time in
	// nanoseconds, from its mmap page. It comes before cpu's first Trace and
	// again whenever the page changes it.
	TimeConv(cpu int, tc perfdata.TimeConv)
	// Trace passes the next bytes of cpu's PT stream. data is valid only
	// during the call: the source reads it in place from the AUX ring.
	Trace(cpu int, data []byte)
	// Loss reports trace of cpu lost before the next Trace (a gap), or side
	// band records lost (n of them), by cause.
	Loss(cpu int, why LossKind, n uint64)
	// Side passes one side-band event of cpu. ev is valid only during the
	// call.
	Side(cpu int, ev *SideEvent)
	// Round ends one pass of the reader over all CPUs. With flush set,
	// everything the source traced before the call that started the round
	// (Flush, Stop) has been passed on, and the sink releases all it holds.
	Round(flush bool)
}

// TraceSource produces the raw PT trace of every CPU: the kernel (PT) or, in
// tests, a replay.
type TraceSource interface {
	// Start begins tracing on every CPU and passing the trace to sink, from
	// a goroutine of the source, until Stop.
	Start(sink TraceSink) error
	// Flush passes on everything traced so far, ending with Round(true),
	// and returns after that round.
	Flush() error
	// Stop stops tracing, passes on what was traced, ending with
	// Round(true), and releases the kernel resources. Start may follow.
	Stop() error
}

// LossKind is the cause of a Loss.
type LossKind uint8

// Causes of trace loss. The AUX kinds and LossHole break the PT stream (see
// BreaksTrace).
const (
	// LossTruncated: PERF_RECORD_AUX with PERF_AUX_FLAG_TRUNCATED; the AUX
	// ring was full and tracing stopped until the reader made room.
	LossTruncated LossKind = iota
	// LossPartial: PERF_AUX_FLAG_PARTIAL; the record has gaps.
	LossPartial
	// LossCollision: PERF_AUX_FLAG_COLLISION; samples collided.
	LossCollision
	// LossHole: the AUX offsets skip bytes the reader never saw.
	LossHole
	// LossSideBand: PERF_RECORD_LOST; n side-band records (switches,
	// comms, AUX records) were dropped by a full data ring. The thread of
	// cpu (of every CPU when cpu is out of range) is unknown from its last
	// known switch until its next one or ITRACE_START. The trace itself is
	// intact: perfio reads it up to aux_head whether or not its AUX
	// records arrived.
	LossSideBand
	// LossFlush: tracing was stopped for a moment, at this point of the
	// stream, to push buffered trace out; it resumes with a PSB+.
	// PTWRITEs in that window are not traced, which nothing can count, so
	// flushes are counted apart: a record open at the flush is dropped, but
	// the stream does not break and no error is counted.
	LossFlush
	// NumLossKinds is the number of causes, the size of arrays indexed
	// by LossKind.
	NumLossKinds
)

var lossNames = [NumLossKinds]string{"aux truncated", "aux partial", "aux collision", "aux hole", "side band lost", "flush"}

// String returns the cause as status prints it.
func (k LossKind) String() string {
	if k < NumLossKinds {
		return lossNames[k]
	}
	return "unknown loss"
}

// BreaksTrace tells whether the loss leaves a gap in the PT stream: the
// next Trace may start anywhere in a packet, and the loss is an error.
func (k LossKind) BreaksTrace() bool { return k != LossSideBand && k != LossFlush }

// SideKind is the kind of a side-band event.
type SideKind uint8

// Side-band events (PERF_RECORD_*).
const (
	// SideITraceStart: tracing started on the CPU with PID/TID running.
	SideITraceStart SideKind = iota + 1
	// SideSwitchIn: PID/TID now runs on the CPU (SWITCH_CPU_WIDE, in).
	SideSwitchIn
	// SideSwitchOut: PID/TID stops running on the CPU (SWITCH_CPU_WIDE,
	// out); NextPID/NextTID is the task that follows.
	SideSwitchOut
	// SideComm: PID/TID is now named Comm (exec or prctl).
	SideComm
	// SideMmap2: PID mapped Filename at Addr, Len bytes, file offset PgOff.
	SideMmap2
	// SideExit: thread PID/TID exited.
	SideExit
)

// SideEvent is one side-band record. Time is perf time in nanoseconds.
type SideEvent struct {
	Kind             SideKind
	Time             uint64
	PID, TID         int32
	NextPID, NextTID int32  // SideSwitchOut
	Comm             string // SideComm
	// Exec: the SideComm came with an exec (PERF_RECORD_MISC_COMM_EXEC):
	// PID runs another program, in a new address space.
	Exec             bool
	Addr, Len, PgOff uint64 // SideMmap2
	Filename         string // SideMmap2
	// Maj, Min and Ino identify the mapped file (SideMmap2 of an MMAP2
	// record that carries them; 0 when not known), so that a file
	// replaced on disk since is not read for its code.
	Maj, Min uint32
	Ino      uint64
}
