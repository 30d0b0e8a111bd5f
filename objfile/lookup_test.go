package objfile

import (
	"errors"
	"testing"
)

func TestWithoutParams(t *testing.T) {
	for in, want := range map[string]string{
		"f":                         "f",
		"ns::f(long, int)":          "ns::f",
		"Buf<long, 4>::get(int)":    "Buf<long, 4>::get",
		"g(void (*)(int), char)":    "g",
		"operator()(int)":           "operator()",
		"unbalanced)":               "unbalanced)",
		"clonly(long, long) [clone": "clonly(long, long) [clone",
	} {
		if got := withoutParams(in); got != want {
			t.Errorf("withoutParams(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLookupCandidates: a table of symbols as readSymbols makes them,
// looked up by the names users type.
func TestLookupCandidates(t *testing.T) {
	f := &File{path: "/x", symtab: true, syms: []Symbol{
		{Name: "clonly(long, long) [clone .constprop.0]", Raw: "_ZL6clonlyll.constprop.0", Offset: 0x1250, Addr: 0x1250},
		{Name: "hot.cold", Raw: "hot.cold", Offset: 0x1300, Addr: 0x1300},
		{Name: "hot.part.0", Raw: "hot.part.0", Offset: 0x1310, Addr: 0x1310},
		{Name: "geo::scale(long)", Raw: "_ZN3geo5scaleEl", Offset: 0x12a0, Addr: 0x12a0},
		{Name: "geo::scale(double)", Raw: "_ZN3geo5scaleEd", Offset: 0x12b0, Addr: 0x12b0},
		{Name: "geo::detail::area(long, long)", Raw: "_ZN3geo6detail4areaEll", Offset: 0x1290, Addr: 0x1290},
		{Name: "main.add", Raw: "main.add", Offset: 0x1400, Addr: 0x1400},
		{Name: "demo::pick", Raw: "_ZN4demo4pick17h0123456789abcdefE", Offset: 0x12c0, Addr: 0x12c0},
		{Name: "demo::pick", Raw: "_ZN4demo4pick17hfedcba9876543210E", Offset: 0x12d0, Addr: 0x12d0},
	}, imports: map[string]string{"printf": "libc.so.6", "sin": ""}, needed: []string{"libm.so.6", "libc.so.6"}}
	f.sortSymbols()
	f.linkOuter()
	tests := []struct {
		name string
		is   error
		want string
	}{
		{"clonly", ErrNoSymbol, `no such symbol: no function "clonly" in /x, but GCC clones of it: _ZL6clonlyll.constprop.0 at 0x1250 (clonly(long, long) [clone .constprop.0]): use a raw name or a file offset`},
		{"clonly(long, long)", ErrNoSymbol, `no such symbol: no function "clonly(long, long)" in /x, but GCC clones of it: _ZL6clonlyll.constprop.0 at 0x1250 (clonly(long, long) [clone .constprop.0]): use a raw name or a file offset`},
		{"hot", ErrNoSymbol, `no such symbol: no function "hot" in /x, but GCC clones of it: hot.cold at 0x1300, hot.part.0 at 0x1310: use a raw name or a file offset`},
		{"main", ErrNoSymbol, `no such symbol: no function "main" in /x`},
		{"demo::pick", ErrAmbiguous, `ambiguous symbol: symbol "demo::pick" names 2 functions: _ZN4demo4pick17h0123456789abcdefE at 0x12c0 (demo::pick), _ZN4demo4pick17hfedcba9876543210E at 0x12d0 (demo::pick): use a raw name or a file offset`},
		{"geo::scale", ErrAmbiguous, `ambiguous symbol: symbol "geo::scale" names 2 functions: _ZN3geo5scaleEl at 0x12a0 (geo::scale(long)), _ZN3geo5scaleEd at 0x12b0 (geo::scale(double)): use a raw name or a file offset`},
		{"printf", ErrNoSymbol, `no such symbol: no function "printf" in /x: printf is in libc.so.6: add it as a target`},
		{"sin", ErrNoSymbol, `no such symbol: no function "sin" in /x: sin is imported from a linked library (libm.so.6, libc.so.6): add that library as a target`},
	}
	for _, tt := range tests {
		_, err := f.Lookup(tt.name)
		if !errors.Is(err, tt.is) || err.Error() != tt.want {
			t.Errorf("Lookup(%q) = %v\nwant %v: %s", tt.name, err, tt.is, tt.want)
		}
	}
	if s, err := f.Lookup("geo::detail::area"); err != nil || s.Raw != "_ZN3geo6detail4areaEll" {
		t.Errorf("Lookup(geo::detail::area) = %+v, %v: want the one function of that name", s, err)
	}
	for _, raw := range []string{"_ZL6clonlyll.constprop.0", "hot.cold", "_ZN4demo4pick17hfedcba9876543210E"} {
		if s, err := f.Lookup(raw); err != nil || s.Raw != raw {
			t.Errorf("Lookup(%q) = %+v, %v", raw, s, err)
		}
	}
	f.symtab = false
	if _, err := f.Lookup("main"); err == nil || err.Error() != "no such symbol: no function \"main\" in /x: no symbol table: use a file offset from `objdump -d`" {
		t.Errorf("Lookup(main) without .symtab = %v", err)
	}
}
