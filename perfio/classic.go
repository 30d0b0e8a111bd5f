package perfio

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"ptfs/decode"
	"ptfs/engine"

	"golang.org/x/sys/unix"
)

// ClassicOptions configure a Classic source. Zero values select defaults.
type ClassicOptions struct {
	// RingPages is the size of each CPU's data ring in pages, a power of
	// two; default 256.
	RingPages int
	// Latency is how long a sample is held back so that samples of other
	// CPUs stamped earlier can still arrive and go out before it; default
	// 50ms.
	Latency time.Duration
	// CPUs to trace; default all online CPUs.
	CPUs []int
}

// Defaults of ClassicOptions.
const (
	DefaultRingPages = 256
	DefaultLatency   = 50 * time.Millisecond
)

// maxRingPages bounds RingPages (4 GiB rings with 4 KiB pages).
const maxRingPages = 1 << 20

// minPass is the shortest sleep between two passes while records are held
// back. A pass releases what is older than Latency; under a steady stream
// something is always just due, so without this bound the reader would wake
// for every few records. Each wake of an idle process costs far more than
// its records (the Go runtime's sysmon restarts polling every 20 µs for a
// while after it), so passes are batched: a record goes out at most
// Latency + minPass after its hit, or when its ring reaches its wakeup
// watermark. It also paces the retries after a failed wait.
const minPass = 25 * time.Millisecond

// idleInterval is how long the reader sleeps when it holds no record back:
// a hit that does not fill a ring to its watermark is read this late at
// most, while an idle mount wakes ten times a second instead of a hundred.
const idleInterval = 100 * time.Millisecond

// ClassicStats are the counters of a Classic source.
type ClassicStats struct {
	Records uint64 // records passed to the sink
	// Lost counts the samples the kernel dropped because a ring was
	// full, each event's own (LostBy says how), where a ring's LOST
	// record comes only with the next sample that fits, which may never
	// come.
	Lost uint64
	// LostBy is how Lost is counted: the kernel tells on the first
	// event opened.
	LostBy  LostCounting
	Unknown uint64 // samples of an event id not (or no longer) added
	Errors  uint64 // malformed ring data or samples, skipped
	Late    uint64 // times a record went out after a later one (order broken)
	// Filtered counts records that their event's Filter dropped: not
	// losses.
	Filtered uint64
	// TaskLost counts COMM and EXIT records the kernel dropped because a
	// CPU's task ring was full; after one, process names are read from
	// /proc again.
	TaskLost uint64
}

// LostCounting is how a Classic counts the samples its rings had no room
// for.
type LostCounting uint8

const (
	// LostNotYet: no event opened yet; the kernel has not told.
	LostNotYet LostCounting = iota
	// LostPerEvent: each event's own count (read_format
	// PERF_FORMAT_LOST, kernel 6.0+), current at once.
	LostPerEvent
	// LostByHits: each event's hits (its count) minus its samples read
	// from the rings, the rings drained after the count is read (kernels
	// before 6.0 refuse PERF_FORMAT_LOST). At most what was lost while
	// the event fires, exact once it is idle, removed or closed.
	LostByHits
)

func (l LostCounting) String() string {
	switch l {
	case LostPerEvent:
		return "per event (PERF_FORMAT_LOST)"
	case LostByHits:
		return "hits minus samples read (the kernel lacks PERF_FORMAT_LOST, before 6.0): exact once an event is idle"
	}
	return "not yet (no event opened)"
}

// Classic reads classic uprobe events: one tracepoint perf event per event
// and CPU, all events of a CPU writing into one ring owned by a dummy event,
// read by one goroutine that merges the CPUs in time order.
type Classic struct {
	sink    engine.Sink
	latency uint64 // ns

	mu     sync.Mutex // guards the fields below and the rings
	cpus   []*cpuRing
	events map[uint16]*classicEvent
	// lastEv caches the event of the previous sample; reset on Remove.
	lastEv *classicEvent
	// lostBy is how losses are counted, set by the first event opened.
	lostBy LostCounting
	// fdMu keeps the fds of the events that Stats reads open: taken
	// before mu by Stats, alone to close an event's fds once it is out
	// of events.
	fdMu sync.RWMutex
	// merge orders the held-back samples by time; each one's bytes wait
	// in its CPU's raw queue, decoded only as it is released (held).
	merge  engine.Merger[held]
	raw    []rawQueue
	closed bool
	// comms names the processes of the records: the task rings' COMM and
	// EXIT records keep it current, applied in time order as records are
	// released (tasks holds those not applied yet); /proc names a process
	// first seen.
	comms  *engine.Comms
	tasks  []taskEvent
	side   sideParser
	sideEv engine.SideEvent

	// poll is where the reader sleeps; Remove and Close wake it so that it
	// flushes or stops at once instead of at its next poll.
	poll *poller
	// flushes are the acks of the flushes Remove asked for, queued before
	// its wake: the reader takes them all once woken (poller.woken), so
	// that none waits for its next poll, however many Removes run at once.
	flushMu   sync.Mutex
	flushes   []chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error

	// lostGone holds the lost samples of the events removed; Stats adds
	// those of the events still added.
	records, lostGone, unknown, errs, filtered, taskLost atomic.Uint64
}

// cpuRing is the ring of one CPU: anchor is the dummy event that owns the
// mmap; every tracepoint event of that CPU redirects its output there.
// task holds the CPU's COMM and EXIT records, in a ring of their own so
// that its LOST records count lost COMM and EXIT records only (a ring's
// LOST record counts whatever it had no room for; lost samples are
// counted by their events, see eventLost).
type cpuRing struct {
	cpu    int
	anchor *fd
	mem    []byte
	ring   *Ring
	// wakeup is the ring's wakeup watermark, in bytes.
	wakeup uint64
	// ringErrs is the part of ring.Errors already added to Classic.errs.
	ringErrs uint64
	task     *taskRing
}

// taskRing is a dummy event that writes the COMM records (exec, renames)
// and EXIT records of one CPU's tasks into its own ring.
type taskRing struct {
	fd       *fd
	mem      []byte
	ring     *Ring
	ringErrs uint64
}

// taskEvent is a COMM (exit false) or EXIT of a process's main thread.
type taskEvent struct {
	time uint64
	pid  int32
	exit bool
	comm string
}

// taskRingPages is the size of a task ring: a COMM or EXIT record is 40 to
// 64 bytes, and the ring is read at least every idleInterval.
const taskRingPages = 16

// classicEvent is one added event and its perf fds, one per CPU.
type classicEvent struct {
	ev  *decode.Event
	fds []int
	// words and wordsEnd are wordOffsets of ev: the release's fill of
	// an event of 8-byte arguments (fillWords).
	words    []int
	wordsEnd int
	// samples counts its samples read from the rings (LostByHits).
	samples uint64
}

// newClassicEvent returns the classicEvent of ev, without fds.
func newClassicEvent(ev *decode.Event) *classicEvent {
	ce := &classicEvent{ev: ev}
	ce.words, ce.wordsEnd = wordOffsets(ev)
	return ce
}

// NewClassic opens the per-CPU rings and starts the reader goroutine, which
// passes records to sink. Close releases everything.
func NewClassic(opts ClassicOptions, sink engine.Sink) (*Classic, error) {
	if sink == nil {
		return nil, fmt.Errorf("%w: nil sink", engine.ErrOptions)
	}
	if opts.RingPages == 0 {
		opts.RingPages = DefaultRingPages
	}
	if opts.RingPages < 0 || opts.RingPages&(opts.RingPages-1) != 0 || opts.RingPages > maxRingPages {
		return nil, fmt.Errorf("%w: ring pages %d is not a power of two up to %d", engine.ErrOptions, opts.RingPages, maxRingPages)
	}
	if opts.Latency == 0 {
		opts.Latency = DefaultLatency
	}
	if opts.Latency < 0 {
		return nil, fmt.Errorf("%w: negative latency %v", engine.ErrOptions, opts.Latency)
	}
	cpus, err := traceCPUs(opts.CPUs)
	if err != nil {
		return nil, err
	}
	poll, err := newPoller()
	if err != nil {
		return nil, err
	}
	c := &Classic{
		sink:    sink,
		latency: uint64(opts.Latency),
		events:  make(map[uint16]*classicEvent),
		comms:   engine.NewComms(ProcComm),
		side:    sideParser{idSize: classicIDSize},
		poll:    poll,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	for _, cpu := range cpus {
		cr, err := openCPURing(cpu, opts.RingPages)
		if err == nil {
			c.cpus = append(c.cpus, cr)
			if err = c.poll.addRing(cr.anchor.n, cr.ring.head, cr.ring.tail, cr.wakeup); err != nil {
				err = fmt.Errorf("cpu %d: %w", cpu, err)
			}
		}
		if err != nil {
			close(c.done) // no reader goroutine to wait for
			return nil, errors.Join(err, c.Close())
		}
	}
	c.merge, c.raw = engine.NewMerger[held](len(c.cpus), engine.MaxPending), make([]rawQueue, len(c.cpus))
	go c.run()
	return c, nil
}

// openCPURing opens the dummy event that owns cpu's ring and maps the ring,
// and the CPU's task ring.
func openCPURing(cpu, pages int) (*cpuRing, error) {
	attr := perfAttr(unix.PERF_TYPE_SOFTWARE, unix.PERF_COUNT_SW_DUMMY)
	// Wake the reader when a quarter of the ring is full; the poll
	// interval covers slower streams.
	attr.Bits |= unix.PerfBitWatermark
	attr.Wakeup = uint32(pages * os.Getpagesize() / 4)
	wakeup := uint64(attr.Wakeup)
	fd, mem, ring, err := openRing(attr, cpu, pages)
	if err != nil {
		return nil, err
	}
	// Runs from the start (not disabled) and wakes nobody: the reader
	// reads it whenever it reads the samples.
	attr = perfAttr(unix.PERF_TYPE_SOFTWARE, unix.PERF_COUNT_SW_DUMMY)
	attr.Bits &^= unix.PerfBitDisabled
	attr.Bits |= unix.PerfBitComm | unix.PerfBitCommExec | unix.PerfBitTask | unix.PerfBitSampleIDAll
	tfd, tmem, tring, err := openRing(attr, cpu, taskRingPages)
	if err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		return nil, fmt.Errorf("task ring: %w", err)
	}
	return &cpuRing{cpu: cpu, anchor: newFD(fd), mem: mem, ring: ring, wakeup: wakeup,
		task: &taskRing{fd: newFD(tfd), mem: tmem, ring: tring}}, nil
}

// openRing opens a perf event of attr on cpu and maps its ring of pages.
func openRing(attr *unix.PerfEventAttr, cpu, pages int) (int, []byte, *Ring, error) {
	pageSize := os.Getpagesize()
	fd, err := unix.PerfEventOpen(attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return -1, nil, nil, fmt.Errorf("perf_event_open dummy on cpu %d: %w", cpu, err)
	}
	mem, err := unix.Mmap(fd, 0, (1+pages)*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, nil, fmt.Errorf("mmap %d pages of cpu %d ring: %w", pages, cpu, err)
	}
	ring, err := NewDataRing(mem, pageSize)
	if err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		return -1, nil, nil, fmt.Errorf("cpu %d: %w", cpu, err)
	}
	return fd, mem, ring, nil
}

// perfAttr returns the attributes shared by the ring owners and the
// tracepoint events: SET_OUTPUT requires the same clock on both.
func perfAttr(typ uint32, config uint64) *unix.PerfEventAttr {
	return &unix.PerfEventAttr{
		Type:        typ,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Config:      config,
		Sample:      1,
		Sample_type: classicSampleType,
		Bits:        unix.PerfBitDisabled | unix.PerfBitUseClockID,
		Clockid:     unix.CLOCK_MONOTONIC,
	}
}

// Add starts reading event ev: ev.ID is its tracefs id and ev.Args locate
// its arguments in the raw sample data, as its tracefs format file says
// (tracefs.ParseFormat). Its records point to ev, so ev must not change
// afterwards.
func (c *Classic) Add(ev *decode.Event) error {
	if err := checkEvent(ev); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ce, err := c.openLocked(ev)
	if err != nil {
		return err
	}
	return c.enableLocked(ce)
}

// openLocked opens ev's perf events, disabled, and makes them known, so
// that no sample of ev counts as unknown once they are enabled. Opening
// takes the kernel's event_mutex, which a uprobe removal anywhere holds
// while it waits for every hit in a handler; enabling does not.
func (c *Classic) openLocked(ev *decode.Event) (*classicEvent, error) {
	if c.closed {
		return nil, engine.ErrClosed
	}
	if _, ok := c.events[ev.ID]; ok {
		return nil, fmt.Errorf("%w: id %d (%s/%s)", engine.ErrExists, ev.ID, ev.Group, ev.Name)
	}
	ce := newClassicEvent(ev)
	var err error
	if ev.Filter.PID != 0 {
		err = c.openProcess(ce, ev.Filter.PID)
	} else {
		err = c.openTask(ce, -1)
	}
	if err != nil {
		closeFDs(ce.fds)
		return nil, err
	}
	c.events[ev.ID] = ce
	return ce, nil
}

// enableLocked enables the events openLocked opened; on failure they are
// closed and forgotten, their losses counted.
func (c *Classic) enableLocked(ce *classicEvent) error {
	ev := ce.ev
	for _, fd := range ce.fds {
		if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
			disableFDs(ce.fds)
			c.drainLocked()
			// The fds enabled so far may have lost samples too.
			c.lostGone.Add(c.eventLost(ce))
			closeFDs(ce.fds)
			delete(c.events, ev.ID)
			c.lastEv = nil
			return fmt.Errorf("enable event %d (%s/%s): %w", ev.ID, ev.Group, ev.Name, err)
		}
	}
	return nil
}

// openTask opens ce's event for thread tid (-1: every task) on every CPU,
// writing into the CPU's ring. A thread's events are inherited by the
// threads and children it creates from then on.
func (c *Classic) openTask(ce *classicEvent, tid int) error {
	ev := ce.ev
	attr := perfAttr(unix.PERF_TYPE_TRACEPOINT, uint64(ev.ID))
	// Each event counts the samples the ring had no room for (see
	// eventLost).
	if c.lostBy != LostByHits {
		attr.Read_format = unix.PERF_FORMAT_LOST
	}
	if tid >= 0 {
		attr.Bits |= unix.PerfBitInherit
	}
	for _, cr := range c.cpus {
		fd, err := perfEventOpen(attr, tid, cr.cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if c.lostBy == LostNotYet {
			fd, err = c.learnLostFormat(attr, tid, cr.cpu, fd, err)
		}
		if err != nil {
			return fmt.Errorf("perf_event_open tracepoint %d (%s/%s) on cpu %d, task %d: %w", ev.ID, ev.Group, ev.Name, cr.cpu, tid, err)
		}
		ce.fds = append(ce.fds, fd)
		if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_SET_OUTPUT, cr.anchor.n); err != nil {
			return fmt.Errorf("redirect event %d to cpu %d ring: %w", ev.ID, cr.cpu, err)
		}
	}
	return nil
}

// perfEventOpen is perf_event_open(2); tests stand in a kernel without
// PERF_FORMAT_LOST.
var perfEventOpen = unix.PerfEventOpen

// learnLostFormat sets how c counts losses from the first tracepoint
// event opened, whose attr asked for PERF_FORMAT_LOST and gave fd, err.
// Kernels before 6.0 refuse that flag with a bare EINVAL: the event is
// opened once more without it, and when that works, losses are counted by
// hits from then on (LostByHits). Called holding mu.
func (c *Classic) learnLostFormat(attr *unix.PerfEventAttr, tid, cpu, fd int, err error) (int, error) {
	if err == nil {
		c.lostBy = LostPerEvent
		return fd, nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fd, err
	}
	attr.Read_format = 0
	fd, err2 := perfEventOpen(attr, tid, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err2 != nil {
		// Refused for another reason: ask again on the next open.
		attr.Read_format = unix.PERF_FORMAT_LOST
		return fd, err
	}
	c.lostBy = LostByHits // status says so
	return fd, nil
}

// maxTaskPasses bounds the listings of a process's threads in
// openProcess: each pass attaches the threads the last one did not list.
const maxTaskPasses = 16

// openProcess opens ce's event for every thread of process pid (%pid=N),
// as perf record -p does: the kernel then samples that process alone, and
// installs the uprobe in its memory only, so other processes do not even
// trap. Threads are listed until a pass finds no new one; a thread that
// an attached thread creates later inherits the events. A process that
// does not exist fails with ESRCH.
func (c *Classic) openProcess(ce *classicEvent, pid int32) error {
	seen := map[int]bool{}
	dir := "/proc/" + strconv.Itoa(int(pid)) + "/task"
	for pass := 0; pass < maxTaskPasses; pass++ {
		ents, err := os.ReadDir(dir)
		if err != nil {
			if len(seen) == 0 {
				return fmt.Errorf("%%pid=%d: %w (%v)", pid, unix.ESRCH, err)
			}
			return nil // gone meanwhile: its events end with it
		}
		added := false
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || seen[tid] {
				continue
			}
			seen[tid], added = true, true
			if err := c.openTask(ce, tid); err != nil {
				if errors.Is(err, unix.ESRCH) {
					continue // the thread exited meanwhile
				}
				return err
			}
		}
		if !added {
			return nil
		}
	}
	return nil
}

// Remove stops reading event id and closes its fds. Samples it already
// wrote are read first, and when Remove returns every record of the event
// has reached the sink (records of other events held back for ordering go
// out with them, early); a sample still being written on another CPU while
// the event is disabled arrives later and counts as Unknown. Closing the
// last perf event of a uprobe waits for the kernel to unregister it (RCU
// grace periods, ~85 ms), so the fds are closed without the lock:
// concurrent Removes overlap those waits.
func (c *Classic) Remove(id uint16) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return engine.ErrClosed
	}
	ce, ok := c.events[id]
	if !ok {
		c.mu.Unlock()
		return fmt.Errorf("%w: id %d", engine.ErrNotFound, id)
	}
	err := disableFDs(ce.fds)
	c.drainLocked()
	c.lostGone.Add(c.eventLost(ce))
	delete(c.events, id)
	c.lastEv = nil
	c.mu.Unlock()
	c.fdMu.Lock()
	err = errors.Join(err, closeFDs(ce.fds))
	c.fdMu.Unlock()
	// The reader delivers what is held back: the sink sees records from
	// one goroutine only.
	ack := make(chan struct{})
	c.flushMu.Lock()
	c.flushes = append(c.flushes, ack)
	c.flushMu.Unlock()
	if werr := c.poll.wake(); werr != nil {
		// Not woken, the reader may never take it: withdrawn (unless
		// already taken, then it is closed unheard).
		c.flushMu.Lock()
		if i := slices.Index(c.flushes, ack); i >= 0 {
			c.flushes = slices.Delete(c.flushes, i, i+1)
		}
		c.flushMu.Unlock()
		return errors.Join(err, werr)
	}
	select {
	case <-ack:
	case <-c.done:
	}
	return err
}

// Stats returns all counters.
func (c *Classic) Stats() ClassicStats {
	// The events' counts are read without mu, which the reader takes for
	// each pass: reading a CPU's event may wait for an IPI to that CPU
	// (0.28 ms for 4 events on 2 CPUs here, under load). fdMu keeps their
	// fds open meanwhile.
	c.fdMu.RLock()
	c.mu.Lock()
	evs := slices.Collect(maps.Values(c.events))
	by := c.lostBy
	c.mu.Unlock()
	counts := make([]uint64, len(evs))
	for i, ce := range evs {
		counts[i] = c.eventCount(ce, by)
	}
	c.fdMu.RUnlock()
	c.mu.Lock()
	if by == LostByHits && len(evs) > 0 {
		// The samples written by the time the hits were read.
		c.drainLocked()
	}
	lost := c.lostGone.Load()
	for i, ce := range evs {
		// One removed meanwhile is counted in lostGone.
		if c.events[ce.ev.ID] == ce {
			lost += ce.lossOf(by, counts[i])
		}
	}
	late := c.merge.Late()
	c.mu.Unlock()
	return ClassicStats{
		Records:  c.records.Load(),
		Lost:     lost,
		LostBy:   by,
		Unknown:  c.unknown.Load(),
		Errors:   c.errs.Load(),
		Late:     late,
		Filtered: c.filtered.Load(),
		TaskLost: c.taskLost.Load(),
	}
}

// Close stops the events, passes every record still in the rings to the
// sink, stops the reader and releases all fds and mappings. It is
// idempotent; later calls return the first result.
func (c *Classic) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		c.mu.Lock()
		c.closed = true
		for _, ce := range c.events {
			errs = append(errs, disableFDs(ce.fds))
		}
		c.mu.Unlock()
		// The reader drains and flushes everything once more, then exits;
		// woken, it does so now rather than at the end of its sleep.
		close(c.stop)
		werr := c.poll.wake()
		<-c.done
		errs = append(errs, werr)
		// Their losses counted under the lock that Stats reads them
		// with; the fds closed without it (slow, see Remove).
		c.mu.Lock()
		var gone []*classicEvent
		for id, ce := range c.events {
			c.lostGone.Add(c.eventLost(ce))
			gone = append(gone, ce)
			delete(c.events, id)
		}
		// A Stats that saw the events before they went drains under mu
		// (losses counted by hits): from here on it finds no ring, and
		// no raw queue to fill, before they are unmapped. The reader is
		// done: nothing takes from the raw queues either.
		cpus := c.cpus
		c.cpus = nil
		for q := range c.raw {
			c.raw[q].free()
		}
		c.mu.Unlock()
		c.fdMu.Lock()
		for _, ce := range gone {
			errs = append(errs, closeFDs(ce.fds))
		}
		c.fdMu.Unlock()
		for _, cr := range cpus {
			if tr := cr.task; tr != nil {
				if err := unix.Munmap(tr.mem); err != nil {
					errs = append(errs, fmt.Errorf("munmap cpu %d task ring: %w", cr.cpu, err))
				}
				if err := tr.fd.Close(); err != nil {
					errs = append(errs, fmt.Errorf("close cpu %d task ring: %w", cr.cpu, err))
				}
			}
			if err := unix.Munmap(cr.mem); err != nil {
				errs = append(errs, fmt.Errorf("munmap cpu %d ring: %w", cr.cpu, err))
			}
			if err := cr.anchor.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close cpu %d ring: %w", cr.cpu, err))
			}
		}
		errs = append(errs, c.poll.close())
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// run is the reader goroutine: wait for a ring (or the poll interval), take
// the time, drain all rings, and pass on what the watermark releases.
func (c *Classic) run() {
	defer close(c.done)
	var out []decode.Record
	var due uint64 // when the oldest record held back is due; 0: none held
	for {
		final := false
		select {
		case <-c.stop:
			final = true
		default:
			wait := idleInterval
			if due != 0 {
				wait = sleepUntil(due)
			}
			if err := c.poll.wait(wait); err != nil {
				c.errs.Add(1)
				time.Sleep(minPass)
			}
		}
		var acks []chan struct{}
		if c.poll.woken() {
			c.flushMu.Lock()
			acks, c.flushes = c.flushes, nil
			c.flushMu.Unlock()
		}
		// now is taken before draining: every sample stamped up to now -
		// latency is either in the rings now or counted Late later. A flush
		// releases everything.
		watermark := ^uint64(0)
		if !final && len(acks) == 0 {
			watermark = monotonicNow()
			watermark -= min(watermark, c.latency)
		}
		c.mu.Lock()
		c.drainLocked()
		for {
			var more bool
			out, more = c.releaseLocked(watermark, out[:0])
			due = c.dueLocked()
			c.mu.Unlock()
			if len(out) > 0 {
				// Counted first: whoever has seen a record in the sink
				// finds it counted in Stats too.
				c.records.Add(uint64(len(out)))
				c.sink(out)
			}
			if !more {
				break
			}
			c.mu.Lock()
		}
		for _, ack := range acks {
			close(ack)
		}
		if final {
			return
		}
	}
}

// dueLocked returns when the oldest record held back is due (its time plus
// the latency), 0 when none is held.
func (c *Classic) dueLocked() uint64 {
	oldest, ok := c.merge.Oldest()
	if !ok {
		return 0
	}
	return max(oldest+c.latency, 1)
}

// sleepUntil returns how long the reader sleeps while records are held
// until due: at least minPass and at most idleInterval.
func sleepUntil(due uint64) time.Duration {
	d := time.Duration(due - min(due, monotonicNow()))
	return min(max(d, minPass), idleInterval)
}

// monotonicNow returns CLOCK_MONOTONIC in ns, the clock of the samples:
// the runtime's nanotime, which reads it through the vDSO. A clock_gettime
// syscall (x/sys's ClockGettime) at every pass woke the runtime's sysmon
// from its deep sleep into polling every 20 µs (see poller).
func monotonicNow() uint64 { return uint64(nanotime()) }

// nanotime is the runtime's monotonic clock (CLOCK_MONOTONIC on Linux).
// The linker's linkname check (Go 1.23 on) allows this pull: the runtime
// marks nanotime with a push linkname and keeps its name and signature for
// such users (go.dev/issue/67401). Its suggested time.Since(start) gives
// only the time since start, not the absolute clock the samples carry.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// drainLocked moves every record in the rings into the merger, each CPU's
// process names first.
func (c *Classic) drainLocked() {
	tasks := len(c.tasks)
	for q, cr := range c.cpus {
		if cr.task != nil {
			c.drainTasks(cr.task)
		}
		r := cr.ring
		r.Begin()
		c.drainSamples(q, r)
		c.endRing(r, &cr.ringErrs)
	}
	// Each task ring is in time order; several CPUs' events interleave.
	if len(c.tasks) > tasks {
		slices.SortStableFunc(c.tasks, func(a, b taskEvent) int { return cmp.Compare(a.time, b.time) })
	}
}

// drainSamples moves the records of ring r, CPU q's, into the merge. The
// batch is copied at once into the CPU's raw queue (one or two copies,
// not one a sample) and its records are walked there: each sample queued
// stays where it landed, and only after a record that is not (a LOST
// record, a sample of an unknown event or a malformed one) do the next
// ones move down over it, so that the held samples stay contiguous.
func (c *Classic) drainSamples(q int, r *Ring) {
	n := r.left()
	if n == 0 {
		return
	}
	rq := &c.raw[q]
	buf := rq.room(n)
	r.readRest(buf)
	kept := 0
	for off := 0; off < len(buf); {
		typ, rec, ok := nextRecord(buf[off:])
		if !ok {
			// As Ring.Next: the rest of the batch is dropped, and the
			// next batch starts at the head the kernel writes from.
			c.errs.Add(1)
			break
		}
		off += len(rec)
		switch typ {
		case recordSample:
			if c.addSample(q, rec) {
				if at := off - len(rec); at != kept {
					copy(buf[kept:], rec)
				}
				kept += len(rec)
			}
		case recordLost:
			// Counted by the events (eventLost), also on kernels
			// without PERF_FORMAT_LOST; a record that does not parse
			// is an error.
			c.lostCount(rec)
		}
	}
	rq.commit(kept)
}

// lostCount returns the count of a LOST record (struct { header; u64 id;
// u64 lost; }), 0 for a malformed one (counted as an error).
func (c *Classic) lostCount(rec []byte) uint64 {
	if len(rec) < headerSize+16 {
		c.errs.Add(1)
		return 0
	}
	return binary.LittleEndian.Uint64(rec[headerSize+8:])
}

// endRing releases what was read of r and adds the ring's new errors,
// beyond the seen ones, to the error count.
func (c *Classic) endRing(r *Ring, seen *uint64) {
	r.End()
	if e := r.Errors(); e != *seen {
		c.errs.Add(e - *seen)
		*seen = e
	}
}

// addSample queues one sample record of ring q for the merge, counting
// what it cannot use, and tells whether it did: its bytes, where
// drainSamples copied them, are then held in q's raw queue (a held sample
// takes its size there instead of a decoded record's slot, and the
// merge's ring holds a small held).
func (c *Classic) addSample(q int, rec []byte) bool {
	var s sample
	if err := parseSample(rec, &s); err != nil {
		c.errs.Add(1)
		return false
	}
	id := rawEventID(s.raw)
	// Hits come in runs of one event: skip the map lookup for those.
	if c.lastEv == nil || c.lastEv.ev.ID != id {
		c.lastEv = c.events[id]
		if c.lastEv == nil {
			c.unknown.Add(1)
			return false
		}
	}
	c.lastEv.samples++
	*c.merge.Push(q, s.time) = held{ev: c.lastEv}
	return true
}

// held is a sample the merge holds back: its event (which Remove may
// forget before the sample is released). Its bytes are the next record of
// the raw queue of the merge queue it is in (TakeRun tells which), whose
// header has its size: a slot of the merge takes 16 bytes, where one that
// kept the queue and size took 24 (thousands held, a fresh page of them
// a page fault; DESIGN §4, the seventh pass).
type held struct {
	ev *classicEvent
}

// rawQueue holds the bytes of one CPU's held-back samples, in the order
// the merge takes them (a CPU's samples go out in ring order). It is a
// ring of bytes in which each batch copied in stays contiguous: one that
// does not fit before the end of the buffer starts again at its front
// (the bytes left at the end are skipped, up to wrap), so that a sample
// held is never moved (a buffer compacted by moving what is held moved
// as many bytes again as it took in; drainSamples moves a sample only
// over a record of its batch that is not held). It grows by doubling,
// copying what is held to the front of the new buffer.
type rawQueue struct {
	buf []byte
	// mem is the anonymous mapping that buf lies in (rawBuffer), nil
	// while buf is on the Go heap; free unmaps it.
	mem []byte
	// The bytes held are [r, w) while wrap is 0; once the writes started
	// again at the front, [r, wrap) then [0, w) (wrap >= r > 0 then).
	r, w, wrap int
	// front tells that the last room is at the buffer's front, not at w.
	front bool
}

// minRawQueue is the first buffer size of a rawQueue: about 900 samples.
const minRawQueue = 64 << 10

// room returns contiguous space for the next n bytes: after those held,
// else at the buffer's front when they fit before the first one held,
// else in a grown buffer. commit keeps what was written there.
func (b *rawQueue) room(n int) []byte {
	at := b.w
	b.front = false
	switch {
	case b.wrap == 0 && b.w+n <= len(b.buf):
	case b.wrap == 0 && n < b.r:
		// Room at the front, before the first sample held (strictly:
		// w == r means empty).
		at, b.front = 0, true
	case b.wrap > 0 && b.w+n < b.r:
	default:
		b.grow(n)
		at = b.w
	}
	return b.buf[at : at+n]
}

// commit holds the first k bytes of the last room, after those held
// before.
func (b *rawQueue) commit(k int) {
	if k == 0 {
		return
	}
	if b.front {
		b.wrap, b.w = b.w, 0
	}
	b.w += k
}

// grow makes room for n bytes more: a buffer of twice the size, at least
// what is held and n, with what is held at its front, in order.
func (b *rawQueue) grow(n int) {
	held := b.w - b.r
	if b.wrap > 0 {
		held = b.wrap - b.r + b.w
	}
	buf, mem := rawBuffer(max(2*len(b.buf), held+n, minRawQueue))
	k := 0
	if b.wrap > 0 {
		k = copy(buf, b.buf[b.r:b.wrap])
		k += copy(buf[k:], b.buf[:b.w])
	} else {
		k = copy(buf, b.buf[b.r:b.w])
	}
	// Nothing refers to the old buffer's bytes any more: a take's
	// bytes are valid only until the next room.
	b.free()
	b.buf, b.mem, b.r, b.w, b.wrap = buf, mem, 0, k, 0
}

// hugePage is the size of a transparent huge page on amd64.
const hugePage = 2 << 20

// rawBuffer returns a buffer of at least size bytes for a rawQueue, and
// the anonymous mapping it lies in, if any. A buffer larger than the
// first (minRawQueue: a CPU with few hits) is rounded up to whole huge
// pages, in an anonymous mapping of its own advised into transparent huge
// pages: a busy CPU's queue grows to megabytes (held back 50 ms at
// 600,000 samples/s, plus a ring's batch; at 100,000 a second to about a
// megabyte), and each first touch of a fresh 4 KiB page of the Go heap is
// a page fault, 11-20 µs each in the VM of DESIGN §4 (the seventh pass),
// where a 2 MiB page costs 130 µs. The Go heap gets no huge pages with
// THP in its "madvise" mode. A huge page of queue is half the CPU's
// default ring. The first buffer, or one whose mapping fails, is on the
// Go heap.
func rawBuffer(size int) (buf, mem []byte) {
	if size <= minRawQueue {
		return make([]byte, size), nil
	}
	size = (size + hugePage - 1) &^ (hugePage - 1)
	// A huge page lies at a 2 MiB-aligned address: map one more to
	// find the aligned range in (the rest is never touched, so it takes
	// no memory). Linux 6.7 on aligns such a mapping itself; older ones
	// do not.
	mem, err := unix.Mmap(-1, 0, size+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]byte, size), nil
	}
	buf = hugeAligned(mem, size)
	// Advice only: a kernel without THP, or with it off, gives 4 KiB
	// pages, as the Go heap would.
	unix.Madvise(buf, unix.MADV_HUGEPAGE)
	return buf, mem
}

// hugeAligned returns the first size bytes of mem that start at a huge
// page's address; mem holds size+hugePage bytes.
func hugeAligned(mem []byte, size int) []byte {
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(mem)))) & (hugePage - 1)
	return mem[off : off+size : off+size]
}

// free empties b, unmapping its buffer if it is a mapping. (x/sys's
// Munmap fails only for a slice it did not map: not one of rawBuffer's.)
func (b *rawQueue) free() {
	if b.mem != nil {
		unix.Munmap(b.mem)
	}
	*b = rawQueue{}
}

// take returns the next record held, its size read from its header,
// valid until the next room.
func (b *rawQueue) take() []byte {
	if b.wrap > 0 && b.r == b.wrap {
		b.r, b.wrap = 0, 0
	}
	n := int(binary.LittleEndian.Uint16(b.buf[b.r+6:]))
	rec := b.buf[b.r : b.r+n]
	b.r += n
	if b.wrap == 0 && b.r == b.w {
		b.r, b.w = 0, 0 // empty: start again at the front
	}
	return rec
}

// maxBatch bounds the records of one batch to the sink: the batch stays in
// the cache between its decoding and its formatting, and its storage
// stays the same size however many records a pass releases.
const maxBatch = 1024

// releaseLocked appends to out, in time order, the records of the samples
// that watermark releases, up to maxBatch (more: there may be others):
// each decoded from its bytes into out's slot (whose string storage is
// reused), named after its process and dropped when its event's Filter
// rejects it (counted, not a loss). The merge's runs are read where they
// are held (engine.Merger.TakeRun), not copied into a batch first. The
// task events up to each record's time are applied first, and after the
// last record those up to watermark: every record stamped before it has
// been released.
func (c *Classic) releaseLocked(watermark uint64, out []decode.Record) (_ []decode.Record, more bool) {
	n, taken := len(out), 0
	// Room for a whole batch once, not per run: the storage is reused.
	out = slices.Grow(out, maxBatch)
	var s sample
	for taken < maxBatch {
		run, q := c.merge.TakeRun(watermark, maxBatch-taken)
		if len(run) == 0 {
			break
		}
		raw := &c.raw[q]
		taken += len(run)
		out = out[:n+len(run)]
		for i := range run {
			h := &run[i].V
			r := &out[n]
			// Both checked when the sample was queued; only an argument
			// beyond the raw data fails here.
			if err := parseSample(raw.take(), &s); err != nil {
				c.errs.Add(1)
				continue
			}
			if ce := h.ev; ce.words != nil && len(s.raw) >= ce.wordsEnd {
				fillWords(ce.ev, ce.words, &s, r)
			} else if err := fillRecord(ce.ev, &s, r); err != nil {
				c.errs.Add(1)
				continue
			}
			if len(c.tasks) > 0 {
				c.applyTasks(r.Time)
			}
			// The cache's answer inline (a call per record cost a fifth
			// of the naming); commMiss only when it has none.
			comm, ok := c.comms.Cached(r.PID)
			if !ok {
				comm = c.commMiss(r.PID)
			}
			r.Comm = comm
			if f := &r.Event.Filter; f.Active() && !f.Match(r.PID, r.Comm) {
				c.filtered.Add(1)
				continue
			}
			n++
		}
	}
	more = taken == maxBatch
	if !more {
		c.applyTasks(watermark)
	}
	return out[:n], more
}

// applyTasks applies the task events up to time t.
func (c *Classic) applyTasks(t uint64) {
	k := 0
	for ; k < len(c.tasks) && c.tasks[k].time <= t; k++ {
		if e := &c.tasks[k]; e.exit {
			c.comms.Exit(e.pid)
		} else {
			c.comms.Set(e.pid, e.comm)
		}
	}
	if k > 0 {
		c.tasks = c.tasks[:copy(c.tasks, c.tasks[k:])]
	}
}

// commMiss returns the name of process pid, which the cache does not
// hold, at the time of the record being named. It is looked up in /proc,
// unless a task event of it is still to come: then /proc gives the name
// after that exec or rename, not the one the record's process had, and
// the record gets none.
func (c *Classic) commMiss(pid int32) string {
	for i := range c.tasks {
		if c.tasks[i].pid == pid {
			return ""
		}
	}
	return c.comms.Get(pid)
}

// drainTasks queues a task ring's COMM and EXIT records of main threads
// for releaseLocked (drainLocked puts them in time order): a process is
// named after its main thread (exec, or a rename of that thread; other
// threads name only themselves).
func (c *Classic) drainTasks(tr *taskRing) {
	r := tr.ring
	r.Begin()
	for {
		typ, misc, rec, ok := r.Next()
		if !ok {
			break
		}
		switch typ {
		case recordLost:
			if n := c.lostCount(rec); n > 0 {
				c.taskLost.Add(n)
				// An exec or exit went unseen: ask /proc again.
				c.comms.Reset()
			}
		case unix.PERF_RECORD_COMM, unix.PERF_RECORD_EXIT:
			ev := &c.sideEv
			if err := c.side.parse(typ, misc, rec, ev); err != nil {
				c.errs.Add(1)
				continue
			}
			if ev.PID != ev.TID {
				continue
			}
			c.tasks = append(c.tasks, taskEvent{time: ev.Time, pid: ev.PID, exit: ev.Kind == engine.SideExit, comm: ev.Comm})
		}
	}
	c.endRing(r, &tr.ringErrs)
}

// ProcComm returns the name of process pid from /proc/PID/comm, "" when
// the process is gone or its name unreadable.
func ProcComm(pid int32) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

// eventLost returns the samples that ce's events could not write because
// their ring was full, as c counts them (LostCounting). Called holding mu,
// with the events disabled and the rings drained since (Remove, Close): in
// LostByHits the count is then exact.
func (c *Classic) eventLost(ce *classicEvent) uint64 {
	return ce.lossOf(c.lostBy, c.eventCount(ce, c.lostBy))
}

// eventCount reads the count of ce's events that tells their losses the
// way by says: their lost samples (read_format PERF_FORMAT_LOST: u64 value,
// u64 lost) or their hits (read_format 0: u64 value; see lossOf).
func (c *Classic) eventCount(ce *classicEvent, by LostCounting) uint64 {
	if by == LostByHits {
		return readSum(ce.fds, 8, 0, &c.errs)
	}
	return readSum(ce.fds, 16, 8, &c.errs)
}

// lossOf returns ce's lost samples from count, read by eventCount. Called
// holding mu. In LostByHits count is the hits, read before the rings were
// drained of what they held: every sample written by then is among those
// read, so this is at most what was lost then, and exact when no hit came
// between the read and the drain (samples beyond the hits came after it).
func (ce *classicEvent) lossOf(by LostCounting, count uint64) uint64 {
	if by == LostByHits {
		return count - min(count, ce.samples)
	}
	return count
}

// readSum reads the read_format record (size bytes) of each event of fds
// and sums its u64 at off (an inherited event's children count in it). A
// failed read counts in errs.
func readSum(fds []int, size, off int, errs *atomic.Uint64) uint64 {
	var n uint64
	var buf [16]byte
	for _, fd := range fds {
		if k, err := unix.Read(fd, buf[:size]); err != nil || k != size {
			errs.Add(1)
			continue
		}
		n += binary.LittleEndian.Uint64(buf[off:])
	}
	return n
}

// disableFDs stops the events of fds.
func disableFDs(fds []int) error {
	var errs []error
	for _, fd := range fds {
		if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_DISABLE, 0); err != nil {
			errs = append(errs, fmt.Errorf("disable perf event: %w", err))
		}
	}
	return errors.Join(errs...)
}

// closeFDs closes fds.
func closeFDs(fds []int) error {
	var errs []error
	for _, fd := range fds {
		if err := unix.Close(fd); err != nil {
			errs = append(errs, fmt.Errorf("close perf event: %w", err))
		}
	}
	return errors.Join(errs...)
}
