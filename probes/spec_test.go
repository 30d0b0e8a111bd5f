package probes

import (
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"ptfs/decode"
)

func TestParse(t *testing.T) {
	a := func(name, fetch string, typ decode.ArgType) Arg { return Arg{Name: name, Fetch: fetch, Type: typ} }
	tests := []struct {
		in   string
		want *Spec
		str  string // canonical text; "" means the input itself
	}{
		{"0x1040", &Spec{Offset: 0x1040}, ""},
		{"4160", &Spec{Offset: 4160}, "0x1040"},
		{"0", &Spec{}, "0x0"},
		{"0X1A", &Spec{Offset: 0x1a}, "0x1a"},
		{"0xffffffffffffffff", &Spec{Offset: 1<<64 - 1}, ""},
		{"target", &Spec{Symbol: "target"}, ""},
		{"target+4", &Spec{Symbol: "target", Offset: 4}, "target+0x4"},
		{"target+0x9", &Spec{Symbol: "target", Offset: 9}, ""},
		{"target+0", &Spec{Symbol: "target"}, "target"},
		{"_ZN2ns2fnEi+0x4", &Spec{Symbol: "_ZN2ns2fnEi", Offset: 4}, ""},
		{"foo.cold", &Spec{Symbol: "foo.cold"}, ""},
		{"ns::fn", &Spec{Symbol: "ns::fn"}, ""},
		{"0x1040 %di %si", &Spec{Offset: 0x1040, Args: []Arg{a("", "%di", 0), a("", "%si", 0)}}, ""},
		{"  0x1040\t%di  ", &Spec{Offset: 0x1040, Args: []Arg{a("", "%di", 0)}}, "0x1040 %di"},
		{"target+4 a=%di b=+8(%si):u32", &Spec{Symbol: "target", Offset: 4,
			Args: []Arg{a("a", "%di", 0), a("b", "+8(%si)", decode.U32)}}, "target+0x4 a=%di b=+8(%si):u32"},
		{"0x1170%multinop", &Spec{Offset: 0x1170, MultiNop: true}, "0x1170 %multinop"},
		{"target+4%nopace", &Spec{Symbol: "target", Offset: 4, NoPace: true}, "target+0x4 %nopace"},
		{"0x10%multinop%nopace %ax", &Spec{Offset: 0x10, MultiNop: true, NoPace: true, Args: []Arg{a("", "%ax", 0)}},
			"0x10 %multinop %nopace %ax"},
		{"0x10 %di %nopace", &Spec{Offset: 0x10, NoPace: true, Args: []Arg{a("", "%di", 0)}}, "0x10 %nopace %di"},
		{"0x10 %nopace %multinop", &Spec{Offset: 0x10, NoPace: true, MultiNop: true}, "0x10 %multinop %nopace"},
		{"0x10 %ax %bx %cx %dx %si %di %bp %sp", &Spec{Offset: 0x10, Args: []Arg{a("", "%ax", 0), a("", "%bx", 0),
			a("", "%cx", 0), a("", "%dx", 0), a("", "%si", 0), a("", "%di", 0), a("", "%bp", 0), a("", "%sp", 0)}}, ""},
		{"0x10 %r8 %r15 %ip %flags %cs %ss %orig_ax", &Spec{Offset: 0x10, Args: []Arg{a("", "%r8", 0), a("", "%r15", 0),
			a("", "%ip", 0), a("", "%flags", 0), a("", "%cs", 0), a("", "%ss", 0), a("", "%orig_ax", 0)}}, ""},
		{`0x10 \42 \0x2A \-5 \-0x10 \-0`, &Spec{Offset: 0x10, Args: []Arg{a("", `\42`, 0), a("", `\0x2a`, 0),
			a("", `\-5`, 0), a("", `\-0x10`, 0), a("", `\0`, 0)}}, `0x10 \42 \0x2a \-5 \-0x10 \0`},
		{`0x10 \18446744073709551615 \-9223372036854775808`, &Spec{Offset: 0x10,
			Args: []Arg{a("", `\18446744073709551615`, 0), a("", `\-9223372036854775808`, 0)}}, ""},
		{"0x10 $stack $stack0 $stack3", &Spec{Offset: 0x10, Args: []Arg{a("", "$stack", 0), a("", "$stack0", 0), a("", "$stack3", 0)}}, ""},
		{"0x10 +0(%di) -8(%sp):s32 +0x10(%r12):x32 -0(%ax)", &Spec{Offset: 0x10, Args: []Arg{a("", "+0(%di)", 0),
			a("", "-8(%sp)", decode.S32), a("", "+0x10(%r12)", decode.X32), a("", "+0(%ax)", 0)}},
			"0x10 +0(%di) -8(%sp):s32 +0x10(%r12):x32 +0(%ax)"},
		{"0x10 +2147483647(%di) -2147483648(%di)", &Spec{Offset: 0x10,
			Args: []Arg{a("", "+2147483647(%di)", 0), a("", "-2147483648(%di)", 0)}}, ""},
		{"0x10 x=%di:u64 y=%si:u32 z=%ax:s32 w=%bx:x32", &Spec{Offset: 0x10, Args: []Arg{a("x", "%di", 0),
			a("y", "%si", decode.U32), a("z", "%ax", decode.S32), a("w", "%bx", decode.X32)}},
			"0x10 x=%di y=%si:u32 z=%ax:s32 w=%bx:x32"},
		{"0x10 a=%di:u8 b=%si:u16 c=%dx:s8 d=%cx:s16 e=%r8:s64 f=%r9:x8 g=%ax:x16 h=%bx:x64", &Spec{Offset: 0x10, Args: []Arg{
			a("a", "%di", decode.U8), a("b", "%si", decode.U16), a("c", "%dx", decode.S8), a("d", "%cx", decode.S16),
			a("e", "%r8", decode.S64), a("f", "%r9", decode.X8), a("g", "%ax", decode.X16), a("h", "%bx", decode.X64)}}, ""},
		{"0x10 c=+9(%di):char s=+0(%si):string u=-8(%sp):ustring", &Spec{Offset: 0x10, Args: []Arg{
			a("c", "+9(%di)", decode.Char), a("s", "+0(%si)", decode.String), a("u", "-8(%sp)", decode.UString)}}, ""},
		{"0x10 +24(%di):b4@4/32 %si:b64@0/64 %dx:b1@7/8 %cx:b16@0/16", &Spec{Offset: 0x10, Args: []Arg{
			{Fetch: "+24(%di)", Type: decode.U32, Bits: decode.Bitfield{Width: 4, Offset: 4}},
			{Fetch: "%si", Type: decode.U64, Bits: decode.Bitfield{Width: 64}},
			{Fetch: "%dx", Type: decode.U8, Bits: decode.Bitfield{Width: 1, Offset: 7}},
			{Fetch: "%cx", Type: decode.U16, Bits: decode.Bitfield{Width: 16}}}}, ""},
		{"0x10 _a9=%di arg1=%si", &Spec{Offset: 0x10, Args: []Arg{a("_a9", "%di", 0), a("arg1", "%si", 0)}}, ""},
		{"0x10 arg1=%di %si", &Spec{Offset: 0x10, Args: []Arg{a("arg1", "%di", 0), a("", "%si", 0)}}, ""},
		{"0x10 %di arg3=%si", &Spec{Offset: 0x10, Args: []Arg{a("", "%di", 0), a("arg3", "%si", 0)}}, ""},
		{"0x10 " + strings.Repeat("a", 31) + "=%di", &Spec{Offset: 0x10, Args: []Arg{a(strings.Repeat("a", 31), "%di", 0)}}, ""},
		{"fib%return ret=$retval", &Spec{Symbol: "fib", Return: true, Args: []Arg{a("ret", "$retval", 0)}}, "fib %return ret=$retval"},
		{"fib $retval:s32 %return", &Spec{Symbol: "fib", Return: true, Args: []Arg{a("", "$retval", decode.S32)}}, "fib %return $retval:s32"},
		{"0x10 %return", &Spec{Offset: 0x10, Return: true}, ""},
		{"target %pid=4711 %di", &Spec{Symbol: "target", PID: 4711, Args: []Arg{a("", "%di", 0)}}, ""},
		{"target%pid=1%comm=a.out", &Spec{Symbol: "target", PID: 1, Comm: "a.out"}, "target %pid=1 %comm=a.out"},
		{"target %comm=kworker/0:1-ev %pid=4194304", &Spec{Symbol: "target", PID: 4194304, Comm: "kworker/0:1-ev"},
			"target %pid=4194304 %comm=kworker/0:1-ev"},
		{"target %comm=%di %di", &Spec{Symbol: "target", Comm: "%di", Args: []Arg{a("", "%di", 0)}}, ""},
		{"0x10 %nopace %return %multinop %comm=x %pid=2 r=$retval", &Spec{Offset: 0x10, NoPace: true, Return: true,
			MultiNop: true, PID: 2, Comm: "x", Args: []Arg{a("r", "$retval", 0)}}, "0x10 %return %multinop %nopace %pid=2 %comm=x r=$retval"},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.in, err)
			continue
		}
		if tt.want != nil && !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Parse(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		str := tt.str
		if str == "" {
			str = strings.Join(strings.Fields(tt.in), " ")
		}
		if tt.want != nil && got.String() != str {
			t.Errorf("Parse(%q).String() = %q, want %q", tt.in, got.String(), str)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		in   string
		want error
		msg  string // substring of the message: the offending token
	}{
		{"", ErrSyntax, "empty spec"},
		{"   \t ", ErrSyntax, "empty spec"},
		{"%di", ErrSyntax, "missing site"},
		{"0x", ErrSyntax, `"0x"`},
		{"0xg1", ErrSyntax, `"0xg1"`},
		{"010", ErrSyntax, "leading zero"},
		{"12abc", ErrSyntax, `"12abc"`},
		{"0x10000000000000000", ErrSyntax, "out of range"},
		{"-5", ErrSyntax, `"-5"`},
		{"$stack", ErrSyntax, `"$stack"`},
		{"a=%di", ErrSyntax, `"a=%di"`},
		{"target+", ErrSyntax, `""`},
		{"target+x", ErrSyntax, `"x"`},
		{"target+0x", ErrSyntax, `"0x"`},
		{"target+1+2", ErrSyntax, `"1+2"`},
		{"0x10 %foo", ErrSyntax, `"%foo"`},
		{"0x10%foo", ErrSyntax, `"%foo"`},
		{"0x10%", ErrSyntax, `"%"`},
		{"0x10 %nopace %nopace", ErrSyntax, "duplicate"},
		{"0x10%multinop %multinop", ErrSyntax, "duplicate"},
		{"0x10 %return %return", ErrSyntax, "duplicate"},
		{"0x10 $retval", ErrSyntax, "$retval needs %return"},
		{"0x10 r=$retval", ErrSyntax, "$retval needs %return"},
		{"0x10 %pid=0", ErrSyntax, "%pid=0"},
		{"0x10 %pid=4194305", ErrSyntax, "1 to 4194304"},
		{"0x10 %pid=0x10", ErrSyntax, "decimal"},
		{"0x10 %pid=-1", ErrSyntax, "%pid=-1"},
		{"0x10 %pid=", ErrSyntax, "%pid="},
		{"0x10 %pid=1 %pid=1", ErrSyntax, "duplicate"},
		{"0x10 %comm=", ErrSyntax, "1 to 15 bytes"},
		{"0x10 %comm=0123456789abcdef", ErrSyntax, "1 to 15 bytes"},
		{"0x10 %comm=a\x01", ErrSyntax, "printable"},
		{"0x10 %comm=\xff", ErrSyntax, "printable"},
		{"0x10 %comm=a %comm=a", ErrSyntax, "duplicate"},
		{"0x10 %return=1", ErrSyntax, `"%return"`},
		{"0x10 %rdi", ErrSyntax, `"%rdi"`},
		{"0x10 %edi", ErrSyntax, `"%edi"`},
		{"0x10 %ds", ErrSyntax, `"%ds"`},
		{"0x10 %DI", ErrSyntax, `"%DI"`},
		{"0x10 %", ErrSyntax, `"%"`},
		{"0x10 %di:u128", ErrSyntax, "types: u64 u32 s32 x32 u8 u16 s8 s16 s64 x8 x16 x64 char string ustring, b<width>"},
		{"0x10 %di:U8", ErrSyntax, `"U8"`},
		{"0x10 %di:string", ErrSyntax, "want +DISP(%REG):string"},
		{"0x10 $stack1:ustring", ErrSyntax, "reads a string from memory"},
		{`0x10 \16:string`, ErrSyntax, "reads a string from memory"},
		{"0x10 %di:symbol", ErrSyntax, "only in kernel probes"},
		{"0x10 %di:symstr", ErrSyntax, "only in kernel probes"},
		{"0x10 %di:u8[4]", ErrSyntax, `"u8[4]"`},
		{"0x10 %di:b4@60/32", ErrSyntax, "outside the 32-bit container"},
		{"0x10 %di:b0@2/32", ErrSyntax, "width is at least 1"},
		{"0x10 %di:b33@0/32", ErrSyntax, "outside"},
		{"0x10 %di:b8@1/8", ErrSyntax, "outside"},
		{"0x10 %di:b4@2/24", ErrSyntax, "8, 16, 32 or 64"},
		{"0x10 %di:b4@04/32", ErrSyntax, "decimal"},
		{"0x10 %di:b4@0x4/32", ErrSyntax, "decimal"},
		{"0x10 %di:b4@2", ErrSyntax, "missing"},
		{"0x10 %di:b@2/32", ErrSyntax, "bad bitfield"},
		{"0x10 %di:b4@2/32/", ErrSyntax, "bad bitfield"},
		{"0x10 %di:b99999999999999999999@2/32", ErrSyntax, "bad bitfield"},
		{"0x10 %di:", ErrSyntax, `""`},
		{"0x10 $comm", ErrSyntax, `"$comm"`},
		{"0x10 $arg1", ErrSyntax, `"$arg1"`},
		{"0x10 @0x1234", ErrSyntax, `"@0x1234"`},
		{`0x10 \"str"`, ErrSyntax, `\"str"`},
		{"0x10 $stack03", ErrSyntax, `"$stack03"`},
		{"0x10 $stack0x3", ErrSyntax, `"$stack0x3"`},
		{"0x10 $stackx", ErrSyntax, `"$stackx"`},
		{"0x10 $stack268435456", ErrSyntax, "out of range"},
		{`0x10 \`, ErrSyntax, `\`},
		{`0x10 \18446744073709551616`, ErrSyntax, "out of range"},
		{`0x10 \-9223372036854775809`, ErrSyntax, "out of range"},
		{`0x10 \abc`, ErrSyntax, `\abc`},
		{"0x10 +8(%rsi)", ErrSyntax, `"%rsi"`},
		{"0x10 +8(%si", ErrSyntax, `"+8(%si"`},
		{"0x10 8(%si)", ErrSyntax, `"8(%si)"`},
		{"0x10 +(%si)", ErrSyntax, `""`},
		{"0x10 +8(+8(%si))", ErrSyntax, `"+8(%si)"`},
		{"0x10 +u8(%si)", ErrSyntax, `"u8"`},
		{"0x10 +2147483648(%di)", ErrSyntax, "32-bit"},
		{"0x10 -2147483649(%di)", ErrSyntax, "32-bit"},
		{"0x10 %di %si %ax %bx %cx %dx %r8 %r9 %r10", ErrSyntax, `"%r10"`},
		{"0x10 =%di", ErrSyntax, "empty argument name"},
		{"0x10 9a=%di", ErrSyntax, `"9a"`},
		{"0x10 a-b=%di", ErrSyntax, `"a-b"`},
		{"0x10 common_pid=%di", ErrSyntax, "reserved"},
		{"0x10 __probe_ip=%di", ErrSyntax, "reserved"},
		{"0x10 x=%di x=%si", ErrSyntax, `"x"`},
		{"0x10 arg2=%di %si", ErrSyntax, `"arg2"`},
		{"0x10 " + strings.Repeat("a", 32) + "=%di", ErrSyntax, "too long"},
		{"0x10 a=", ErrSyntax, "empty fetch"},
		{"0x10 garbage", ErrSyntax, `"garbage"`},
	}
	for _, tt := range tests {
		s, err := Parse(tt.in)
		if err == nil {
			t.Errorf("Parse(%q) = %v, want error", tt.in, s)
			continue
		}
		if !errors.Is(err, tt.want) {
			t.Errorf("Parse(%q) error %q is not %v", tt.in, err, tt.want)
		}
		if !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("Parse(%q) error %q does not mention %q", tt.in, err, tt.msg)
		}
	}
}

func TestErrorsUnwrapToErrno(t *testing.T) {
	tests := []struct {
		err   error
		errno syscall.Errno
	}{
		{ErrSyntax, syscall.EINVAL},
		{ErrBadSite, syscall.EINVAL},
		{ErrNoSymbol, syscall.ENOENT},
		{ErrRefused, syscall.EOPNOTSUPP},
		{ErrBadBinary, syscall.ENOEXEC},
	}
	for _, tt := range tests {
		_, perr := Parse("0x10 %bogus")
		if tt.err != ErrSyntax {
			perr = errors.Join(errors.New("context"), tt.err)
		}
		var errno syscall.Errno
		if !errors.As(perr, &errno) || errno != tt.errno {
			t.Errorf("%v: errno %v, want %v", tt.err, errno, tt.errno)
		}
		if !errors.Is(perr, tt.err) || !errors.Is(perr, tt.errno) {
			t.Errorf("%v: errors.Is fails on %v", tt.err, perr)
		}
	}
	if errors.Is(ErrSyntax, ErrBadSite) {
		t.Error("ErrSyntax matches ErrBadSite")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"0x1040 %di %si", "target+4 a=%di b=+8(%si):u32", "0x1170%multinop",
		"target+4%nopace", `0x10 \-0x5 $stack3 -8(%sp):s32`, "0x10 arg1=%di %si", "010", "%return",
		`"geo::area(long, long)"+4 %di # c`, "f %di\n# state: x\n",

		"0x10 a=+0(%si):string b=-8(%sp):ustring c=%di:char", "0x10 %di:b4@4/32 %si:b64@0/64 %ax:s8 %bx:x64",
		"0x10 %di:b4@04/32", "0x10 %di:symbol",
		"fib%return r=$retval", "f %pid=12 %comm=sh"} {

		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := Parse(in)
		if err != nil {
			if !errors.Is(err, ErrSyntax) && !errors.Is(err, ErrRefused) {
				t.Fatalf("Parse(%q): error %v wraps neither ErrSyntax nor ErrRefused", in, err)
			}
			return
		}
		// What the parser takes, ptw mode takes too or refuses with the
		// reason; its wire form has only the stub's types.
		if w, err := s.PTWWire(); err != nil {
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "string") {
				t.Fatalf("PTWWire(%q): %v", in, err)
			}
		} else {
			for _, a := range w.Args {
				if a.Bits.Width != 0 || a.Type != decode.U64 && a.Type != decode.U32 && a.Type != decode.S32 && a.Type != decode.X32 {
					t.Fatalf("PTWWire(%q) has %+v", in, a)
				}
			}
		}
		if len(s.Args) > MaxArgs {
			t.Fatalf("Parse(%q): %d args", in, len(s.Args))
		}
		text := s.String()
		s2, err := Parse(text)
		if err != nil {
			t.Fatalf("Parse(%q).String() = %q does not parse: %v", in, text, err)
		}
		if !reflect.DeepEqual(s, s2) {
			t.Fatalf("round trip of %q via %q: %+v != %+v", in, text, s, s2)
		}
		if s2.String() != text {
			t.Fatalf("String not canonical: %q then %q", text, s2.String())
		}
	})
}

// ptw mode: the kernel gets the words the stub writes (u64, or u32 and the
// 32-bit types the ptwrite document names); ptfs formats the rest, and
// strings are refused with the reason, naming the argument.
func TestPTWWire(t *testing.T) {
	tests := []struct {
		in, wire, formatted string
	}{
		{"0x10 %di %si:u32 %ax:s32 %bx:x32", "0x10 %di %si:u32 %ax:s32 %bx:x32", ""},
		{"0x10 a=%di:s64 b=%si:x64 c=%ax:u64", "0x10 a=%di b=%si c=%ax", "a=s64 b=x64"},
		{"0x10 a=%di:u8 b=%si:s16 c=+8(%ax):x8 d=%bx:char", "0x10 a=%di:u32 b=%si:u32 c=+8(%ax):u32 d=%bx:u32", "a=u8 b=s16 c=x8 d=char"},
		{"0x10 +24(%di):b4@4/32 %si:b12@40/64 %dx:b3@0/8", "0x10 +24(%di):u32 %si %dx:u32", "arg1=b4@4/32 arg2=b12@40/64 arg3=b3@0/8"},
	}
	for _, tt := range tests {
		s, err := Parse(tt.in)
		if err != nil {
			t.Fatal(err)
		}
		before := s.String()
		w, err := s.PTWWire()
		if err != nil {
			t.Errorf("PTWWire(%q): %v", tt.in, err)
			continue
		}
		if w.String() != tt.wire || s.PTWFormatted() != tt.formatted {
			t.Errorf("PTWWire(%q) = %q, formatted %q; want %q, %q", tt.in, w, s.PTWFormatted(), tt.wire, tt.formatted)
		}
		if s.String() != before {
			t.Errorf("PTWWire changed the spec: %q", s)
		}
	}
	for _, in := range []string{"0x10 %di s=+0(%si):string", "0x10 %di +0(%si):ustring"} {
		s, err := Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.PTWWire()
		if !errors.Is(err, ErrRefused) || !errors.Is(err, syscall.EOPNOTSUPP) || !strings.Contains(err.Error(), "cannot copy a string") ||
			!strings.Contains(err.Error(), "--mode classic") || !strings.Contains(err.Error(), " is a ") {
			t.Errorf("PTWWire(%q): %v, want refused with the reason", in, err)
		}
	}
}
