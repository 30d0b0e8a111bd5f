// Package perfflow decodes the control flow of one CPU's Intel PT trace from
// perf (AUX data) together with its side band over time: the memory and the
// thread that each stretch of trace ran in follow the MMAP, COMM exec, FORK,
// ITRACE_START and context-switch records as the trace's own time (its TSC
// packets, converted by the recording's TIME_CONV) passes theirs, as perf's
// intel-pt decoder does; AUX records place the bytes in time where the trace
// says nothing, and their loss flags, holes in the AUX offsets and lost
// side band become gap lines, counted per cause.
package perfflow

import (
	"errors"
	"fmt"

	"ptfs/decode"
	"ptfs/flow"
	"ptfs/images"
	"ptfs/perfdata"
)

// Causes of gaps: the errors of the gap lines (wrapped in flow.ErrLost
// for trace; side band lost is not trace lost).
var (
	// ErrAuxTruncated: the AUX buffer was full (PERF_RECORD_AUX
	// TRUNCATED): the trace after the record's data was lost.
	ErrAuxTruncated = errors.New("aux truncated")
	// ErrAuxCollision: the record's data collided (COLLISION).
	ErrAuxCollision = errors.New("aux collision")
	// ErrAuxPartial: the record's data is a partial snapshot (PARTIAL).
	ErrAuxPartial = errors.New("aux partial")
	// ErrAuxHole: the AUX offsets of the data skip bytes.
	ErrAuxHole = errors.New("aux hole")
	// ErrSideBandLost: the ring dropped side-band records
	// (PERF_RECORD_LOST): the thread is unknown until the next switch.
	ErrSideBandLost = errors.New("side band lost")
)

// Counters count what a Decoder followed and lost.
type Counters struct {
	// Switches counts the changes of thread applied, Spaces the changes
	// of address space (switch, exec or mmap of the running process).
	Switches, Spaces uint64
	// Truncated, Collision, Partial and Holes count the AUX losses,
	// SideBandLost the LOST records: each was a gap line.
	Truncated, Collision, Partial, Holes, SideBandLost uint64
}

// Decoder decodes one AUX buffer's trace, fed in order, with the side band
// of its CPU. It is the flow.Handler of its own flow.Stream and hands the
// lines to a flow.Branches; it is that Branches' memory and Symbolizer: the
// address space of the process running at the time.
type Decoder struct {
	procs *images.Processes
	tl    *perfdata.Timeline
	fd    *flow.Decoder
	s     *flow.Stream
	out   *flow.Branches
	conv  func(tsc uint64) uint64
	cpu   int32

	pid, tid int32
	space    *images.Space
	// none is the memory of a process the side band told nothing of.
	none *images.Space
	gen  uint64
	// primed: the first bytes were looked at for the trace's first time.
	primed bool
	// placed is a time the bytes being fed were written after (their
	// AUX record's predecessor's): the time where the trace has none.
	placed uint64
	// fresh: the next instruction is the first after an event or a
	// resynchronisation: side band that changes memory may apply there.
	fresh bool
	c     Counters
}

// Config says what a Decoder decodes with.
type Config struct {
	// Processes is the memory model the side band is applied to (from
	// its start: Forget what an earlier pass left).
	Processes *images.Processes
	// Timeline is the side band of the buffer (perfdata.File.Timeline).
	Timeline *perfdata.Timeline
	// CPU is the buffer's CPU (-1: a per-thread buffer), on every line.
	CPU int32
	// TimeConv converts the trace's TSC to perf time (nil: the side band
	// is placed by the AUX records alone and lines carry no time=).
	TimeConv func(tsc uint64) uint64
	// Options are the flow decoder's; Time is set when TimeConv is.
	Options flow.Options
}

// New returns a Decoder that prints to out, made with
// flow.NewBranches(w, d, d, events) by the caller through mk.
func New(c Config, mk func(mem flow.Memory, sym flow.Symbolizer) *flow.Branches) *Decoder {
	d := &Decoder{procs: c.Processes, tl: c.Timeline, conv: c.TimeConv, cpu: c.CPU, pid: -1, tid: -1, none: images.NewSpace(), fresh: true}
	d.space = d.none
	opts := c.Options
	if c.TimeConv != nil && opts.Time == nil {
		// TSC packets are enough to place side band; MTC needs the
		// recording's TSC/CTC ratio, which is not read yet.
		opts.Time = &decode.ClockConfig{}
	}
	d.fd = flow.New(d, opts)
	d.out = mk(code{d}, d)
	d.out.SetContext(-1, c.CPU)
	if c.TimeConv != nil {
		d.out.SetClock(d.fd)
		d.out.TimeConv = c.TimeConv
	}
	d.s = flow.NewStream(d.fd, d)
	d.gen = d.space.Generation()
	// The trace of a CPU begins after its ITRACE_START: the first
	// bytes decode in the process it names.
	for {
		e, ok := d.tl.Peek()
		if !ok {
			break
		}
		d.tl.Next(e.Time)
		d.apply(e)
		if e.Kind == perfdata.ItraceStart {
			d.placed = e.Time
			break
		}
	}
	d.syncMemory()
	return d
}

// Write decodes the next bytes of the buffer's trace.
func (d *Decoder) Write(p []byte) (int, error) {
	if !d.primed && len(p) > 0 {
		d.primed = true
		d.prime(p)
	}
	return d.s.Write(p)
}

// prime applies the side band up to the time of the trace's first PSB+
// in p (its TSC packet), if p holds one: the decoder reads the code at the
// PSB's IP before it tells its Handler anything.
func (d *Decoder) prime(p []byte) {
	if d.conv == nil {
		return
	}
	pd := decode.NewPacketDecoder(p)
	if pd.SyncForward() != nil {
		return
	}
	var pk decode.Packet
	for pd.Next(&pk) == nil && pk.Kind != decode.PSBEnd {
		if pk.Kind == decode.TSC {
			d.placed = max(d.placed, d.conv(pk.Payload))
			d.advance(true)
			return
		}
	}
}

// Place says that the bytes fed from now on were written after perf time
// t (the time of the AUX record before theirs): side band up to t applies
// before them where the trace has no time of its own.
func (d *Decoder) Place(t uint64) {
	d.placed = max(d.placed, t)
}

// Lose marks trace lost at this point, for cause (ErrAuxTruncated, ...):
// a gap line, counted by cause, and decoding resynchronises at the next PSB.
func (d *Decoder) Lose(cause error) {
	switch {
	case errors.Is(cause, ErrAuxTruncated):
		d.c.Truncated++
	case errors.Is(cause, ErrAuxCollision):
		d.c.Collision++
	case errors.Is(cause, ErrAuxPartial):
		d.c.Partial++
	case errors.Is(cause, ErrAuxHole):
		d.c.Holes++
	}
	d.s.Gap(cause)
}

// Close ends the trace and the listing (flow.Branches.Finish), and the
// flow decoder (flow.Decoder.Close: Flow's Counters still answer).
func (d *Decoder) Close() error {
	err := d.s.Close()
	d.out.Finish()
	d.fd.Close()
	return err
}

// Counters returns what d followed and lost so far.
func (d *Decoder) Counters() Counters { return d.c }

// Flow returns the flow decoder (its counters).
func (d *Decoder) Flow() *flow.Decoder { return d.fd }

// Branches returns the printer of the lines.
func (d *Decoder) Branches() *flow.Branches { return d.out }

// ReadAt reads the code of the running process for the flow decoder
// (flow.Memory). Where there is none, side band already due may give it:
// the decoder reads the code at a PSB's IP before it tells its Handler
// anything (a resynchronisation after a loss during which the process
// exec'd or mapped it).
func (d *Decoder) ReadAt(dst []byte, addr uint64) (int, error) {
	n, err := d.space.ReadAt(dst, addr)
	if n > 0 {
		return n, err
	}
	if e, ok := d.tl.Peek(); !ok || e.Time > d.now() {
		return n, err
	}
	d.advance(true)
	return d.space.ReadAt(dst, addr)
}

// code reads the running process's code without applying side band: the
// printer's reads (is a far transfer a syscall), from within a line.
type code struct{ d *Decoder }

func (c code) ReadAt(dst []byte, addr uint64) (int, error) { return c.d.space.ReadAt(dst, addr) }

// Generation changes when the running process's memory does.
func (d *Decoder) Generation() uint64 { return d.space.Generation() }

// Symbolize names addr in the running process (flow.Symbolizer).
func (d *Decoder) Symbolize(addr uint64) (string, uint64, string, bool) {
	return d.space.Symbolize(addr)
}

// Insn passes the instruction on; the first after an event or a sync may
// see the memory change first.
func (d *Decoder) Insn(in *flow.Insn) {
	if d.fresh {
		d.fresh = false
		d.advance(true)
	}
	d.out.Insn(in)
}

// Branch passes the branch on, in the thread running at its time. Memory
// does not change under a branch (the walk may be chaining blocks): side
// band that would change it waits for the next event; a process switch
// comes with tracing off and on anyway (user-space tracing).
func (d *Decoder) Branch(from, to uint64, k flow.BranchKind) {
	d.advance(false)
	d.out.Branch(from, to, k)
}

// Edges passes the branches on (flow.EdgeHandler): a batch has no event
// within it, so one time holds for all of it.
func (d *Decoder) Edges(batch [][]flow.Edge) {
	d.advance(false)
	d.out.Edges(batch)
}

// Event passes the event on, after the side band due at its time. After
// an error the code is looked up afresh: the block that failed may be
// there when the decoder resynchronises later.
func (d *Decoder) Event(e *flow.Event) {
	d.advance(true)
	d.fresh = true
	d.out.Event(e)
	if e.Kind == flow.EvError {
		d.fd.MemoryChanged()
	}
}

// now is the time the trace has reached: its clock's, else the AUX
// placement's.
func (d *Decoder) now() uint64 {
	if d.conv != nil {
		if tsc, ok := d.fd.TSC(); ok {
			return max(d.conv(tsc), d.placed)
		}
	}
	return d.placed
}

// advance applies the side band due at the trace's time; with memOK, also
// what changes the running process's memory.
func (d *Decoder) advance(memOK bool) {
	// Called at every branch: nothing waiting (the common case of a
	// busy CPU) costs neither the clock nor a copy of an event.
	if d.tl.Len() > 0 {
		now := d.now()
		for {
			e, ok := d.tl.Peek()
			if !ok || e.Time > now || !memOK && d.changesMemory(&e) {
				break
			}
			d.tl.Next(now)
			d.apply(e)
		}
	}
	if memOK {
		d.syncMemory()
	}
}

// changesMemory tells whether e changes the memory code is read from.
func (d *Decoder) changesMemory(e *perfdata.Event) bool {
	switch e.Kind {
	case perfdata.Mmap:
		return e.PID == d.pid
	case perfdata.Comm:
		return e.Exec && e.PID == d.pid
	case perfdata.ItraceStart, perfdata.Switch:
		return e.PID != d.pid && e.PID >= 0
	}
	return false
}

// ApplyProcess applies what the side-band event e does to the memory of
// the processes p, the one place that says it (perf.data's decoding, the
// live one): an MMAP maps its file (the error: the mapping's code stays
// unknown), the COMM of an exec starts a new space, a FORK of a new
// process copies its parent's. Exits are not applied (the spaces must
// outlive them: trace may still be decoded in them); other events change
// no memory.
func ApplyProcess(p *images.Processes, e *perfdata.Event) error {
	switch {
	case e.Kind == perfdata.Mmap && e.PID >= 0:
		return p.Mmap(e.PID, e.Addr, e.Len, e.PgOff, e.Name)
	case e.Kind == perfdata.Comm && e.Exec:
		p.Exec(e.PID)
	case e.Kind == perfdata.Fork && e.PID != e.PPID:
		p.Fork(e.PPID, e.PID)
	}
	return nil
}

// apply takes one side-band event into the model. Image errors were told
// when the side band was first applied (the files are read once).
func (d *Decoder) apply(e perfdata.Event) {
	_ = ApplyProcess(d.procs, &e)
	switch e.Kind {
	case perfdata.ItraceStart, perfdata.Switch:
		d.setTask(e.PID, e.TID)
	case perfdata.Lost:
		// The switches in the lost records are unknown: no tid= until
		// the next one; the memory stays the last known process's.
		d.c.SideBandLost++
		d.setTask(d.pid, -1)
		ev := flow.Event{Kind: flow.EvError, Offset: d.s.Counters().Bytes, Err: fmt.Errorf("%w: %d records", ErrSideBandLost, e.Lost)}
		d.out.Event(&ev)
	}
}

// setTask makes tid of pid the running thread (-1: not known); a task
// whose pid is not known keeps the memory of the last known one.
func (d *Decoder) setTask(pid, tid int32) {
	if tid != d.tid {
		d.c.Switches++
		d.tid = tid
		d.out.SetContext(tid, d.cpu)
	}
	if pid >= 0 {
		d.pid = pid
	}
}

// syncMemory makes the running process's current space the memory, and
// drops what the flow decoder and the printer cached of another.
func (d *Decoder) syncMemory() {
	s, ok := d.procs.Space(d.pid)
	if !ok {
		s = d.none
	}
	if g := s.Generation(); g != d.gen {
		// The printer tells what it holds in the old memory first.
		d.out.SymbolsChanged()
		d.space, d.gen = s, g
		d.c.Spaces++
		d.fd.MemoryChanged()
	}
}

// DecodeBuffer feeds the trace of b to d, placed and cut by its AUX
// records auxes (perfdata.File.AuxRecords, by offset): the bytes of a
// record are placed after the time of the one before; COLLISION and
// PARTIAL lose trace before the record's bytes, TRUNCATED after them (as
// perfio reads a live ring), and a jump in the chunks' AUX offsets is a
// hole. It ends with Close.
func (d *Decoder) DecodeBuffer(b *perfdata.Buffer, auxes []perfdata.Event) error {
	ai, begun := 0, -1
	var prev uint64
	// end ends record ai, begun here when none of its bytes came.
	end := func() {
		if begun < ai {
			d.begin(&auxes[ai], prev)
		}
		if prev = auxes[ai].Time; auxes[ai].AuxFlags&perfdata.AuxTruncated != 0 {
			d.Lose(ErrAuxTruncated)
		}
		ai++
	}
	for i, c := range b.Chunks {
		if i > 0 && c.Offset != b.Chunks[i-1].Offset+uint64(len(b.Chunks[i-1].Data)) {
			d.Lose(ErrAuxHole)
		}
		data, off := c.Data, c.Offset
		for {
			for ai < len(auxes) && auxes[ai].AuxOffset+auxes[ai].AuxSize <= off {
				end()
			}
			if len(data) == 0 {
				break
			}
			n := uint64(len(data))
			if ai < len(auxes) {
				a := &auxes[ai]
				if off < a.AuxOffset {
					n = min(n, a.AuxOffset-off)
				} else {
					if begun < ai {
						begun = ai
						d.begin(a, prev)
					}
					n = min(n, a.AuxOffset+a.AuxSize-off)
				}
			}
			if _, err := d.Write(data[:n]); err != nil {
				return err
			}
			data, off = data[n:], off+n
		}
	}
	for ai < len(auxes) {
		// Records whose data never came: their losses still count.
		end()
	}
	return d.Close()
}

// begin starts the bytes of AUX record a, written after time prev.
func (d *Decoder) begin(a *perfdata.Event, prev uint64) {
	d.Place(prev)
	if a.AuxFlags&perfdata.AuxCollision != 0 {
		d.Lose(ErrAuxCollision)
	}
	if a.AuxFlags&perfdata.AuxPartial != 0 {
		d.Lose(ErrAuxPartial)
	}
}

// Add adds o's counts to c.
func (c *Counters) Add(o *Counters) {
	c.Switches += o.Switches
	c.Spaces += o.Spaces
	c.Truncated += o.Truncated
	c.Collision += o.Collision
	c.Partial += o.Partial
	c.Holes += o.Holes
	c.SideBandLost += o.SideBandLost
}
