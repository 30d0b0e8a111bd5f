// Package session is the tracing engine behind a mount: its targets, their
// probes in tracefs, the record source, and the text streams the mount
// serves. It does not know the mount: its Session and Target have the
// methods of fs.Tracer and fs.Target with their own types in the
// signatures, and package bind makes them an fs.Tracer (DESIGN §4).
package session

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"ptfs/decode"
	"ptfs/engine"
	"ptfs/images"
	"ptfs/live"
	"ptfs/perfio"
	"ptfs/probes"
	"ptfs/stream"
	"ptfs/tracefs"
)

// Options configure a Session. Zero values select defaults.
type Options struct {
	// Mode is the wanted mode; ModeAuto picks the best the machine has.
	Mode Mode
	// Stream bounds each records file (zero values: the stream package's
	// defaults).
	Stream stream.Options
	// RingPages is the per-CPU ring size of the classic record source, in
	// pages.
	RingPages int
	// PT configures the Intel PT capture of ptw mode.
	PT perfio.PTOptions
	// Latency is how long records are held back so that records of other
	// CPUs stamped earlier can go out before them (0: the source's
	// default).
	Latency time.Duration

	// Tracefs is the tracefs to install probes in; nil finds (and if need
	// be mounts) the system's. Tests pass a simulated kernel.
	Tracefs *tracefs.Tracefs
	// Sysfs is the root of sysfs for the capability checks; "" is /sys.
	Sysfs string
	// Trace is the PT trace source of ptw mode; nil opens Intel PT through
	// perf_event_open. Tests pass a replay.
	Trace engine.TraceSource
	// BranchTrace is the source of branch tracing in classic mode; nil
	// opens branch-only Intel PT events at the first open of a
	// `branches`. Tests pass a replay.
	BranchTrace engine.TraceSource
	// Branches configures the decode stage of the branches files (its
	// VDSO nil: ptfs's own vDSO).
	Branches live.Options
	// ClockOffset measures perf time minus CLOCK_MONOTONIC, to place
	// classic records among the branch lines; nil: perfio.PerfClockOffset.
	// Tests of a simulated kernel pass their own.
	ClockOffset func() (int64, error)
}

// Default bounds of a records file (stream.Options).
const (
	DefaultStreamLimit     = stream.DefaultLimit
	DefaultStreamHardLimit = stream.DefaultHardLimit
)

// Sentinel errors of the session.
var (
	// ErrBadName reports a target or probe name that cannot be used (EINVAL).
	ErrBadName = fmt.Errorf("bad name: %w", syscall.EINVAL)
	// ErrTargetExists reports a second target of the same name (EEXIST).
	ErrTargetExists = fmt.Errorf("target exists: %w", syscall.EEXIST)
	// ErrNoTarget reports an unknown target (ENOENT).
	ErrNoTarget = fmt.Errorf("no such target: %w", syscall.ENOENT)
	// ErrNoProbe reports an unknown probe (ENOENT).
	ErrNoProbe = fmt.Errorf("no such probe: %w", syscall.ENOENT)
	// ErrClosed reports a call after Close (ESHUTDOWN).
	ErrClosed = fmt.Errorf("session closed: %w", syscall.ESHUTDOWN)
)

// Session is the engine of one mount.
type Session struct {
	opts  Options
	pid   int
	tfs   *tracefs.Tracefs
	caps  Caps
	mode  Mode
	why   string
	claim *tracefs.Claim
	src   source
	br    *branches
	vdso  *images.ELF // ptfs's own vDSO, for branches; nil if none
	watch *watcher    // nil when inotify is unavailable

	// routes maps an event id to its probe (and, while the probe is
	// replaced at its site, the swap); copied on write so that the record
	// path reads it without a lock.
	routes atomic.Pointer[map[uint16]*route]
	// dups counts the second records of hits that both events of a probe
	// replaced at its site recorded (see swap); only deliver writes it.
	dups atomic.Uint64
	// unsettled counts the replacements at a site whose old event went
	// without waiting for the hits in its handlers (see Target.add):
	// some of those hits may be recorded by neither event.
	unsettled atomic.Uint64

	mu      sync.Mutex // guards targets, groups, leftovers, closed and routes writes
	targets map[string]*Target
	groups  map[string]bool
	// leftovers are tracefs events that could not be removed when their
	// probe went; Close tries them again.
	leftovers []leftover
	// refused says why the last targets were refused, newest last.
	refused []string
	closed  bool
}

// keepRefused is how many refused targets the root status lists.
const keepRefused = 4

// leftover is a tracefs event whose removal failed.
type leftover struct{ group, event string }

// leave records a tracefs event whose removal failed, for Close.
func (s *Session) leave(group, event string) {
	s.mu.Lock()
	s.leftovers = append(s.leftovers, leftover{group, event})
	s.mu.Unlock()
}

// Detect reports the machine's capabilities, mounting tracefs if needed.
func Detect() Caps {
	tfs, err := tracefs.FindTracefs()
	return defaultRoots.detect(tfs, err)
}

// New starts a session: it finds tracefs, picks the mode, claims this
// process's probe groups, removes the probes that dead mounts left behind
// and starts the record source of the mode.
func New(opts Options) (*Session, error) {
	if opts.Mode == "" {
		opts.Mode = ModeAuto
	}
	r := defaultRoots
	if opts.Sysfs != "" {
		r.sysfs = opts.Sysfs
	}
	tfs, terr := opts.Tracefs, error(nil)
	if tfs == nil {
		tfs, terr = tracefs.FindTracefs()
	}
	caps := r.detect(tfs, terr)
	if terr != nil {
		return nil, fmt.Errorf("tracefs: %w", terr)
	}
	mode, why, err := caps.Choose(opts.Mode)
	if err != nil {
		return nil, err
	}
	s := &Session{
		opts:    opts,
		pid:     os.Getpid(),
		tfs:     tfs,
		caps:    caps,
		mode:    mode,
		why:     why,
		targets: map[string]*Target{},
		groups:  map[string]bool{},
	}
	s.routes.Store(&map[uint16]*route{})
	if s.claim, err = tracefs.ClaimProbes(); err != nil {
		return nil, err
	}
	removed, err := tfs.RemoveStale(s.pid)
	for _, r := range removed {
		logrus.WithField("probe", r).Info("ptfs: removed a probe left by a dead mount")
	}
	if err != nil {
		logrus.WithError(err).Warn("ptfs: removing stale probes")
	}
	stage := s.newStage(r)
	s.br = newBranches(s, r, stage)
	if s.src, err = s.newSource(r, stage); err != nil {
		s.claim.Close()
		err = errors.Join(fmt.Errorf("record source: %w", err), stage.Close())
		if s.vdso != nil {
			err = errors.Join(err, s.vdso.Close())
		}
		return nil, err
	}
	if s.watch, err = newWatcher(s.targetList, settle); err != nil {
		logrus.WithError(err).Warn("ptfs: target paths are checked on probe writes only")
	}
	logrus.WithFields(logrus.Fields{"mode": mode, "why": why, "tracefs": tfs.Dir}).Debug("ptfs: session started")
	return s, nil
}

// newStage makes the decode stage of the branches files: ptfs's own vDSO
// stands for the traced processes' (unless the options give one), and the
// trace's timing is the PMU's.
func (s *Session) newStage(r roots) *live.Stage {
	o := s.opts.Branches
	if o.VDSO == nil {
		vdso, err := live.OwnVDSO()
		if err != nil {
			logrus.WithError(err).Debug("ptfs: branches in the vDSO are unknown code")
		} else {
			o.VDSO, s.vdso = vdso, vdso
		}
	}
	if o.Clock == nil {
		if t, ok := perfio.PTTiming(r.intelPT()); ok {
			o.Clock = &decode.ClockConfig{MTCFreq: t.MTCPeriod, CPUID15EAX: t.ARTDen, CPUID15EBX: t.ARTNum}
		}
	}
	return live.New(o)
}

// newSource makes the record source of the session's mode. In ptw mode
// nothing is traced until the first probe is added (or `branches` is
// opened); its trace goes to stage too.
func (s *Session) newSource(r roots, stage *live.Stage) (source, error) {
	if s.mode != ModePTW {
		c, err := perfio.NewClassic(perfio.ClassicOptions{RingPages: s.opts.RingPages, Latency: s.opts.Latency}, s.deliver)
		if err != nil {
			return nil, err
		}
		return classicSource{c}, nil
	}
	trace := s.opts.Trace
	var timing decode.Timing
	var pt *perfio.PT
	var comm func(int32) string
	if trace == nil {
		var err error
		if pt, err = perfio.NewPT(r.intelPT(), s.opts.PT); err != nil {
			return nil, err
		}
		trace, timing, comm = pt, pt.Timing(), perfio.ProcComm
	}
	s.br.conf, _ = trace.(reconfigurer)
	s.br.pt = pt
	w, err := engine.NewPTW(engine.Tee(trace, stage), engine.PTWOptions{Latency: s.opts.Latency, Timing: timing, Comm: comm}, s.deliver)
	if err != nil {
		return nil, err
	}
	return ptwSource{w, pt}, nil
}

// Mode returns the mode the session runs in.
func (s *Session) Mode() Mode { return s.mode }

// deliver is the record source's sink: it routes each record of a batch
// to its target. A run of records of one target is written under one
// take of its lock (Target.emit) and goes into its stream at once.
func (s *Session) deliver(rs []decode.Record) {
	routes := *s.routes.Load()
	var (
		rt     *route
		lastID = -1 // hits come in runs of one event: one lookup a run
		t      *Target
	)
	for i := 0; i < len(rs); i++ {
		r := &rs[i]
		if int(r.Event.ID) != lastID {
			rt, lastID = routes[r.Event.ID], int(r.Event.ID)
		}
		if rt == nil {
			// Not ours: Remove delivers every record of an event before
			// the route goes, and the source counts samples of unknown
			// events.
			continue
		}
		if rt.swap != nil && rt.swap.drop(r) {
			s.dups.Add(1)
			continue
		}
		if to := rt.p.target; to != t {
			if t != nil {
				t.endEmit()
			}
			t = to
			t.beginEmit()
		}
		if rt.ev != nil {
			named := *r
			named.Event = rt.ev
			t.emit(&named)
			continue
		}
		if rt.swap != nil {
			t.emit(r)
			continue
		}
		// A run of the event's records, each neither renamed nor
		// checked against a replacement: formatted at once.
		j := i + 1
		for j < len(rs) && rs[j].Event == r.Event {
			j++
		}
		t.emitRun(rs[i:j])
		i = j - 1
	}
	if t != nil {
		t.endEmit()
	}
}

// setRoute adds (p != nil) or removes the route of id.
func (s *Session) setRoute(id uint16, p *probe) {
	s.updateRoutes(func(m map[uint16]*route) {
		if p != nil {
			m[id] = &route{p: p}
		} else {
			delete(m, id)
		}
	})
}

// Status returns the root status file.
func (s *Session) Status() []byte {
	var b []byte
	b = fmt.Appendf(b, "mode: %s\nreason: %s\n", s.mode, s.why)
	b = s.caps.AppendText(b)
	s.mu.Lock()
	var sum decode.Counters
	n := len(s.targets)
	for _, t := range s.targets {
		c := t.counters()
		sum.Add(&c)
	}
	refused := slices.Clone(s.refused)
	s.mu.Unlock()
	shared := s.src.shared()
	sum.Add(&shared)
	b = fmt.Appendf(b, "targets: %d\n", n)
	b = fmt.Appendf(b, "replacement duplicates: %d (hits recorded by both events of a probe replaced at its site; one copy kept)\n", s.dups.Load())
	b = fmt.Appendf(b, "unsettled replacements: %d (the old event went without waiting for the hits in its handlers: some may be unrecorded)\n", s.unsettled.Load())
	for _, r := range refused {
		b = fmt.Appendf(b, "refused target: %s\n", r)
	}
	b = s.src.appendStatus(b)
	return decode.AppendSummary(b, &sum)
}

// Targets returns the targets, sorted by name.
func (s *Session) Targets() []*Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := slices.Sorted(maps.Keys(s.targets))
	out := make([]*Target, len(names))
	for i, n := range names {
		out[i] = s.targets[n]
	}
	return out
}

// checkName accepts a file name that can stand in the mount and in the
// record lines. Other bytes are safe: tracefs names are sanitised copies.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return fmt.Errorf("%q: %w", name, ErrBadName)
	}
	if strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("%q: control characters (newline, CR, NUL...) are not allowed: %w", name, ErrBadName)
	}
	return nil
}

// targetList returns the targets.
func (s *Session) targetList() []*Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Values(s.targets))
}

// AddTarget starts tracing the binary at path as target name.
// A refusal is logged and listed in the root status: `ln -s` can only
// show the errno ("Exec format error").
func (s *Session) AddTarget(name, path string) (*Target, error) {
	t, err := s.addTarget(name, path)
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			s.refuse(name, path, err)
		}
		return nil, err
	}
	return t, nil
}

// refuse logs why target name -> path was refused and keeps it for Status.
func (s *Session) refuse(name, path string, err error) {
	logrus.WithError(err).WithFields(logrus.Fields{"target": name, "path": path}).Warn("ptfs: target refused")
	line := fmt.Sprintf("%q -> %q: %s", name, path, oneLine(err.Error()))
	s.mu.Lock()
	s.refused = append(s.refused, line)
	if len(s.refused) > keepRefused {
		s.refused = slices.Delete(s.refused, 0, len(s.refused)-keepRefused)
	}
	s.mu.Unlock()
}

func (s *Session) addTarget(name, path string) (*Target, error) {
	if err := checkName(name); err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	if name == "status" {
		return nil, fmt.Errorf("target %q: name of a fixed file: %w", name, ErrBadName)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", name, err)
	}
	// The file is opened once, without blocking, and kept: probes name it
	// by its descriptor, never by the path.
	bin, err := probes.Open(abs)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		bin.Close()
		return nil, ErrClosed
	}
	if _, ok := s.targets[name]; ok {
		bin.Close()
		return nil, fmt.Errorf("target %s: %w", name, ErrTargetExists)
	}
	// Sanitising can map two target names to one group: number the later.
	base := tracefs.GroupName(s.pid, name)
	group := base
	for i := 2; s.groups[group]; i++ {
		group = tracefs.Numbered(base, i)
	}
	s.groups[group] = true
	t := newTarget(s, name, abs, group, bin)
	s.targets[name] = t
	if s.watch != nil {
		if err := s.watch.watch(abs); err != nil {
			logrus.WithError(err).WithField("target", name).Warn("ptfs: the path is checked on probe writes only")
		}
	}
	logrus.WithFields(logrus.Fields{"target": name, "path": abs, "group": group, "file": bin.ID().String()}).Debug("ptfs: target added")
	return t, nil
}

// RemoveTarget removes target name and its probes.
func (s *Session) RemoveTarget(name string) error {
	s.mu.Lock()
	t, ok := s.targets[name]
	if ok {
		delete(s.targets, name)
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("target %s: %w", name, ErrNoTarget)
	}
	err := t.close()
	s.mu.Lock()
	// A group with leftovers stays taken: a new target must not meet them.
	if !slices.ContainsFunc(s.leftovers, func(l leftover) bool { return l.group == t.group }) {
		delete(s.groups, t.group)
	}
	s.mu.Unlock()
	return err
}

// Close removes every probe of the session and stops the record source.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	ts := s.targets
	s.targets = map[string]*Target{}
	s.mu.Unlock()
	var errs []error
	if s.watch != nil {
		errs = append(errs, s.watch.Close())
	}
	for _, t := range ts {
		errs = append(errs, t.close())
	}
	errs = append(errs, s.br.shutdown(), s.src.Close())
	if s.vdso != nil {
		errs = append(errs, s.vdso.Close())
	}
	// With the perf events closed, what was busy may go now.
	s.mu.Lock()
	left := s.leftovers
	s.leftovers = nil
	s.mu.Unlock()
	for _, l := range left {
		if s.mode == ModePTW {
			// Its disabling may have been what failed; removal needs it.
			_ = s.tfs.Enable(l.group, l.event, false)
		}
		if err := s.tfs.RemoveProbe(l.group, l.event); err != nil {
			errs = append(errs, fmt.Errorf("probe %s/%s left in tracefs: %w", l.group, l.event, err))
		}
	}
	errs = append(errs, s.claim.Close())
	return errors.Join(errs...)
}
