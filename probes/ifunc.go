package probes

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"ptfs/objfile"
	"ptfs/x86insn"
)

// maxImpls bounds the implementations an IFUNC error names.
const maxImpls = 16

// ripLea matches a rip-relative lea in x86insn's GNU syntax: how a
// resolver loads the address of the implementation it returns.
var ripLea = regexp.MustCompile(`^lea (-?)0x([0-9a-f]+)\(%rip\),`)

// ifuncErr refuses a site by the name of a GNU indirect function: the code
// at its address is the resolver, which the dynamic linker runs once, not
// what callers run. It names the implementations the resolver can return
// (the code addresses it loads with a rip-relative lea), by name where the
// symbols say and by file offset.
func (b *Binary) ifuncErr(sym objfile.Symbol) error {
	var impls []string
	for _, addr := range b.resolverTargets(sym) {
		off, _ := b.Offset(addr)
		name := "0x" + strconv.FormatUint(off, 16)
		if fn, fnOff, ok := b.SymbolAt(addr); ok && fnOff == 0 {
			name = fn.Name + " at " + name
		}
		impls = append(impls, name)
	}
	what := "no implementation found in its code"
	if len(impls) > 0 {
		what = "its implementations: " + strings.Join(impls, ", ")
	}
	return fmt.Errorf("%w: %s is a GNU IFUNC: the code at file offset 0x%x is its resolver, which runs once when the program loads; %s (probe one by name or file offset; the resolver itself by file offset)",
		ErrRefused, sym.Name, sym.Offset, what)
}

// resolverTargets returns the distinct executable addresses that the code
// of resolver loads with rip-relative leas, at most maxImpls.
func (b *Binary) resolverTargets(resolver objfile.Symbol) []uint64 {
	size := min(resolver.Size, 4096)
	code, err := b.ReadCode(resolver.Addr, size)
	if err != nil {
		return nil
	}
	var out []uint64
	for pc := uint64(0); pc < uint64(len(code)) && len(out) < maxImpls; {
		in, err := x86insn.Decode(code[pc:], resolver.Addr+pc)
		if err != nil {
			break
		}
		pc += uint64(in.Len)
		m := ripLea.FindStringSubmatch(in.Text)
		if m == nil {
			continue
		}
		disp, err := strconv.ParseUint(m[2], 16, 64)
		if err != nil {
			continue
		}
		next := resolver.Addr + pc
		target := next + disp
		if m[1] == "-" {
			target = next - disp
		}
		if seg, ok := b.SegmentAt(target); ok && seg.Exec() && !slices.Contains(out, target) {
			out = append(out, target)
		}
	}
	return out
}
