package session

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sirupsen/logrus"

	"ptfs/decode"
	"ptfs/objfile"
	"ptfs/probes"
	"ptfs/stream"
	"ptfs/tracefs"
)

// Target is one traced binary of a session.
//
// Locks, in the order they are taken: change, then mu, then the Session's
// mu. change serialises what changes probes (SetProbe, RemoveProbe,
// following the path, close) and is held across tracefs writes, ELF
// parsing and perf_event_open; mu is held only to read or publish state,
// never across I/O, so that lookups, probe files and status answer while
// an install runs. State that readers see (bin, pathState, closed and the
// installed fields of each probe) is written holding both, and read
// holding either.
type Target struct {
	s     *Session
	name  string
	path  string // the user's absolute path: shown and followed
	group string // tracefs group
	recs  *stream.Stream
	brs   *stream.Stream // branches
	// brOn: the branches are read, classic records go there too.
	brOn atomic.Bool

	change  sync.Mutex
	events  map[string]bool // tracefs event names in use in group; guarded by change
	pending atomic.Bool     // a follow of the path is scheduled

	mu     sync.Mutex // guards probes and syms; see above for the rest
	probes map[string]*probe
	// bin is the file the path named when last looked at; the probes are
	// on it, or on an older one while the path is gone or unusable.
	bin       *probes.Binary
	syms      []byte // the symbols text of bin, made on first use
	pathState string // "" while the path names bin, else what is wrong
	closed    bool

	out sync.Mutex // guards seq, cnt, fmt, line, spare, lines, inPlace and brRecs: the record path
	seq uint64
	cnt decode.Counters
	fmt decode.RecordWriter
	// line holds the lines formatted and not yet committed (see emit):
	// in place in the records stream's chunk (inPlace), else in spare;
	// lines counts them (one a record), so that Commit need not.
	line, spare []byte
	lines       int
	inPlace     bool
	// brRecs: the records of this run go to the branches too.
	brRecs bool
}

// probe is one file in probes/. Its working fields describe the installed
// probe; text and err the last spec written and why it was refused.
type probe struct {
	target *Target
	name   string

	// The installed probe; ev == nil when none is.
	spec   string
	sp     *probes.Spec // spec, parsed
	bin    *probes.Binary
	site   *probes.Site
	ev     *decode.Event
	tevent string // tracefs event name
	line   string // tracefs line
	// untyped: the kernel refused the spec's typed fetchargs, line has
	// none, and the records format the spec's types (tracefs.Installed).
	untyped bool
	// rets are the other events of a return probe that ptw mode emulates
	// with a probe on each ret (ev, tevent and line are the first ret's).
	rets []retEvent

	// stale says why spec, installed once, is not installed on the
	// binary that the path names now (its symbol went, its site is
	// refused); sp is kept to try again when the path changes.
	stale error

	// The last spec written, when it was refused.
	badSpec string
	err     error

	// staged is a spec written through a temp file (StageProbe) whose
	// site another probe has: it is installed when this file is renamed
	// over that probe (see RenameProbe); taken says whose site it is.
	staged, taken string
}

func newTarget(s *Session, name, path, group string, bin *probes.Binary) *Target {
	return &Target{
		s:      s,
		name:   name,
		path:   path,
		group:  group,
		bin:    bin,
		recs:   stream.New(s.opts.Stream),
		brs:    stream.New(s.opts.Stream),
		probes: map[string]*probe{},
		events: map[string]bool{},
	}
}

// Name returns the target's directory name.
func (t *Target) Name() string { return t.name }

// Path returns the binary's absolute path.
func (t *Target) Path() string { return t.path }

// Records returns the records stream.
func (t *Target) Records() *stream.Stream { return t.recs }

// Branches is an open of the branches file: the first starts branch
// tracing (DESIGN §2). Without Intel PT it fails with EOPNOTSUPP and the
// reason.
func (t *Target) Branches() (*stream.Stream, error) {
	if err := t.s.br.open(t); err != nil {
		logrus.WithError(err).WithField("target", t.name).Warn("ptfs: branches")
		if errors.Is(err, ErrNoBranches) {
			return nil, fmt.Errorf("%w: %w", err, syscall.EOPNOTSUPP)
		}
		return nil, err
	}
	return t.brs, nil
}

// CloseBranches ends an open of the branches file: the last stops branch
// tracing.
func (t *Target) CloseBranches() { t.s.br.close(t, false) }

// Symbols returns one function a line: file offset, size, demangled name,
// of the binary the path named when last looked at. The text is made once
// per binary: every stat of the file asks for it.
func (t *Target) Symbols() ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.syms == nil {
		t.syms = objfile.AppendSymbols([]byte{}, t.bin.Functions())
	}
	return t.syms, nil
}

// maxEmit bounds the lines emit gathers before they go into the records
// stream: readers see a long run's lines as it goes, and the spare buffer
// stays in the cache.
const maxEmit = 64 << 10

// minInPlace is the least free space of the records chunk that lines are
// formatted into in place; below it they go into the spare buffer (and
// are copied into the stream), so that a line rarely outgrows the space
// (which costs append a new array).
const minInPlace = 4 << 10

// beginEmit starts a run of records of the delivered batch: emit formats
// them, endEmit commits them to the records file.
func (t *Target) beginEmit() {
	t.out.Lock()
	t.brRecs = t.brOn.Load() && t.s.mode != ModePTW
	t.nextLines()
}

// emit formats r, the next record, after beginEmit. Lines are formatted
// into the free space of the records stream's chunk and committed there
// without a copy (stream.Tail, Commit).
func (t *Target) emit(r *decode.Record) {
	t.seq++
	t.cnt.Records++
	buf, n := t.line, len(t.line)
	t.line = t.fmt.Append(t.line, t.seq, r)
	t.lines++
	if t.brRecs {
		// ptw records come with the branches, from the same trace.
		t.s.br.record(t, r, t.line[n:])
	}
	if t.inPlace && cap(t.line) != cap(buf) {
		// The line did not fit the chunk's free space: append moved
		// the lines to a new array. Those before it are in place.
		t.recs.Commit(buf[:n], t.lines-1)
		t.line, t.inPlace, t.lines = append(t.spare[:0], t.line[n:]...), false, 1
	}
	if !t.inPlace {
		t.spare = t.line[:0] // keep what append grew
	}
	if len(t.line) >= maxEmit || t.inPlace && cap(t.line)-len(t.line) < minInPlace {
		t.recs.Commit(t.line, t.lines)
		t.nextLines()
	}
}

// emitRun formats rs, the next records, all of one event, as emit does
// each, but as many at once as the chunk's free space holds
// (RecordWriter.AppendRun, up to maxEmit between commits); a record it
// leaves (no room, an event whose line's length is not known before, the
// spare buffer, or a classic record that the branches being read get
// too) goes through emit.
func (t *Target) emitRun(rs []decode.Record) {
	for len(rs) > 0 {
		k := 0
		if t.inPlace && !t.brRecs {
			// The capacity bounded at maxEmit: the run stops short of it
			// by less than a line's bound, and emit takes the lines up to
			// it, so that a commit comes where emit's would (every
			// maxEmit bytes, not a chunk's free space later).
			line := t.line[:len(t.line):min(cap(t.line), maxEmit)]
			line, k = t.fmt.AppendRun(line, t.seq+1, rs)
			t.line = t.line[:len(line)]
		}
		if k == 0 {
			t.emit(&rs[0])
			rs = rs[1:]
			continue
		}
		t.seq += uint64(k)
		t.cnt.Records += uint64(k)
		t.lines += k
		rs = rs[k:]
		if len(t.line) >= maxEmit || cap(t.line)-len(t.line) < minInPlace {
			t.recs.Commit(t.line, t.lines)
			t.nextLines()
		}
	}
}

// nextLines makes line the buffer of the next lines: the free space of
// the records stream's chunk, unless it is under minInPlace.
func (t *Target) nextLines() {
	t.line, t.inPlace, t.lines = t.recs.Tail(), true, 0
	if cap(t.line) < minInPlace {
		t.line, t.inPlace = t.spare[:0], false
	}
}

// endEmit commits the lines emitted since beginEmit.
func (t *Target) endEmit() {
	t.recs.Commit(t.line, t.lines)
	// Not kept across runs: only the record path appends, but the
	// stream may be emptied meanwhile.
	t.line, t.lines = nil, 0
	t.out.Unlock()
}

func (t *Target) counters() decode.Counters {
	t.out.Lock()
	defer t.out.Unlock()
	return t.cnt
}

// Status returns the target's status file.
func (t *Target) Status() []byte {
	var b []byte
	b = fmt.Appendf(b, "mode: %s\npath: %s\ntracefs group: %s\n", t.s.mode, t.path, t.group)
	t.mu.Lock()
	active, refused, stale := 0, 0, 0
	for _, p := range t.probes {
		if p.ev != nil {
			active++
		}
		if p.err != nil {
			refused++
		}
		if p.stale != nil {
			stale++
		}
	}
	file := fmt.Sprintf("%s (%s)", t.bin.Path(), t.bin.ID())
	if t.pathState != "" {
		file += ": " + t.pathState
	}
	t.mu.Unlock()
	capture := "idle (no probe)"
	if active > 0 {
		capture = t.s.src.running()
	}
	b = fmt.Appendf(b, "file: %s\n", file)
	b = fmt.Appendf(b, "probes: %d active, %d refused, %d stale\ncapture: %s\n", active, refused, stale, capture)
	b = t.recs.AppendStatus(b, "records")
	b = t.s.br.appendStatus(b, t)
	b = t.s.src.appendStatus(b)
	c := t.counters()
	// Losses and decoder counts that no event attributes to one target:
	// every target counts them.
	shared := t.s.src.shared()
	c.Add(&shared)
	return decode.AppendSummary(b, &c)
}

// Probes returns the probe names, sorted.
func (t *Target) Probes() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Sorted(maps.Keys(t.probes))
}

// ProbeText returns the probe file: the spec, then '# ' lines.
func (t *Target) ProbeText(name string) ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.probes[name]
	if !ok {
		return nil, false
	}
	var b []byte
	if p.ev != nil {
		b = fmt.Appendf(b, "%s\n", p.spec)
		b = fmt.Appendf(b, "# state: installed (%s mode, event id %d)\n", t.s.mode, p.ev.ID)
		b = fmt.Appendf(b, "# tracefs: %s\n", p.line)
		for _, r := range p.rets {
			b = fmt.Appendf(b, "# tracefs: %s\n", r.line)
		}
		b = fmt.Appendf(b, "# file: %s (%s)\n", p.bin.Path(), p.bin.ID())
		b = appendSite(b, p.site)
		if t.s.mode == ModeClassic {
			// What each hit costs the traced program, and a cheaper site.
			b = fmt.Appendf(b, "# %s\n", p.site.Cost)
		}
		if p.untyped {
			b = append(b, "# ptw: the kernel refused typed fetchargs; installed untyped, ptfs formats u32/s32/x32\n"...)
		}
		if f := p.sp.PTWFormatted(); f != "" && t.s.mode == ModePTW {
			b = fmt.Appendf(b, "# ptw: ptfs formats %s from the stub's u64/u32 words\n", f)
		}
	} else if p.stale != nil {
		b = fmt.Appendf(b, "%s\n", p.spec)
		b = fmt.Appendf(b, "# state: stale: %s\n", oneLine(p.stale.Error()))
	}
	if p.err != nil {
		if p.ev == nil {
			b = fmt.Appendf(b, "%s\n", p.badSpec)
			b = fmt.Appendf(b, "# state: refused\n")
		} else {
			b = fmt.Appendf(b, "# refused %q, kept the probe above\n", p.badSpec)
		}
		b = fmt.Appendf(b, "# error: %s\n", oneLine(p.err.Error()))
	}
	if p.staged != "" {
		b = fmt.Appendf(b, "%s\n# state: staged: %s; rename this file over it to replace it\n", p.staged, p.taken)
	} else if p.ev == nil && p.err == nil && p.stale == nil {
		b = append(b, "# state: empty (write a spec to install a probe)\n"...)
	}
	return b, true
}

func appendSite(b []byte, s *probes.Site) []byte {
	where := "no function"
	if s.Func != "" {
		where = s.Func + "+0x" + strconv.FormatUint(s.FuncOff, 16)
	}
	b = fmt.Appendf(b, "# site: %s, file offset 0x%x, address 0x%x: %s\n", where, s.Offset, s.Addr, s.Insn)
	return fmt.Appendf(b, "# %s\n", s.Verdict)
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", "; ") }

// CreateProbe creates an empty probe file.
func (t *Target) CreateProbe(name string) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	if _, ok := t.probes[name]; !ok {
		t.probes[name] = &probe{target: t, name: name}
	}
	return nil
}

// SetProbe checks spec and installs it as probe name. A working probe is
// replaced only after the new one is installed; on any error it stays, and
// the error is kept for the probe file.
func (t *Target) SetProbe(name, spec string) error {
	return t.setProbe(name, spec, false)
}

// setProbe is SetProbe; with stage, a spec whose site another probe has
// is kept as staged (StageProbe) instead of refused.
func (t *Target) setProbe(name, spec string, stage bool) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	// A probe file's own text (`sed -i`, `cat a > b`) is its spec with
	// comment lines: what is kept and compared is the spec line.
	if line, err := probes.SpecLine(spec); err == nil {
		spec = line
	}
	t.change.Lock()
	defer t.change.Unlock()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ErrClosed
	}
	p := t.probes[name]
	if p == nil {
		p = &probe{target: t, name: name}
		t.probes[name] = p
	}
	t.mu.Unlock()
	// The watcher may not have seen a change of the path yet: a spec
	// resolves against the file the path names now.
	err := t.follow()
	switch {
	case err != nil:
	case p.ev != nil && spec == p.spec && p.bin == t.bin:
		// Rewriting the installed spec changes nothing.
	default:
		if err = t.install(p, spec); err != nil {
			break
		}
		// The path may have changed while the probe went in: it is on
		// the file it was checked in, and follows from there. A file
		// that cannot be used shows in status; the probe stands.
		if ferr := t.follow(); ferr != nil {
			logrus.WithError(ferr).WithField("target", t.name).Warn("ptfs: following the target's path")
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p.staged, p.taken = "", ""
	var taken *siteTakenError
	if stage && p.ev == nil && errors.As(err, &taken) {
		p.staged, p.taken, p.err = spec, taken.Error(), nil
		return nil
	}
	if err != nil {
		p.badSpec, p.err = oneLine(strings.TrimRight(spec, "\n")), err
		logrus.WithError(err).WithFields(logrus.Fields{"target": t.name, "probe": name}).Debug("ptfs: probe refused")
		return fmt.Errorf("probe %s: %w", name, err)
	}
	p.err = nil
	return nil
}

// install installs spec for p, then retires p's previous probe.
func (t *Target) install(p *probe, spec string) error {
	sp, err := probes.Parse(spec)
	if err != nil {
		return err
	}
	return t.place(p, spec, sp)
}

// place resolves sp against the target's binary and installs it for p.
func (t *Target) place(p *probe, spec string, sp *probes.Spec) error {
	if t.s.mode == ModePTW {
		// Types the stub cannot write (strings): the reason, before
		// the site is even looked at.
		if _, err := sp.PTWWire(); err != nil {
			return err
		}
	}
	bin := t.bin
	site, err := bin.Resolve(sp)
	if err != nil {
		return err
	}
	for _, o := range t.list() {
		// An entry and a return probe of one function share its site.
		if o != p && o.ev != nil && o.bin == bin && o.site.Offset == site.Offset && o.sp.Return == sp.Return {
			return &siteTakenError{o.name, site.Offset}
		}
	}
	ptw := t.s.mode == ModePTW
	if ptw {
		// A ptwrite kernel refuses such sites anyway; say why first.
		if err := site.Verdict.Err(); err != nil {
			return err
		}
		if p.ev != nil && p.bin == bin && p.site.Offset == site.Offset && p.sp.Return == sp.Return {
			return t.replaceAtSite(p, spec, sp, site)
		}
	} else if err := site.Cost.Err(); err != nil {
		// The kernel would take the line and never fire.
		return err
	}
	return t.add(p, bin, spec, sp, site)
}

// list returns the probes; their installed fields may be read while
// change is held.
func (t *Target) list() []*probe {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Collect(maps.Values(t.probes))
}

// replaceAtSite replaces p's ptw probe with one at the same site. A
// ptwrite kernel takes one probe a site, so the old probe goes first; when
// the new one then fails, the old one is installed again.
func (t *Target) replaceAtSite(p *probe, spec string, sp *probes.Spec, site *probes.Site) error {
	oldSpec, oldSp, oldSite, bin := p.spec, p.sp, p.site, p.bin
	if err := t.retire(p); err != nil {
		return fmt.Errorf("removing the probe it replaces at the same site: %w", err)
	}
	err := t.add(p, bin, spec, sp, site)
	if err == nil {
		return nil
	}
	if rerr := t.add(p, bin, oldSpec, oldSp, oldSite); rerr != nil {
		return errors.Join(err, fmt.Errorf("the replaced probe could not be installed again: %w", rerr))
	}
	return err
}

// add installs the probe of sp at site of bin for p and starts reading it,
// then retires p's previous probe, if any. The line names bin by its
// descriptor, so the kernel probes the inode that was resolved.
func (t *Target) add(p *probe, bin *probes.Binary, spec string, sp *probes.Spec, site *probes.Site) error {
	ptw := t.s.mode == ModePTW
	if ptw && sp.Return {
		return t.addRets(p, bin, spec, sp, site)
	}
	tevent := t.freeEvent(p.name)
	in, err := t.s.tfs.Install(ptw, t.group, tevent, bin.FDPath(), site.Offset, sp)
	if err != nil {
		return err
	}
	ev := in.Event
	// A classic probe replaced at its own site: both events record the
	// hits until the old one goes, one copy is kept (see swap). (A ptw
	// probe at its own site went first: replaceAtSite.)
	swapped := p.ev != nil && p.site.Offset == site.Offset && p.sp.Return == sp.Return
	// Records show the mount's names; the tracefs names carry the PID.
	ev.Group, ev.Name = "ptfs_"+t.name, p.name
	ev.Filter = sp.Filter()
	if swapped {
		t.s.beginSwap(p, p.ev.ID, ev.ID)
	} else {
		t.s.setRoute(ev.ID, p)
	}
	if err = t.s.src.Add(ev); err != nil {
		t.s.setRoute(ev.ID, nil)
	} else if ptw {
		// A ptw probe emits only while enabled, and the capture runs
		// before it is: no hit is written into a trace nobody reads.
		if err = t.s.tfs.Enable(t.group, tevent, true); err != nil {
			err = errors.Join(err, t.s.src.Remove(ev.ID))
			t.s.setRoute(ev.ID, nil)
		}
	}
	if err != nil {
		if swapped {
			t.s.setRoute(p.ev.ID, p)
		}
		if rerr := t.s.tfs.RemoveProbe(t.group, tevent); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return err
	}
	t.events[tevent] = true
	t.s.br.setEvent(ev.ID, ev)
	if swapped {
		// A hit whose handlers the kernel began before the new event was
		// enabled on its CPU ran the new event's first (newest first) and
		// may be between the two, preempted: disabling the old event now
		// would leave it recorded by neither. Once every such hit is
		// through, each later hit runs the new event's enabled handler.
		if serr := t.s.src.settle(); serr != nil {
			t.s.unsettled.Add(1)
			logrus.WithError(serr).WithField("probe", p.name).Warn("ptfs: the hits of the replacement's first moment may go unrecorded")
		}
	}
	if p.ev != nil {
		if rerr := t.retire(p); rerr != nil {
			// The new probe works; the old one is retried at unmount.
			logrus.WithError(rerr).WithField("probe", p.name).Warn("ptfs: removing the replaced probe")
		}
		if swapped {
			// Every record of the old event has been delivered.
			t.s.setRoute(ev.ID, p)
		}
	}
	t.mu.Lock()
	p.spec, p.sp, p.bin, p.site, p.ev, p.tevent, p.line, p.untyped, p.stale = spec, sp, bin, site, ev, tevent, in.Line, in.Untyped, nil
	p.installedLocked(spec)
	t.mu.Unlock()
	logrus.WithFields(logrus.Fields{"target": t.name, "probe": p.name, "line": in.Line}).Debug("ptfs: probe installed")
	return nil
}

// installedLocked drops p's refusal of spec, now installed (a spec refused
// on a file that lacked its site, installed when the path names one that
// has it): in the lock section that shows it installed, so that no reader
// of the probe file sees the probe installed beside that error. A refusal
// of another spec stays. Called holding t.mu.
func (p *probe) installedLocked(spec string) {
	if p.err != nil && p.badSpec == spec {
		p.err = nil
	}
}

// freeEvent returns a tracefs event name for probe that no installed probe
// of the target uses, so that a replacement can be installed beside the
// probe it replaces.
func (t *Target) freeEvent(probe string) string {
	base := tracefs.EventName(probe)
	name := base
	for i := 2; t.events[name]; i++ {
		name = tracefs.Numbered(base, i)
	}
	return name
}

// retire stops and removes p's installed probe. When tracefs refuses to
// remove it (EBUSY: another tool holds its event), the probe is no longer read
// or routed, its event name stays taken, and Session.Close tries again.
func (t *Target) retire(p *probe) error {
	if p.ev == nil {
		return nil
	}
	err := t.stop(retEvent{p.ev, p.tevent, p.line})
	for _, r := range p.rets {
		err = errors.Join(err, t.stop(r))
	}
	t.mu.Lock()
	p.ev, p.sp, p.site, p.rets = nil, nil, nil, nil
	t.mu.Unlock()
	return err
}

// stop stops reading and removes one installed event (see retire).
func (t *Target) stop(r retEvent) error {
	var err error
	if t.s.mode == ModePTW {
		// Stop the hits before the capture lets go of the event.
		err = t.s.tfs.Enable(t.group, r.tevent, false)
	}
	err = errors.Join(err, t.s.src.Remove(r.ev.ID))
	t.s.setRoute(r.ev.ID, nil)
	t.s.br.setEvent(r.ev.ID, nil)
	if rerr := t.s.tfs.RemoveProbe(t.group, r.tevent); rerr != nil {
		t.s.leave(t.group, r.tevent)
		err = errors.Join(err, rerr)
	} else {
		delete(t.events, r.tevent)
	}
	return err
}

// retEvent is one tracefs event of a probe: its decoder event, tracefs
// event name and line.
type retEvent struct {
	ev     *decode.Event
	tevent string
	line   string
}

// addRets installs a return probe in ptw mode, where the kernel takes
// none: a ptw probe on each ret of the function (site.Rets, checked by the
// site checker), fetching %ax for $retval, all routed to p. Either all are
// installed or none; then p's previous probe is retired.
func (t *Target) addRets(p *probe, bin *probes.Binary, spec string, sp *probes.Spec, site *probes.Site) error {
	at := probes.AtRet(sp)
	var evs []retEvent
	untyped := false
	undo := func(err error) error {
		for _, r := range evs {
			err = errors.Join(err, t.stop(r))
		}
		return err
	}
	for _, off := range site.Rets {
		tevent := t.freeEvent(p.name)
		in, err := t.s.tfs.Install(true, t.group, tevent, bin.FDPath(), off, at)
		if err != nil {
			return undo(fmt.Errorf("the probe on the ret at file offset 0x%x: %w", off, err))
		}
		t.events[tevent] = true
		untyped = untyped || in.Untyped
		ev := in.Event
		ev.Group, ev.Name, ev.Filter = "ptfs_"+t.name, p.name, sp.Filter()
		t.s.setRoute(ev.ID, p)
		r := retEvent{ev, tevent, in.Line}
		if err := t.s.src.Add(ev); err != nil {
			t.s.setRoute(ev.ID, nil)
			if rerr := t.s.tfs.RemoveProbe(t.group, tevent); rerr == nil {
				delete(t.events, tevent)
			}
			return undo(err)
		}
		evs = append(evs, r)
		// The records of the rets go into branches too (ptw mode).
		t.s.br.setEvent(ev.ID, ev)
		if err := t.s.tfs.Enable(t.group, tevent, true); err != nil {
			return undo(err)
		}
	}
	if p.ev != nil {
		if rerr := t.retire(p); rerr != nil {
			logrus.WithError(rerr).WithField("probe", p.name).Warn("ptfs: removing the replaced probe")
		}
	}
	t.mu.Lock()
	p.spec, p.sp, p.bin, p.site, p.untyped, p.stale = spec, sp, bin, site, untyped, nil
	p.ev, p.tevent, p.line, p.rets = evs[0].ev, evs[0].tevent, evs[0].line, evs[1:]
	p.installedLocked(spec)
	t.mu.Unlock()
	return nil
}

// RemoveProbe removes probe name and its uprobe.
func (t *Target) RemoveProbe(name string) error {
	t.change.Lock()
	defer t.change.Unlock()
	t.mu.Lock()
	p, ok := t.probes[name]
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("probe %s: %w", name, ErrNoProbe)
	}
	err := t.retire(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		// The file stays and says why; a second rm removes it.
		p.badSpec, p.err = p.spec, fmt.Errorf("removing: %w", err)
		return fmt.Errorf("probe %s: %w", name, err)
	}
	delete(t.probes, name)
	return nil
}

// close removes every probe and releases the binaries.
func (t *Target) close() error {
	t.change.Lock()
	defer t.change.Unlock()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	// With closed set, nothing adds to probes any more.
	bins := t.binaries()
	var errs []error
	for name, p := range t.probes {
		if err := t.retire(p); err != nil {
			errs = append(errs, fmt.Errorf("probe %s: %w", name, err))
		}
	}
	// Branch tracing for it ends before its file goes (the filter names it).
	t.s.br.close(t, true)
	for _, b := range bins {
		errs = append(errs, b.Close())
	}
	errs = append(errs, t.recs.Close(), t.brs.Close())
	return errors.Join(errs...)
}
