package engine

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"ptfs/decode"
	"ptfs/perfdata"
)

// PTWOptions configure a PTW. Zero values select defaults.
type PTWOptions struct {
	// Latency is how long (wall clock) a record is held back so that
	// records of other CPUs stamped earlier can still arrive and go out
	// before it; default DefaultPTWLatency. PT trace reaches the reader in
	// AUX-buffer-sized bursts, hence much later than classic samples.
	Latency time.Duration
	// MaxPending bounds the records held back; beyond it the oldest go out
	// early (and may be counted Late). Default 65536.
	MaxPending int
	// Timing times records between TSC packets (PT.Timing); zero: records
	// have the time of the last TSC packet.
	Timing decode.Timing
	// Comm looks up the name of a process that the side band has not
	// named yet (perfio.ProcComm); nil leaves such records without comm=
	// until a COMM record names their process.
	Comm func(pid int32) string
}

// DefaultPTWLatency is the default PTWOptions.Latency.
const DefaultPTWLatency = time.Second

// maxCPUs bounds the CPU numbers a TraceSource may pass (the kernel's
// largest NR_CPUS).
const maxCPUs = 8192

// maxTimeline bounds the side-band entries kept per CPU; see timeline.
const maxTimeline = 1 << 14

// wmSamples is the size of the watermark history; wmSpacing the number of
// samples per Latency, which bounds the history to wmSpacing+1 samples.
const (
	wmSamples = 64
	wmSpacing = 32
)

// PTWStats are the counters of a PTW.
type PTWStats struct {
	Records uint64 // records passed to the sink
	Late    uint64 // times a record went out after a later one (order broken)
	Bytes   uint64 // PT bytes decoded
	// Losses counts the Loss calls of each kind: gaps for the kinds that
	// break the trace, lost side-band records (the n of each call) for
	// LossSideBand. Index by LossKind.
	Losses [NumLossKinds]uint64
	Side   SideStats
	// Manual counts PTWRITEs outside a probe record (also counted in
	// Decode.Stray): no target owns them, so they are dropped.
	Manual uint64
	// Unattributed counts records whose thread the side band did not tell
	// (before a CPU's first ITRACE_START or switch, after lost side band
	// until the next switch, or a record without time); they go out with
	// TID -1, never with a guessed thread.
	Unattributed uint64
	// Untimed counts records without time (Time 0): their CPU had no
	// TimeConv (no cap_user_time_zero, as under kvm-clock) or no TSC
	// packet yet. They go out in arrival order, held back at most until
	// the records already released, and are not counted Late.
	Untimed uint64
	// Filtered counts records that their event's Filter dropped (a
	// process the probe does not watch, or one the side band did not
	// name): not losses.
	Filtered uint64
	// CPUs counts the CPUs that passed trace; NoTimeConv those of them
	// that passed it without a TimeConv, whose records have no time.
	CPUs, NoTimeConv int
	// Decode sums the counters of every CPU's record assembler. Its
	// Records are those completed, held back or not; its Errors include
	// one per gap (every Loss that breaks the trace), every side-band
	// record lost (attribution may be wrong after it), and every call of
	// the source with a CPU out of range.
	Decode decode.Counters
}

// SideStats count the side-band events by kind.
type SideStats struct {
	ITraceStart, SwitchIn, SwitchOut, Comm, Mmap2, Exit uint64
	Other                                               uint64 // unknown kinds (or nil), ignored
	// Dropped counts thread switches forgotten because a CPU had
	// maxTimeline of them pending; records stamped before the oldest kept
	// one get TID -1.
	Dropped uint64
}

// PTW is the record source of ptw mode: it consumes the raw PT trace of a
// TraceSource, assembles each CPU's probe records with a decode.Assembler,
// attributes them to threads from the side band, and passes them to the
// sink merged across CPUs in time order. Add, Remove, Stats and Close may
// be called from any goroutine.
//
// Thread switches do not call Assembler.ContextSwitch. The side band of a
// CPU arrives in data-ring order, and a PERF_RECORD_AUX is written after the
// trace it announces, so a switch reaches the sink before the Trace bytes
// that cover it: those bytes may hold, before the switch, the rest of a
// record that is already open. Breaking the record when the switch arrives
// would therefore drop good records, and it would still not find the byte
// where the switch happened, since PT with branch=0 and user-only tracing
// carries nothing at a switch and records know time only at timing packets. A
// record broken by preemption is caught anyway in the common case: the next
// probe header on that CPU ends it and counts its missing words as dropped.
// The thread of a record is the one that ran at its time (see timeline).
type PTW struct {
	src     TraceSource
	sink    Sink
	latency time.Duration
	timing  decode.Timing
	// clock is monotonic time since NewPTW; tests replace it.
	clock func() time.Duration

	// ctl serializes Add, Remove and Close, and with them the calls of
	// src. The sink path never takes it: src.Flush and src.Stop wait for
	// a Round, which must be able to run.
	ctl     sync.Mutex
	running bool
	closed  bool
	// kept: Keep(true) holds the source running without events (the
	// live branches of ptw mode read the same trace).
	kept     bool
	closeErr error

	mu      sync.Mutex // guards the fields below; the sink path holds it
	events  map[uint16]*decode.Event
	cpus    []*ptwCPU // by CPU number; nil until the CPU is first named
	merge   Merger[decode.Record]
	maxSeen uint64 // highest record time assembled
	wm      watermark
	losses  [NumLossKinds]uint64
	side    SideStats
	manual  uint64
	unattr  uint64
	untimed uint64
	filter  uint64
	comms   *Comms
	bytes   uint64
	badCPU  uint64

	// out holds the records of one Round; only the source's goroutine
	// (one at a time) uses it.
	out     []decode.Record
	records atomic.Uint64
}

// ptwCPU is the decoding state of one CPU. It is the Output of its
// assembler, whose calls come from the sink path with PTW.mu held.
type ptwCPU struct {
	p      *PTW
	q      int // merger queue
	asm    *decode.Assembler
	tc     perfdata.TimeConv
	conv   func(uint64) uint64 // tc.NS, bound once so that TimeConv does not allocate
	haveTC bool
	traced bool // Trace was called
	tl     timeline
}

// NewPTW returns a PTW that will read src and pass records to sink. The
// source starts with the first Add and stops with the last Remove. The sink
// must not call methods of the PTW.
func NewPTW(src TraceSource, o PTWOptions, sink Sink) (*PTW, error) {
	if src == nil || sink == nil {
		return nil, fmt.Errorf("%w: nil trace source or sink", ErrOptions)
	}
	if o.Latency < 0 || o.MaxPending < 0 {
		return nil, fmt.Errorf("%w: negative latency %v or max pending %d", ErrOptions, o.Latency, o.MaxPending)
	}
	if o.Latency == 0 {
		o.Latency = DefaultPTWLatency
	}
	if o.MaxPending == 0 {
		o.MaxPending = MaxPending
	}
	start := time.Now()
	return &PTW{
		src:     src,
		sink:    sink,
		latency: o.Latency,
		timing:  o.Timing,
		clock:   func() time.Duration { return time.Since(start) },
		events:  make(map[uint16]*decode.Event),
		merge:   NewMerger[decode.Record](0, o.MaxPending),
		comms:   NewComms(o.Comm),
	}, nil
}

// Add adds ev to the event table of every CPU's assembler: from then on,
// probe headers with ev.ID assemble records of ev (which must not change
// afterwards). The first Add starts the source.
func (p *PTW) Add(ev *decode.Event) error {
	if ev == nil {
		return fmt.Errorf("%w: nil event", ErrBadEvent)
	}
	if len(ev.Args) > len(decode.Record{}.Args) {
		return fmt.Errorf("%w: event %s/%s has %d arguments, at most %d", ErrBadEvent,
			ev.Group, ev.Name, len(ev.Args), len(decode.Record{}.Args))
	}
	p.ctl.Lock()
	defer p.ctl.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.mu.Lock()
	if _, ok := p.events[ev.ID]; ok {
		p.mu.Unlock()
		return fmt.Errorf("%w: id %d (%s/%s)", ErrExists, ev.ID, ev.Group, ev.Name)
	}
	p.events[ev.ID] = ev
	p.setEventsLocked()
	p.mu.Unlock()
	if p.running {
		return nil
	}
	if err := p.src.Start((*ptwSink)(p)); err != nil {
		p.mu.Lock()
		delete(p.events, ev.ID)
		p.setEventsLocked()
		p.mu.Unlock()
		return fmt.Errorf("start pt trace for event %d (%s/%s): %w", ev.ID, ev.Group, ev.Name, err)
	}
	p.running = true
	return nil
}

// Keep holds the source running while no event is added (on), or lets
// it stop once none is (off): the PT events of ptw mode also carry the
// trace of the live branches files. Keep(true) starts a stopped source.
func (p *PTW) Keep(on bool) error {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.kept = on
	p.mu.Lock()
	idle := len(p.events) == 0
	p.mu.Unlock()
	switch {
	case on && !p.running:
		if err := p.src.Start((*ptwSink)(p)); err != nil {
			p.kept = false
			return fmt.Errorf("start pt trace: %w", err)
		}
		p.running = true
	case !on && p.running && idle:
		return p.stop()
	}
	return nil
}

// Remove removes event id. Every record of it already traced reaches the
// sink before Remove returns (records of other events held back for
// ordering go out with them, early); a hit traced later counts as stray, so
// disable the probe first. The last Remove stops the source.
func (p *PTW) Remove(id uint16) error {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.mu.Lock()
	_, ok := p.events[id]
	last := len(p.events) == 1
	p.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	var err error
	if p.running {
		if last && !p.kept {
			err = p.stop()
		} else if ferr := p.src.Flush(); ferr != nil {
			err = fmt.Errorf("flush pt trace: %w", ferr)
		}
	}
	// Removed even when the flush failed: the caller's probe is gone.
	p.mu.Lock()
	delete(p.events, id)
	p.setEventsLocked()
	p.mu.Unlock()
	return err
}

// Close stops the source if it runs; every record traced reaches the sink
// first. It is idempotent; later calls return the first result.
func (p *PTW) Close() error {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	if p.closed {
		return p.closeErr
	}
	p.closed = true
	if p.running {
		p.closeErr = p.stop()
	}
	return p.closeErr
}

// stop stops the source, with ctl held, and ends every CPU's stream: the
// next Start begins new streams.
func (p *PTW) stop() error {
	err := p.src.Stop()
	p.running = false
	p.mu.Lock()
	for _, c := range p.cpus {
		if c != nil {
			c.asm.End()
			c.tl.reset()
		}
	}
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("stop pt trace: %w", err)
	}
	return nil
}

// Stats returns all counters.
func (p *PTW) Stats() PTWStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PTWStats{
		Records:      p.records.Load(),
		Late:         p.merge.Late(),
		Bytes:        p.bytes,
		Losses:       p.losses,
		Side:         p.side,
		Manual:       p.manual,
		Unattributed: p.unattr,
		Untimed:      p.untimed,
		Filtered:     p.filter,
	}
	for _, c := range p.cpus {
		if c != nil {
			cc := c.asm.Counters()
			st.Decode.Add(&cc)
			if c.traced {
				st.CPUs++
				if !c.haveTC {
					st.NoTimeConv++
				}
			}
		}
	}
	st.Decode.Errors += p.losses[LossSideBand] + p.badCPU
	return st
}

// setEventsLocked gives every assembler the current event table.
func (p *PTW) setEventsLocked() {
	for _, c := range p.cpus {
		if c != nil {
			c.asm.SetEvents(p.events)
		}
	}
}

// cpuLocked returns the state of cpu, created on first use, or nil (counted)
// for a CPU number out of range.
func (p *PTW) cpuLocked(cpu int) *ptwCPU {
	if cpu >= 0 && cpu < len(p.cpus) && p.cpus[cpu] != nil {
		return p.cpus[cpu]
	}
	if cpu < 0 || cpu >= maxCPUs {
		p.badCPU++
		return nil
	}
	for len(p.cpus) <= cpu {
		p.cpus = append(p.cpus, nil)
	}
	c := &ptwCPU{p: p, q: p.merge.AddQueue()}
	c.conv = c.tc.NS
	c.asm = decode.NewAssembler(p.events, c)
	c.asm.SetCPU(int32(cpu))
	c.asm.SetTiming(p.timing)
	p.cpus[cpu] = c
	return c
}

// Record queues a record the assembler completed, with the thread (and
// its process and the process's name) that ran on the CPU at its time,
// unless its event's Filter drops it. A record without time cannot be
// placed in the timeline (no thread) nor among other CPUs' records: it is
// merged at the latest time released, so it goes out by arrival, behind
// what its CPU queued before, without holding anything back or counting
// as late.
func (c *ptwCPU) Record(r *decode.Record) {
	p := c.p
	at, pid, tid := r.Time, int32(0), int32(-1)
	if at == 0 {
		p.untimed++
		at = p.merge.last
	} else {
		pid, tid = c.tl.at(r.Time)
	}
	comm := p.comms.Get(pid)
	if f := &r.Event.Filter; f.Active() && !f.Match(pid, comm) {
		p.filter++
		return
	}
	s := p.merge.Push(c.q, at)
	*s = *r
	s.PID, s.TID, s.Comm = pid, tid, comm
	if tid < 0 {
		p.unattr++
	}
	p.maxSeen = max(p.maxSeen, r.Time)
}

// Manual counts a PTWRITE outside a record: no target can claim it.
func (c *ptwCPU) Manual(*decode.Manual) { c.p.manual++ }

// ptwSink is the TraceSink side of a PTW, kept off PTW's method set so that
// only the source calls it.
type ptwSink PTW

// TimeConv implements TraceSink.
func (s *ptwSink) TimeConv(cpu int, tc perfdata.TimeConv) {
	p := (*PTW)(s)
	p.mu.Lock()
	if c := p.cpuLocked(cpu); c != nil {
		c.tc = tc
		if !c.haveTC {
			c.asm.SetTimeConv(c.conv)
			c.haveTC = true
		}
	}
	p.mu.Unlock()
}

// Trace implements TraceSink.
func (s *ptwSink) Trace(cpu int, data []byte) {
	p := (*PTW)(s)
	p.mu.Lock()
	if c := p.cpuLocked(cpu); c != nil {
		c.traced = true
		c.tl.trace()
		p.bytes += uint64(len(data))
		c.asm.Feed(data)
	}
	p.mu.Unlock()
}

// Loss implements TraceSink. A kind out of range breaks the trace too.
func (s *ptwSink) Loss(cpu int, why LossKind, n uint64) {
	p := (*PTW)(s)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch why {
	case LossSideBand:
		// Counted even when cpu is out of range; then no CPU's thread is
		// known any more.
		p.losses[LossSideBand] += n
		if cpu >= 0 && cpu < maxCPUs {
			p.cpuLocked(cpu).tl.lost()
			return
		}
		for _, c := range p.cpus {
			if c != nil {
				c.tl.lost()
			}
		}
		return
	case LossFlush:
		p.losses[LossFlush]++
		if c := p.cpuLocked(cpu); c != nil {
			c.asm.ContextSwitch()
		}
		return
	}
	if why < NumLossKinds {
		p.losses[why]++
	}
	if c := p.cpuLocked(cpu); c != nil {
		c.asm.Gap()
	}
}

// Side implements TraceSink.
func (s *ptwSink) Side(cpu int, ev *SideEvent) {
	p := (*PTW)(s)
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.cpuLocked(cpu)
	st := &p.side
	if c == nil || ev == nil {
		if ev == nil {
			st.Other++
		}
		return
	}
	switch ev.Kind {
	case SideITraceStart:
		st.ITraceStart++
		st.Dropped += c.tl.add(ev.Time, ev.PID, ev.TID)
	case SideSwitchIn:
		st.SwitchIn++
		st.Dropped += c.tl.add(ev.Time, ev.PID, ev.TID)
	case SideSwitchOut:
		st.SwitchOut++
		st.Dropped += c.tl.add(ev.Time, ev.NextPID, ev.NextTID)
	case SideComm:
		st.Comm++
		// The process's name is its main thread's: exec, or a rename
		// of that thread (other threads name only themselves).
		if ev.PID == ev.TID {
			p.comms.Set(ev.PID, ev.Comm)
		}
	case SideMmap2:
		st.Mmap2++
	case SideExit:
		st.Exit++
		if ev.PID == ev.TID {
			p.comms.Exit(ev.PID)
		}
	default:
		st.Other++
	}
}

// Round implements TraceSink: it releases the records whose time is at or
// before the watermark (all with flush) to the sink, in time order.
func (s *ptwSink) Round(flush bool) {
	p := (*PTW)(s)
	p.mu.Lock()
	w := ^uint64(0)
	if !flush {
		w = p.wm.update(p.clock(), p.maxSeen, p.latency)
	}
	p.out = p.merge.Release(w, p.out[:0])
	out := p.out
	p.mu.Unlock()
	// Outside the lock: Stats and Add need not wait for the sink.
	// Counted before the sink takes them, as the classic reader does:
	// whoever has seen a record in the sink finds it counted in Stats.
	if len(out) > 0 {
		p.records.Add(uint64(len(out)))
		p.sink(out)
	}
}

// watermark is the history of the highest record time seen, sampled at
// Rounds at least Latency/wmSpacing apart, from which update finds the
// highest time seen at least Latency ago.
type watermark struct {
	s       [wmSamples]wmSample
	head, n int
}

type wmSample struct {
	wall time.Duration // when the sample was taken
	max  uint64        // highest record time seen by then
}

func (w *watermark) at(i int) *wmSample { return &w.s[(w.head+i)%len(w.s)] }

// update samples seen at now and returns the highest record time seen at
// least lat ago (0 when none). A sample taken later than the record was
// seen only holds it back longer.
func (w *watermark) update(now time.Duration, seen uint64, lat time.Duration) uint64 {
	if w.n == 0 || now-w.at(w.n-1).wall >= lat/wmSpacing {
		if w.n == len(w.s) { // only if the clock jumped: forget the oldest
			w.head = (w.head + 1) % len(w.s)
			w.n--
		}
		*w.at(w.n) = wmSample{wall: now, max: seen}
		w.n++
	}
	cut := now - lat
	for w.n >= 2 && w.at(1).wall <= cut {
		w.head = (w.head + 1) % len(w.s)
		w.n--
	}
	if s := w.at(0); s.wall <= cut {
		return s.max
	}
	return 0
}

// timeline is which thread ran on one CPU from when, from the side band
// (ITRACE_START, SWITCH in and out), in time order, with the thread's
// process; an entry of TID -1 marks where side band was lost and the thread
// is unknown. Records of a CPU come
// in time order, so a cursor moves forward through it. What is behind the
// cursor is pruned, and so is what came before the previous Trace but the
// last such entry: side band and AUX records share the data ring, in the
// order the kernel wrote them, so the bytes of a Trace were written after
// the PERF_RECORD_AUX of the previous one, when that last entry's thread was
// running. Entries beyond maxTimeline (a CPU that switches often but traces
// nothing for long) drop the oldest half.
type timeline struct {
	ent  []tlEntry
	cur  int // entry current at the last lookup
	mark int // len(ent) at the last Trace
}

type tlEntry struct {
	time     uint64
	pid, tid int32
}

// add appends that thread tid of process pid runs from time and returns
// how many entries it dropped to stay bounded. A time before the last
// entry's (the kernel writes a CPU's side band in time order) is taken as
// the last entry's.
func (t *timeline) add(time uint64, pid, tid int32) uint64 {
	var dropped uint64
	if n := len(t.ent); n > 0 && time < t.ent[n-1].time {
		time = t.ent[n-1].time
	}
	if len(t.ent) >= maxTimeline {
		dropped = uint64(len(t.ent) / 2)
		t.cut(len(t.ent) / 2)
	}
	if len(t.ent) == cap(t.ent) {
		// Grown by hand: append's growth would overshoot the bound.
		ent := make([]tlEntry, len(t.ent), min(max(2*cap(t.ent), 16), maxTimeline))
		copy(ent, t.ent)
		t.ent = ent
	}
	if tid < 0 {
		pid = 0
	}
	t.ent = append(t.ent, tlEntry{time: time, pid: pid, tid: tid})
	return dropped
}

// lost makes the thread unknown from the last entry's time on, and
// returns what add dropped: the side band that went missing came after that
// entry and may have held a switch, so neither that entry's thread nor any
// other is known until the next entry. An empty timeline knows nothing
// already.
func (t *timeline) lost() uint64 {
	n := len(t.ent)
	if n == 0 || t.ent[n-1].tid < 0 {
		return 0
	}
	return t.add(t.ent[n-1].time, 0, -1)
}

// cut drops the first k entries.
func (t *timeline) cut(k int) {
	n := copy(t.ent, t.ent[k:])
	t.ent = t.ent[:n]
	t.cur = max(0, t.cur-k)
	t.mark = max(0, t.mark-k)
}

// trace is called before each Trace of the CPU: it prunes what no record
// of the coming bytes can need.
func (t *timeline) trace() {
	// Copying costs the kept entries: prune when that is at most what
	// goes.
	if k := max(t.cur, t.mark-1); k > 0 && 2*k >= len(t.ent) {
		t.cut(k)
	}
	t.mark = len(t.ent)
}

// at returns the process and thread that ran at time, or 0 and -1 when the
// side band did not say (yet).
func (t *timeline) at(time uint64) (pid, tid int32) {
	if len(t.ent) == 0 {
		return 0, -1
	}
	t.cur = min(t.cur, len(t.ent)-1)
	for t.cur+1 < len(t.ent) && t.ent[t.cur+1].time <= time {
		t.cur++
	}
	// A record out of time order: look behind the cursor.
	for i := t.cur; i >= 0; i-- {
		if t.ent[i].time <= time {
			return t.ent[i].pid, t.ent[i].tid
		}
	}
	return 0, -1
}

// reset forgets everything: a new trace begins with its own ITRACE_START.
func (t *timeline) reset() {
	t.ent = t.ent[:0]
	t.cur, t.mark = 0, 0
}
