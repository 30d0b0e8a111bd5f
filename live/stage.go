// Package live is the decode stage of the live `branches` files (DESIGN §4):
// it takes the raw Intel PT trace of a mount as an engine.TraceSink, decodes
// each CPU's control flow (flow.Decoder) over the memory of the process that
// ran (images.Processes, built from the side band and, for processes that
// were running before tracing began, /proc/PID/maps), formats the lines with
// flow.Branches, and hands each attached target the lines of its own code,
// gap lines and its probe records, into its bounded `branches` stream.
package live

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"ptfs/decode"
	"ptfs/engine"
	"ptfs/images"
	"ptfs/objfile"
	"ptfs/perfdata"
	"ptfs/perfflow"
	"ptfs/stream"
)

// Sentinel errors of the stage.
var (
	// ErrAttached reports a second Attach of a target name.
	ErrAttached = errors.New("target attached already")
	// ErrNotAttached reports a Detach of a target not attached.
	ErrNotAttached = errors.New("target not attached")
)

// Options configure a Stage. Zero values select defaults.
type Options struct {
	// Path maps a file name of the side band to the path it is read
	// from; nil reads the name itself.
	Path func(name string) string
	// VDSO is the code of "[vdso]" mappings: ptfs's own (OwnVDSO), the
	// kernel maps the same image into every process. nil: unknown code.
	VDSO images.Source
	// Maps reads the mappings of a process that the side band has not
	// shown (it ran before tracing began); nil reads /proc/PID/maps.
	Maps func(pid int32) ([]images.MapsEntry, error)
	// Clock configures the time estimate from the trace's timing packets
	// (with the TimeConv of a CPU, lines carry time=); nil: TSC packets
	// alone.
	Clock *decode.ClockConfig
}

// Stats are the stage's counters (DESIGN §5, the branches lines of status).
type Stats struct {
	Bytes uint64 // trace bytes decoded or held
	// Losses counts the trace losses of the source by cause; each that
	// breaks the trace gave a gap line.
	Losses [engine.NumLossKinds]uint64
	// DecodeErrors counts the decoder's errors (each a gap: error line).
	DecodeErrors uint64
	// UnknownCode counts mappings whose code is not known (a file that
	// cannot be read or matched, a vDSO without a dump, a process whose
	// maps could not be read).
	UnknownCode uint64
	// Replaced counts mappings of files replaced on disk since they were
	// mapped: unknown code (also in UnknownCode).
	Replaced uint64
	// Outside counts lines of code that no attached target owns, dropped.
	Outside uint64
	// Branches, Lines: branch lines and lines of any kind handed to the
	// targets.
	Branches, Lines uint64
	// Manual counts manual ptwrites (given to every attached target).
	Manual uint64
}

// Stage is the decode stage: an engine.TraceSink whose lines go to the
// targets attached. The sink methods come from one goroutine at a time (the
// source's reader); Attach, Detach, SetEvents and Stats from any.
type Stage struct {
	opts Options

	mu      sync.Mutex
	procs   *images.Processes
	cpus    []*cpuState // by CPU number; nil until named
	targets []*Target
	out     []byte // the formatter's output being routed (cpuState.Write)
	events  map[uint16]*decode.Event
	exits   []int32 // processes that exited, forgotten after the next decode
	st      Stats
	// mapsErrs counts processes whose /proc/PID/maps could not be read.
	mapsErrs uint64
	// read is the file each name was read as (mmap).
	read map[string]objfile.FileID
}

// maxCPUs bounds the CPU numbers the stage accepts (the kernel's NR_CPUS).
const maxCPUs = 8192

// New returns a stage with nothing attached.
func New(o Options) *Stage {
	if o.Maps == nil {
		o.Maps = procMaps
	}
	if o.Clock == nil {
		o.Clock = &decode.ClockConfig{}
	}
	return &Stage{opts: o, procs: images.NewProcesses(images.Options{VDSO: o.VDSO, Path: o.Path}),
		read: map[string]objfile.FileID{}}
}

// Close releases the files the images read.
func (s *Stage) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs.Close()
}

// Target is a target attached to the stage: its own code's lines, the gap
// lines and its probe records go to its stream.
type Target struct {
	name string
	// owns are the " (DSO)" texts of the target's file as lines name it
	// (images names a mapping by the side band's file name).
	owns  [][]byte
	event []byte // "event=ptfs_NAME/": its probe records
	out   *stream.Stream
	seq   uint64 // its records in this stream
	buf   []byte
	// runStart, runEnd: the lines of the formatter's output that go to
	// out next (take, flush).
	runStart, runEnd int
}

// Attach makes the lines of code in a file named by one of paths (as the
// side band names it: the kernel's path of the file), the records of event
// group "ptfs_"+name and every gap line go to out.
func (s *Stage) Attach(name string, paths []string, out *stream.Stream) error {
	t := &Target{name: name, out: out, event: []byte("event=ptfs_" + name + "/")}
	for _, p := range paths {
		t.owns = append(t.owns, []byte("("+p+")"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.targets {
		if o.name == name {
			return fmt.Errorf("%w: %s", ErrAttached, name)
		}
	}
	s.targets = append(s.targets, t)
	return nil
}

// Detach stops giving lines to target name. Trace already decoded went to
// its stream; trace held by the decoder goes to the targets attached
// when it is decoded (none: it is dropped, counted as outside).
func (s *Stage) Detach(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, t := range s.targets {
		if t.name == name {
			s.targets = append(s.targets[:i], s.targets[i+1:]...)
			if len(s.targets) == 0 {
				// Nobody reads what is held; the next reader starts
				// at the trace that comes then.
				for _, c := range s.cpus {
					if c != nil {
						c.end()
					}
				}
			}
			return nil
		}
	}
	return fmt.Errorf("%w: %s", ErrNotAttached, name)
}

// SetEvents gives the probe events whose records ptw trace carries: their
// records are printed among the branches, in execution order.
func (s *Stage) SetEvents(events map[uint16]*decode.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = events
	for _, c := range s.cpus {
		if c != nil && c.run != nil {
			c.run.Branches().SetEvents(events)
		}
	}
}

// Stats returns the counters.
func (s *Stage) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.UnknownCode = s.procs.Unknown() + s.mapsErrs + s.st.Replaced
	for _, c := range s.cpus {
		if c != nil {
			st.DecodeErrors += c.errors()
		}
	}
	return st
}

// cpuLocked returns the state of cpu, made on first use, or nil for a CPU
// number out of range.
func (s *Stage) cpuLocked(cpu int) *cpuState {
	if cpu >= 0 && cpu < len(s.cpus) && s.cpus[cpu] != nil {
		return s.cpus[cpu]
	}
	if cpu < 0 || cpu >= maxCPUs {
		return nil
	}
	for len(s.cpus) <= cpu {
		s.cpus = append(s.cpus, nil)
	}
	c := newCPU(s, int32(cpu))
	s.cpus[cpu] = c
	return c
}

// TimeConv implements engine.TraceSink: from the CPU's next run, its side
// band applies as the trace's time passes it, and lines carry time=.
func (s *Stage) TimeConv(cpu int, tc perfdata.TimeConv) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.cpuLocked(cpu); c != nil {
		c.tc = tc
		c.conv = c.tc.NS
	}
}

// Trace implements engine.TraceSink. With no target attached the trace is
// not kept: nobody reads its lines.
func (s *Stage) Trace(cpu int, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.targets) == 0 {
		return
	}
	if c := s.cpuLocked(cpu); c != nil {
		s.st.Bytes += uint64(len(data))
		c.write(data)
	}
}

// lossCauses are the errors of the gap lines of the losses that break the
// trace, as perfflow names them.
var lossCauses = [engine.NumLossKinds]error{
	engine.LossTruncated: perfflow.ErrAuxTruncated,
	engine.LossPartial:   perfflow.ErrAuxPartial,
	engine.LossCollision: perfflow.ErrAuxCollision,
	engine.LossHole:      perfflow.ErrAuxHole,
}

// Loss implements engine.TraceSink: a loss that breaks the trace is a hole
// (a `gap: error ... err=trace lost: CAUSE` line for every target, decoding
// resumes at the next PSB); a flush ends the run (the next trace starts
// with a PSB+); lost side band makes the thread unknown until the next
// switch (a `gap: error ... err=side band lost: N records` line).
func (s *Stage) Loss(cpu int, why engine.LossKind, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if why >= engine.NumLossKinds {
		why = engine.LossHole
	}
	if why == engine.LossSideBand {
		s.st.Losses[why] += n
	} else {
		s.st.Losses[why]++
	}
	c := s.cpuLocked(cpu)
	switch {
	case c == nil:
	case why == engine.LossSideBand:
		c.tid = -1
		c.side(perfdata.Event{Kind: perfdata.Lost, Lost: n, PID: c.pid, TID: -1, Time: c.last, HasTime: true})
	case why == engine.LossFlush:
		c.end()
	default:
		c.gap(lossCauses[why])
	}
}

// Side implements engine.TraceSink: each record goes into the CPU's side
// band, applied when the trace's time passes it (see cpuState). A process
// that the side band names for the first time is read from /proc/PID/maps
// now, while it runs.
func (s *Stage) Side(cpu int, ev *engine.SideEvent) {
	if ev == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cpuLocked(cpu)
	if c == nil {
		return
	}
	e := perfdata.Event{PID: ev.PID, TID: ev.TID, Time: ev.Time, HasTime: true, CPU: int32(cpu)}
	switch ev.Kind {
	case engine.SideMmap2:
		s.space(ev.PID)
		e.Kind, e.Addr, e.Len, e.PgOff, e.Name = perfdata.Mmap, ev.Addr, ev.Len, ev.PgOff, s.mapName(ev)
	case engine.SideComm:
		if !ev.Exec {
			return
		}
		e.Kind, e.Name, e.Exec = perfdata.Comm, ev.Comm, true
	case engine.SideExit:
		if ev.PID == ev.TID {
			s.exits = append(s.exits, ev.PID)
		}
		return
	case engine.SideITraceStart, engine.SideSwitchIn, engine.SideSwitchOut:
		e.Kind = perfdata.Switch
		if ev.Kind == engine.SideITraceStart {
			e.Kind = perfdata.ItraceStart
		}
		if ev.Kind == engine.SideSwitchOut {
			e.Out, e.PID, e.TID = true, ev.NextPID, ev.NextTID
		}
		s.space(e.PID)
		c.pid, c.tid = e.PID, e.TID
	default:
		return
	}
	c.side(e)
}

// mapName returns the name under which ev's file is mapped. A file that
// the record identifies (device and inode) is read only if the path names
// that file now: one replaced on disk since the process mapped it is
// mapped as unknown code ("[replaced] PATH", counted), never decoded from
// another file's bytes; a path that names another file than the one read
// for an earlier mapping is read again. (A file that cannot be read is
// mapped as unknown code too, Processes.Unknown; its lines say [unknown].)
func (s *Stage) mapName(ev *engine.SideEvent) string {
	name := ev.Filename
	if ev.Ino == 0 || !strings.HasPrefix(name, "/") {
		return name
	}
	path := name
	if s.opts.Path != nil {
		path = s.opts.Path(name)
	}
	want := objfile.FileID{Dev: unix.Mkdev(ev.Maj, ev.Min), Ino: ev.Ino}
	now, err := objfile.StatID(path)
	if err != nil || !now.SameFile(want) {
		s.st.Replaced++
		return "[replaced] " + name
	}
	if read, ok := s.read[name]; ok && !read.SameFile(want) {
		s.procs.Reread(name)
	}
	s.read[name] = want
	return name
}

// Round implements engine.TraceSink: with flush (the source stopped or
// flushed its events) every CPU's run is decoded to its end; processes
// that exited and run nowhere are forgotten.
func (s *Stage) Round(flush bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.cpus {
		if c != nil && flush {
			c.end()
		}
	}
	for _, pid := range s.exits {
		if !s.runningLocked(pid) {
			s.procs.Exit(pid)
		}
	}
	s.exits = s.exits[:0]
}

// runningLocked tells whether pid is a CPU's current process or may still
// be decoded (a CPU's run is under way).
func (s *Stage) runningLocked(pid int32) bool {
	for _, c := range s.cpus {
		if c != nil && (c.pid == pid || c.run != nil) {
			return true
		}
	}
	return false
}

// space makes the memory of pid from /proc/PID/maps when the side band has
// not shown the process (it ran before tracing began).
func (s *Stage) space(pid int32) {
	if _, ok := s.procs.Space(pid); ok || pid < 0 {
		return
	}
	s.procs.Exec(pid)
	entries, err := s.opts.Maps(pid)
	if err != nil {
		// Its code stays unknown: counted, and its lines say so.
		s.mapsErrs++
		return
	}
	// Files that cannot be read are mapped as unknown code and counted by
	// Processes.Unknown.
	_ = s.procs.MapMaps(pid, entries)
}
