package session

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"ptfs/decode"
	"ptfs/engine"
	"ptfs/live"
	"ptfs/perfio"
)

// reconfigurer switches the branch tracing and address filter of PT
// events: perfio.PT, or a test's replay.
type reconfigurer interface {
	Reconfigure(branch bool, filter string) error
}

// branches is the branch tracing of a session (DESIGN §2, branches): the
// decode stage, the source that feeds it and the readers of each target's
// `branches`. The first open starts branch tracing, the last close stops
// it. Classic mode runs branch-only PT events of its own, with address
// filters for the targets' code; ptw mode reconfigures its PT events to
// carry branches too (engine.Tee passes their trace to the stage), without
// filters, which would hide the probes' stubs.
type branches struct {
	s     *Session
	err   error // why branches are unavailable; nil: available
	stage *live.Stage
	ptw   bool
	// newSource makes the classic-mode source at the first open (the
	// kernel's needs Intel PT); src is it once made.
	newSource func() (engine.TraceSource, *perfio.PT, error)
	src       engine.TraceSource
	// conf switches branch tracing and filters; pt is the kernel's PT
	// source, for status; nil with a test's source.
	conf reconfigurer
	pt   *perfio.PT
	// nFilters is the PMU's address filters (nrErr: why unknown).
	nFilters int
	nrErr    error

	// mu serialises opens, closes and the source's start, stop and
	// reconfiguration (held across them); it comes after a Target's
	// locks and before the Session's mu.
	mu        sync.Mutex
	readers   map[*Target]int
	on        bool
	filter    string
	filterWhy string
	lastErr   error
	events    map[uint16]*decode.Event

	// clock places classic records (CLOCK_MONOTONIC) in perf time.
	clock recordClock
}

// clockRefresh is how long a measured clock offset is used: NTP slews
// CLOCK_MONOTONIC against perf time by up to 500 ppm, 0.5 ms a second.
const clockRefresh = uint64(time.Second)

// recordClock converts the time of classic records (CLOCK_MONOTONIC) to
// perf time, the clock of the branch lines, with an offset measured again
// after clockRefresh.
type recordClock struct {
	measure func() (int64, error)
	mu      sync.Mutex
	offset  int64
	at      uint64 // record time of the last measurement; 0: none
	failed  bool   // the last measurement failed (logged at the first)
}

// perf returns the perf time of a record's time, or 0 (unknown: the
// record goes as it arrives) while the offset cannot be measured.
func (c *recordClock) perf(mono uint64) uint64 {
	if mono == 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at == 0 || mono > c.at && mono-c.at > clockRefresh {
		off, err := c.measure()
		if err != nil && !c.failed {
			logrus.WithError(err).Warn("ptfs: classic records in branches go as they arrive, not by time")
		}
		c.offset, c.at, c.failed = off, mono, err != nil
	}
	if c.failed {
		return 0
	}
	return uint64(int64(mono) + c.offset)
}

// record gives a classic record line of t to the stage, placed by time
// among t's branch lines (DESIGN §2).
func (b *branches) record(t *Target, r *decode.Record, line []byte) {
	// false: t was detached meanwhile; its reader is gone.
	_ = b.stage.Record(t.name, int(r.CPU), b.clock.perf(r.Time), line)
}

// newBranches prepares branch tracing for the session's mode; nothing
// runs until the first open.
func newBranches(s *Session, r roots, stage *live.Stage) *branches {
	b := &branches{s: s, stage: stage, ptw: s.mode == ModePTW, readers: map[*Target]int{}, events: map[uint16]*decode.Event{}}
	b.clock.measure = s.opts.ClockOffset
	if b.clock.measure == nil {
		b.clock.measure = func() (int64, error) {
			off, _, err := perfio.PerfClockOffset()
			return off, err
		}
	}
	b.nFilters, b.nrErr = perfio.NrAddrFilters(r.intelPT())
	if b.ptw {
		// ptw mode's PT events tee their trace into the stage
		// (Session's ptw source, engine.Tee); no source of its own.
		return b
	}
	if src := s.opts.BranchTrace; src != nil {
		b.src = src
		b.conf, _ = src.(reconfigurer)
		return b
	}
	if b.err = s.caps.BranchesErr(); b.err != nil {
		return b
	}
	b.newSource = func() (engine.TraceSource, *perfio.PT, error) {
		o := s.opts.PT
		o.Branch, o.NoPTW, o.Filter = true, true, b.filter
		pt, err := perfio.NewPT(r.intelPT(), o)
		if err != nil {
			return nil, nil, err
		}
		return pt, pt, nil
	}
	return b
}

// open adds a reader of t's branches: the first of t attaches t to the
// stage, the first of all starts branch tracing; a change of the targets
// read changes the address filter.
func (b *branches) open(t *Target) error {
	if b.err != nil {
		return b.err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.readers[t] > 0 {
		b.readers[t]++
		return nil
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if err := b.stage.Attach(t.name, t.ownPaths(), t.brs); err != nil {
		return fmt.Errorf("branches of %s: %w", t.name, err)
	}
	b.readers[t] = 1
	t.brOn.Store(true)
	if err := b.apply(); err != nil {
		b.detachLocked(t)
		if rerr := b.apply(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		b.lastErr = err
		return fmt.Errorf("start branch tracing: %w", err)
	}
	return nil
}

// close ends one reader of t's branches (or all of them, for a target
// that goes); the last of all stops branch tracing.
func (b *branches) close(t *Target, all bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.readers[t]
	if n == 0 {
		// The target went while the file was open.
		return
	}
	if n > 1 && !all {
		b.readers[t] = n - 1
		return
	}
	b.detachLocked(t)
	if err := b.apply(); err != nil {
		b.lastErr = err
		logrus.WithError(err).WithField("target", t.name).Warn("ptfs: branch tracing")
	}
}

// detachLocked forgets t's readers and its lines.
func (b *branches) detachLocked(t *Target) {
	delete(b.readers, t)
	t.brOn.Store(false)
	if err := b.stage.Detach(t.name); err != nil {
		logrus.WithError(err).WithField("target", t.name).Debug("ptfs: branches detach")
	}
}

// apply brings the source in line with the readers: running with branch
// tracing (and, in classic mode, the filter of the targets read) while
// any reader is, stopped otherwise.
func (b *branches) apply() error {
	want := len(b.readers) > 0
	if b.ptw {
		return b.applyPTW(want)
	}
	filter, why := b.filterFor()
	switch {
	case want && !b.on:
		if b.src == nil {
			src, pt, err := b.newSource()
			if err != nil {
				return err
			}
			b.src, b.pt, b.conf = src, pt, pt
		}
		if err := b.reconfigure(true, filter); err != nil {
			return err
		}
		b.filter, b.filterWhy = filter, why
		if err := b.src.Start(b.stage); err != nil {
			return err
		}
		b.on = true
	case want && filter != b.filter:
		if err := b.reconfigure(true, filter); err != nil {
			// The running events keep the old filter: its targets'
			// code is still traced, others' lines dropped.
			return err
		}
		b.filter, b.filterWhy = filter, why
	case !want && b.on:
		b.on = false
		return b.src.Stop()
	}
	return nil
}

// applyPTW switches branch tracing of ptw mode's PT events: on, the
// events are reopened with branch tracing (records keep flowing; the
// moment between is a flush loss) and the source kept running without
// probes; off, the reverse.
func (b *branches) applyPTW(want bool) error {
	w := b.s.src.(ptwSource).PTW
	b.filter, b.filterWhy = "", "none in ptw mode: the probes' stubs, in no file, would be filtered out; "+unfiltered
	switch {
	case want && !b.on:
		if err := b.reconfigure(true, ""); err != nil {
			return err
		}
		if err := w.Keep(true); err != nil {
			return errors.Join(err, b.reconfigure(false, ""))
		}
		b.on = true
	case !want && b.on:
		b.on = false
		return errors.Join(w.Keep(false), b.reconfigure(false, ""))
	}
	return nil
}

// reconfigure switches the PT events, when there is anything to switch.
func (b *branches) reconfigure(branch bool, filter string) error {
	if b.conf == nil {
		return nil
	}
	return b.conf.Reconfigure(branch, filter)
}

// unfiltered says what branch tracing without an address filter shows.
const unfiltered = "all user code is traced and decoded, lines outside the targets read are dropped"

// filterFor returns the address filter text of the targets read, or ""
// and why there is none: the PMU has none or too few, or a path the
// filter grammar cannot hold. Every executable PT_LOAD segment of each
// target is a range of the file ptfs holds (its /proc/PID/fd path).
func (b *branches) filterFor() (string, string) {
	if b.nrErr != nil {
		return "", fmt.Sprintf("none (%v): %s", b.nrErr, unfiltered)
	}
	var fs []perfio.AddrFilter
	for t := range b.readers {
		t.mu.Lock()
		bin := t.bin
		t.mu.Unlock()
		for _, seg := range bin.Segments() {
			if seg.Exec() && seg.Filesz > 0 {
				fs = append(fs, perfio.AddrFilter{Offset: seg.Off, Size: seg.Filesz, File: bin.FDPath()})
			}
		}
	}
	if len(fs) == 0 {
		return "", "none (no reader)"
	}
	slices.SortFunc(fs, func(a, b perfio.AddrFilter) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Offset, b.Offset))
	})
	text, err := perfio.FilterText(fs, b.nFilters)
	if err != nil {
		return "", fmt.Sprintf("none (%v): %s", err, unfiltered)
	}
	return text, ""
}

// fileChanged sets the address filter anew when the path of a target
// read names another file (DESIGN §2, following the path): its code is
// traced from now on. Called holding t's change.
func (b *branches) fileChanged(t *Target) {
	if b.ptw || b.err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.readers[t] == 0 {
		return
	}
	if err := b.apply(); err != nil {
		b.lastErr = err
		logrus.WithError(err).WithField("target", t.name).Warn("ptfs: address filter of the new file")
	}
}

// setEvent adds (ev != nil) or removes the probe event id whose records
// ptw trace carries among the branches.
func (b *branches) setEvent(id uint16, ev *decode.Event) {
	if !b.ptw {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if ev != nil {
		b.events[id] = ev
	} else {
		delete(b.events, id)
	}
	b.stage.SetEvents(maps.Clone(b.events))
}

// shutdown stops branch tracing at the session's end and releases the
// stage.
func (b *branches) shutdown() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for t := range b.readers {
		b.detachLocked(t)
	}
	var err error
	if b.on && !b.ptw {
		err = b.src.Stop()
	}
	b.on = false
	return errors.Join(err, b.stage.Close())
}

// appendStatus appends the branches lines of t's status (DESIGN §5).
func (b *branches) appendStatus(dst []byte, t *Target) []byte {
	if b.err != nil {
		return fmt.Appendf(dst, "branches: unavailable: %s\n", b.err)
	}
	b.mu.Lock()
	n, targets, on := b.readers[t], len(b.readers), b.on
	filter, why, lastErr := b.filter, b.filterWhy, b.lastErr
	b.mu.Unlock()
	src := "branch-only Intel PT events"
	if b.ptw {
		src = "ptw mode's Intel PT events, reopened with branch tracing"
	}
	switch {
	case on && n > 0:
		dst = fmt.Appendf(dst, "branches: on (%d readers of this target, %d targets read; %s)\n", n, targets, src)
	case on:
		dst = fmt.Appendf(dst, "branches: off for this target (%d other targets read; %s)\n", targets, src)
	default:
		dst = append(dst, "branches: off (no reader; opening branches starts branch tracing)\n"...)
	}
	if on {
		if filter != "" {
			dst = fmt.Appendf(dst, "branches filter: %s\n", filter)
		} else {
			dst = fmt.Appendf(dst, "branches filter: %s\n", why)
		}
	}
	st := b.stage.Stats()
	dst = append(dst, "branches losses:"...)
	for k, v := range st.Losses {
		if engine.LossKind(k) != engine.LossFlush {
			dst = fmt.Appendf(dst, " %s=%d", engine.LossKind(k), v)
		}
	}
	dst = fmt.Appendf(dst, " decode errors=%d unknown code=%d (replaced on disk=%d)\n", st.DecodeErrors, st.UnknownCode, st.Replaced)
	dst = fmt.Appendf(dst, "branches decoded: bytes=%d branches=%d lines=%d outside=%d (lines of code no reader's target owns: dropped) "+
		"manual ptwrites=%d flushes=%d\n", st.Bytes, st.Branches, st.Lines, st.Outside, st.Manual, st.Losses[engine.LossFlush])
	if lastErr != nil {
		dst = fmt.Appendf(dst, "branches error: %s\n", oneLine(lastErr.Error()))
	}
	if b.pt != nil && !b.ptw {
		dst = appendPTStatus(dst, b.pt.Status(), b.pt.Stats())
	}
	return t.brs.AppendStatus(dst, "branches")
}

// ownPaths are the names the side band gives the target's file: its path
// and, when a symbolic link leads there, the file it names (the kernel
// names a mapping by the file's own path).
func (t *Target) ownPaths() []string {
	paths := []string{t.path}
	if real, err := filepath.EvalSymlinks(t.path); err == nil && real != t.path {
		paths = append(paths, real)
	}
	return paths
}
