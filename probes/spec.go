package probes

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"ptfs/decode"
)

// MaxArgs is the most fetch arguments one probe takes (the ptwrite header
// counts them in a byte, the stub emits at most eight).
const MaxArgs = 8

// maxArgName is the longest argument name tracefs accepts (MAX_ARG_NAME_LEN
// is 32 with the terminating NUL).
const maxArgName = 31

// maxPID is the largest process id a Linux kernel gives (PID_MAX_LIMIT).
const maxPID = 1 << 22

// maxComm is the longest process name the kernel keeps (TASK_COMM_LEN is
// 16 with the terminating NUL).
const maxComm = 15

// optionsHelp lists the options for error messages.
const optionsHelp = "options: %nopace, %multinop, %return, %pid=N, %comm=NAME"

// maxStackSlot bounds $stackN so that the slot offset 8*N fits the signed
// 32-bit displacement that a ptwrite stub load encodes.
const maxStackSlot = (1<<31 - 1) / 8

// registers are the x86-64 register names that the kernel's
// regs_query_register_offset accepts (arch/x86/kernel/ptrace.c,
// CONFIG_X86_64): no r/e prefixes, no segment registers but cs and ss.
var registers = map[string]bool{
	"ax": true, "bx": true, "cx": true, "dx": true,
	"si": true, "di": true, "bp": true, "sp": true,
	"r8": true, "r9": true, "r10": true, "r11": true,
	"r12": true, "r13": true, "r14": true, "r15": true,
	"ip": true, "flags": true, "cs": true, "ss": true, "orig_ax": true,
}

// Spec is a parsed probe spec: `SITE [OPTION...] [ARG...]`.
type Spec struct {
	// Symbol names the function the site is relative to; empty when the
	// site is a plain file offset.
	Symbol string
	// Offset is the file offset of the site when Symbol is empty, else the
	// byte offset from the start of Symbol.
	Offset uint64
	// NoPace drops the LFENCE between ptwrite words (%nopace).
	NoPace bool
	// MultiNop marks a site of five 1-byte NOPs (%multinop).
	MultiNop bool
	// Return makes a return probe (%return): it fires when the function
	// at the site returns, and $retval fetches the return value. The site
	// must be a function's entry.
	Return bool
	// PID keeps only the records of one process (%pid=N); 0 keeps all.
	PID int32
	// Comm keeps only the records of processes of that name (%comm=NAME,
	// at most 15 bytes as the kernel keeps names); "" keeps all.
	Comm string
	// Args are the fetch arguments, at most MaxArgs.
	Args []Arg
}

// AtRet returns the spec of the probe that stands in for return probe s
// on one ret of its function (ptw mode): an entry probe with the same
// options and arguments, $retval fetched from %ax, where the ret finds it.
func AtRet(s *Spec) *Spec {
	r := *s
	r.Return = false
	r.Args = slices.Clone(s.Args)
	for i := range r.Args {
		if r.Args[i].Fetch == "$retval" {
			r.Args[i].Fetch = "%ax"
		}
	}
	return &r
}

// Filter returns the record filter of the spec's %pid and %comm.
func (s *Spec) Filter() decode.Filter { return decode.Filter{PID: s.PID, Comm: s.Comm} }

// Arg is one fetch argument of a spec.
type Arg struct {
	// Name is the name the spec gave, or "" (tracefs then names it argN).
	Name string
	// Fetch is the fetch expression in canonical tracefs text, such as
	// "%di", "\\0x2a", "$stack2" or "+8(%si)".
	Fetch string
	// Type is the argument type; U64 when the spec gave none. For a
	// bitfield it is the container's unsigned type.
	Type decode.ArgType
	// Bits is the bitfield of a b<width>@<offset>/<container> type.
	Bits decode.Bitfield
}

// EffectiveName returns the name tracefs gives argument i (counted from 0)
// of a probe: its own name, or argN counted from 1.
func (a *Arg) EffectiveName(i int) string {
	if a.Name != "" {
		return a.Name
	}
	return "arg" + strconv.Itoa(i+1)
}

func syntaxErr(format string, v ...any) error {
	return fmt.Errorf("%w: %s", ErrSyntax, fmt.Sprintf(format, v...))
}

// Parse parses a probe spec: one line, which may end with a `# comment`
// (SpecLine), its site a symbol in double quotes when it has spaces.
// Errors wrap ErrSyntax and quote the offending token.
func Parse(text string) (*Spec, error) {
	text, err := SpecLine(text)
	if err != nil {
		return nil, err
	}
	s := &Spec{}
	if s.Symbol, text, err = cutQuoted(text); err != nil {
		return nil, err
	}
	toks := strings.Fields(text)
	if len(toks) == 0 {
		return nil, syntaxErr("empty spec (want SITE [OPTION...] [ARG...]; %s)", optionsHelp)
	}
	site, glued, _ := strings.Cut(toks[0], "%")
	if err := s.parseSite(site, toks[0]); err != nil {
		return nil, err
	}
	if strings.Contains(toks[0], "%") {
		for _, o := range strings.Split(glued, "%") {
			if err := s.option("%"+o, toks[0]); err != nil {
				return nil, err
			}
		}
	}
	for _, t := range toks[1:] {
		if isOption(t) {
			if err := s.option(t, t); err != nil {
				return nil, err
			}
			continue
		}
		if len(s.Args) == MaxArgs {
			return nil, syntaxErr("too many arguments at %q (at most %d)", t, MaxArgs)
		}
		a, err := ParseArg(t)
		if err != nil {
			return nil, err
		}
		s.Args = append(s.Args, a)
	}
	if err := checkNames(s.Args); err != nil {
		return nil, err
	}
	if !s.Return {
		for _, a := range s.Args {
			if a.Fetch == "$retval" {
				return nil, syntaxErr("$retval needs %%return (a return probe): %q", text)
			}
		}
	}
	return s, nil
}

// isOption tells option tokens from register fetches: both start with '%'.
func isOption(t string) bool {
	if strings.HasPrefix(t, "%pid=") || strings.HasPrefix(t, "%comm=") {
		return true
	}
	if !strings.HasPrefix(t, "%") || strings.ContainsAny(t, ":=") {
		return false
	}
	return !registers[t[1:]]
}

func (s *Spec) option(o, tok string) error {
	switch o {
	case "%nopace":
		if s.NoPace {
			return syntaxErr("duplicate option %q", tok)
		}
		s.NoPace = true
	case "%multinop":
		if s.MultiNop {
			return syntaxErr("duplicate option %q", tok)
		}
		s.MultiNop = true
	case "%return":
		if s.Return {
			return syntaxErr("duplicate option %q", tok)
		}
		s.Return = true
	default:
		if v, ok := strings.CutPrefix(o, "%pid="); ok {
			return s.pidOption(v, tok)
		}
		if v, ok := strings.CutPrefix(o, "%comm="); ok {
			return s.commOption(v, tok)
		}
		if o != tok {
			return syntaxErr("unknown option %q in %q (%s)", o, tok, optionsHelp)
		}
		return syntaxErr("unknown option or register %q (%s)", o, optionsHelp)
	}
	return nil
}

func (s *Spec) pidOption(v, tok string) error {
	if s.PID != 0 {
		return syntaxErr("duplicate option %q", tok)
	}
	n, err := ParseUint(v)
	if err != nil || isHex(v) || n == 0 || n > maxPID {
		return syntaxErr("bad %%pid=%s in %q: want a decimal process id from 1 to %d", v, tok, maxPID)
	}
	s.PID = int32(n)
	return nil
}

func (s *Spec) commOption(v, tok string) error {
	if s.Comm != "" {
		return syntaxErr("duplicate option %q", tok)
	}
	if v == "" || len(v) > maxComm {
		return syntaxErr("bad %%comm=%s in %q: want a process name of 1 to %d bytes (the kernel keeps %d)", v, tok, maxComm, maxComm)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f {
			return syntaxErr("bad %%comm= in %q: byte %q is not printable ASCII", tok, c)
		}
	}
	s.Comm = v
	return nil
}

func (s *Spec) parseSite(site, tok string) error {
	if s.Symbol != "" {
		return s.parseQuotedSite(site, tok)
	}
	if site == "" {
		return syntaxErr("missing site (a file offset, SYMBOL or SYMBOL+OFFSET) before %q", "%")
	}
	if c := site[0]; c >= '0' && c <= '9' {
		off, err := ParseUint(site)
		if err != nil {
			return syntaxErr("bad file offset %q: %v", site, err)
		}
		s.Offset = off
		return nil
	}
	if strings.ContainsAny(site[:1], "$\\+-=:()@\"") || strings.Contains(site, "=") {
		return syntaxErr("bad site %q (want a file offset, SYMBOL or SYMBOL+OFFSET)", tok)
	}
	sym, off, ok := strings.Cut(site, "+")
	if ok {
		n, err := ParseUint(off)
		if err != nil {
			return syntaxErr("bad offset %q in site %q: %v", off, site, err)
		}
		s.Offset = n
	}
	s.Symbol = sym
	return nil
}

// ParseUint parses what tracefs parses for an offset, minus the octal that
// kstrtoul's base 0 would make of a leading zero: decimal, or hex after 0x.
func ParseUint(t string) (uint64, error) {
	if h, ok := strings.CutPrefix(t, "0x"); ok || strings.HasPrefix(t, "0X") {
		if !ok {
			h = t[2:]
		}
		if h == "" || strings.ContainsAny(h[:1], "+-_") {
			return 0, fmt.Errorf("want hex digits after 0x")
		}
		v, err := strconv.ParseUint(h, 16, 64)
		if err != nil {
			return 0, numErr(err)
		}
		return v, nil
	}
	if t == "" || t[0] < '0' || t[0] > '9' {
		return 0, fmt.Errorf("want a decimal or 0x-prefixed hex number")
	}
	if len(t) > 1 && t[0] == '0' {
		return 0, fmt.Errorf("leading zero (octal to the kernel): write decimal or 0x hex")
	}
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, numErr(err)
	}
	return v, nil
}

func numErr(err error) error {
	if ne, ok := err.(*strconv.NumError); ok {
		if ne.Err == strconv.ErrRange {
			return fmt.Errorf("out of range")
		}
		return fmt.Errorf("not a number")
	}
	return err
}

// formatUint prints v the way it was written: hex stays hex.
func formatUint(v uint64, hex bool) string {
	if hex {
		return "0x" + strconv.FormatUint(v, 16)
	}
	return strconv.FormatUint(v, 10)
}

func isHex(t string) bool { return strings.HasPrefix(t, "0x") || strings.HasPrefix(t, "0X") }

// ParseArg parses one fetch argument as a spec writes it:
// [NAME=]FETCH[:TYPE]. Errors wrap ErrSyntax.
func ParseArg(t string) (Arg, error) {
	var a Arg
	body := t
	if n, rest, ok := strings.Cut(t, "="); ok {
		if err := checkName(n, t); err != nil {
			return a, err
		}
		a.Name, body = n, rest
	}
	if i := strings.LastIndexByte(body, ':'); i >= 0 {
		if err := a.parseType(body[i+1:], t); err != nil {
			return a, err
		}
		body = body[:i]
	}
	f, err := parseFetch(body)
	if err != nil {
		return a, syntaxErr("bad argument %q: %v", t, err)
	}
	if a.Type.IsString() && !strings.HasSuffix(f, ")") {
		return a, syntaxErr("argument %q: %v reads a string from memory: want +DISP(%%REG):%v, such as +0(%%si):%v", t, a.Type, a.Type, a.Type)
	}
	a.Fetch = f
	return a, nil
}

// parseType sets the type of a from its spelling t in token tok: one of
// the kernel's type names, or a bitfield.
func (a *Arg) parseType(t, tok string) error {
	if typ, ok := decode.ParseArgType(t); ok {
		a.Type = typ
		return nil
	}
	switch {
	case strings.HasPrefix(t, "b") && strings.ContainsAny(t, "@/"):
		return a.parseBitfield(t, tok)
	case t == "symbol" || t == "symstr":
		return syntaxErr("type %q in %q: the kernel resolves %s only in kernel probes, not in uprobes (x64 prints the address)", t, tok, t)
	}
	return syntaxErr("unsupported type %q in %q (types: %s, b<width>@<offset>/<8|16|32|64>)", t, tok, strings.Join(decode.ArgTypeNames(), " "))
}

// parseBitfield parses b<width>@<offset>/<container bits>, in decimal as
// ArgsText prints it: the kernel reads it with base 0, so a leading zero
// would be octal to it.
func (a *Arg) parseBitfield(t, tok string) error {
	bad := func(why string) error {
		return syntaxErr("bad bitfield %q in %q: %s (want b<width>@<offset>/<8|16|32|64>, such as b4@2/32)", t, tok, why)
	}
	w, rest, ok1 := strings.Cut(t[1:], "@")
	o, c, ok2 := strings.Cut(rest, "/")
	if !ok1 || !ok2 {
		return bad("missing @ or /")
	}
	var n [3]uint64
	for i, d := range []string{w, o, c} {
		v, err := ParseUint(d)
		if err != nil || isHex(d) || v > 64 {
			return bad(fmt.Sprintf("%q is not a decimal number up to 64", d))
		}
		n[i] = v
	}
	typ, ok := decode.IntType(int(n[2]/8), false, false)
	switch {
	case !ok || n[2]%8 != 0:
		return bad("the container is 8, 16, 32 or 64 bits")
	case n[0] == 0:
		return bad("the width is at least 1")
	case n[0]+n[1] > n[2]:
		return bad(fmt.Sprintf("bits %d to %d lie outside the %d-bit container", n[1], n[1]+n[0]-1, n[2]))
	}
	a.Type, a.Bits = typ, decode.Bitfield{Width: uint8(n[0]), Offset: uint8(n[1])}
	return nil
}

// parseFetch validates the fetch arguments ptfs takes (those ptwrite probes
// take too) and returns its canonical text.
func parseFetch(f string) (string, error) {
	switch {
	case f == "":
		return "", fmt.Errorf("empty fetch argument")
	case f[0] == '%':
		if !registers[f[1:]] {
			return "", fmt.Errorf("unknown register %q (x86-64 uprobes take ax bx cx dx si di bp sp r8..r15 ip flags cs ss orig_ax)", f)
		}
		return f, nil
	case f[0] == '\\':
		return parseImm(f[1:])
	case f == "$stack", f == "$retval":
		return f, nil
	case strings.HasPrefix(f, "$stack"):
		n, err := ParseUint(f[6:])
		if err != nil || isHex(f[6:]) {
			return "", fmt.Errorf("bad stack slot %q: want $stack or $stackN with decimal N", f)
		}
		if n > maxStackSlot {
			return "", fmt.Errorf("stack slot %q out of range (at most %d)", f, maxStackSlot)
		}
		return "$stack" + strconv.FormatUint(n, 10), nil
	case f[0] == '+' || f[0] == '-':
		return parseDeref(f)
	}
	return "", fmt.Errorf("fetch %q not supported (ptfs takes %%REG, \\IMM, $stack, $stackN, +DISP(%%REG) or, with %%return, $retval)", f)
}

func parseImm(v string) (string, error) {
	neg := strings.HasPrefix(v, "-")
	num := strings.TrimPrefix(v, "-")
	n, err := ParseUint(num)
	if err != nil {
		return "", fmt.Errorf("bad immediate \\%s: %w", v, err)
	}
	if neg && n > 1<<63 {
		return "", fmt.Errorf("bad immediate \\%s: out of range", v)
	}
	if n == 0 {
		neg = false
	}
	out := "\\" + formatUint(n, isHex(num))
	if neg {
		out = "\\-" + formatUint(n, isHex(num))
	}
	return out, nil
}

func parseDeref(f string) (string, error) {
	neg := f[0] == '-'
	disp, reg, ok := strings.Cut(f[1:], "(")
	if !ok || !strings.HasSuffix(reg, ")") {
		return "", fmt.Errorf("bad memory reference %q: want +DISP(%%REG)", f)
	}
	reg = strings.TrimSuffix(reg, ")")
	if !strings.HasPrefix(reg, "%") || !registers[reg[1:]] {
		return "", fmt.Errorf("bad base register %q in %q", reg, f)
	}
	n, err := ParseUint(disp)
	if err != nil {
		return "", fmt.Errorf("bad displacement %q in %q: %w", disp, f, err)
	}
	// The stub encodes the displacement as a signed 32-bit value.
	if (neg && n > 1<<31) || (!neg && n > 1<<31-1) {
		return "", fmt.Errorf("displacement %q in %q out of the signed 32-bit range", disp, f)
	}
	sign := "+"
	if neg && n != 0 {
		sign = "-"
	}
	return sign + formatUint(n, isHex(disp)) + "(" + reg + ")", nil
}

// reservedNames are the field names that every uprobe event already has.
// IsIdent tells whether s is a C identifier of at most max bytes, the
// only names tracefs takes for groups, events and arguments.
func IsIdent(s string, max int) bool {
	if s == "" || len(s) > max || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

var reservedNames = map[string]bool{
	"__probe_ip": true, "__probe_ret_ip": true, "__probe_func": true,
}

func checkName(n, tok string) error {
	if n == "" {
		return syntaxErr("empty argument name in %q", tok)
	}
	if len(n) > maxArgName {
		return syntaxErr("argument name %q too long (at most %d characters)", n, maxArgName)
	}
	if !IsIdent(n, maxArgName) {
		return syntaxErr("argument name %q is not a C identifier", n)
	}
	if strings.HasPrefix(n, "common_") || reservedNames[n] {
		return syntaxErr("argument name %q is reserved by tracefs", n)
	}
	return nil
}

// checkNames rejects duplicate names, counting the argN names that tracefs
// gives unnamed arguments.
func checkNames(args []Arg) error {
	for i := range args {
		for j := 0; j < i; j++ {
			if args[i].EffectiveName(i) == args[j].EffectiveName(j) {
				return syntaxErr("argument name %q used twice (unnamed argument %d is called arg%d)",
					args[i].EffectiveName(i), max(i, j)+1, max(i, j)+1)
			}
		}
	}
	return nil
}

// String returns the canonical text of s, which Parse reads back to an
// equal Spec.
func (s *Spec) String() string {
	var b strings.Builder
	b.WriteString(s.siteText())
	if s.Return {
		b.WriteString(" %return")
	}
	if s.MultiNop {
		b.WriteString(" %multinop")
	}
	if s.NoPace {
		b.WriteString(" %nopace")
	}
	if s.PID != 0 {
		b.WriteString(" %pid=" + strconv.Itoa(int(s.PID)))
	}
	if s.Comm != "" {
		b.WriteString(" %comm=" + s.Comm)
	}
	b.WriteString(ArgsText(s.Args))
	return b.String()
}

func (s *Spec) siteText() string {
	switch {
	case s.Symbol == "":
		return "0x" + strconv.FormatUint(s.Offset, 16)
	case s.Offset == 0:
		return quoteSymbol(s.Symbol)
	}
	return quoteSymbol(s.Symbol) + "+0x" + strconv.FormatUint(s.Offset, 16)
}

// ArgsText renders args as tracefs takes them, each with a leading space;
// u64 is the default type and is left out.
func ArgsText(args []Arg) string {
	var b strings.Builder
	for _, a := range args {
		b.WriteByte(' ')
		if a.Name != "" {
			b.WriteString(a.Name)
			b.WriteByte('=')
		}
		b.WriteString(a.Fetch)
		if a.Bits.Width != 0 || a.Type != decode.U64 {
			b.WriteByte(':')
			b.WriteString(a.typeText())
		}
	}
	return b.String()
}

// typeText returns the tracefs spelling of a's type: its bitfield's, such
// as "b4@2/32", or its type's.
func (a *Arg) typeText() string {
	if a.Bits.Width != 0 {
		return a.Bits.Text(a.Type)
	}
	return a.Type.String()
}
