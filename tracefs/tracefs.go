package tracefs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"ptfs/decode"
	"ptfs/probes"
)

// Tracefs is a tracefs mount with uprobe_events.
type Tracefs struct {
	// Dir is the mount point, such as /sys/kernel/tracing. Every read, and
	// every write other than uprobe_events commands, goes to files in Dir.
	Dir string
	// Exec, when set, receives each uprobe_events command (one line,
	// without the newline) instead of the file: a simulated kernel in
	// tests. Its errors should be syscall.Errno values, as a write to the
	// real file gives. Nil writes the file.
	Exec func(cmd string) error
}

// tracefsDirs are the usual tracefs mount points; the first is where
// FindTracefs mounts it when neither has uprobe_events.
var tracefsDirs = []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"}

// FindTracefs returns the tracefs at /sys/kernel/tracing or
// /sys/kernel/debug/tracing, mounting it on /sys/kernel/tracing when
// neither has uprobe_events. The mount is left in place for everyone, as
// the kernel's standard location.
func FindTracefs() (*Tracefs, error) {
	return findTracefs(tracefsDirs, tracefsDirs[0])
}

func findTracefs(dirs []string, mountAt string) (*Tracefs, error) {
	for _, d := range dirs {
		if hasUprobes(d) {
			return &Tracefs{Dir: d}, nil
		}
	}
	if err := unix.Mount("nodev", mountAt, "tracefs", 0, ""); err != nil {
		return nil, fmt.Errorf("%w: none in %s, and mount -t tracefs nodev %s: %w",
			ErrNoTracefs, strings.Join(dirs, ", "), mountAt, err)
	}
	if !hasUprobes(mountAt) {
		return nil, fmt.Errorf("%w: tracefs at %s has no uprobe_events (kernel without CONFIG_UPROBE_EVENTS?)", ErrNoTracefs, mountAt)
	}
	return &Tracefs{Dir: mountAt}, nil
}

func hasUprobes(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "uprobe_events"))
	return err == nil
}

// HasUprobes tells whether the mount has uprobe_events (a kernel with
// CONFIG_UPROBE_EVENTS).
func (t *Tracefs) HasUprobes() bool { return hasUprobes(t.Dir) }

func (t *Tracefs) path(name ...string) string {
	return filepath.Join(append([]string{t.Dir}, name...)...)
}

// Events returns the lines of uprobe_events.
func (t *Tracefs) Events() ([]string, error) {
	data, err := os.ReadFile(t.path("uprobe_events"))
	if err != nil {
		return nil, fmt.Errorf("read uprobe_events: %w", err)
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// write writes one command to uprobe_events, once CheckCommand has passed
// it: nothing else reaches the kernel.
func (t *Tracefs) write(cmd string) error {
	if err := CheckCommand(cmd); err != nil {
		return err
	}
	if t.Exec != nil {
		return t.Exec(cmd)
	}
	f, err := os.OpenFile(t.path("uprobe_events"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open uprobe_events: %w", err)
	}
	_, err = f.Write([]byte(cmd + "\n"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// kernelReason returns the kernel's reason for refusing cmd, from the
// newest error_log entry about cmd, as one readable line such as
// `Invalid register name (at "%ds")`; "" when there is none. error_log is
// shared by every tracefs user, so the entry is found by its command
// rather than by clearing the log, which would erase other writers'
// reasons as they look for them.
func (t *Tracefs) kernelReason(cmd string) string {
	data, err := os.ReadFile(t.path("error_log"))
	if err != nil {
		return ""
	}
	return errorLogReason(string(data), cmd)
}

// errorLogReason extracts the newest entry of an error_log text whose
// Command line is cmd: the message after "error: " and the token the caret
// line points at.
func errorLogReason(log, cmd string) string {
	lines := strings.Split(log, "\n")
	last := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "[") && i+1 < len(lines) {
			if c, ok := strings.CutPrefix(strings.TrimSpace(lines[i+1]), "Command: "); ok && c == cmd {
				last = i
			}
		}
	}
	if last < 0 {
		return ""
	}
	msg := lines[last]
	if _, m, ok := strings.Cut(msg, "error: "); ok {
		msg = m
	} else if _, m, ok := strings.Cut(msg, "] "); ok {
		msg = m
	}
	if last+2 < len(lines) {
		cl, caret := lines[last+1], lines[last+2]
		start := strings.Index(cl, "Command: ") + len("Command: ")
		if col := strings.IndexByte(caret, '^'); start >= len("Command: ") && col >= start && col < len(cl) {
			tok, _, _ := strings.Cut(cl[col:], " ")
			if tok != "" {
				msg += fmt.Sprintf(" (at %q)", tok)
			}
		}
	}
	return strings.TrimSpace(msg)
}

// sameSite tells whether two probe places name the same file and offset.
func sameSite(a, b ProbeLine) bool {
	if a.Offset != b.Offset {
		return false
	}
	if a.Path == b.Path {
		return true
	}
	sa, err1 := os.Stat(a.Path)
	sb, err2 := os.Stat(b.Path)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// defaultGroup is the group of an event whose line names none: where a
// stock kernel puts its stand-in for a ptw: line.
const defaultGroup = "uprobes"

// AddProbe installs the probe of one uprobe_events line (as ClassicLine or
// PTWLine make it) and verifies that the kernel lists the line's
// GRP/EVENT at the line's file and offset afterwards, whatever kind it
// lists it as: a ptwrite kernel may list a ptw probe as p:. It refuses
// with ErrExists an event name that exists (the kernel would merge a
// second classic line of the same name into one event) and a ptw probe at
// a site that another probe uses (ptwrite kernels refuse a second probe at
// one site). The first line in a group of this process's PID removes what
// the group holds (a dead process's lines, with the same PID: adopt). A
// kernel that accepts a ptw: line but creates another event
// at its site instead (a stock kernel makes a classic probe named
// uprobes/p_FILE_OFF) gets that stand-in removed and the line refused with
// probes.ErrRefused. An offset beyond the end of the file is refused with
// probes.ErrBadSite before the kernel sees it, and a line that
// CheckCommand refuses with ErrBadLine. Kernel errors carry the reason
// from error_log: EEXIST maps to ErrExists, EINVAL, E2BIG, ERANGE and
// EOPNOTSUPP to probes.ErrRefused, others stay errnos.
func (t *Tracefs) AddProbe(line string) error {
	_, err := t.addProbe(line)
	return err
}

// addProbe is AddProbe that also returns, when the kernel created
// something other than the line asked for, what it created (as
// KIND:GRP/EVENT), all of it removed again.
func (t *Tracefs) addProbe(line string) (standIns []string, err error) {
	// Checked before parsing, so that a hostile line is refused as such
	// rather than as a bad spec.
	if err := CheckCommand(line); err != nil {
		return nil, err
	}
	pl, err := ParseLine(line)
	if err != nil {
		return nil, err
	}
	// The kernel takes any offset and fails only when the probe is
	// registered later: refuse one beyond the file now.
	if st, err := os.Stat(pl.Path); err == nil && st.Mode().IsRegular() && pl.Offset >= uint64(st.Size()) {
		return nil, fmt.Errorf("%w: file offset 0x%x is beyond the end of %s (%d bytes)", probes.ErrBadSite, pl.Offset, pl.Path, st.Size())
	}
	if err := t.adopt(pl.Group); err != nil {
		return nil, fmt.Errorf("add probe %s/%s: %w", pl.Group, pl.Event, err)
	}
	before, err := t.Events()
	if err != nil {
		return nil, err
	}
	for _, l := range before {
		el, err := ParseLine(l)
		if err != nil {
			continue // not ours to judge; it cannot clash with a known site
		}
		if el.Group == pl.Group && el.Event == pl.Event {
			return nil, fmt.Errorf("%w: event %s/%s exists already", ErrExists, pl.Group, pl.Event)
		}
		// Only ptwrite uprobes refuse a second probe at a site; classic
		// ones share it (another tool's probe, or the probe that this
		// one replaces). A ptw probe may be listed as p:, so a ptw line
		// meets every kind.
		if (pl.Kind == "ptw" || el.Kind == "ptw") && sameSite(el, pl) {
			return nil, fmt.Errorf("%w: probe %s/%s is at %s:0x%x already", ErrExists, el.Group, el.Event, pl.Path, pl.Offset)
		}
	}
	if err := t.write(line); err != nil {
		return nil, t.addError(pl, line, err)
	}
	after, err := t.Events()
	if err != nil {
		return nil, err
	}
	made, ok := created(pl, before, after)
	// The kernel hands uprobe_events out a page per read, each page from
	// the line at its index: a line that another writer removes meanwhile
	// moves the rest up, and a read misses one. Look again before
	// concluding that the line is not there.
	for try := 0; !ok && len(made) == 0 && try < 3; try++ {
		if after, err = t.Events(); err != nil {
			return nil, err
		}
		made, ok = created(pl, before, after)
	}
	if ok {
		return nil, nil
	}
	var errs []error
	for _, el := range made {
		standIns = append(standIns, el.Kind+":"+el.Group+"/"+el.Event)
		if err := t.RemoveProbe(el.Group, el.Event); err != nil {
			errs = append(errs, err)
		}
	}
	if len(standIns) == 0 {
		err := fmt.Errorf("%w: the kernel accepted %s:%s/%s but does not list it", probes.ErrRefused, pl.Kind, pl.Group, pl.Event)
		// Unlisted or not, nothing of a refused line may stay behind.
		if rerr := t.RemoveProbe(pl.Group, pl.Event); rerr != nil && !errors.Is(rerr, syscall.ENOENT) {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	err = fmt.Errorf("%w: the kernel accepted %s:%s/%s but created %s instead (removed): it does not support %s probes",
		probes.ErrRefused, pl.Kind, pl.Group, pl.Event, strings.Join(standIns, ", "), pl.Kind)
	return standIns, errors.Join(append([]error{err}, errs...)...)
}

// created compares the uprobe_events lines before and after the write of
// pl. ok says that the kernel lists pl's GRP/EVENT at pl's file and offset,
// under any kind. Otherwise made is what the write created instead: pl's
// GRP/EVENT at another place, and, for a ptw line, a new event of the
// default group at pl's file and offset (the stand-in a stock kernel makes
// of it: its name comes from the path, not the line). Lines of other
// groups, and lines that were there before, are never counted: other
// writers change uprobe_events meanwhile.
func created(pl ProbeLine, before, after []string) (made []ProbeLine, ok bool) {
	old := make(map[string]bool, len(before))
	for _, l := range before {
		old[l] = true
	}
	for _, l := range after {
		el, err := ParseLine(l)
		if err != nil || old[l] {
			continue
		}
		switch {
		case el.Group == pl.Group && el.Event == pl.Event:
			if sameSite(el, pl) {
				return nil, true
			}
			made = append(made, el)
		case pl.Kind == "ptw" && el.Group == defaultGroup && sameSite(el, pl):
			made = append(made, el)
		}
	}
	return made, false
}

// Installed is a probe that Install added.
type Installed struct {
	// Line is the line the kernel took.
	Line string
	// Untyped says that a ptwrite kernel refused the spec's typed
	// fetchargs and Line has the arguments without their types: each is
	// a u64 payload (a memory argument an 8-byte load), and Event still
	// has the spec's types, so that records print u32/s32/x32 from the
	// low 32 bits as a typed probe's would.
	Untyped bool
	// Event is the probe's event for the decoder, as Event gives it.
	Event *decode.Event
}

// Install adds probe s at file offset off of path (a Binary's FDPath) as
// GRP/EVENT: Line's line, ptw choosing the kind, added by AddProbe, then its
// event read back by Event; an event that cannot be read gets its probe
// removed again. In ptw mode the kernel is asked for the words the stub
// writes (probes.Spec.PTWWire: ptfs formats the narrower and 8-byte types,
// strings are refused before any write). The kernel's document of ptwrite
// uprobes both describes u32/s32/x32 fetchargs and says typed suffixes are
// rejected: when the kernel refuses a ptw: line with typed arguments,
// Install writes it again without the types, and the untyped line's
// success shows that the types were what it refused. When that fails too,
// the error is the typed line's, with the untyped line's reason when it
// differs.
func (t *Tracefs) Install(ptw bool, group, event, path string, off uint64, s *probes.Spec) (*Installed, error) {
	ks := s
	if ptw {
		var err error
		if ks, err = s.PTWWire(); err != nil {
			return nil, err
		}
	}
	line, err := Line(ptw, group, event, path, off, ks)
	if err != nil {
		return nil, err
	}
	in := &Installed{Line: line}
	standIns, err := t.addProbe(line)
	if u := untyped(ks); err != nil && ptw && u != nil && len(standIns) == 0 && errors.Is(err, probes.ErrRefused) {
		uline, lerr := Line(ptw, group, event, path, off, u)
		if lerr != nil {
			return nil, errors.Join(err, lerr)
		}
		if _, uerr := t.addProbe(uline); uerr != nil {
			if uerr.Error() != err.Error() {
				err = fmt.Errorf("%w (without types: %w)", err, uerr)
			}
			return nil, err
		}
		in.Line, in.Untyped, ks, err = uline, true, u, nil
	}
	if err != nil {
		return nil, err
	}
	ev, err := t.Event(group, event, ks)
	if err != nil {
		return nil, errors.Join(err, t.RemoveProbe(group, event))
	}
	// The kernel's fields are the stub's words in ptw mode (u64 when
	// untyped); the records print the spec's types, and cut a ptw
	// bitfield out of its container word (a classic probe's kernel cuts
	// it itself).
	for i := range ev.Args {
		ev.Args[i].Type = s.Args[i].Type
		if ptw {
			ev.Args[i].Bits = s.Args[i].Bits
		}
	}
	in.Event = ev
	return in, nil
}

// untyped returns s with the types of its arguments left out (u64, the
// kernel's default), or nil when none has another type.
func untyped(s *probes.Spec) *probes.Spec {
	if !slices.ContainsFunc(s.Args, func(a probes.Arg) bool { return a.Type != decode.U64 }) {
		return nil
	}
	u := *s
	u.Args = slices.Clone(s.Args)
	for i := range u.Args {
		u.Args[i].Type = decode.U64
	}
	return &u
}

// addError maps a failed uprobe_events write of line to the package's
// errors.
func (t *Tracefs) addError(pl ProbeLine, line string, err error) error {
	reason := t.kernelReason(line)
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("add probe %s/%s: %w", pl.Group, pl.Event, err)
	}
	if reason == "" {
		reason = errno.Error()
	}
	switch errno {
	case syscall.EEXIST:
		return fmt.Errorf("%w: kernel: %s", ErrExists, reason)
	case syscall.EINVAL, syscall.E2BIG, syscall.ERANGE, syscall.EOPNOTSUPP:
		return fmt.Errorf("%w: kernel: %s", probes.ErrRefused, reason)
	}
	return fmt.Errorf("add probe %s/%s: %w (kernel: %s)", pl.Group, pl.Event, errno, reason)
}

// RemoveProbe removes the event GRP/EVENT. A probe that a perf event holds
// or that is enabled cannot go: the error then wraps EBUSY.
func (t *Tracefs) RemoveProbe(group, event string) error {
	cmd := "-:" + group + "/" + event
	err := t.write(cmd)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("remove probe %s/%s: %w: a perf event or an enabled trace still uses it", group, event, err)
	}
	if reason := t.kernelReason(cmd); reason != "" {
		return fmt.Errorf("remove probe %s/%s: %w (kernel: %s)", group, event, err, reason)
	}
	return fmt.Errorf("remove probe %s/%s: %w", group, event, err)
}

// Enable turns tracing of GRP/EVENT on or off through its enable file. A
// ptwrite probe emits PTWRITEs only while enabled; classic probes are
// registered by their perf events instead and are not enabled here. An
// enabled probe cannot be removed: disable it first.
func (t *Tracefs) Enable(group, event string, on bool) error {
	v := "0\n"
	if on {
		v = "1\n"
	}
	f, err := os.OpenFile(t.path("events", group, event, "enable"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("enable %s/%s: %w", group, event, err)
	}
	_, err = f.Write([]byte(v))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("enable %s/%s (write %q): %w", group, event, strings.TrimSpace(v), err)
	}
	return nil
}

// EventID returns the tracefs id of GRP/EVENT: the perf tracepoint config
// and the id in ptwrite headers.
func (t *Tracefs) EventID(group, event string) (uint16, error) {
	return readID(t.events(), group, event)
}

// Event describes GRP/EVENT for the decoder: its id, and per argument of s
// the name the spec gave, the type, and where a classic sample holds it.
// The format file must list exactly the arguments of s, under their names
// and with the sizes of their types.
func (t *Tracefs) Event(group, event string, s *probes.Spec) (*decode.Event, error) {
	ev, err := ReadEvent(t.events(), group, event)
	if err != nil {
		return nil, err
	}
	if ev == nil {
		err = errors.New("no __probe_ip field: not a uprobe event")
	} else {
		err = matchArgs(ev.Args, s)
	}
	if err != nil {
		return nil, fmt.Errorf("event %s/%s: %w", group, event, err)
	}
	return ev, nil
}

// events is the events tree of the mount; as an fs.FS it refuses names
// that would leave the tree (fs.ValidPath: no "..", nothing absolute).
func (t *Tracefs) events() fs.FS { return os.DirFS(t.path("events")) }

// ReadmeMentionsPTW tells whether the tracefs README documents ptw probes,
// the kernel side of ptwrite uprobe support. A stock kernel may still
// accept a ptw: line (making a classic stand-in), so AddProbe verifies every
// write whatever this says.
func (t *Tracefs) ReadmeMentionsPTW() (bool, error) {
	data, err := os.ReadFile(t.path("README"))
	if err != nil {
		return false, fmt.Errorf("read tracefs README: %w", err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "ptw[") || strings.HasPrefix(l, "ptw:") || strings.Contains(l, " ptw[:") {
			return true, nil
		}
	}
	return false, nil
}
