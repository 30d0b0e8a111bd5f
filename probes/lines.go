package probes

import (
	"fmt"
	"strconv"
	"strings"
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

// ClassicLine returns the uprobe_events line of a classic probe:
// "p:GRP/EVENT PATH:0xOFF ARGS". Unnamed arguments stay unnamed (tracefs
// calls them argN); u64 is the default type and is left out. The ptwrite
// options of s do not apply and are left out.
func ClassicLine(group, event, path string, site *Site, s *Spec) string {
	return "p:" + group + "/" + event + " " + path + ":0x" + strconv.FormatUint(site.Offset, 16) + argsText(s.Args)
}

// PTWLine returns the uprobe_events line of a ptwrite probe:
// "ptw:GRP/EVENT PATH:0xOFF[%multinop] ARGS [%nopace]".
func PTWLine(group, event, path string, site *Site, s *Spec) string {
	var b strings.Builder
	b.WriteString("ptw:" + group + "/" + event + " " + path + ":0x" + strconv.FormatUint(site.Offset, 16))
	if s.MultiNop {
		b.WriteString("%multinop")
	}
	b.WriteString(argsText(s.Args))
	if s.NoPace {
		b.WriteString(" %nopace")
	}
	return b.String()
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
// ErrSyntax.
func ParseLine(line string) (ProbeLine, error) {
	var pl ProbeLine
	f := strings.Fields(line)
	if len(f) < 2 {
		return pl, fmt.Errorf("%w: uprobe line %q: want KIND:GRP/EVENT PATH:OFFSET", ErrSyntax, line)
	}
	kind, name, ok := strings.Cut(f[0], ":")
	if !ok || (kind != "p" && kind != "r" && kind != "ptw") {
		return pl, fmt.Errorf("%w: uprobe line %q: unknown kind %q", ErrSyntax, line, kind)
	}
	grp, ev, ok := strings.Cut(name, "/")
	if !ok || grp == "" || ev == "" {
		return pl, fmt.Errorf("%w: uprobe line %q: want GRP/EVENT", ErrSyntax, line)
	}
	i := strings.LastIndexByte(f[1], ':')
	if i <= 0 {
		return pl, fmt.Errorf("%w: uprobe line %q: want PATH:OFFSET", ErrSyntax, line)
	}
	off := f[1][i+1:]
	if j := strings.IndexAny(off, "%("); j >= 0 {
		off = off[:j] // %return, %multinop, (ref_ctr_offset)
	}
	n, err := parseUint(off)
	if err != nil {
		return pl, fmt.Errorf("%w: uprobe line %q: bad offset %q", ErrSyntax, line, off)
	}
	return ProbeLine{Kind: kind, Group: grp, Event: ev, Path: f[1][:i], Offset: n}, nil
}
