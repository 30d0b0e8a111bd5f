package perfio

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"ptfs/decode"
	"ptfs/engine"
)

// PTOptions configure a PT source. Zero values select defaults.
type PTOptions struct {
	// CPUs to trace; default all CPUs online at each Start.
	CPUs []int
	// DataPages is the size of each CPU's side-band ring in pages, a power
	// of two; default DefaultPTDataPages, or 256 KiB when the locked-memory
	// limit would refuse the privileged sizes (see PTStatus.Buffers).
	DataPages int
	// AuxPages is the size of each CPU's AUX (trace) ring in pages, a
	// power of two of at least 8 KiB; default 4 MiB, or 128 KiB when the
	// locked-memory limit would refuse that.
	AuxPages int
	// AuxWatermark is how many bytes of trace make the kernel publish them
	// and wake the reader; default DefaultAuxWatermark or half the AUX ring
	// if that is less; at most the AUX ring.
	AuxWatermark int
	// FlushInterval is how often a CPU that published no trace since the
	// last look is stopped for a moment to push out what it buffered (the
	// kernel publishes AUX data only at the watermark or when the event
	// stops); default DefaultFlushInterval, negative disables.
	FlushInterval time.Duration
	// PSBPeriod is PTConfig.PSBPeriod.
	PSBPeriod int
	// Branch turns on branch tracing.
	Branch bool
	// NoPTW traces branches only, without PTWRITE (PTConfig.NoPTW).
	NoPTW bool
	// Filter is the address filter text (FilterText) set on every
	// CPU's event when it opens; "" traces all user code.
	Filter string
}

// Defaults of PTOptions.
const (
	DefaultPTDataPages   = 64
	DefaultAuxWatermark  = 64 << 10
	DefaultFlushInterval = 500 * time.Millisecond
)

// maxPTPages bounds DataPages and AuxPages (4 GiB with 4 KiB pages).
const maxPTPages = 1 << 20

// ptIdleWait is the longest the reader sleeps without a wakeup; ptRetryWait
// how soon it comes back for a record that waits for aux_head or an event
// to enable again; hotplugInterval how often it looks for CPUs gone
// offline; reenablePasses how many read passes enable an event again after
// a truncation, until it publishes trace.
const (
	ptIdleWait      = 100 * time.Millisecond
	ptRetryWait     = time.Millisecond
	hotplugInterval = time.Second
	reenablePasses  = 10
)

// Sentinel errors of PT.
var (
	// ErrStarted reports Start of a PT source that runs.
	ErrStarted = errors.New("pt source already started")
	// ErrNotStarted reports Flush or Stop of a PT source that does not run.
	ErrNotStarted = errors.New("pt source not started")
	// ErrNoCPU reports a Start that could trace no CPU; the error joins
	// each CPU's reason.
	ErrNoCPU = errors.New("no cpu could be traced")
)

// PTStats are the counters of a PT source, summed over all its runs.
type PTStats struct {
	Records uint64 // data ring records read (AUX, LOST, switches, ...)
	Bytes   uint64 // PT bytes passed to the sink
	// Losses counts the losses passed to the sink, indexed by engine.LossKind:
	// one per gap, or for engine.LossSideBand the records lost.
	Losses [engine.NumLossKinds]uint64
	Errors uint64 // malformed records, failed ioctls, unreadable time
	// Switches counts the Reconfigures of a running source: each stops
	// every CPU's event and opens it anew (a LossFlush per CPU).
	Switches uint64
}

// CPUState is what a PT source does with one CPU.
type CPUState uint8

// States of a CPU in PTStatus.
const (
	// CPUTracing: its events are open and enabled.
	CPUTracing CPUState = iota
	// CPUOffline: offline at Start (not listed online, or ENODEV).
	CPUOffline
	// CPUBusy: EBUSY at Start: another PT or LBR user holds it.
	CPUBusy
	// CPUError: another error at Start (CPUStatus.Err).
	CPUError
	// CPUWentOffline: it went offline while traced; its event is gone
	// for good, and the next Start tries it again.
	CPUWentOffline
	// CPUCameOnline: it came online after Start; the next Start traces it.
	CPUCameOnline
)

var cpuStateNames = [...]string{"tracing", "offline", "busy (EBUSY: another PT or LBR user)", "error",
	"went offline (not traced until the next start)", "came online (traced from the next start)"}

// String returns the state as status prints it.
func (s CPUState) String() string {
	if int(s) < len(cpuStateNames) {
		return cpuStateNames[s]
	}
	return "unknown"
}

// CPUStatus is the state of one CPU, with the error for CPUError.
type CPUStatus struct {
	CPU   int
	State CPUState
	Err   error
}

// PTStatus says how a PT source runs: ring sizes and why, and each CPU's
// state at the last Start and since.
type PTStatus struct {
	AuxPages, DataPages int
	// Buffers says where the sizes came from: "flags", "privileged
	// defaults: ..." or "unprivileged defaults: ..." with the reason.
	Buffers string
	CPUs    []CPUStatus
}

// PT is the engine.TraceSource of the kernel: per CPU, one system-wide,
// user-mode intel_pt event with PTWRITE tracing, with a side-band ring and
// an AUX ring, and one dummy event that writes the side band into the PT
// event's ring; read by one goroutine.
type PT struct {
	attr     unix.PerfEventAttr
	dir      string
	timingOK bool
	opts     PTOptions
	switches atomic.Uint64
	buffers  string
	pageSize int
	cnt      ptCounters
	timing   decode.Timing
	op       opener
	cpuDir   string

	// mu serializes Start, Flush and Stop, and guards run.
	mu  sync.Mutex
	run *ptRun

	// stMu guards cpuStates, which Start and the reader write and Status
	// reads.
	stMu      sync.Mutex
	cpuStates []CPUStatus
}

// ptEnv is what NewPT reads from the machine; tests give their own.
type ptEnv struct {
	op      opener
	cpuDir  string // cpuSysDir
	procDir string // procDir
	memlock func() (uint64, error)
}

// NewPT prepares tracing from the intel_pt PMU described in dir (PTSysfsDir
// on a real machine); nothing is opened until Start. It fails with ErrNoPT
// or ErrNoPTW (see PTAttr) when the machine cannot trace PTWRITE. Ring
// sizes left 0 are chosen like perf's from the locked-memory limits.
func NewPT(dir string, o PTOptions) (*PT, error) {
	return newPT(dir, o, ptEnv{op: kernelOpener{}, cpuDir: cpuSysDir, procDir: procDir, memlock: memlockLimit})
}

func newPT(dir string, o PTOptions, env ptEnv) (*PT, error) {
	if o.FlushInterval == 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if err := checkCPUs(o.CPUs); err != nil {
		return nil, err
	}
	pageSize := os.Getpagesize()
	ncpu := len(o.CPUs)
	if ncpu == 0 {
		cpus, err := onlineCPUsIn(env.cpuDir)
		if err != nil {
			return nil, err
		}
		ncpu = len(cpus)
	}
	memlock, lerr := env.memlock()
	var lim mlockLimits
	if lerr == nil {
		lim, lerr = readMlockLimits(env.procDir, memlock)
	}
	buffers := chooseBuffers(&o, lim, lerr, ncpu, pageSize)
	for _, n := range []struct {
		name  string
		pages int
	}{{"data pages", o.DataPages}, {"aux pages", o.AuxPages}} {
		if n.pages < 0 || n.pages&(n.pages-1) != 0 || n.pages > maxPTPages {
			return nil, fmt.Errorf("%w: %s %d is not a power of two up to %d", engine.ErrOptions, n.name, n.pages, maxPTPages)
		}
	}
	if o.AuxPages*pageSize < minAuxBytes {
		return nil, fmt.Errorf("%w: aux pages %d: the aux ring must hold at least %d KiB, as perf requires", engine.ErrOptions, o.AuxPages, minAuxBytes>>10)
	}
	if o.AuxWatermark == 0 {
		// At most half the ring, so that the reader frees space before
		// the ring fills.
		o.AuxWatermark = min(DefaultAuxWatermark, o.AuxPages*pageSize/2)
	}
	if o.AuxWatermark < 0 || o.AuxWatermark > o.AuxPages*pageSize {
		return nil, fmt.Errorf("%w: aux watermark %d outside the %d-byte aux ring", engine.ErrOptions, o.AuxWatermark, o.AuxPages*pageSize)
	}
	timing, mtc := PTTiming(dir)
	p := &PT{dir: dir, timingOK: mtc, opts: o, buffers: buffers, pageSize: pageSize, timing: timing, op: env.op, cpuDir: env.cpuDir}
	attr, err := p.attrFor(o.Branch, o.NoPTW)
	if err != nil {
		return nil, err
	}
	p.attr = *attr
	return p, nil
}

// attrFor builds the PT event's attributes with branch tracing on or off.
func (p *PT) attrFor(branch, noPTW bool) (*unix.PerfEventAttr, error) {
	return PTAttr(p.dir, PTConfig{Branch: branch, NoPTW: noPTW, PSBPeriod: p.opts.PSBPeriod, AuxWatermark: uint32(p.opts.AuxWatermark),
		MTC: p.timingOK, MTCPeriod: int(p.timing.MTCPeriod)})
}

// Reconfigure turns branch tracing on or off and sets the address filter
// text ("" for none). A PT event's configuration is fixed when it opens
// (the intel_pt PMU takes no PERF_EVENT_IOC_MODIFY_ATTRIBUTES), so a
// running source stops every CPU's event, passes on what it traced,
// reports LossFlush on each (what ran in between is not traced: ptw
// records open then are dropped, the stream does not break), and opens
// and enables them anew, with the same sink; a stopped one only takes
// the configuration for its next Start. When the new events cannot be
// opened, the source is stopped and the error returned.
func (p *PT) Reconfigure(branch bool, filter string) error {
	attr, err := p.attrFor(branch, p.opts.NoPTW)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attr, p.opts.Branch, p.opts.Filter = *attr, branch, filter
	r := p.run
	if r == nil {
		return nil
	}
	sink := r.sink
	p.run = nil
	cpus := r.cpus // shutdown forgets them
	if err := r.shutdown(); err != nil {
		return fmt.Errorf("reconfigure pt: stop: %w", err)
	}
	// The old reader is gone and the new one not started: this goroutine
	// is the only caller of sink now.
	for _, c := range cpus {
		c.rd.loss(sink, engine.LossFlush, 1)
	}
	p.switches.Add(1)
	nr, err := p.open()
	if err != nil {
		return fmt.Errorf("reconfigure pt: %w", err)
	}
	nr.sink = sink
	p.run = nr
	go nr.loop(sink)
	return nil
}

// Stats returns the counters.
func (p *PT) Stats() PTStats {
	s := PTStats{
		Records:  p.cnt.records.Load(),
		Bytes:    p.cnt.bytes.Load(),
		Errors:   p.cnt.errors.Load(),
		Switches: p.switches.Load(),
	}
	for i := range s.Losses {
		s.Losses[i] = p.cnt.losses[i].Load()
	}
	return s
}

// Status returns the ring sizes and the CPUs' states.
func (p *PT) Status() PTStatus {
	p.stMu.Lock()
	defer p.stMu.Unlock()
	return PTStatus{AuxPages: p.opts.AuxPages, DataPages: p.opts.DataPages, Buffers: p.buffers, CPUs: slices.Clone(p.cpuStates)}
}

// wentOffline marks a traced cpu gone offline.
func (p *PT) wentOffline(cpu int) {
	p.stMu.Lock()
	defer p.stMu.Unlock()
	for i := range p.cpuStates {
		if p.cpuStates[i].CPU == cpu {
			p.cpuStates[i].State = CPUWentOffline
		}
	}
}

// cameOnline marks an untraced cpu that is online now and was offline at
// Start, or not known then; a busy or failed one keeps its reason.
func (p *PT) cameOnline(cpu int) {
	p.stMu.Lock()
	defer p.stMu.Unlock()
	for i := range p.cpuStates {
		if p.cpuStates[i].CPU == cpu {
			if p.cpuStates[i].State == CPUOffline {
				p.cpuStates[i].State = CPUCameOnline
			}
			return
		}
	}
	p.cpuStates = append(p.cpuStates, CPUStatus{CPU: cpu, State: CPUCameOnline})
}

// ptRun is one Start..Stop of a PT source.
type ptRun struct {
	p    *PT
	cpus []*ptCPU
	sink engine.TraceSink
	// poll is where the reader sleeps; Flush and Stop wake it so that it
	// looks at their request at once.
	poll     *poller
	flushReq chan chan struct{}
	stop     chan struct{}
	done     chan struct{}
	// stopErr holds the reader's errors of the final disable.
	stopErr error
}

// ptCPU is the events of one CPU and the two mappings of the PT event.
type ptCPU struct {
	cpu      int
	fd       *fd // the intel_pt event
	side     *fd // the dummy event whose side band goes into fd's ring
	op       opener
	mem, aux []byte
	rd       *auxReader
	lastHead uint64 // aux_head at the last flush check
	// reenable counts the read passes that still enable the event after
	// the kernel disabled it on a full AUX ring; truncHead is aux_head
	// then: once it moves, the event runs again.
	reenable  int
	truncHead uint64
	gone      bool // the CPU went offline
}

// Timing returns what the decoder needs to time records between TSC
// packets: the MTC period PT asks for and the TSC:ART ratio (PTTiming);
// zero when the machine offers no MTC.
func (p *PT) Timing() decode.Timing { return p.timing }

// Start opens and maps the events of every CPU to trace (those online now,
// or PTOptions.CPUs), enables them and starts the reader goroutine, which
// passes the trace to sink until Stop. A CPU that cannot be opened (offline,
// busy, an error) is skipped and shown in Status; Start fails, with ErrNoCPU
// and every CPU's error, only when no CPU could be opened. sink must not
// call methods of p.
func (p *PT) Start(sink engine.TraceSink) error {
	if sink == nil {
		return fmt.Errorf("%w: nil sink", engine.ErrOptions)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.run != nil {
		return ErrStarted
	}
	r, err := p.open()
	if err != nil {
		return err
	}
	p.run = r
	r.sink = sink
	go r.loop(sink)
	return nil
}

// open makes a run with the events of every CPU it could open, mapped and
// enabled, or releases what it opened. It records each CPU's state.
func (p *PT) open() (*ptRun, error) {
	r := &ptRun{
		p:        p,
		flushReq: make(chan chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	var err error
	if r.poll, err = newPoller(); err != nil {
		return nil, err
	}
	online, err := onlineCPUsIn(p.cpuDir)
	if err != nil {
		return nil, errors.Join(err, r.release())
	}
	want := p.opts.CPUs
	if len(want) == 0 {
		want = online
	}
	var states []CPUStatus
	var errs []error
	for _, cpu := range want {
		if !slices.Contains(online, cpu) {
			states = append(states, CPUStatus{CPU: cpu, State: CPUOffline})
			continue
		}
		c, err := p.startCPU(r.poll, cpu)
		if err != nil {
			states = append(states, CPUStatus{CPU: cpu, State: openState(err), Err: err})
			errs = append(errs, err)
			continue
		}
		r.cpus = append(r.cpus, c)
		states = append(states, CPUStatus{CPU: cpu, State: CPUTracing})
	}
	p.stMu.Lock()
	p.cpuStates = states
	p.stMu.Unlock()
	if len(r.cpus) == 0 {
		err := fmt.Errorf("%w (of %v)", ErrNoCPU, want)
		return nil, errors.Join(append([]error{err}, append(errs, r.release())...)...)
	}
	return r, nil
}

// startCPU opens cpu's events, enables the side-band event, then the PT
// event, and adds the PT event and its AUX ring to poll, or closes what it
// opened. The ring goes in last: poll has no removal, and its look reads
// every ring it holds, so a ring closed (unmapped) after it went in would
// be read at every wait. Trace written before it went in is no wake-up
// lost: the look reads the ring's fill.
func (p *PT) startCPU(poll *poller, cpu int) (*ptCPU, error) {
	c, err := p.openCPU(cpu)
	if err != nil {
		return nil, err
	}
	// The side band first, so that the switch of the thread that runs
	// when tracing starts is not missed.
	for _, f := range []*fd{c.side, c.fd} {
		if err := p.op.ioctl(f.n, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
			return nil, errors.Join(fmt.Errorf("enable events of cpu %d: %w", cpu, err), c.close())
		}
	}
	if err := poll.addRing(c.fd.n, &c.rd.page.Aux_head, &c.rd.page.Aux_tail, uint64(p.opts.AuxWatermark)); err != nil {
		return nil, errors.Join(fmt.Errorf("cpu %d: %w", cpu, err), c.close())
	}
	return c, nil
}

// openState is the state of a CPU whose events failed to open with err.
func openState(err error) CPUState {
	switch {
	case errors.Is(err, unix.ENODEV):
		return CPUOffline
	case errors.Is(err, unix.EBUSY):
		return CPUBusy
	}
	return CPUError
}

// openCPU opens cpu's events and maps the PT event's rings as perf does: the
// control page and data ring at offset 0, then the AUX ring at the page's
// aux_offset, set to the end of the data mapping. Mapping both writable
// selects the non-overwrite mode, where the kernel never overwrites trace
// the reader has not released. Then the side-band event is opened and its
// output set to the PT event's ring (it has no mapping of its own); both
// events must be on the same CPU with the same clock, which they are.
func (p *PT) openCPU(cpu int) (*ptCPU, error) {
	attr := p.attr // the kernel may write the size back
	n, err := p.op.open(&attr, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("perf_event_open intel_pt on cpu %d: %w (%s)", cpu, err, openHint(err))
	}
	c := &ptCPU{cpu: cpu, fd: newFD(n), op: p.op}
	if p.opts.Filter != "" {
		// Before the event is enabled: it never traces outside the
		// ranges.
		if err := p.op.setFilter(n, p.opts.Filter); err != nil {
			return nil, errors.Join(fmt.Errorf("address filter %q on cpu %d (PERF_EVENT_IOC_SET_FILTER): %w", p.opts.Filter, cpu, err), c.close())
		}
	}
	size := (1 + p.opts.DataPages) * p.pageSize
	if c.mem, err = p.op.mmap(n, 0, size); err != nil {
		return nil, errors.Join(fmt.Errorf("mmap %d data pages of cpu %d: %w (%s)", p.opts.DataPages, cpu, err, mmapHint(err)), c.close())
	}
	page := (*unix.PerfEventMmapPage)(unsafe.Pointer(&c.mem[0]))
	auxSize := p.opts.AuxPages * p.pageSize
	page.Aux_offset, page.Aux_size = uint64(size), uint64(auxSize)
	if c.aux, err = p.op.mmap(n, int64(size), auxSize); err != nil {
		return nil, errors.Join(fmt.Errorf("mmap %d aux pages of cpu %d: %w (%s)", p.opts.AuxPages, cpu, err, mmapHint(err)), c.close())
	}
	if c.rd, err = newAuxReader(cpu, c.mem, c.aux, p.pageSize, &p.cnt); err != nil {
		return nil, errors.Join(fmt.Errorf("cpu %d: %w", cpu, err), c.close())
	}
	side := SideBandAttr()
	sn, err := p.op.open(&side, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("perf_event_open side-band dummy on cpu %d: %w (%s)", cpu, err, openHint(err)), c.close())
	}
	c.side = newFD(sn)
	if err := p.op.ioctl(sn, unix.PERF_EVENT_IOC_SET_OUTPUT, n); err != nil {
		return nil, errors.Join(fmt.Errorf("side band of cpu %d into the intel_pt ring (SET_OUTPUT): %w", cpu, err), c.close())
	}
	return c, nil
}

// openHint explains the usual causes of a perf_event_open error.
func openHint(err error) string {
	switch {
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return "system-wide tracing needs root (CAP_PERFMON) or kernel.perf_event_paranoid <= 0"
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP):
		return "the intel_pt PMU or one of the requested config bits is not supported here"
	case errors.Is(err, unix.EBUSY):
		return "the PT hardware of this cpu is in use by another PT or LBR user (perf record, a debugger, a hypervisor)"
	case errors.Is(err, unix.ENODEV):
		return "the cpu is offline"
	case errors.Is(err, unix.EMFILE), errors.Is(err, unix.ENFILE):
		return "out of file descriptors"
	}
	return "unexpected error"
}

// mmapHint explains the usual causes of an mmap error on a perf event.
func mmapHint(err error) string {
	switch {
	case errors.Is(err, unix.ENOMEM), errors.Is(err, unix.EPERM):
		return "the rings exceed the locked-memory limit: reduce --aux-pages or raise kernel.perf_event_mlock_kb"
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP):
		return "the event has no AUX area of that size (not an intel_pt event, or a size the kernel refuses)"
	}
	return "unexpected error"
}

// close releases c's events and mappings, the side-band event first: it
// writes into the PT event's ring.
func (c *ptCPU) close() error {
	var errs []error
	if c.side != nil {
		if err := c.side.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close cpu %d side-band event: %w", c.cpu, err))
		}
	}
	for _, m := range [][]byte{c.aux, c.mem} {
		if m != nil {
			if err := c.op.munmap(m); err != nil {
				errs = append(errs, fmt.Errorf("munmap cpu %d ring: %w", c.cpu, err))
			}
		}
	}
	c.aux, c.mem = nil, nil
	if err := c.fd.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close cpu %d intel_pt: %w", c.cpu, err))
	}
	return errors.Join(errs...)
}

// release closes everything the run opened.
func (r *ptRun) release() error {
	var errs []error
	for _, c := range r.cpus {
		errs = append(errs, c.close())
	}
	r.cpus = nil
	if r.poll != nil {
		errs = append(errs, r.poll.close())
	}
	return errors.Join(errs...)
}

// Flush stops every CPU's event for a moment so that the kernel publishes
// what it buffered, passes everything on, ending with Round(true), and
// enables them again. Each CPU reports Loss(engine.LossFlush, 1): PTWRITEs in that
// moment are not traced.
func (p *PT) Flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.run
	if r == nil {
		return ErrNotStarted
	}
	ack := make(chan struct{})
	if err := r.poll.wake(); err != nil {
		return err
	}
	select {
	case r.flushReq <- ack:
		<-ack
		return nil
	case <-r.done:
		return ErrNotStarted
	}
}

// Stop disables every CPU's event, passes on what they traced, ending with
// Round(true), stops the reader and releases every fd and mapping, even when
// some step fails. Start may follow.
func (p *PT) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.run
	if r == nil {
		return ErrNotStarted
	}
	p.run = nil
	return r.shutdown()
}

// shutdown stops the reader goroutine of r and releases its events.
func (r *ptRun) shutdown() error {
	close(r.stop)
	werr := r.poll.wake()
	<-r.done
	return errors.Join(werr, r.stopErr, r.release())
}

// loop is the reader goroutine: wait for a wakeup (AUX watermark, a
// request) or a timer, drain every CPU, enable again the events the kernel
// disabled on a full AUX ring, flush idle CPUs every FlushInterval, look for
// CPUs gone offline every hotplugInterval, end the pass with Round(false).
func (r *ptRun) loop(sink engine.TraceSink) {
	defer close(r.done)
	interval := r.p.opts.FlushInterval
	nextCheck := time.Now().Add(interval)
	nextHotplug := time.Now().Add(hotplugInterval)
	for _, c := range r.cpus {
		c.lastHead = atomic.LoadUint64(&c.rd.page.Aux_head)
	}
	for {
		wait := min(ptIdleWait, time.Until(nextHotplug))
		if interval > 0 {
			wait = min(wait, time.Until(nextCheck))
		}
		for _, c := range r.cpus {
			if c.rd.stalled || c.reenable > 0 {
				wait = min(wait, ptRetryWait)
			}
		}
		if err := r.poll.wait(max(wait, 0)); err != nil {
			r.p.cnt.errors.Add(1)
			time.Sleep(ptRetryWait)
		}
		var ack chan struct{}
		select {
		case <-r.stop:
			r.stopErr = r.disableAll()
			r.drainAll(sink)
			sink.Round(true)
			return
		case ack = <-r.flushReq:
		default:
		}
		if ack != nil {
			r.poll.reset()
			r.flushAll(sink)
			close(ack)
			nextCheck = time.Now().Add(interval)
			continue
		}
		r.drainAll(sink)
		r.reenableAll()
		now := time.Now()
		if interval > 0 && !now.Before(nextCheck) {
			r.flushIdle(sink)
			nextCheck = now.Add(interval)
		}
		if !now.Before(nextHotplug) {
			r.hotplug()
			nextHotplug = now.Add(hotplugInterval)
		}
		sink.Round(false)
	}
}

// drainCPU passes on what c's rings hold and notes a truncation: the kernel
// disables the event then, and reenableAll enables it again.
func (r *ptRun) drainCPU(sink engine.TraceSink, c *ptCPU) {
	if res := c.rd.drain(sink); res.truncated {
		c.reenable, c.truncHead = reenablePasses, atomic.LoadUint64(&c.rd.page.Aux_head)
	}
}

// reenableAll enables the events that a truncation disabled, at the end of
// a read pass as perf does, when the pass made room. The kernel disables
// the event from irq work after the truncation, and on kernels before the
// 2025 fix of that flow ("perf/aux: Properly launch pending disable flow")
// an enable that came before the work ran is undone; so the passes after
// it enable the event again (an enabled event ignores that) until its
// aux_head moves, at most reenablePasses times.
func (r *ptRun) reenableAll() {
	for _, c := range r.cpus {
		if c.reenable == 0 || c.gone {
			continue
		}
		if atomic.LoadUint64(&c.rd.page.Aux_head) != c.truncHead {
			c.reenable = 0
			continue
		}
		c.reenable--
		r.ioctl(c, unix.PERF_EVENT_IOC_ENABLE)
	}
}

// drainAll drains every CPU.
func (r *ptRun) drainAll(sink engine.TraceSink) {
	for _, c := range r.cpus {
		r.drainCPU(sink, c)
	}
}

// flushCPU stops c's PT event so that the kernel publishes its buffered
// trace, drains it, reports the gap and starts the event again. The
// side-band event stays enabled.
func (r *ptRun) flushCPU(sink engine.TraceSink, c *ptCPU) {
	r.ioctl(c, unix.PERF_EVENT_IOC_DISABLE)
	r.drainCPU(sink, c)
	c.rd.loss(sink, engine.LossFlush, 1)
	c.reenable = 0
	r.ioctl(c, unix.PERF_EVENT_IOC_ENABLE)
}

// flushIdle flushes every CPU whose aux_head has not moved since the last
// check: the kernel may hold its trace back until the watermark.
func (r *ptRun) flushIdle(sink engine.TraceSink) {
	for _, c := range r.cpus {
		if c.gone {
			continue
		}
		if atomic.LoadUint64(&c.rd.page.Aux_head) == c.lastHead {
			r.flushCPU(sink, c)
		}
		c.lastHead = atomic.LoadUint64(&c.rd.page.Aux_head)
	}
}

// flushAll is Flush in the reader: every CPU stopped, drained and reported,
// Round(true), every CPU started again.
func (r *ptRun) flushAll(sink engine.TraceSink) {
	for _, c := range r.cpus {
		r.ioctl(c, unix.PERF_EVENT_IOC_DISABLE)
	}
	r.drainAll(sink)
	for _, c := range r.cpus {
		c.rd.loss(sink, engine.LossFlush, 1)
	}
	sink.Round(true)
	for _, c := range r.cpus {
		c.reenable = 0
		r.ioctl(c, unix.PERF_EVENT_IOC_ENABLE)
		c.lastHead = atomic.LoadUint64(&c.rd.page.Aux_head)
	}
}

// hotplug compares the online CPUs with the run's: a traced CPU that went
// offline lost its events for good (the kernel does not bring them back
// when it returns), and a CPU that came online is not traced; both show in
// Status until the next Start, which opens what is online then.
func (r *ptRun) hotplug() {
	online, err := onlineCPUsIn(r.p.cpuDir)
	if err != nil {
		r.p.cnt.errors.Add(1)
		return
	}
	for _, c := range r.cpus {
		if !c.gone && !slices.Contains(online, c.cpu) {
			c.gone = true
			r.p.wentOffline(c.cpu)
		}
	}
	want := r.p.opts.CPUs
	for _, cpu := range online {
		if len(want) > 0 && !slices.Contains(want, cpu) {
			continue
		}
		if !slices.ContainsFunc(r.cpus, func(c *ptCPU) bool { return c.cpu == cpu }) {
			r.p.cameOnline(cpu)
		}
	}
}

// ioctl runs an enable or disable ioctl on c's PT event in the reader, which
// has no caller to return an error to: a failure is counted (status shows
// the count). A CPU gone offline is left alone.
func (r *ptRun) ioctl(c *ptCPU, req uint) {
	if c.gone {
		return
	}
	if err := r.p.op.ioctl(c.fd.n, req, 0); err != nil {
		r.p.cnt.errors.Add(1)
	}
}

// disableAll disables every CPU's PT event.
func (r *ptRun) disableAll() error {
	var errs []error
	for _, c := range r.cpus {
		if c.gone {
			continue
		}
		if err := r.p.op.ioctl(c.fd.n, unix.PERF_EVENT_IOC_DISABLE, 0); err != nil {
			errs = append(errs, fmt.Errorf("disable intel_pt on cpu %d: %w", c.cpu, err))
		}
	}
	return errors.Join(errs...)
}
