package tracefs

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"ptfs/decode"
	"ptfs/probes"
)

func TestLines(t *testing.T) {
	const off = 0x1189
	tests := []struct {
		spec, classic, ptw string
	}{
		{"0x1189", "p:G/E /bin/t:0x1189", "ptw:G/E /bin/t:0x1189"},
		{"target+9 %di %si", "p:G/E /bin/t:0x1189 %di %si", "ptw:G/E /bin/t:0x1189 %di %si"},
		{"0x1189 a=%di b=+8(%si):u32", "p:G/E /bin/t:0x1189 a=%di b=+8(%si):u32", "ptw:G/E /bin/t:0x1189 a=%di b=+8(%si):u32"},
		{"0x1189%multinop %di", "p:G/E /bin/t:0x1189 %di", "ptw:G/E /bin/t:0x1189%multinop %di"},
		{"0x1189 %di %nopace", "p:G/E /bin/t:0x1189 %di", "ptw:G/E /bin/t:0x1189 %di %nopace"},
		{"0x1189%multinop%nopace", "p:G/E /bin/t:0x1189", "ptw:G/E /bin/t:0x1189%multinop %nopace"},
		{`0x1189 \0x2A \-5 $stack $stack2`, `p:G/E /bin/t:0x1189 \0x2a \-5 $stack $stack2`, `ptw:G/E /bin/t:0x1189 \0x2a \-5 $stack $stack2`},
		{"0x1189 -8(%sp):s32 x=%ax:x32 y=%bx:u64", "p:G/E /bin/t:0x1189 -8(%sp):s32 x=%ax:x32 y=%bx", "ptw:G/E /bin/t:0x1189 -8(%sp):s32 x=%ax:x32 y=%bx"},
	}
	for _, tt := range tests {
		s := mustParse(t, tt.spec)
		if got := ClassicLine("G", "E", "/bin/t", off, s); got != tt.classic {
			t.Errorf("ClassicLine(%q) = %q, want %q", tt.spec, got, tt.classic)
		}
		if got := PTWLine("G", "E", "/bin/t", off, s); got != tt.ptw {
			t.Errorf("PTWLine(%q) = %q, want %q", tt.spec, got, tt.ptw)
		}
		for _, l := range []string{tt.classic, tt.ptw} {
			pl, err := ParseLine(l)
			if err != nil || pl.Group != "G" || pl.Event != "E" || pl.Path != "/bin/t" || pl.Offset != 0x1189 {
				t.Errorf("ParseLine(%q) = %+v, %v", l, pl, err)
			}
		}
	}
}

func TestParseLine(t *testing.T) {
	tests := []struct {
		line string
		want ProbeLine
		err  bool
	}{
		{"p:h3exp/a /tmp/h3x/t:0x0000000000001180 arg1=%di arg2=%si", ProbeLine{"p", "h3exp", "a", "/tmp/h3x/t", 0x1180}, false},
		{"r:h3exp/v /tmp/h3x/t:0x0000000000001180 arg1=%di", ProbeLine{"r", "h3exp", "v", "/tmp/h3x/t", 0x1180}, false},
		{"ptw:probe_t/target ./t:0x1189 arg1=%di arg2=%si", ProbeLine{"ptw", "probe_t", "target", "./t", 0x1189}, false},
		{"ptw:e /bin/t:0x1170%multinop %di", ProbeLine{}, true},
		{"ptw:g/e /bin/t:0x1170%multinop %di", ProbeLine{"ptw", "g", "e", "/bin/t", 0x1170}, false},
		{"p:g/e /a:b/c:0x10(0x20)", ProbeLine{"p", "g", "e", "/a:b/c", 0x10}, false},
		{"p:g/e /bin/t:4480", ProbeLine{"p", "g", "e", "/bin/t", 4480}, false},
		{"", ProbeLine{}, true},
		{"p:g/e", ProbeLine{}, true},
		{"x:g/e /bin/t:0x10", ProbeLine{}, true},
		{"p:g/ /bin/t:0x10", ProbeLine{}, true},
		{"p:/e /bin/t:0x10", ProbeLine{}, true},
		{"p:g/e /bin/t", ProbeLine{}, true},
		{"p:g/e :0x10", ProbeLine{}, true},
		{"p:g/e /bin/t:0xzz", ProbeLine{}, true},
		{"-:g/e", ProbeLine{}, true},
	}
	for _, tt := range tests {
		got, err := ParseLine(tt.line)
		if tt.err {
			if !errors.Is(err, probes.ErrSyntax) {
				t.Errorf("ParseLine(%q) = %+v, %v; want probes.ErrSyntax", tt.line, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseLine(%q) = %+v, %v; want %+v", tt.line, got, err, tt.want)
		}
	}
}

func TestNames(t *testing.T) {
	groups := []struct {
		pid          int
		target, want string
	}{
		{42, "t", "ptfs42_t"},
		{1234, "my-prog.bin", "ptfs1234_my_prog_bin"},
		{7, "", "ptfs7_"},
		{7, "ünï", "ptfs7___n__"},
		{99999, strings.Repeat("x", 80), "ptfs99999_" + strings.Repeat("x", 53)},
	}
	for _, tt := range groups {
		got := GroupName(tt.pid, tt.target)
		if got != tt.want || len(got) > maxEventName {
			t.Errorf("GroupName(%d, %q) = %q, want %q", tt.pid, tt.target, got, tt.want)
		}
		if pid, ok := groupPID(got); !ok || pid != tt.pid {
			t.Errorf("groupPID(%q) = %d, %v", got, pid, ok)
		}
	}
	events := []struct{ in, want string }{
		{"e", "e"},
		{"entry_1", "entry_1"},
		{"9lives", "_9lives"},
		{"a.b-c", "a_b_c"},
		{"", "_"},
		{strings.Repeat("y", 70), strings.Repeat("y", 63)},
	}
	for _, tt := range events {
		if got := EventName(tt.in); got != tt.want {
			t.Errorf("EventName(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	for _, g := range []string{"uprobes", "ptfs", "ptfs_x", "ptfsx_1", "ptfs012_t", "ptfs12", "ptfs-1_t", "ptfs99999999999999999999_t"} {
		if pid, ok := groupPID(g); ok {
			t.Errorf("groupPID(%q) = %d, want no ptfs group", g, pid)
		}
	}
}

func TestErrorLogReason(t *testing.T) {
	const entry = "[  253.335922] trace_uprobe: error: Invalid register name\n" +
		"  Command: p:h3exp/e /tmp/h3x/t:0x1180 %ds\n" +
		"                                       ^\n"
	tests := []struct{ log, cmd, want string }{
		{"", "x", ""},
		{"garbage\n", "x", ""},
		{entry, "p:h3exp/e /tmp/h3x/t:0x1180 %ds", `Invalid register name (at "%ds")`},
		// Another writer's newer entry is not ours.
		{entry + "[  264.750676] trace_uprobe: error: Failed to find the given file\n" +
			"  Command: p:other/l /nonexist:0x10 %di\n" +
			"                     ^\n",
			"p:h3exp/e /tmp/h3x/t:0x1180 %ds", `Invalid register name (at "%ds")`},
		{"[    1.000000] trace_uprobe: error: Old one\n  Command: p:h3exp/l /nonexist:0x10 %di\n             ^\n" +
			"[  264.750676] trace_uprobe: error: Failed to find the given file\n" +
			"  Command: p:h3exp/l /nonexist:0x10 %di\n" +
			"                     ^\n",
			"p:h3exp/l /nonexist:0x10 %di", `Failed to find the given file (at "/nonexist:0x10")`},
		{entry, "p:h3exp/f /tmp/h3x/t:0x1180 %ds", ""},
		{"[ 1.0] trace_uprobe: error: No caret\n  Command: x\n", "x", "No caret"},
		{"[ 1.0] something else\n  Command: x\n    ^\n", "x", "something else"},
	}
	for _, tt := range tests {
		if got := errorLogReason(tt.log, tt.cmd); got != tt.want {
			t.Errorf("errorLogReason(%q, %q) = %q, want %q", tt.log, tt.cmd, got, tt.want)
		}
	}
}

const realFormat = `name: a
ID: 2326
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:unsigned char common_preempt_count;	offset:3;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:unsigned long __probe_ip;	offset:8;	size:8;	signed:0;
	field:u64 arg1;	offset:16;	size:8;	signed:0;
	field:s32 b;	offset:24;	size:4;	signed:1;

print fmt: "(%lx) arg1=0x%Lx b=%d", REC->__probe_ip, REC->arg1, REC->b
`

func TestMatchArgs(t *testing.T) {
	parse := func() []decode.Arg {
		ev, err := ParseFormat(strings.NewReader(realFormat))
		if err != nil || ev == nil {
			t.Fatalf("ParseFormat: %v, %v", ev, err)
		}
		return ev.Args
	}
	args := parse()
	if err := matchArgs(args, mustParse(t, "0x10 %di b=%si:s32")); err != nil {
		t.Fatal(err)
	}
	if len(args) != 2 || args[0].Name != "" || args[0].Offset != 16 || args[0].Size != 8 ||
		args[1].Name != "b" || args[1].Offset != 24 || args[1].Size != 4 || args[1].Type.String() != "s32" {
		t.Errorf("matchArgs = %+v", args)
	}
	for _, spec := range []string{"0x10 %di", "0x10 %di c=%si:s32", "0x10 %di b=%si", "0x10 %di %si %ax",
		"0x10 %di b=+0(%si):string", "0x10 %di b=%si:u16", "0x10 %di b=%si:b4@0/16"} {
		if a := parse(); matchArgs(a, mustParse(t, spec)) == nil {
			t.Errorf("matchArgs(%q) = %+v, want a mismatch error", spec, a)
		}
	}
}

func FuzzParseLine(f *testing.F) {
	f.Add("p:h3exp/a /tmp/h3x/t:0x0000000000001180 arg1=%di arg2=%si")
	f.Add("ptw:g/e /bin/t:0x1170%multinop %di %nopace")
	f.Add("p:g/e /a:b/c:0x10(0x20)")
	f.Fuzz(func(t *testing.T, line string) {
		pl, err := ParseLine(line)
		if err != nil {
			if !errors.Is(err, probes.ErrSyntax) {
				t.Fatalf("error %v is not probes.ErrSyntax", err)
			}
			return
		}
		if pl.Group == "" || pl.Event == "" || pl.Path == "" {
			t.Fatalf("ParseLine(%q) = %+v", line, pl)
		}
	})
}

func TestNumbered(t *testing.T) {
	long := strings.Repeat("a", 63)
	cases := []struct {
		name string
		n    int
		want string
	}{
		{"e", 1, "e"},
		{"e", 2, "e_2"},
		{"ptfs1_t", 12, "ptfs1_t_12"},
		{long, 2, long[:61] + "_2"},
		{long, 100, long[:59] + "_100"},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		got := Numbered(c.name, c.n)
		if got != c.want || len(got) > maxEventName {
			t.Errorf("Numbered(%q, %d) = %q, want %q", c.name, c.n, got, c.want)
		}
		seen[got] = true
	}
	// Long names stay distinct however they are numbered.
	seen = map[string]bool{long: true}
	for i := 2; i < 1000; i++ {
		if g := Numbered(long, i); seen[g] {
			t.Fatalf("Numbered(long, %d) = %q repeats", i, g)
		} else {
			seen[g] = true
		}
	}
}

// TestPTWLine covers every spec form in ptw: lines. The wanted lines are
// those of DESIGN §1 and of the ptwrite uprobes documentation, including
// the line perf probe --ptwrite writes for "target+9 %di %si".
func TestPTWLine(t *testing.T) {
	tests := []struct {
		group, event, path string
		off                uint64
		spec, want         string
	}{
		// perf probe --ptwrite -x ./t --add "target+9 %di %si" writes this.
		{"probe_t", "target", "./t", 0x1189, "target+9 arg1=%di arg2=%si", "ptw:probe_t/target ./t:0x1189 arg1=%di arg2=%si"},
		// DESIGN §1 and the documentation's quick start.
		{"uprobes", "e", "t", 0x1040, "0x1040 %di %si", "ptw:uprobes/e t:0x1040 %di %si"},
		{"uprobes", "e", "/bin/t", 0x1180, "0x1180 %di", "ptw:uprobes/e /bin/t:0x1180 %di"},
		{"uprobes", "e", "t", 0x1170, "0x1170%multinop %di %si", "ptw:uprobes/e t:0x1170%multinop %di %si"},
		{"G", "E", "/bin/t", 0x1170, "0x1170 %multinop %di", "ptw:G/E /bin/t:0x1170%multinop %di"},
		{"G", "E", "/bin/t", 0x1170, "0x1170 %di %nopace", "ptw:G/E /bin/t:0x1170 %di %nopace"},
		{"G", "E", "/bin/t", 0x1170, "0x1170%nopace %di", "ptw:G/E /bin/t:0x1170 %di %nopace"},
		{"G", "E", "/bin/t", 0x1170, "0x1170 %nopace %multinop", "ptw:G/E /bin/t:0x1170%multinop %nopace"},
		{"G", "E", "/bin/t", 0x10, "0x10", "ptw:G/E /bin/t:0x10"},
		// Every fetcharg form, with and without names, in every type.
		{"G", "E", "/bin/t", 0x10, "0x10 %ax %r15:u32 %bx:s32 %cx:x32 %dx:u64", "ptw:G/E /bin/t:0x10 %ax %r15:u32 %bx:s32 %cx:x32 %dx"},
		{"G", "E", "/bin/t", 0x10, `0x10 \0x42 k=\7:u32 \-1:s32`, `ptw:G/E /bin/t:0x10 \0x42 k=\7:u32 \-1:s32`},
		{"G", "E", "/bin/t", 0x10, "0x10 $stack s=$stack3 $stack0:x32", "ptw:G/E /bin/t:0x10 $stack s=$stack3 $stack0:x32"},
		{"G", "E", "/bin/t", 0x10, "0x10 +8(%si) m=-16(%bp):u32 +0(%sp):s32 +0x20(%di):x32", "ptw:G/E /bin/t:0x10 +8(%si) m=-16(%bp):u32 +0(%sp):s32 +0x20(%di):x32"},
		{"G", "E", "/bin/t", 0x10, "0x10 a=%di b=+8(%si):u32 %nopace", "ptw:G/E /bin/t:0x10 a=%di b=+8(%si):u32 %nopace"},
	}
	for _, tt := range tests {
		s := mustParse(t, tt.spec)
		got := PTWLine(tt.group, tt.event, tt.path, tt.off, s)
		if got != tt.want {
			t.Errorf("PTWLine(%q) = %q, want %q", tt.spec, got, tt.want)
			continue
		}
		pl, err := ParseLine(got)
		if err != nil || pl != (ProbeLine{"ptw", tt.group, tt.event, tt.path, tt.off}) {
			t.Errorf("ParseLine(%q) = %+v, %v", got, pl, err)
		}
	}
}

// TestErrorsUnwrapToErrno: each sentinel matches itself and its errno
// through a wrapped error, and no other sentinel.
func TestErrorsUnwrapToErrno(t *testing.T) {
	tests := []struct {
		err   error
		errno syscall.Errno
	}{
		{ErrExists, syscall.EEXIST},
		{ErrNoTracefs, syscall.ENODEV},
		{ErrBadLine, syscall.EINVAL},
	}
	for _, tt := range tests {
		err := fmt.Errorf("context: %w", tt.err)
		var errno syscall.Errno
		if !errors.As(err, &errno) || errno != tt.errno {
			t.Errorf("%v: errno %v, want %v", tt.err, errno, tt.errno)
		}
		if !errors.Is(err, tt.err) || !errors.Is(err, tt.errno) {
			t.Errorf("%v: errors.Is fails on %v", tt.err, err)
		}
	}
	if errors.Is(ErrBadLine, probes.ErrSyntax) {
		t.Error("ErrBadLine matches probes.ErrSyntax")
	}
}
