package perfio

import (
	"errors"
	"fmt"
	"os"
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
	// CPUs to trace; default all online CPUs.
	CPUs []int
	// DataPages is the size of each CPU's side-band ring in pages, a power
	// of two; default DefaultPTDataPages.
	DataPages int
	// AuxPages is the size of each CPU's AUX (trace) ring in pages, a
	// power of two; default DefaultPTAuxPages.
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
}

// Defaults of PTOptions.
const (
	DefaultPTDataPages   = 64
	DefaultPTAuxPages    = 1024
	DefaultAuxWatermark  = 64 << 10
	DefaultFlushInterval = 500 * time.Millisecond
)

// maxPTPages bounds DataPages and AuxPages (4 GiB with 4 KiB pages).
const maxPTPages = 1 << 20

// ptIdleWait is the longest the reader sleeps without a wakeup; ptRetryWait
// how soon it comes back for an event to enable again or a record that
// waits for aux_head.
const (
	ptIdleWait  = 100 * time.Millisecond
	ptRetryWait = time.Millisecond
)

// Sentinel errors of PT.
var (
	// ErrStarted reports Start of a PT source that runs.
	ErrStarted = errors.New("pt source already started")
	// ErrNotStarted reports Flush or Stop of a PT source that does not run.
	ErrNotStarted = errors.New("pt source not started")
)

// PTStats are the counters of a PT source, summed over all its runs.
type PTStats struct {
	Records uint64 // side-band ring records read (AUX, LOST, switches, ...)
	Bytes   uint64 // PT bytes passed to the sink
	// Losses counts the losses passed to the sink, indexed by engine.LossKind:
	// one per gap, or for engine.LossSideBand the records lost.
	Losses [engine.NumLossKinds]uint64
	Errors uint64 // malformed records, failed ioctls, unreadable time
}

// PT is the engine.TraceSource of the kernel: one system-wide, user-mode intel_pt
// event per CPU with PTWRITE tracing, each with a side-band ring and an AUX
// ring, read by one goroutine.
type PT struct {
	attr     unix.PerfEventAttr
	opts     PTOptions
	cpus     []int
	pageSize int
	cnt      ptCounters
	timing   decode.Timing

	// mu serializes Start, Flush and Stop, and guards run.
	mu  sync.Mutex
	run *ptRun
}

// NewPT prepares tracing from the intel_pt PMU described in dir (PTSysfsDir
// on a real machine); nothing is opened until Start. It fails with ErrNoPT
// or ErrNoPTW (see PTAttr) when the machine cannot trace PTWRITE.
func NewPT(dir string, o PTOptions) (*PT, error) {
	if o.DataPages == 0 {
		o.DataPages = DefaultPTDataPages
	}
	if o.AuxPages == 0 {
		o.AuxPages = DefaultPTAuxPages
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	pageSize := os.Getpagesize()
	if o.AuxWatermark == 0 && o.AuxPages > 0 {
		// At most half the ring, so that the reader frees space before
		// the ring fills.
		o.AuxWatermark = min(DefaultAuxWatermark, o.AuxPages*pageSize/2)
	}
	for _, n := range []struct {
		name  string
		pages int
	}{{"data pages", o.DataPages}, {"aux pages", o.AuxPages}} {
		if n.pages < 0 || n.pages&(n.pages-1) != 0 || n.pages > maxPTPages {
			return nil, fmt.Errorf("%w: %s %d is not a power of two up to %d", engine.ErrOptions, n.name, n.pages, maxPTPages)
		}
	}
	if o.AuxWatermark < 0 || o.AuxWatermark > o.AuxPages*pageSize {
		return nil, fmt.Errorf("%w: aux watermark %d outside the %d-byte aux ring", engine.ErrOptions, o.AuxWatermark, o.AuxPages*pageSize)
	}
	cpus, err := traceCPUs(o.CPUs)
	if err != nil {
		return nil, err
	}
	timing, mtc := PTTiming(dir)
	attr, err := PTAttr(dir, PTConfig{Branch: o.Branch, PSBPeriod: o.PSBPeriod, AuxWatermark: uint32(o.AuxWatermark),
		MTC: mtc, MTCPeriod: int(timing.MTCPeriod)})
	if err != nil {
		return nil, err
	}
	return &PT{attr: *attr, opts: o, cpus: cpus, pageSize: pageSize, timing: timing}, nil
}

// Stats returns the counters.
func (p *PT) Stats() PTStats {
	s := PTStats{
		Records: p.cnt.records.Load(),
		Bytes:   p.cnt.bytes.Load(),
		Errors:  p.cnt.errors.Load(),
	}
	for i := range s.Losses {
		s.Losses[i] = p.cnt.losses[i].Load()
	}
	return s
}

// ptRun is one Start..Stop of a PT source.
type ptRun struct {
	p    *PT
	cpus []*ptCPU
	// poll is where the reader sleeps; Flush and Stop wake it so that it
	// looks at their request at once.
	poll     *poller
	flushReq chan chan struct{}
	stop     chan struct{}
	done     chan struct{}
	// stopErr holds the reader's errors of the final disable.
	stopErr error
}

// ptCPU is the event of one CPU and its two mappings.
type ptCPU struct {
	cpu       int
	fd        *fd
	mem, aux  []byte
	rd        *auxReader
	lastHead  uint64    // aux_head at the last flush check
	reenable  bool      // the kernel disabled the event on a full AUX ring
	reenableT time.Time // when to enable it again
}

// Timing returns what the decoder needs to time records between TSC
// packets: the MTC period PT asks for and the TSC:ART ratio (PTTiming);
// zero when the machine offers no MTC.
func (p *PT) Timing() decode.Timing { return p.timing }

// Start opens and maps one intel_pt event per CPU, enables them and starts
// the reader goroutine, which passes the trace to sink until Stop. sink must
// not call methods of p.
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
	for _, c := range r.cpus {
		if err := unix.IoctlSetInt(c.fd.n, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
			err = fmt.Errorf("enable intel_pt on cpu %d: %w", c.cpu, err)
			return errors.Join(err, r.disableAll(), r.release())
		}
	}
	p.run = r
	go r.loop(sink)
	return nil
}

// open makes a run with every CPU's event opened and mapped, or releases
// what it opened.
func (p *PT) open() (*ptRun, error) {
	r := &ptRun{
		p:        p,
		flushReq: make(chan chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	fail := func(err error) (*ptRun, error) { return nil, errors.Join(err, r.release()) }
	var err error
	if r.poll, err = newPoller(); err != nil {
		return nil, err
	}
	for _, cpu := range p.cpus {
		c, err := p.openCPU(cpu)
		if err != nil {
			return fail(err)
		}
		r.cpus = append(r.cpus, c)
		if err := r.poll.add(c.fd.n); err != nil {
			return fail(fmt.Errorf("cpu %d: %w", cpu, err))
		}
	}
	return r, nil
}

// openCPU opens cpu's event and maps its rings as perf does: the control
// page and data ring at offset 0, then the AUX ring at the page's
// aux_offset, set to the end of the data mapping. Mapping both writable
// selects the non-overwrite mode, where the kernel never overwrites trace
// the reader has not released.
func (p *PT) openCPU(cpu int) (*ptCPU, error) {
	attr := p.attr // the kernel may write the size back
	fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("perf_event_open intel_pt on cpu %d: %w (%s)", cpu, err, openHint(err))
	}
	c := &ptCPU{cpu: cpu, fd: newFD(fd)}
	size := (1 + p.opts.DataPages) * p.pageSize
	if c.mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, errors.Join(fmt.Errorf("mmap %d data pages of cpu %d: %w (%s)", p.opts.DataPages, cpu, err, mmapHint(err)), c.close())
	}
	page := (*unix.PerfEventMmapPage)(unsafe.Pointer(&c.mem[0]))
	auxSize := p.opts.AuxPages * p.pageSize
	page.Aux_offset, page.Aux_size = uint64(size), uint64(auxSize)
	if c.aux, err = unix.Mmap(fd, int64(size), auxSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, errors.Join(fmt.Errorf("mmap %d aux pages of cpu %d: %w (%s)", p.opts.AuxPages, cpu, err, mmapHint(err)), c.close())
	}
	if c.rd, err = newAuxReader(cpu, c.mem, c.aux, p.pageSize, &p.cnt); err != nil {
		return nil, errors.Join(fmt.Errorf("cpu %d: %w", cpu, err), c.close())
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
		return "the PT hardware is in use by another tracer (perf record, a debugger, a hypervisor)"
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

// close releases c's mappings and fd.
func (c *ptCPU) close() error {
	var errs []error
	for _, m := range [][]byte{c.aux, c.mem} {
		if m != nil {
			if err := unix.Munmap(m); err != nil {
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
	close(r.stop)
	werr := r.poll.wake()
	<-r.done
	return errors.Join(werr, r.stopErr, r.release())
}

// loop is the reader goroutine: wait for a wakeup (AUX watermark, a
// request) or a timer, drain every CPU, flush idle CPUs every
// FlushInterval, end the pass with Round(false).
func (r *ptRun) loop(sink engine.TraceSink) {
	defer close(r.done)
	interval := r.p.opts.FlushInterval
	nextCheck := time.Now().Add(interval)
	for _, c := range r.cpus {
		c.lastHead = atomic.LoadUint64(&c.rd.page.Aux_head)
	}
	for {
		wait := ptIdleWait
		if interval > 0 {
			wait = min(wait, time.Until(nextCheck))
		}
		for _, c := range r.cpus {
			if c.reenable || c.rd.stalled {
				wait = min(wait, ptRetryWait)
			}
		}
		if err := r.poll.wait(wait); err != nil {
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
		now := time.Now()
		for _, c := range r.cpus {
			if c.reenable && !now.Before(c.reenableT) {
				c.reenable = false
				r.ioctl(c, unix.PERF_EVENT_IOC_ENABLE)
			}
		}
		if interval > 0 && !now.Before(nextCheck) {
			r.flushIdle(sink)
			nextCheck = now.Add(interval)
		}
		sink.Round(false)
	}
}

// drainCPU passes on what c's rings hold and notes a truncation.
func (r *ptRun) drainCPU(sink engine.TraceSink, c *ptCPU) {
	if res := c.rd.drain(sink); res.truncated {
		// The kernel disables the event from irq work after a
		// truncation; enabling it before that work ran would be undone.
		c.reenable, c.reenableT = true, time.Now().Add(ptRetryWait)
	}
}

// drainAll drains every CPU.
func (r *ptRun) drainAll(sink engine.TraceSink) {
	for _, c := range r.cpus {
		r.drainCPU(sink, c)
	}
}

// flushCPU stops c's event so that the kernel publishes its buffered trace,
// drains it, reports the gap and starts the event again.
func (r *ptRun) flushCPU(sink engine.TraceSink, c *ptCPU) {
	r.ioctl(c, unix.PERF_EVENT_IOC_DISABLE)
	r.drainCPU(sink, c)
	c.rd.loss(sink, engine.LossFlush, 1)
	c.reenable = false
	r.ioctl(c, unix.PERF_EVENT_IOC_ENABLE)
}

// flushIdle flushes every CPU whose aux_head has not moved since the last
// check: the kernel may hold its trace back until the watermark.
func (r *ptRun) flushIdle(sink engine.TraceSink) {
	for _, c := range r.cpus {
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
		c.reenable = false
		r.ioctl(c, unix.PERF_EVENT_IOC_ENABLE)
		c.lastHead = atomic.LoadUint64(&c.rd.page.Aux_head)
	}
}

// ioctl runs an enable or disable ioctl in the reader, which has no caller
// to return an error to: a failure is counted (status shows the count).
func (r *ptRun) ioctl(c *ptCPU, req uint) {
	if err := unix.IoctlSetInt(c.fd.n, req, 0); err != nil {
		r.p.cnt.errors.Add(1)
	}
}

// disableAll disables every CPU's event.
func (r *ptRun) disableAll() error {
	var errs []error
	for _, c := range r.cpus {
		if err := unix.IoctlSetInt(c.fd.n, unix.PERF_EVENT_IOC_DISABLE, 0); err != nil {
			errs = append(errs, fmt.Errorf("disable intel_pt on cpu %d: %w", c.cpu, err))
		}
	}
	return errors.Join(errs...)
}
