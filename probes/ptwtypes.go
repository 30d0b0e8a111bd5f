package probes

import (
	"fmt"
	"slices"
	"strings"

	"ptfs/decode"
)

// ptwWire returns the type a ptwrite stub writes for an argument of type t
// with bitfield b: the stub writes 8-byte words (u64) and 4-byte ones
// (u32, s32, x32, which the kernel's document names); a narrower type is a
// u32 word, an 8-byte one a u64 word, and ptfs formats the spec's type
// from it. A bitfield is its container's word, cut by ptfs.
func ptwWire(t decode.ArgType, b decode.Bitfield) decode.ArgType {
	switch {
	case t.Size() == 8:
		return decode.U64
	case b.Width == 0 && (t == decode.U32 || t == decode.S32 || t == decode.X32):
		return t
	}
	return decode.U32
}

// PTWWire returns s as a ptwrite kernel is asked for it: each argument
// with the type its stub writes (see ptwWire) and no bitfield. A string
// argument is refused (wrapping ErrRefused): the stub writes words, it
// cannot copy memory.
func (s *Spec) PTWWire() (*Spec, error) {
	w := *s
	w.Args = slices.Clone(s.Args)
	for i := range w.Args {
		a := &w.Args[i]
		if a.Type.IsString() {
			return nil, fmt.Errorf("%w: ptw mode: argument %s is a %v: the ptwrite stub writes 4- and 8-byte words and cannot copy a string (classic mode reads strings: ptfs mount --mode classic)",
				ErrRefused, a.EffectiveName(i), a.Type)
		}
		a.Type, a.Bits = ptwWire(a.Type, a.Bits), decode.Bitfield{}
	}
	return &w, nil
}

// PTWFormatted says which arguments of s ptfs formats from a wider word in
// ptw mode, such as "a=s64 b=u8 c=b4@2/32", or "" when the stub writes
// each as its type.
func (s *Spec) PTWFormatted() string {
	var b strings.Builder
	for i := range s.Args {
		a := &s.Args[i]
		if a.Bits.Width == 0 && ptwWire(a.Type, a.Bits) == a.Type {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a.EffectiveName(i) + "=" + a.typeText())
	}
	return b.String()
}
