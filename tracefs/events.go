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
// `__probe_ip` field (`__probe_ret_ip` for a return probe), as uprobe,
// kprobe and ptw events do; other events are skipped. The fields after it
// are the arguments: the kernel names an unnamed argument argN (N its
// position from 1), which becomes Name "", so that it prints as a bare
// value. A field of 1, 2, 4 or 8 bytes is s8 to s64 when signed; else x8
// to x32 when the print format shows it in hex (or its declaration names
// an x type), char for a 1-byte one it shows as '%c', else u8 to u64 (an
// 8-byte hex field is the kernel's default type, printed as ptfs prints
// an untyped argument); a __data_loc char[] is a string.
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
		if want := a.Type.Size(); f.Size != want {
			return fmt.Errorf("argument %q has size %d in the format, %d for type %v", a.EffectiveName(i), f.Size, want, a.Type)
		}
		if f.Type.IsString() != a.Type.IsString() {
			return fmt.Errorf("argument %q is %v in the format, %v in the spec", a.EffectiveName(i), f.Type, a.Type)
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
		decls    []string // of the arguments
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
			ev, decls = &decode.Event{}, nil
			continue
		}
		if ev == nil {
			continue // common fields
		}
		decls = append(decls, decl)
		a := decode.Arg{Name: fname, Offset: off, Size: size}
		if fname == "arg"+strconv.Itoa(len(ev.Args)+1) {
			a.Name = ""
		}
		var ok bool
		if a.Type, ok = fieldType(decl, size, signed); !ok {
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
	convs := printConvs(printFmt, len(ev.Args))
	if convs == nil {
		convs = make([]string, len(ev.Args))
	}
	for i := range ev.Args {
		a := &ev.Args[i]
		if a.Type.Signed() || a.Type.IsString() || a.Type.Size() == 8 {
			continue
		}
		switch {
		case strings.Contains(convs[i], "=0x%") || strings.HasPrefix(decls[i], "x"):
			a.Type, _ = decode.IntType(a.Type.Size(), false, true)
		case strings.HasSuffix(convs[i], "='%c'") && a.Type.Size() == 1:
			a.Type = decode.Char
		}
	}
	return ev, nil
}

// fieldType is the type of an argument field as its declaration, size and
// signedness give it: a __data_loc char[] is a string, the others u or s
// of their size. An 8-byte field is u64 unless signed: the kernel's
// default type is x64, which ptfs prints in decimal, as records of an
// untyped argument do.
func fieldType(decl string, size int, signed bool) (decode.ArgType, bool) {
	if strings.HasPrefix(decl, "__data_loc char[] ") {
		return decode.String, size == 4
	}
	return decode.IntType(size, signed, false)
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

// printConvs returns the NAME=CONV of each of the n arguments in a print
// format: the quoted string starts with "(%lx)" for __probe_ip, then one
// conversion per argument; a string's is NAME=\"%s\", escaped quotes
// inside the quoted string. nil when the format does not have that shape.
func printConvs(pf string, n int) []string {
	q1 := strings.IndexByte(pf, '"')
	if q1 < 0 {
		return nil
	}
	end := -1
	for i := q1 + 1; i < len(pf); i++ {
		if pf[i] == '\\' {
			i++
			continue
		}
		if pf[i] == '"' {
			end = i
			break
		}
	}
	if end < 0 {
		return nil
	}
	convs := strings.Fields(pf[q1+1 : end])
	if len(convs) != n+1 {
		return nil
	}
	return convs[1:]
}
