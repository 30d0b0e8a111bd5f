// Package enginetest provides Replay, an engine.TraceSource that plays a
// script of PT trace instead of reading the kernel. It is for tests of ptw
// mode (the record engine, the session, the mount) on machines without
// Intel PT; nothing in ptfs itself uses it.
package enginetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"ptfs/engine"
	"ptfs/perfdata"
)

// Sentinel errors of Replay.
var (
	// ErrRunning reports Start of a replay already started.
	ErrRunning = errors.New("replay already started")
	// ErrNotRunning reports Flush, Sync or Stop of a replay not started.
	ErrNotRunning = errors.New("replay not started")
	// ErrBadStep reports a step Queue cannot play.
	ErrBadStep = errors.New("bad step")
)

// StepKind selects the TraceSink call a Step makes.
type StepKind uint8

// Step kinds, one per TraceSink method that carries data.
const (
	StepTimeConv StepKind = iota + 1
	StepTrace
	StepLoss
	StepSide
)

// Step is one call of the sink for one CPU. Build it with TimeConv, Trace,
// Loss or Side.
type Step struct {
	Kind     StepKind
	TimeConv perfdata.TimeConv // StepTimeConv
	Data     []byte            // StepTrace
	Loss     engine.LossKind   // StepLoss
	N        uint64            // StepLoss
	Side     engine.SideEvent  // StepSide
}

// TimeConv returns a step that passes tc.
func TimeConv(tc perfdata.TimeConv) Step { return Step{Kind: StepTimeConv, TimeConv: tc} }

// Trace returns a step that passes data as PT bytes.
func Trace(data []byte) Step { return Step{Kind: StepTrace, Data: data} }

// Loss returns a step that reports a loss.
func Loss(why engine.LossKind, n uint64) Step { return Step{Kind: StepLoss, Loss: why, N: n} }

// Side returns a step that passes a side-band event.
func Side(ev engine.SideEvent) Step { return Step{Kind: StepSide, Side: ev} }

// Batch is what one pass of a reader over the CPUs finds: per CPU, its
// steps in order. A batch is played CPU by CPU in ascending order and
// followed by Round(false).
type Batch map[int][]Step

// Replay is a TraceSource that plays queued batches. Start launches a
// goroutine that plays what is queued and what is queued later; Flush,
// Sync and Stop play everything queued first. It honours the TraceSource
// contract: one goroutine calls the sink, data passed to Trace and Side is
// valid only during the call (Replay overwrites it afterwards, so that a
// sink keeping it shows up in tests).
type Replay struct {
	mu       sync.Mutex
	queue    []Batch
	running  bool
	startErr error
	starts   int
	stops    int
	flushes  int
	kick     chan struct{}
	req      chan request
	done     chan struct{}
	// configs are the Reconfigure calls, oldest first.
	configs []Config
	cpus    map[int]bool // CPUs that played a step

	// Used only by the playing goroutine.
	buf  []byte
	side engine.SideEvent
}

// request asks the playing goroutine to play everything queued, then call
// Round(flush), then exit if stop.
type request struct {
	flush, stop bool
	ack         chan struct{}
}

// NewReplay returns a replay with batches queued.
func NewReplay(batches ...Batch) (*Replay, error) {
	r := &Replay{}
	if err := r.Queue(batches...); err != nil {
		return nil, err
	}
	return r, nil
}

// Queue appends batches to play; a running replay plays them soon.
func (r *Replay) Queue(batches ...Batch) error {
	for _, b := range batches {
		for cpu, steps := range b {
			if cpu < 0 {
				return fmt.Errorf("%w: cpu %d", ErrBadStep, cpu)
			}
			for i, s := range steps {
				if s.Kind < StepTimeConv || s.Kind > StepSide {
					return fmt.Errorf("%w: cpu %d step %d has kind %d", ErrBadStep, cpu, i, s.Kind)
				}
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queue = append(r.queue, batches...)
	if r.running {
		select {
		case r.kick <- struct{}{}:
		default: // a kick is pending already
		}
	}
	return nil
}

// FailNextStart makes the next Start fail with err, to test callers'
// error paths.
func (r *Replay) FailNextStart(err error) {
	r.mu.Lock()
	r.startErr = err
	r.mu.Unlock()
}

// Start implements engine.TraceSource.
func (r *Replay) Start(sink engine.TraceSink) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		return ErrRunning
	}
	if err := r.startErr; err != nil {
		r.startErr = nil
		return err
	}
	r.running = true
	r.starts++
	r.kick = make(chan struct{}, 1)
	r.req = make(chan request)
	r.done = make(chan struct{})
	r.kick <- struct{}{}
	go r.run(sink, r.kick, r.req, r.done)
	return nil
}

// Flush implements engine.TraceSource: it plays everything queued, then
// Round(true).
func (r *Replay) Flush() error {
	r.mu.Lock()
	if !r.running {
		r.mu.Unlock()
		return ErrNotRunning
	}
	r.flushes++
	req, done := r.req, r.done
	r.mu.Unlock()
	return ask(req, done, true)
}

// ask passes a request to the playing goroutine and waits until it has
// been served, or fails when a concurrent Stop ended the goroutine first.
func ask(req chan<- request, done <-chan struct{}, flush bool) error {
	ack := make(chan struct{})
	select {
	case req <- request{flush: flush, ack: ack}:
		<-ack
		return nil
	case <-done:
		return ErrNotRunning
	}
}

// Sync plays everything queued, then Round(false), like one pass of a
// reader, and returns after it.
func (r *Replay) Sync() error {
	r.mu.Lock()
	if !r.running {
		r.mu.Unlock()
		return ErrNotRunning
	}
	req, done := r.req, r.done
	r.mu.Unlock()
	return ask(req, done, false)
}

// Stop implements engine.TraceSource: it plays everything queued, then
// Round(true), and ends the goroutine. Start may follow.
func (r *Replay) Stop() error {
	r.mu.Lock()
	if !r.running {
		r.mu.Unlock()
		return ErrNotRunning
	}
	r.running = false
	r.stops++
	req, done := r.req, r.done
	r.mu.Unlock()
	req <- request{flush: true, stop: true, ack: make(chan struct{})}
	<-done
	return nil
}

// Config is one configuration of the simulated PT events (Reconfigure).
type Config struct {
	Branch bool
	Filter string
	// Running: the replay was started, so the kernel's events were
	// reopened (a flush loss per CPU, as perfio.PT reports).
	Running bool
}

// Reconfigure is perfio.PT's: branch tracing on or off, an address filter.
// It is recorded (Configs); on a running replay every CPU that played a
// step reports a LossFlush and a flush round follows, as the kernel's
// source reports reopening its events.
func (r *Replay) Reconfigure(branch bool, filter string) error {
	r.mu.Lock()
	c := Config{Branch: branch, Filter: filter, Running: r.running}
	r.configs = append(r.configs, c)
	var b Batch
	if c.Running {
		b = Batch{}
		for cpu := range r.cpus {
			b[cpu] = []Step{Loss(engine.LossFlush, 1)}
		}
	}
	r.mu.Unlock()
	if !c.Running {
		return nil
	}
	if err := r.Queue(b); err != nil {
		return err
	}
	return r.Flush()
}

// Configs returns the Reconfigure calls so far, oldest first.
func (r *Replay) Configs() []Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.configs)
}

// Counts returns how often Start (successfully), Stop and Flush were
// called.
func (r *Replay) Counts() (starts, stops, flushes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts, r.stops, r.flushes
}

// Running tells whether the replay was started and not stopped.
func (r *Replay) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

// run is the playing goroutine.
func (r *Replay) run(sink engine.TraceSink, kick <-chan struct{}, req <-chan request, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case <-kick:
			r.playQueued(sink)
		case q := <-req:
			r.playQueued(sink)
			sink.Round(q.flush)
			close(q.ack)
			if q.stop {
				return
			}
		}
	}
}

// playQueued plays the queued batches, each followed by Round(false).
func (r *Replay) playQueued(sink engine.TraceSink) {
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			r.mu.Unlock()
			return
		}
		b := r.queue[0]
		r.queue[0] = nil
		r.queue = r.queue[1:]
		r.mu.Unlock()
		r.play(sink, b)
		sink.Round(false)
	}
}

// play plays one batch.
func (r *Replay) play(sink engine.TraceSink, b Batch) {
	cpus := make([]int, 0, len(b))
	for cpu := range b {
		cpus = append(cpus, cpu)
	}
	slices.Sort(cpus)
	r.mu.Lock()
	if r.cpus == nil {
		r.cpus = map[int]bool{}
	}
	for _, cpu := range cpus {
		r.cpus[cpu] = true
	}
	r.mu.Unlock()
	for _, cpu := range cpus {
		for i := range b[cpu] {
			s := &b[cpu][i]
			switch s.Kind {
			case StepTimeConv:
				sink.TimeConv(cpu, s.TimeConv)
			case StepTrace:
				r.buf = append(r.buf[:0], s.Data...)
				sink.Trace(cpu, r.buf)
				for j := range r.buf {
					r.buf[j] = 0xff
				}
			case StepLoss:
				sink.Loss(cpu, s.Loss, s.N)
			case StepSide:
				r.side = s.Side
				sink.Side(cpu, &r.side)
				r.side = engine.SideEvent{TID: -2, PID: -2}
			}
		}
	}
}
