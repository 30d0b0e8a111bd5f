package objfile

import (
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ianlancetaylor/demangle"
)

// Symbol is one function of a file.
type Symbol struct {
	// Name is the demangled name; Raw the name in the symbol table.
	Name, Raw string
	// Addr is the virtual address, Offset the file offset, Size the size
	// in bytes (0 when the symbol table does not say).
	Addr, Offset, Size uint64
	// IFunc marks a GNU indirect function (STT_GNU_IFUNC): the code at
	// Addr is a resolver that returns the implementation to call.
	IFunc bool
}

// end is where the symbol's extent ends, wrapping as the address
// arithmetic of a hostile table does.
func (s *Symbol) end() uint64 { return s.Addr + s.Size }

// readSymbols collects the defined functions of .symtab and .dynsym that
// lie in a segment's file image, without duplicates, sorted by address
// then raw name.
func (f *File) readSymbols(ef *elf.File) error {
	for i, get := range []func() ([]elf.Symbol, error){ef.Symbols, ef.DynamicSymbols} {
		var syms []elf.Symbol
		err := safely(func() (err error) {
			syms, err = get()
			return err
		})
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return fmt.Errorf("%w: %s: symbols: %w", ErrBadBinary, f.path, err)
		}
		f.symtab = f.symtab || i == 0 && err == nil
		for _, s := range syms {
			t := elf.ST_TYPE(s.Info)
			if (t != elf.STT_FUNC && t != elf.STT_GNU_IFUNC) || s.Section == elf.SHN_UNDEF || s.Name == "" {
				continue
			}
			off, ok := f.Offset(s.Value)
			if !ok {
				continue
			}
			f.syms = append(f.syms, Symbol{
				Name: demangle.Filter(s.Name), Raw: s.Name,
				Addr: s.Value, Offset: off, Size: s.Size, IFunc: t == elf.STT_GNU_IFUNC,
			})
		}
	}
	f.sortSymbols()
	f.linkOuter()
	f.readImports(ef)
	return nil
}

// readImports fills imports and needed, for the hint of a lookup of a
// function that the file only calls. They are hints: a malformed dynamic
// section leaves them empty rather than refusing the file.
func (f *File) readImports(ef *elf.File) {
	var imps []elf.ImportedSymbol
	_ = safely(func() (err error) {
		imps, err = ef.ImportedSymbols()
		return err
	})
	_ = safely(func() (err error) {
		f.needed, err = ef.ImportedLibraries()
		return err
	})
	f.imports = make(map[string]string, len(imps))
	for _, s := range imps {
		f.imports[s.Name] = s.Library
	}
}

// sortSymbols sorts the symbols by address then raw name and keeps one of
// each (raw name, address): the first read, so .symtab's over .dynsym's.
// It sorts indices, not the symbols: moving two strings a swap costs a
// write barrier each, and the index breaks ties by reading order.
func (f *File) sortSymbols() {
	idx := make([]int32, len(f.syms))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(i, j int32) int {
		x, y := &f.syms[i], &f.syms[j]
		return cmp.Or(cmp.Compare(x.Addr, y.Addr), strings.Compare(x.Raw, y.Raw), cmp.Compare(i, j))
	})
	sorted := make([]Symbol, 0, len(idx))
	for _, i := range idx {
		s := &f.syms[i]
		if n := len(sorted); n > 0 && sorted[n-1].Addr == s.Addr && sorted[n-1].Raw == s.Raw {
			continue
		}
		sorted = append(sorted, *s)
	}
	f.syms = sorted
}

// linkOuter fills outer: for each symbol the nearest earlier one that
// ends after it (a stack of ends, decreasing from bottom to top).
func (f *File) linkOuter() {
	f.outer = make([]int32, len(f.syms))
	stack := make([]int32, 0, 16)
	for i := range f.syms {
		end := f.syms[i].end()
		for len(stack) > 0 && f.syms[stack[len(stack)-1]].end() <= end {
			stack = stack[:len(stack)-1]
		}
		f.outer[i] = -1
		if len(stack) > 0 {
			f.outer[i] = stack[len(stack)-1]
		}
		stack = append(stack, int32(i))
	}
}

// Functions returns the defined functions of .symtab and .dynsym, without
// duplicates, sorted by address then raw name. The caller owns the slice.
func (f *File) Functions() []Symbol {
	return append([]Symbol(nil), f.syms...)
}

// SymbolAt returns the function whose extent holds addr and addr's offset
// in it. Of several, it is the last in Functions' order: the innermost of
// nested ones, and of aliases the last by raw name. A function of unknown
// size holds only its own address.
func (f *File) SymbolAt(addr uint64) (Symbol, uint64, bool) {
	if i := f.symbolAt(addr); i >= 0 {
		return f.syms[i], addr - f.syms[i].Addr, true
	}
	return Symbol{}, 0, false
}

// symbolAt is SymbolAt's index, -1 for none. The last symbol starting at
// or before addr holds it if it starts there or ends after it; else only
// the chain of symbols that end after it can (any symbol between two links
// ends no later than the later link, so before addr).
func (f *File) symbolAt(addr uint64) int {
	i := sort.Search(len(f.syms), func(i int) bool { return f.syms[i].Addr > addr }) - 1
	if i >= 0 && f.syms[i].Addr == addr {
		return i
	}
	for i >= 0 && addr >= f.syms[i].end() {
		i = int(f.outer[i])
	}
	return i
}

// Lookup finds the function that name names, by demangled or raw name, or
// by a demangled C++ name without its parameters ("ns::f" for an only
// "ns::f(long)").
// Aliases at one address are one function (the largest is returned); a
// name of functions at different addresses is ambiguous (ErrAmbiguous:
// the error lists every candidate with its raw name and file offset), and
// an unknown one gives ErrNoSymbol with a hint: the GCC clones of the
// name (f.constprop.0, f.isra.0, f.cold), the library the file imports it
// from, or that the file has no symbol table.
func (f *File) Lookup(name string) (Symbol, error) {
	var found []Symbol
	for i := range f.syms {
		s := &f.syms[i]
		if s.Name == name || s.Raw == name {
			found = addCandidate(found, s)
		}
	}
	if len(found) == 0 {
		// A C++ name without its parameters: the one function, or the
		// overloads to choose from.
		for i := range f.syms {
			if s := &f.syms[i]; s.Name != s.Raw && withoutParams(s.Name) == name {
				found = addCandidate(found, s)
			}
		}
	}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1:
		return Symbol{}, &candidatesError{fmt.Sprintf("symbol %q names %d functions", name, len(found)), found, ErrAmbiguous}
	}
	if clones := f.clones(name); len(clones) > 0 {
		return Symbol{}, &candidatesError{fmt.Sprintf("no function %q in %s, but GCC clones of it", name, f.path), clones, ErrNoSymbol}
	}
	return Symbol{}, fmt.Errorf("%w: no function %q in %s%s", ErrNoSymbol, name, f.path, f.missingHint(name))
}

// addCandidate adds s to the functions found so far: aliases at one
// address are one function, the largest.
func addCandidate(found []Symbol, s *Symbol) []Symbol {
	for i := range found {
		if found[i].Addr == s.Addr {
			if s.Size > found[i].Size {
				found[i] = *s
			}
			return found
		}
	}
	return append(found, *s)
}

// clones returns the functions that GCC made of name: raw names with a
// clone suffix (f.constprop.0, f.isra.0, f.part.0, f.cold), which C++
// names demangle as "f(long) [clone .constprop.0]". name may be the C++
// name with or without its parameters.
func (f *File) clones(name string) []Symbol {
	var found []Symbol
	for i := range f.syms {
		s := &f.syms[i]
		base, _, cloned := strings.Cut(s.Name, " [clone .")
		if !cloned {
			var suffix string
			base, suffix, cloned = strings.Cut(s.Raw, ".")
			kind, _, _ := strings.Cut(suffix, ".")
			cloned = cloned && cloneKinds[kind]
		}
		if cloned && base != "" && (base == name || withoutParams(base) == name) {
			found = addCandidate(found, s)
		}
	}
	return found
}

// cloneKinds are the suffixes GCC gives the functions it makes of one
// (ipa-clones, hot/cold splitting, LTO).
var cloneKinds = map[string]bool{
	"constprop": true, "isra": true, "part": true, "cold": true, "lto_priv": true,
	"localalias": true, "specialized": true,
}

// withoutParams returns a demangled C++ function name without its
// parameter list: "ns::f(long, int)" is "ns::f".
func withoutParams(name string) string {
	if !strings.HasSuffix(name, ")") {
		return name
	}
	depth := 0
	for i := len(name) - 1; i >= 0; i-- {
		switch name[i] {
		case ')':
			depth++
		case '(':
			if depth--; depth == 0 {
				return name[:i]
			}
		}
	}
	return name
}

// missingHint says where a function the file does not define may be.
func (f *File) missingHint(name string) string {
	if lib, ok := f.imports[name]; ok {
		if lib != "" {
			return fmt.Sprintf(": %s is in %s: add it as a target", name, lib)
		}
		return fmt.Sprintf(": %s is imported from a linked library (%s): add that library as a target", name, strings.Join(f.needed, ", "))
	}
	if !f.symtab {
		return ": no symbol table: use a file offset from `objdump -d`"
	}
	return ""
}

// SweepStart is where a linear sweep of the code of seg up to addr starts
// when no function holds addr: the end of the last function before addr,
// else the start of the executable section or, without section headers,
// of seg.
func (f *File) SweepStart(addr uint64, seg Segment) uint64 {
	start := seg.Vaddr
	for _, sec := range f.exec {
		if sec.HoldsAddr(addr) {
			start = max(start, sec.Vaddr)
		}
	}
	for i := range f.syms {
		s := &f.syms[i]
		if end := s.end(); s.Addr < addr && end <= addr && end > start {
			start = end
		}
	}
	return start
}

// AppendSymbols appends the text of the symbols file: one function a line,
// "0xOFFSET SIZE NAME" with the file offset in hex, the size in decimal
// and the demangled name, then a tab and the raw (mangled) name when the
// two differ: a site may be either, and a demangled name has spaces.
func AppendSymbols(dst []byte, syms []Symbol) []byte {
	for i := range syms {
		s := &syms[i]
		dst = append(dst, "0x"...)
		dst = strconv.AppendUint(dst, s.Offset, 16)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, s.Size, 10)
		dst = append(dst, ' ')
		dst = append(dst, s.Name...)
		if s.Raw != "" && s.Raw != s.Name {
			dst = append(dst, '\t')
			dst = append(dst, s.Raw...)
		}
		dst = append(dst, '\n')
	}
	return dst
}
