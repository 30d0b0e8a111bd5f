package tracefs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"

	"ptfs/decode"
	"ptfs/probes"
)

// ErrBadEvent is returned (wrapped) for an event directory whose id or
// format cannot be parsed.
var ErrBadEvent = errors.New("bad event description")

// LoadEvents reads the probe events of a tracefs events tree (a live one,
// os.DirFS("/sys/kernel/tracing/events"), or a copy): every
// GROUP/EVENT with an `id` and a `format` file whose format has a
// `__probe_ip` field, as uprobe, kprobe and ptw events do; other events are
// skipped. The fields after `__probe_ip` are the arguments: the kernel names
// an unnamed argument argN (N its position from 1), which becomes Name "",
// so that it prints as a bare value. A 4-byte field is s32 when signed, x32
// when the print format shows it in hex, else u32; an 8-byte field is u64.
func LoadEvents(events fs.FS) (map[uint16]*decode.Event, error) {
	groups, err := fs.ReadDir(events, ".")
	if err != nil {
		return nil, fmt.Errorf("load events: %w", err)
	}
	byID := make(map[uint16]*decode.Event)
	for _, g := range groups {
		if !g.IsDir() {
			continue
		}
		evs, err := fs.ReadDir(events, g.Name())
		if errors.Is(err, fs.ErrNotExist) {
			continue // a live tracefs: the group went away since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("load events: %w", err)
		}
		for _, e := range evs {
			if !e.IsDir() {
				continue
			}
			ev, err := ReadEvent(events, g.Name(), e.Name())
			if errors.Is(err, fs.ErrNotExist) {
				continue // no id or format: not an event, or gone since
			}
			if err != nil {
				return nil, fmt.Errorf("load events: %w", err)
			}
			if ev == nil {
				continue
			}
			if old := byID[ev.ID]; old != nil {
				return nil, fmt.Errorf("load events: %s/%s and %s/%s share id %#x: %w",
					old.Group, old.Name, ev.Group, ev.Name, ev.ID, ErrBadEvent)
			}
			byID[ev.ID] = ev
		}
	}
	return byID, nil
}

// ReadEvent reads the event GROUP/NAME of an events tree, the one reader of
// an event's id and format files, live (Tracefs.Event) or from a copy
// (LoadEvents). A missing id or format file gives an error wrapping
// fs.ErrNotExist, a format without `__probe_ip` nil, nil.
func ReadEvent(events fs.FS, group, name string) (*decode.Event, error) {
	dir := group + "/" + name
	data, err := fs.ReadFile(events, dir+"/id")
	if err != nil {
		return nil, fmt.Errorf("event %s: %w", dir, err)
	}
	f, err := events.Open(dir + "/format")
	if err != nil {
		return nil, fmt.Errorf("event %s: %w", dir, err)
	}
	defer f.Close()
	// The id is parsed once the format is known to exist, so that a
	// directory without one is skipped whatever its id says.
	id, err := parseID(dir, data)
	if err != nil {
		return nil, err
	}
	ev, err := ParseFormat(f)
	if err != nil {
		return nil, fmt.Errorf("event %s: %w", dir, err)
	}
	if ev == nil {
		return nil, nil
	}
	ev.ID, ev.Group, ev.Name = id, group, name
	return ev, nil
}

// readID reads the id file of the event GROUP/NAME: the perf tracepoint
// config and the id in ptwrite headers.
func readID(events fs.FS, group, name string) (uint16, error) {
	dir := group + "/" + name
	data, err := fs.ReadFile(events, dir+"/id")
	if err != nil {
		return 0, fmt.Errorf("event %s: %w", dir, err)
	}
	return parseID(dir, data)
}

// parseID parses the contents of the id file of the event directory dir.
func parseID(dir string, data []byte) (uint16, error) {
	text := strings.TrimSpace(string(data))
	id, err := strconv.ParseUint(text, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("event %s: id %q: %w", dir, text, ErrBadEvent)
	}
	return uint16(id), nil
}

// matchArgs checks the argument fields of a format against the arguments
// of s and gives them the spec's types (the format cannot tell u64 from
// x64, nor always x32 from u32).
func matchArgs(args []decode.Arg, s *probes.Spec) error {
	if len(args) != len(s.Args) {
		return fmt.Errorf("format has %d arguments, the spec %d", len(args), len(s.Args))
	}
	for i := range args {
		f, a := &args[i], &s.Args[i]
		if f.Name != a.Name {
			return fmt.Errorf("argument %d is %q in the format, %q in the spec", i+1, f.Name, a.EffectiveName(i))
		}
		want := 8
		if a.Type != decode.U64 {
			want = 4
		}
		if f.Size != want {
			return fmt.Errorf("argument %q has size %d in the format, %d for type %v", a.EffectiveName(i), f.Size, want, a.Type)
		}
		f.Type = a.Type
	}
	return nil
}

// maxFormatSize bounds what ParseFormat reads; real format files are a few
// hundred bytes.
const maxFormatSize = 64 << 10

// ParseFormat parses a tracefs event format file. It returns nil, nil when
// the event is not a probe event (no `__probe_ip` field). Only the Args of
// the result are set; see LoadEvents for the type rules.
func ParseFormat(r io.Reader) (*decode.Event, error) {
	sc := bufio.NewScanner(io.LimitReader(r, maxFormatSize))
	var (
		ev       *decode.Event
		printFmt string
	)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "print fmt:") {
			printFmt = line
			continue
		}
		if !strings.HasPrefix(line, "field:") {
			continue
		}
		decl, off, size, signed, err := parseField(line)
		if err != nil {
			return nil, err
		}
		fname := decl[strings.LastIndexAny(decl, " \t*")+1:]
		// The last fixed field: __probe_ip of an entry probe,
		// __probe_ret_ip (after __probe_func) of a return probe.
		if fname == "__probe_ip" || fname == "__probe_ret_ip" {
			ev = &decode.Event{}
			continue
		}
		if ev == nil {
			continue // common fields
		}
		a := decode.Arg{Name: fname, Offset: off, Size: size}
		if fname == "arg"+strconv.Itoa(len(ev.Args)+1) {
			a.Name = ""
		}
		switch {
		case size == 8:
			a.Type = decode.U64
		case size <= 4 && signed:
			a.Type = decode.S32
		case size <= 4:
			a.Type = decode.U32
			if strings.HasPrefix(decl, "x32 ") {
				a.Type = decode.X32
			}
		default:
			return nil, fmt.Errorf("field %q: size %d: %w", fname, size, ErrBadEvent)
		}
		ev.Args = append(ev.Args, a)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read format: %w", err)
	}
	if ev == nil {
		return nil, nil
	}
	for i := range ev.Args {
		a := &ev.Args[i]
		if a.Type == decode.U32 && hexInPrintFmt(printFmt, i, len(ev.Args)) {
			a.Type = decode.X32
		}
	}
	return ev, nil
}

// parseField parses `field:DECL; offset:N; size:N; signed:N;`.
func parseField(line string) (decl string, off, size int, signed bool, err error) {
	parts := strings.Split(line, ";")
	if len(parts) < 4 {
		return "", 0, 0, false, fmt.Errorf("format line %q: %w", line, ErrBadEvent)
	}
	decl = strings.TrimSpace(strings.TrimPrefix(parts[0], "field:"))
	num := func(s, key string) (int, error) {
		s = strings.TrimSpace(s)
		v, ok := strings.CutPrefix(s, key+":")
		if !ok {
			return 0, fmt.Errorf("format line %q: want %s: %w", line, key, ErrBadEvent)
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("format line %q: %s %q: %w", line, key, v, ErrBadEvent)
		}
		return n, nil
	}
	if off, err = num(parts[1], "offset"); err != nil {
		return
	}
	if size, err = num(parts[2], "size"); err != nil {
		return
	}
	s, err := num(parts[3], "signed")
	if err != nil {
		return
	}
	if decl == "" {
		return "", 0, 0, false, fmt.Errorf("format line %q: no declaration: %w", line, ErrBadEvent)
	}
	return decl, off, size, s != 0, nil
}

// hexInPrintFmt reports whether the print format prints argument i (of n)
// in hex. The format string starts with "(%lx)" for __probe_ip, then one
// NAME=CONV per argument.
func hexInPrintFmt(pf string, i, n int) bool {
	q1 := strings.IndexByte(pf, '"')
	if q1 < 0 {
		return false
	}
	q2 := strings.IndexByte(pf[q1+1:], '"')
	if q2 < 0 {
		return false
	}
	convs := strings.Fields(pf[q1+1 : q1+1+q2])
	if len(convs) != n+1 {
		return false
	}
	return strings.Contains(convs[i+1], "=0x%")
}
