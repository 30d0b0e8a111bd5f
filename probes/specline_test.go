package probes

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"ptfs/decode"
)

// TestParseQuotedAndComments: quoted C++ sites and `# comment`s, with the
// canonical text each reads back from.
func TestParseQuotedAndComments(t *testing.T) {
	di := []Arg{{Fetch: "%di", Type: decode.U64}}
	tests := []struct {
		in   string
		want *Spec
		str  string
	}{
		{`"geo::detail::area(long, long)"+4 %di`, &Spec{Symbol: "geo::detail::area(long, long)", Offset: 4, Args: di},
			`"geo::detail::area(long, long)"+0x4 %di`},
		{`  "Buf<long, 4>::get(int)"`, &Spec{Symbol: "Buf<long, 4>::get(int)"}, `"Buf<long, 4>::get(int)"`},
		{`"operator%(A, B)"%nopace`, &Spec{Symbol: "operator%(A, B)", NoPace: true}, `"operator%(A, B)" %nopace`},
		{`"v::operator+(v const&)"+0x2`, &Spec{Symbol: "v::operator+(v const&)", Offset: 2}, `"v::operator+(v const&)"+0x2`},
		{`"main" %di`, &Spec{Symbol: "main", Args: di}, `main %di`},
		{`"f # not a comment" %di # a comment`, &Spec{Symbol: "f # not a comment", Args: di}, `"f # not a comment" %di`},
		{"target %di # a=%si", &Spec{Symbol: "target", Args: di}, "target %di"},
		{"target %di\t#x", &Spec{Symbol: "target", Args: di}, "target %di"},
		{"f#g", &Spec{Symbol: "f#g"}, "f#g"},
		// A probe file's own text reads back as its spec.
		{"target %di\n# state: installed (classic mode, event id 7)\n# site: target+0x0\n\n", &Spec{Symbol: "target", Args: di}, "target %di"},
		{"# only a comment\n0x10 %di\r\n", &Spec{Offset: 0x10, Args: di}, "0x10 %di"},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Parse(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		if got.String() != tt.str {
			t.Errorf("Parse(%q).String() = %q, want %q", tt.in, got.String(), tt.str)
		}
	}
}

func TestParseQuotedErrors(t *testing.T) {
	tests := []struct{ in, msg string }{
		{`"f(int)`, "unterminated"},
		{`""+4`, "bad quoted site"},
		{`" f"`, "bad quoted site"},
		{"\"f\x01\"", "control character"},
		{"\"f\xff\"", "invalid UTF-8"},
		{`"f(int)"x %di`, `"x"`},
		{`"f(int)"+zz`, `"zz"`},
		{`"f(int)"+4+4`, `"4+4"`},
		{"# nothing", "empty spec"},
		{"0x10 %di\n0x20 %si", "one spec per probe file"},
	}
	for _, tt := range tests {
		s, err := Parse(tt.in)
		if err == nil {
			t.Errorf("Parse(%q) = %+v, want error", tt.in, s)
			continue
		}
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("Parse(%q) error %q: want ErrSyntax mentioning %q", tt.in, err, tt.msg)
		}
	}
}

func TestSpecLine(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"# x\n\n", ""},
		{"f %di # c\n", "f %di"},
		{"\n  f %di  \n# state: refused\n# error: x\n", "f %di"},
	}
	for _, tt := range tests {
		if got, err := SpecLine(tt.in); err != nil || got != tt.want {
			t.Errorf("SpecLine(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}
