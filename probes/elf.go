package probes

import (
	"errors"
	"fmt"
	"strings"

	"ptfs/objfile"
	"ptfs/x86insn"
)

// Binary is an opened x86-64 ELF file (objfile.File) in which probe sites
// are resolved and checked.
type Binary struct {
	*objfile.File
}

// Site is a resolved, checked probe site.
type Site struct {
	// Offset is the file offset and Addr the virtual address of the site.
	Offset, Addr uint64
	// Func is the function holding the site ("" when none does) and
	// FuncOff the site's offset in it.
	Func    string
	FuncOff uint64
	// Insn is the instruction at the site in GNU syntax; Len its length.
	Insn string
	Len  int
	// Verdict says whether and how a ptwrite uprobe can patch the site.
	// Classic probes install on any instruction boundary.
	Verdict Verdict
	// Cost says how the kernel runs a classic uprobe here, and names a
	// cheaper site with the same arguments where there is one.
	Cost Cost
	// Rets are the file offsets of the function's rets, for a return
	// probe: where ptw mode emulates it (Verdict Rets).
	Rets []uint64
}

// Open opens the ELF file at path (objfile.Open: a regular file only,
// never blocking) and reads its function symbols.
func Open(path string) (*Binary, error) {
	f, err := objfile.Open(path)
	if err != nil {
		return nil, err
	}
	return &Binary{f}, nil
}

// lookup finds the function a spec names, by demangled or raw name.
func (b *Binary) lookup(name string) (objfile.Symbol, error) {
	sym, err := b.Lookup(name)
	if err != nil && errors.Is(err, objfile.ErrAmbiguous) {
		return sym, fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	return sym, err
}

// Resolve finds and checks the site of s: a file offset inside an
// executable PT_LOAD segment, on an instruction boundary. The boundary is
// checked by decoding from the start of the function holding the site;
// outside any known function (stripped code) by a linear sweep from the end
// of the previous function, or from the start of the executable section or
// segment, as objdump does. The ptwrite verdict is computed but a refused
// verdict is not an error here: classic probes take such sites. A %return
// probe must be at a function's entry (a return probe takes the return
// address from the top of the stack when it fires); its ptwrite verdict
// is the refusal of returnVerdict.
func (b *Binary) Resolve(s *Spec) (*Site, error) {
	off := s.Offset
	if s.Symbol != "" {
		sym, err := b.lookup(s.Symbol)
		if err != nil {
			return nil, err
		}
		if sym.IFunc {
			return nil, b.ifuncErr(sym)
		}
		if s.Offset > 0 && s.Offset >= sym.Size {
			return nil, fmt.Errorf("%w: %s+0x%x is past the end of %s (%d bytes)",
				ErrBadSite, s.Symbol, s.Offset, s.Symbol, sym.Size)
		}
		off = sym.Offset + s.Offset
	}
	seg, ok := b.SegmentAtOffset(off)
	if !ok {
		if off >= b.Size() {
			return nil, fmt.Errorf("%w: file offset 0x%x is beyond the end of %s (%d bytes)", ErrBadSite, off, b.Path(), b.Size())
		}
		return nil, fmt.Errorf("%w: file offset 0x%x is not in a loaded segment of %s", ErrBadSite, off, b.Path())
	}
	if !seg.Exec() {
		return nil, fmt.Errorf("%w: file offset 0x%x is in a non-executable segment (%v) of %s", ErrBadSite, off, seg.Flags, b.Path())
	}
	addr := off - seg.Off + seg.Vaddr
	site := &Site{Offset: off, Addr: addr}
	var start uint64
	fn, fnOff, ok := b.SymbolAt(addr)
	if ok && fn.Addr >= seg.Vaddr {
		start = fn.Addr
		site.Func, site.FuncOff = fn.Name, fnOff
	} else {
		start = b.SweepStart(addr, seg)
	}
	if s.Return && (site.Func == "" || site.FuncOff != 0) {
		where := "no known function"
		if site.Func != "" {
			where = fmt.Sprintf("%s+0x%x", site.Func, site.FuncOff)
		}
		return nil, fmt.Errorf("%w: %%return needs a function's entry (its return address is on the stack only there); file offset 0x%x is in %s",
			ErrBadSite, off, where)
	}
	in, code, err := b.walk(seg, start, addr)
	if err != nil {
		return nil, err
	}
	site.Insn, site.Len = in.Text, in.Len
	site.Verdict = verdict(s.MultiNop, in, code, addr)
	site.Cost = classicCost(in, code, addr)
	// A return probe must stay at the entry: no other site stands in.
	if site.Func != "" && !s.Return && (site.Cost.Class == Emulated || site.Cost.Class == SingleStepped) {
		site.Cost.Cheaper = b.cheaperSite(seg, fn, addr, site.Cost.Class)
	}
	if s.Return {
		site.Verdict, site.Rets = b.returnVerdict(seg, fn, in.Text)
	}
	return site, nil
}

// returnVerdict judges a return probe on fn for ptw mode. The kernel's
// ptwrite uprobes take no %return, so ptw mode emulates one with a probe on
// each ret of the function, found by walking its code with the site
// checker; it is refused when one of them is, or when the walk cannot
// find them. Returns through a tail jump into another function are not
// rets of fn and are not seen.
func (b *Binary) returnVerdict(seg objfile.Segment, fn objfile.Symbol, insn string) (Verdict, []uint64) {
	v := Verdict{Kind: Refused, Insn: insn}
	end := min(fn.Addr+fn.Size, seg.Vaddr+seg.Filesz)
	code, err := b.ReadCode(fn.Addr, end-fn.Addr)
	var rets []uint64
	var texts []string
	refused := ""
	for pc := fn.Addr; err == nil && pc < end; {
		var in x86insn.Inst
		if in, err = x86insn.Decode(code[pc-fn.Addr:], pc); err != nil {
			break
		}
		if in.Class == x86insn.Ret {
			off := pc - seg.Vaddr + seg.Off
			rv := verdict(false, in, code[pc-fn.Addr:], pc)
			if rv.Kind == Refused && refused == "" {
				refused = fmt.Sprintf("the ret at file offset 0x%x: %s", off, rv.Reason)
			}
			rets = append(rets, off)
			texts = append(texts, fmt.Sprintf("0x%x (%s)", off, rv.Kind))
		}
		pc += uint64(in.Len)
	}
	const head = "%return: ptwrite uprobes take no return probes"
	switch {
	case fn.Size == 0:
		v.Reason = head + ", and the symbol table gives no size for " + fn.Name + " to find its rets"
	case err != nil:
		v.Reason = fmt.Sprintf("%s, and %s cannot be walked to its rets: %v", head, fn.Name, err)
	case len(rets) == 0:
		v.Reason = head + ", and " + fn.Name + " has no ret (it ends in a jump or never returns)"
	case refused != "":
		v.Reason = fmt.Sprintf("%s, and a probe on each ret of %s cannot stand in for one: %s", head, fn.Name, refused)
	default:
		v.Kind = Rets
		v.Reason = fmt.Sprintf("%%return emulated by a probe on each ret of %s (file offsets %s; $retval is %%ax there; returns through a tail jump are not seen)",
			fn.Name, strings.Join(texts, ", "))
		return v, rets
	}
	return v, nil
}

// walk decodes from start to addr, both in seg, and returns the instruction
// at addr with the bytes from addr on.
func (b *Binary) walk(seg objfile.Segment, start, addr uint64) (x86insn.Inst, []byte, error) {
	end := min(addr+x86insn.MaxLen, seg.Vaddr+seg.Filesz)
	buf, err := b.ReadCode(start, end-start)
	if err != nil {
		return x86insn.Inst{}, nil, err
	}
	pc := start
	for {
		in, err := x86insn.Decode(buf[pc-start:], pc)
		if err != nil {
			return x86insn.Inst{}, nil, fmt.Errorf("%w: cannot decode the instruction at file offset 0x%x (%w) on the way to the site",
				ErrBadSite, pc-seg.Vaddr+seg.Off, err)
		}
		if pc == addr {
			return in, buf[pc-start:], nil
		}
		if pc+uint64(in.Len) > addr {
			return x86insn.Inst{}, nil, fmt.Errorf("%w: file offset 0x%x is inside the %d-byte instruction at file offset 0x%x (%s)",
				ErrBadSite, addr-seg.Vaddr+seg.Off, in.Len, pc-seg.Vaddr+seg.Off, in.Text)
		}
		pc += uint64(in.Len)
	}
}
