// Package tracefstest simulates the uprobe part of a tracefs kernel over a
// temp dir, so that code driving tracefs.Tracefs can be tested against a
// ptwrite kernel (in the variants its document leaves open: listing its
// probes as p:, refusing lines without fetchargs or with typed ones), a
// stock kernel or one that refuses sites, none of which this machine has. Reads stay plain file reads: the kernel keeps
// uprobe_events, error_log, README and events/GRP/EVENT/{id,format,enable}
// as files, laid out and worded like the real ones (6.18 and the ptwrite
// uprobes RFC); commands reach it through tracefs.Tracefs.Exec.
package tracefstest

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"ptfs/tracefs"
)

// Options says which kernel to simulate.
type Options struct {
	// PTW makes a kernel with ptwrite uprobes: ptw: lines make ptw probes
	// and the README documents them.
	PTW bool
	// QuietReadme leaves ptw out of a PTW kernel's README, so that only a
	// trial write can prove support.
	QuietReadme bool
	// Stock makes a stock kernel (6.18): it reads a ptw: line as a classic
	// probe without a name, creating p:uprobes/p_BASE_0xOFF, and refuses
	// the ptw options. Without PTW or Stock, ptw: lines are accepted and
	// create nothing.
	Stock bool
	// ListPTWAsP makes a PTW kernel list its ptw probes as classic ones
	// ("p:GRP/EVENT PATH:0x%016x ARGS"): the RFC's document never shows
	// how the kernel lists them.
	ListPTWAsP bool
	// RefuseNoArgs makes a PTW kernel refuse a ptw: line without fetchargs
	// (the RFC says 1 to 8 payloads) with EINVAL.
	RefuseNoArgs bool
	// RefuseTypes makes a PTW kernel refuse a ptw: line with a typed
	// fetcharg (":u32" and the like) with EINVAL, as the RFC's perf probe
	// section says it does while its argument syntax documents the types.
	RefuseTypes bool
	// Refuse, when set, is asked about every probe line before it is
	// created; a non-zero errno refuses the line with reason in error_log,
	// as a ptwrite kernel does when punning fails ("failed to install").
	Refuse func(line string) (syscall.Errno, string)
	// FirstID is the id of the first event made (later ones count up);
	// 0 means 2326. A test replaying a recorded trace gives the id its
	// probe headers carry.
	FirstID int
}

// Kernel is a simulated tracefs kernel. Its methods are safe for
// concurrent use.
type Kernel struct {
	// Tracefs reads the kernel's tree and sends commands to Exec.
	Tracefs *tracefs.Tracefs

	opts   Options
	mu     sync.Mutex
	nextID int
	events []*event // in creation order, as uprobe_events lists them
	cmds   []string
	nlog   int
}

// event is one probe the kernel holds.
type event struct {
	group, name string
	listing     string // its line in uprobe_events
	path        string
	offset      uint64
	ptw         bool
}

// maxName is the longest group or event name (MAX_EVENT_NAME_LEN - 1).
const maxName = 63

// readmeHead is the uprobe part of a 6.18 tracefs README.
const readmeHead = "  uprobe_events\t\t- Create/append/remove/show the userspace dynamic events\n" +
	"\t\t\t  Write into this file to define/undefine new trace events.\n" +
	"\t  accepts: event-definitions (one definition per line)\n" +
	"\t   Format: p[:[<group>/][<event>]] <place> [<args>]\n" +
	"\t           r[maxactive][:[<group>/][<event>]] <place> [<args>]\n" +
	"\t           -:[<group>/][<event>]\n"

// readmePTW is the line a ptwrite kernel adds, as the RFC documents it.
const readmePTW = "  ptw[:[GRP/][EVENT]] PATH:OFFSET [FETCHARGS] : set a ptwrite probe\n"

// New makes a kernel in a temp dir that the test removes at its end.
func New(t testing.TB, opts Options) *Kernel {
	t.Helper()
	if opts.PTW && opts.Stock {
		t.Fatal("tracefstest: a kernel is PTW or Stock, not both")
	}
	if !opts.PTW && (opts.ListPTWAsP || opts.RefuseNoArgs || opts.RefuseTypes) {
		t.Fatal("tracefstest: ListPTWAsP, RefuseNoArgs and RefuseTypes are options of a PTW kernel")
	}
	dir := t.TempDir()
	readme := readmeHead
	if opts.PTW && !opts.QuietReadme {
		readme += readmePTW
	}
	for name, text := range map[string]string{"uprobe_events": "", "error_log": "", "README": readme} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	k := &Kernel{opts: opts, nextID: cmp.Or(opts.FirstID, 2326)}
	k.Tracefs = &tracefs.Tracefs{Dir: dir, Exec: k.Exec}
	return k
}

// Commands returns every command Exec received, in order.
func (k *Kernel) Commands() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.cmds...)
}

// refusal is a command the kernel refuses: errno, and the error_log
// message with the column its caret points at (-1: none).
type refusal struct {
	errno syscall.Errno
	msg   string
	col   int
}

func (r *refusal) Error() string { return r.msg }

// Exec runs one uprobe_events command like the kernel: "-:[GRP/]EVENT"
// removes (ENOENT when missing, EBUSY while enabled), a probe line creates
// its event or is refused with EINVAL, ENOENT or Refuse's errno and an
// error_log entry. A line for an existing event name is refused with
// EEXIST (a real kernel appends a classic line with the same arguments to
// the event as a second site; ptfs never asks for that).
//
// Like trace_parse_run_command, it reads what it is given as a C string
// (up to a NUL), one command a line, each cut at a '#' (a comment): a
// write that smuggles in a newline defines more than one probe here as in
// the kernel.
func (k *Kernel) Exec(cmd string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cmds = append(k.cmds, cmd)
	cmd, _, _ = strings.Cut(cmd, "\x00")
	for _, line := range strings.Split(cmd, "\n") {
		line, _, _ = strings.Cut(line, "#")
		if err := k.exec(strings.TrimSpace(line)); err != nil {
			return err
		}
	}
	return nil
}

// exec runs one command line without its comment.
func (k *Kernel) exec(line string) error {
	if line == "" {
		return nil
	}
	var err error
	if rest, ok := strings.CutPrefix(line, "-:"); ok {
		err = k.remove(rest)
	} else {
		err = k.create(line)
	}
	if r, ok := err.(*refusal); ok {
		if r.msg != "" {
			if err := k.logError(line, r); err != nil {
				return err
			}
		}
		return r.errno
	}
	return err
}

// logError appends an error_log entry like trace_probe_log_err's.
func (k *Kernel) logError(line string, r *refusal) error {
	k.nlog++
	entry := fmt.Sprintf("[%5d.%06d] trace_uprobe: error: %s\n  Command: %s\n", 100+k.nlog, 0, r.msg, line)
	if r.col >= 0 {
		entry += strings.Repeat(" ", len("  Command: ")+r.col) + "^\n"
	}
	f, err := os.OpenFile(filepath.Join(k.Tracefs.Dir, "error_log"), os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		_, err = f.WriteString(entry)
		f.Close()
	}
	if err != nil {
		return fmt.Errorf("tracefstest: write error_log: %w", err)
	}
	return nil
}

func (k *Kernel) find(group, name string) int {
	for i, e := range k.events {
		if e.group == group && e.name == name {
			return i
		}
	}
	return -1
}

func (k *Kernel) remove(name string) error {
	group, ev, ok := strings.Cut(name, "/")
	if !ok {
		group, ev = "uprobes", name
	}
	i := k.find(group, ev)
	if i < 0 {
		return &refusal{errno: syscall.ENOENT, col: -1}
	}
	e := k.events[i]
	dir := filepath.Join(k.Tracefs.Dir, "events", e.group, e.name)
	on, err := os.ReadFile(filepath.Join(dir, "enable"))
	if err != nil {
		return fmt.Errorf("tracefstest: %w", err)
	}
	if strings.TrimSpace(string(on)) != "0" {
		return &refusal{errno: syscall.EBUSY, col: -1}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("tracefstest: %w", err)
	}
	// The group directory goes with its last event.
	_ = os.Remove(filepath.Join(k.Tracefs.Dir, "events", e.group))
	k.events = append(k.events[:i], k.events[i+1:]...)
	return k.list()
}

// list rewrites uprobe_events from the events.
func (k *Kernel) list() error {
	var b strings.Builder
	for _, e := range k.events {
		b.WriteString(e.listing + "\n")
	}
	if err := os.WriteFile(filepath.Join(k.Tracefs.Dir, "uprobe_events"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("tracefstest: %w", err)
	}
	return nil
}

// arg is one parsed fetcharg.
type arg struct {
	name, fetch, typ string
}

func (k *Kernel) create(line string) error {
	fields := strings.Fields(line)
	kind, name, named := strings.Cut(fields[0], ":")
	ptw := kind == "ptw"
	switch {
	case kind == "p" || kind == "r":
	case ptw && k.opts.Stock:
		// The stock parser looks at the first letter, and at the second
		// for the ':' of a name: "ptw:NAME" is a "p" without one.
		ptw, kind, named = false, "p", false
	case ptw && !k.opts.PTW:
		return nil
	case ptw:
	default:
		return &refusal{syscall.EINVAL, "Invalid probe type", 0}
	}
	col := len(fields[0]) + 1
	if len(fields) < 2 {
		return &refusal{syscall.EINVAL, "Probe point is not specified", col}
	}
	place := fields[1]
	i := strings.LastIndexByte(place, ':')
	if i <= 0 {
		return &refusal{syscall.EINVAL, "File offset is not specified", col}
	}
	path, offText := place[:i], place[i+1:]
	multinop := false
	if j := strings.IndexByte(offText, '%'); j >= 0 {
		switch sfx := offText[j+1:]; {
		case sfx == "return" && kind == "p":
			kind = "r"
		case sfx == "multinop" && ptw:
			multinop = true
		default:
			return &refusal{syscall.EINVAL, "Invalid probed address suffix", col + i + 1 + j}
		}
		offText = offText[:j]
	}
	off, err := strconv.ParseUint(offText, 0, 64)
	if err != nil {
		return &refusal{syscall.EINVAL, "Invalid file offset", col + i + 1}
	}
	if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() {
		return &refusal{syscall.ENOENT, "Failed to find the given file", col}
	}
	group, ev := "uprobes", ""
	if named && name != "" {
		group, ev, _ = strings.Cut(name, "/")
		if !strings.Contains(name, "/") {
			group, ev = "uprobes", name
		}
		if len(group) > maxName || len(ev) > maxName {
			return &refusal{syscall.EINVAL, "Event or group name is too long", len(kind) + 1}
		}
		if !cIdent(group) || !cIdent(ev) {
			return &refusal{syscall.EINVAL, "Group/Event name must follow the same rules as C identifiers", len(kind) + 1}
		}
	}
	if ev == "" {
		base := filepath.Base(path)
		if j := strings.IndexAny(base, ".-_"); j >= 0 {
			base = base[:j]
		}
		ev = fmt.Sprintf("%c_%s_0x%x", kind[0], base, off)
	}
	col += len(place) + 1
	var args []arg
	nopace := false
	for _, f := range fields[2:] {
		if f == "%nopace" && ptw {
			nopace = true
			col += len(f) + 1
			continue
		}
		a, r := parseArg(f, len(args)+1, ptw, kind == "r")
		if r == nil && ptw && a.typ != "" && k.opts.RefuseTypes {
			r = &refusal{syscall.EINVAL, "Unknown type is specified", len(f) - len(a.typ)}
		}
		if r != nil {
			r.col += col
			return r
		}
		args = append(args, a)
		col += len(f) + 1
	}
	if ptw && len(args) == 0 && k.opts.RefuseNoArgs {
		return &refusal{syscall.EINVAL, "ptwrite probes need 1 to 8 arguments", len(fields[0]) + 1}
	}
	if ptw && len(args) > 8 {
		return &refusal{syscall.E2BIG, "Too many arguments are specified", len(fields[0]) + 1}
	}
	if ptw && kind == "r" {
		return &refusal{syscall.EINVAL, "ptwrite probes cannot be return probes", len(fields[0]) + 1}
	}
	if k.find(group, ev) >= 0 {
		return &refusal{syscall.EEXIST, "Event already exists", len(kind) + 1}
	}
	if ptw {
		for _, e := range k.events {
			if e.ptw && e.path == path && e.offset == off {
				return &refusal{syscall.EEXIST, "A ptwrite probe exists at this site", len(fields[0]) + 1}
			}
		}
	}
	if k.opts.Refuse != nil {
		if errno, why := k.opts.Refuse(line); errno != 0 {
			return &refusal{errno, why, len(fields[0]) + 1}
		}
	}
	listKind := kind
	if ptw && k.opts.ListPTWAsP {
		listKind = "p"
	}
	return k.add(&event{group: group, name: ev, path: path, offset: off, ptw: ptw,
		listing: listing(listKind, group, ev, path, off, multinop, nopace, args)})
}

// listing is the uprobe_events line of a probe: as 6.18 prints classic
// ones (zero-padded offset, every argument named), and for ptw ones the
// "ptw:GRP/EVENT PATH:0xOFF ARGS" of the RFC with its options, or, listed
// as kind p (ListPTWAsP), the classic form with the options.
func listing(kind, group, ev, path string, off uint64, multinop, nopace bool, args []arg) string {
	var b strings.Builder
	if kind == "ptw" {
		fmt.Fprintf(&b, "ptw:%s/%s %s:0x%x", group, ev, path, off)
	} else {
		fmt.Fprintf(&b, "%s:%s/%s %s:0x%016x", kind, group, ev, path, off)
	}
	if multinop {
		b.WriteString("%multinop")
	}
	for _, a := range args {
		b.WriteString(" " + a.name + "=" + a.fetch)
		if a.typ != "" {
			b.WriteString(":" + a.typ)
		}
	}
	if nopace {
		b.WriteString(" %nopace")
	}
	return b.String()
}

func (k *Kernel) add(e *event) error {
	dir := filepath.Join(k.Tracefs.Dir, "events", e.group, e.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("tracefstest: %w", err)
	}
	id := k.nextID
	k.nextID++
	_, argText, _ := strings.Cut(e.listing, " ")
	_, argText, _ = strings.Cut(argText, " ")
	files := map[string]string{
		"id":     strconv.Itoa(id) + "\n",
		"enable": "0\n",
		"format": formatFile(e.name, id, argText, strings.HasPrefix(e.listing, "r:")),
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return fmt.Errorf("tracefstest: %w", err)
		}
	}
	k.events = append(k.events, e)
	return k.list()
}

// fieldType is how a format file shows a fetcharg type: the field's C
// type, its size, signedness and print format.
type fieldType struct {
	ctype  string
	size   int
	signed bool
	print  string
}

var fieldTypes = map[string]fieldType{
	"u8": {"u8", 1, false, "%u"}, "u16": {"u16", 2, false, "%u"}, "u32": {"u32", 4, false, "%u"}, "u64": {"u64", 8, false, "%Lu"},
	"s8": {"s8", 1, true, "%d"}, "s16": {"s16", 2, true, "%d"}, "s32": {"s32", 4, true, "%d"}, "s64": {"s64", 8, true, "%Ld"},
	"x8": {"u8", 1, false, "0x%x"}, "x16": {"u16", 2, false, "0x%x"}, "x32": {"u32", 4, false, "0x%x"}, "x64": {"u64", 8, false, "0x%Lx"},
	"char": {"u8", 1, false, "'%c'"}, "string": {"__data_loc char[]", 4, true, `\"%s\"`}, "ustring": {"__data_loc char[]", 4, true, `\"%s\"`},
}

// bitfieldType returns the field of a b<width>@<offset>/<container> type as
// 6.18 shows it: the container's unsigned type, the bits cut out.
func bitfieldType(typ string) (fieldType, bool) {
	var w, o, c int
	if n, err := fmt.Sscanf(typ, "b%d@%d/%d", &w, &o, &c); err != nil || n != 3 || w < 1 || w+o > c {
		return fieldType{}, false
	}
	ft, ok := fieldTypes["u"+strconv.Itoa(c)]
	return ft, ok
}

// lookupType returns the field of a fetcharg type.
func lookupType(typ string) (fieldType, bool) {
	if ft, ok := fieldTypes[typ]; ok {
		return ft, true
	}
	return bitfieldType(typ)
}

// ptwTypes are the types the ptwrite stub can write.
var ptwTypes = map[string]bool{"u64": true, "u32": true, "s32": true, "x32": true}

// formatFile writes the format file of a uprobe event with the arguments
// of its listing, packed after __probe_ip (a return probe's __probe_func
// and __probe_ret_ip) as the kernel packs them.
func formatFile(name string, id int, args string, ret bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\nID: %d\nformat:\n", name, id)
	b.WriteString("\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n" +
		"\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n" +
		"\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n" +
		"\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n")
	prints, refs := []string{"(%lx)"}, []string{"REC->__probe_ip"}
	off := 16
	if ret {
		b.WriteString("\tfield:unsigned long __probe_func;\toffset:8;\tsize:8;\tsigned:0;\n" +
			"\tfield:unsigned long __probe_ret_ip;\toffset:16;\tsize:8;\tsigned:0;\n")
		prints, refs = []string{"(%lx <- %lx)"}, []string{"REC->__probe_func", "REC->__probe_ret_ip"}
		off = 24
	} else {
		b.WriteString("\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n")
	}
	for _, f := range strings.Fields(args) {
		if f == "%nopace" {
			continue
		}
		n, rest, _ := strings.Cut(f, "=")
		typ := "x64"
		if j := strings.LastIndexByte(rest, ':'); j >= 0 {
			typ = rest[j+1:]
		}
		ft, _ := lookupType(typ)
		s := 0
		if ft.signed {
			s = 1
		}
		fmt.Fprintf(&b, "\tfield:%s %s;\toffset:%d;\tsize:%d;\tsigned:%d;\n", ft.ctype, n, off, ft.size, s)
		off += ft.size
		prints = append(prints, n+"="+ft.print)
		if strings.HasPrefix(ft.ctype, "__data_loc") {
			refs = append(refs, "__get_str("+n+")")
		} else {
			refs = append(refs, "REC->"+n)
		}
	}
	fmt.Fprintf(&b, "\nprint fmt: \"%s\", %s\n", strings.Join(prints, " "), strings.Join(refs, ", "))
	return b.String()
}

// x86Regs are the register names of x86-64 fetchargs.
var x86Regs = map[string]bool{}

func init() {
	for _, r := range strings.Fields("ax bx cx dx si di bp sp ip flags cs ss r8 r9 r10 r11 r12 r13 r14 r15") {
		x86Regs[r] = true
	}
}

// parseArg parses the n-th argument "[NAME=]FETCHARG[:TYPE]" of a probe
// line (of a return probe when ret); the refusal's column is relative to
// the argument.
func parseArg(f string, n int, ptw, ret bool) (arg, *refusal) {
	a := arg{name: "arg" + strconv.Itoa(n)}
	fetch := f
	if i := strings.IndexByte(f, '='); i >= 0 {
		a.name, fetch = f[:i], f[i+1:]
		if !cIdent(a.name) {
			return a, &refusal{syscall.EINVAL, "Invalid argument name", 0}
		}
	}
	at := len(f) - len(fetch)
	if i := strings.LastIndexByte(fetch, ':'); i >= 0 {
		a.typ = fetch[i+1:]
		fetch = fetch[:i]
		if _, ok := lookupType(a.typ); !ok || ptw && !ptwTypes[a.typ] {
			return a, &refusal{syscall.EINVAL, "Unknown type is specified", at + i + 1}
		}
	}
	a.fetch = fetch
	if strings.HasSuffix(a.typ, "string") && !strings.HasSuffix(fetch, ")") {
		return a, &refusal{syscall.EINVAL, "String type must be used with pointer deref", at}
	}
	switch {
	case strings.HasPrefix(fetch, "%"):
		if !x86Regs[fetch[1:]] {
			return a, &refusal{syscall.EINVAL, "Invalid register name", at}
		}
	case strings.HasPrefix(fetch, `\`):
		if _, err := strconv.ParseInt(fetch[1:], 0, 64); err != nil {
			if _, err := strconv.ParseUint(fetch[1:], 0, 64); err != nil {
				return a, &refusal{syscall.EINVAL, "Invalid immediate value", at}
			}
		}
	case fetch == "$stack":
	case fetch == "$retval":
		if !ret {
			return a, &refusal{syscall.EINVAL, "$retval is only for return probes", at}
		}
	case strings.HasPrefix(fetch, "$stack"):
		if _, err := strconv.ParseUint(fetch[len("$stack"):], 10, 16); err != nil {
			return a, &refusal{syscall.EINVAL, "Invalid $-variable specified", at}
		}
	case strings.HasPrefix(fetch, "+") || strings.HasPrefix(fetch, "-"):
		disp, reg, ok := strings.Cut(fetch[1:], "(")
		if _, err := strconv.ParseInt(disp, 0, 64); err != nil || !ok {
			return a, &refusal{syscall.EINVAL, "Invalid offset", at}
		}
		if !strings.HasSuffix(reg, ")") || !strings.HasPrefix(reg, "%") || !x86Regs[reg[1:len(reg)-1]] {
			return a, &refusal{syscall.EINVAL, "Invalid register name", at + 2 + len(disp)}
		}
	default:
		return a, &refusal{syscall.EINVAL, "Invalid fetch argument", at}
	}
	return a, nil
}

// cIdent tells whether s is a C identifier.
func cIdent(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
