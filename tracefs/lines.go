package tracefs

import (
	"fmt"
	"strconv"
	"strings"

	"ptfs/probes"
)

// maxEventName is the longest group or event name tracefs accepts
// (MAX_EVENT_NAME_LEN is 64 with the terminating NUL).
const maxEventName = 63

// GroupName returns the tracefs group of the probes that process pid
// installs on target: "ptfs<PID>_<target>" with target reduced to
// [A-Za-z0-9_] and the whole cut to the length tracefs accepts. The PID
// lets a later mount find and remove the probes of a dead one.
func GroupName(pid int, target string) string {
	return cut(sanitize("ptfs"+strconv.Itoa(pid)+"_"+target), maxEventName)
}

// EventName returns the tracefs event name for the probe file name probe:
// a C identifier of at most 63 bytes. Distinct names may map to the same
// event name ("a.b", "a-b"); AddProbe then reports ErrExists.
func EventName(probe string) string {
	n := sanitize(probe)
	if n == "" || n[0] >= '0' && n[0] <= '9' {
		n = "_" + n
	}
	return cut(n, maxEventName)
}

// Numbered returns the n-th variant of a group or event name for n > 1:
// name with "_n" behind it, cut so that the whole stays within the length
// tracefs accepts. It tells apart names that sanitising made equal, and a
// replacement probe from the probe it replaces.
func Numbered(name string, n int) string {
	if n <= 1 {
		return name
	}
	suffix := "_" + strconv.Itoa(n)
	return cut(name, maxEventName-len(suffix)) + suffix
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

func cut(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// ClassicLine returns the uprobe_events line of a classic probe at file
// offset off:
// "p:GRP/EVENT PATH:0xOFF ARGS", or "r:..." for a return probe (%return).
// Unnamed arguments stay unnamed (tracefs calls them argN); u64 is the
// default type and is left out. The ptwrite options of s do not apply and
// are left out, and so do %pid and %comm: ptfs filters the records.
func ClassicLine(group, event, path string, off uint64, s *probes.Spec) string {
	kind := "p:"
	if s.Return {
		kind = "r:"
	}
	return kind + group + "/" + event + " " + path + ":0x" + strconv.FormatUint(off, 16) + probes.ArgsText(s.Args)
}

// PTWLine returns the uprobe_events line of a ptwrite probe at file offset
// off:
// "ptw:GRP/EVENT PATH:0xOFF[%multinop] ARGS [%nopace]".
func PTWLine(group, event, path string, off uint64, s *probes.Spec) string {
	var b strings.Builder
	b.WriteString("ptw:" + group + "/" + event + " " + path + ":0x" + strconv.FormatUint(off, 16))
	if s.MultiNop {
		b.WriteString("%multinop")
	}
	b.WriteString(probes.ArgsText(s.Args))
	if s.NoPace {
		b.WriteString(" %nopace")
	}
	return b.String()
}

// maxPath is the longest path the kernel resolves (PATH_MAX without the NUL).
const maxPath = 4095

// CheckCommand checks one uprobe_events command before it is written, as
// the last gate between user input and the kernel: the kernel splits what
// it is given into lines, drops what follows '#' and reads names, paths and
// fetchargs by their own delimiters, so anything but the exact grammar
// could define a probe nobody asked for. It takes "-:GRP/EVENT" and the
// lines of ClassicLine and PTWLine: "p:GRP/EVENT PATH:0xOFF [ARG...]" (or
// "r:" for a return probe, the only kind that may fetch $retval) and
// "ptw:GRP/EVENT PATH:0xOFF[%multinop] [ARG...] [%nopace]", tokens split
// by single spaces, GRP and EVENT C identifiers of at most 63 bytes, PATH
// absolute of at most 4095 bytes in [A-Za-z0-9._/+,@~-], and every ARG
// exactly as the spec parser prints it (in a ptw line, only of the types
// probes.Spec.PTWWire gives). Errors wrap ErrBadLine.
func CheckCommand(cmd string) error {
	if rest, ok := strings.CutPrefix(cmd, "-:"); ok {
		grp, ev, _ := strings.Cut(rest, "/")
		if !probes.IsIdent(grp, maxEventName) || !probes.IsIdent(ev, maxEventName) {
			return badLine(cmd, "want -:GRP/EVENT with C identifiers")
		}
		return nil
	}
	toks := strings.Split(cmd, " ")
	if len(toks) < 2 {
		return badLine(cmd, "want KIND:GRP/EVENT PATH:OFFSET [ARG...]")
	}
	kind, name, _ := strings.Cut(toks[0], ":")
	if kind != "p" && kind != "r" && kind != "ptw" {
		return badLine(cmd, "kind is not p, r or ptw")
	}
	grp, ev, _ := strings.Cut(name, "/")
	if !probes.IsIdent(grp, maxEventName) || !probes.IsIdent(ev, maxEventName) {
		return badLine(cmd, "group and event must be C identifiers of at most 63 bytes")
	}
	i := strings.LastIndexByte(toks[1], ':')
	if i < 0 {
		return badLine(cmd, "want PATH:OFFSET")
	}
	if err := checkPath(toks[1][:i]); err != nil {
		return badLine(cmd, err.Error())
	}
	off := toks[1][i+1:]
	if kind == "ptw" {
		off = strings.TrimSuffix(off, "%multinop")
	}
	if h, ok := strings.CutPrefix(off, "0x"); !ok || h == "" || len(h) > 16 || strings.Trim(h, "0123456789abcdef") != "" {
		return badLine(cmd, "offset is not 0x and lower-case hex digits")
	}
	args := toks[2:]
	if kind == "ptw" && len(args) > 0 && args[len(args)-1] == "%nopace" {
		args = args[:len(args)-1]
	}
	if len(args) > probes.MaxArgs {
		return badLine(cmd, "too many arguments")
	}
	for _, tok := range args {
		// An argument must be the spec parser's own text for it: that
		// admits only names, registers, numbers and the fetch syntax.
		a, err := probes.ParseArg(tok)
		if err != nil || probes.ArgsText([]probes.Arg{a}) != " "+tok {
			return badLine(cmd, fmt.Sprintf("argument %q is not in canonical form", tok))
		}
		if a.Fetch == "$retval" && kind != "r" {
			return badLine(cmd, "$retval outside a return probe")
		}
		// ptfs asks a ptwrite kernel only for the words its stub writes.
		if kind == "ptw" {
			if w, err := (&probes.Spec{Args: []probes.Arg{a}}).PTWWire(); err != nil || w.Args[0] != a {
				return badLine(cmd, fmt.Sprintf("argument %q has a type that ptw lines do not take", tok))
			}
		}
	}
	return nil
}

// checkPath accepts the path of a probe line: absolute, at most maxPath
// bytes, of characters that neither the kernel's line parser nor its
// comment syntax give a meaning. ptfs itself writes only /proc/PID/fd/N.
func checkPath(path string) error {
	if !strings.HasPrefix(path, "/") || len(path) > maxPath {
		return fmt.Errorf("path must be absolute and at most %d bytes", maxPath)
	}
	for i := 0; i < len(path); i++ {
		c := path[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._/+,@~-", c) >= 0 {
			continue
		}
		return fmt.Errorf("byte %q at %d of the path is not allowed", c, i)
	}
	return nil
}

func badLine(cmd, why string) error {
	return fmt.Errorf("%w: %q: %s", ErrBadLine, cmd, why)
}

// Line returns the checked uprobe_events line of probe s at file offset off, as
// group/event on the file path (a Binary's FDPath): PTWLine's when ptw is
// set, else ClassicLine's. Every argument must be exactly what the spec
// parser makes of its own text, so that no fragment carries a byte outside
// the grammar nor splits into two arguments, and the whole line must pass
// CheckCommand. Errors wrap ErrBadLine.
func Line(ptw bool, group, event, path string, off uint64, s *probes.Spec) (string, error) {
	for _, a := range s.Args {
		text := probes.ArgsText([]probes.Arg{a})[1:]
		if b, err := probes.ParseArg(text); err != nil || b != a {
			return "", fmt.Errorf("%w: argument %q is not one canonical fetch argument", ErrBadLine, text)
		}
	}
	line := ClassicLine(group, event, path, off, s)
	if ptw {
		if s.Return {
			return "", fmt.Errorf("%w: ptwrite uprobes take no return probes (%%return)", probes.ErrRefused)
		}
		line = PTWLine(group, event, path, off, s)
	}
	if err := CheckCommand(line); err != nil {
		return "", err
	}
	return line, nil
}

// ProbeLine is the head of one uprobe_events line.
type ProbeLine struct {
	// Kind is the prefix before the colon: "p", "r" or "ptw".
	Kind         string
	Group, Event string
	Path         string
	Offset       uint64
}

// ParseLine parses the kind, names and place of a uprobe_events line as the
// kernel lists it or as ClassicLine and PTWLine write it. Errors wrap
// probes.ErrSyntax.
func ParseLine(line string) (ProbeLine, error) {
	var pl ProbeLine
	f := strings.Fields(line)
	if len(f) < 2 {
		return pl, fmt.Errorf("%w: uprobe line %q: want KIND:GRP/EVENT PATH:OFFSET", probes.ErrSyntax, line)
	}
	kind, name, ok := strings.Cut(f[0], ":")
	if !ok || (kind != "p" && kind != "r" && kind != "ptw") {
		return pl, fmt.Errorf("%w: uprobe line %q: unknown kind %q", probes.ErrSyntax, line, kind)
	}
	grp, ev, ok := strings.Cut(name, "/")
	if !ok || grp == "" || ev == "" {
		return pl, fmt.Errorf("%w: uprobe line %q: want GRP/EVENT", probes.ErrSyntax, line)
	}
	i := strings.LastIndexByte(f[1], ':')
	if i <= 0 {
		return pl, fmt.Errorf("%w: uprobe line %q: want PATH:OFFSET", probes.ErrSyntax, line)
	}
	off := f[1][i+1:]
	if j := strings.IndexAny(off, "%("); j >= 0 {
		off = off[:j] // %return, %multinop, (ref_ctr_offset)
	}
	n, err := probes.ParseUint(off)
	if err != nil {
		return pl, fmt.Errorf("%w: uprobe line %q: bad offset %q", probes.ErrSyntax, line, off)
	}
	return ProbeLine{Kind: kind, Group: grp, Event: ev, Path: f[1][:i], Offset: n}, nil
}
