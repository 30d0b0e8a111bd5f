package tracefs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"ptfs/decode"
)

func TestParseFormat(t *testing.T) {
	const common = "name: e\nID: 2326\nformat:\n" +
		"\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n" +
		"\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n" +
		"\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n" +
		"\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
	tests := []struct {
		name    string
		in      string
		want    []decode.Arg
		nonProb bool
		err     bool
	}{
		{
			name: "classic uprobe as 6.18 writes it",
			in: common + "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n" +
				"\tfield:u64 arg1;\toffset:16;\tsize:8;\tsigned:0;\n" +
				"\tfield:u32 b;\toffset:24;\tsize:4;\tsigned:0;\n" +
				"\tfield:s32 arg3;\toffset:28;\tsize:4;\tsigned:1;\n" +
				"\tfield:u32 arg4;\toffset:32;\tsize:4;\tsigned:0;\n\n" +
				"print fmt: \"(%lx) arg1=0x%Lx b=0x%x arg3=%d arg4=%u\", REC->__probe_ip, REC->arg1, REC->b, REC->arg3, REC->arg4\n",
			want: []decode.Arg{{Type: decode.U64, Offset: 16, Size: 8}, {Name: "b", Type: decode.X32, Offset: 24, Size: 4},
				{Type: decode.S32, Offset: 28, Size: 4}, {Type: decode.U32, Offset: 32, Size: 4}},
		},
		{
			name: "every type, as 6.18 wrote it for a probe of this machine",
			in: common + "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n" +
				"\tfield:s64 a;\toffset:16;\tsize:8;\tsigned:1;\n" +
				"\tfield:u64 ax;\toffset:24;\tsize:8;\tsigned:0;\n" +
				"\tfield:u8 b;\toffset:32;\tsize:1;\tsigned:0;\n" +
				"\tfield:s8 bs;\toffset:33;\tsize:1;\tsigned:1;\n" +
				"\tfield:u8 bx;\toffset:34;\tsize:1;\tsigned:0;\n" +
				"\tfield:s16 d;\toffset:35;\tsize:2;\tsigned:1;\n" +
				"\tfield:u16 dx;\toffset:37;\tsize:2;\tsigned:0;\n" +
				"\tfield:u16 e;\toffset:39;\tsize:2;\tsigned:0;\n" +
				"\tfield:u32 bf;\toffset:41;\tsize:4;\tsigned:0;\n" +
				"\tfield:u64 u;\toffset:45;\tsize:8;\tsigned:0;\n" +
				"\tfield:__data_loc char[] str;\toffset:53;\tsize:4;\tsigned:1;\n" +
				"\tfield:u8 c;\toffset:57;\tsize:1;\tsigned:0;\n" +
				"\tfield:u32 x;\toffset:58;\tsize:4;\tsigned:0;\n\n" +
				`print fmt: "(%lx) a=%Ld ax=0x%Lx b=%u bs=%d bx=0x%x d=%d dx=0x%x e=%u bf=%u u=%Lu str=\"%s\" c='%c' x=0x%x", ` +
				"REC->__probe_ip, REC->a, REC->ax, REC->b, REC->bs, REC->bx, REC->d, REC->dx, REC->e, REC->bf, REC->u, __get_str(str), REC->c, REC->x\n",
			want: []decode.Arg{{Name: "a", Type: decode.S64, Offset: 16, Size: 8}, {Name: "ax", Type: decode.U64, Offset: 24, Size: 8},
				{Name: "b", Type: decode.U8, Offset: 32, Size: 1}, {Name: "bs", Type: decode.S8, Offset: 33, Size: 1},
				{Name: "bx", Type: decode.X8, Offset: 34, Size: 1}, {Name: "d", Type: decode.S16, Offset: 35, Size: 2},
				{Name: "dx", Type: decode.X16, Offset: 37, Size: 2}, {Name: "e", Type: decode.U16, Offset: 39, Size: 2},
				{Name: "bf", Type: decode.U32, Offset: 41, Size: 4}, {Name: "u", Type: decode.U64, Offset: 45, Size: 8},
				{Name: "str", Type: decode.String, Offset: 53, Size: 4}, {Name: "c", Type: decode.Char, Offset: 57, Size: 1},
				{Name: "x", Type: decode.X32, Offset: 58, Size: 4}},
		},
		{
			name: "return probe: arguments after __probe_func and __probe_ret_ip",
			in: common + "\tfield:unsigned long __probe_func;\toffset:8;\tsize:8;\tsigned:0;\n" +
				"\tfield:unsigned long __probe_ret_ip;\toffset:16;\tsize:8;\tsigned:0;\n" +
				"\tfield:s32 ret;\toffset:24;\tsize:4;\tsigned:1;\n\n" +
				"print fmt: \"(%lx <- %lx) ret=%d\", REC->__probe_func, REC->__probe_ret_ip, REC->ret\n",
			want: []decode.Arg{{Name: "ret", Type: decode.S32, Offset: 24, Size: 4}},
		},
		{
			name: "named arg2 in first position stays named",
			in: common + "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n" +
				"\tfield:u64 arg2;\toffset:16;\tsize:8;\tsigned:0;\n",
			want: []decode.Arg{{Name: "arg2", Offset: 16, Size: 8}},
		},
		{name: "not a probe", in: common + "\tfield:int x;\toffset:8;\tsize:4;\tsigned:1;\n", nonProb: true},
		{name: "empty", in: "", nonProb: true},
		{name: "bad size", in: common + "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:u16 x;\toffset:16;\tsize:16;\tsigned:0;\n", err: true},
		{name: "bad number", in: "\tfield:int x;\toffset:z;\tsize:4;\tsigned:1;\n", err: true},
		{name: "short line", in: "\tfield:int x;\toffset:1;\n", err: true},
	}
	for _, tt := range tests {
		ev, err := ParseFormat(strings.NewReader(tt.in))
		switch {
		case tt.err:
			if !errors.Is(err, ErrBadEvent) {
				t.Errorf("%s: err %v, want ErrBadEvent", tt.name, err)
			}
		case err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.nonProb:
			if ev != nil {
				t.Errorf("%s: got event %+v, want none", tt.name, ev)
			}
		case ev == nil:
			t.Errorf("%s: not recognized as a probe", tt.name)
		default:
			if fmt.Sprint(ev.Args) != fmt.Sprint(tt.want) {
				t.Errorf("%s: args %+v, want %+v", tt.name, ev.Args, tt.want)
			}
		}
	}
}

func TestLoadEventsDir(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, s string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	probe := "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:u64 x;\toffset:16;\tsize:8;\tsigned:0;\n"
	write("ptfs_t/e/id", "1730\n")
	write("ptfs_t/e/format", probe)
	write("sched/switch/id", "300\n")
	write("sched/switch/format", "\tfield:int prev;\toffset:8;\tsize:4;\tsigned:1;\n")
	write("enable", "0\n")
	write("ptfs_t/enable", "0\n")
	evs, err := LoadEvents(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[1730] == nil || evs[1730].Group != "ptfs_t" || evs[1730].Name != "e" ||
		len(evs[1730].Args) != 1 || evs[1730].Args[0].Name != "x" {
		t.Fatalf("events %+v", evs)
	}
	write("other/f/id", "1730\n")
	write("other/f/format", probe)
	if _, err := LoadEvents(os.DirFS(dir)); !errors.Is(err, ErrBadEvent) {
		t.Errorf("duplicate id: err %v", err)
	}
	write("other/f/id", "x\n")
	if _, err := LoadEvents(os.DirFS(dir)); !errors.Is(err, ErrBadEvent) {
		t.Errorf("bad id: err %v", err)
	}
	if _, err := LoadEvents(os.DirFS(filepath.Join(dir, "nope"))); err == nil {
		t.Error("missing directory: no error")
	}
}

// TestLoadEventsTracefs installs a classic uprobe on /bin/true, loads the
// real tracefs events tree, and checks that the live reader (Tracefs.Event)
// gives the same event.
func TestLoadEventsTracefs(t *testing.T) {
	tf := tracefsT(t)
	group := testGroup(t, tf, "load")
	spec := mustParse(t, `0x1000 %di b=%si:x32 \0x10:s32 c=+8(%sp):u32`)
	if err := tf.AddProbe(ClassicLine(group, "e", "/bin/true", 0x1000, spec)); err != nil {
		t.Fatal(err)
	}
	// Load a copy of this group's events, as `ptfs decode --events` is
	// used: the live tree changes under a walk (other tests add and remove
	// events meanwhile, and the kernel reuses their ids).
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-r", filepath.Join(tf.Dir, "events", group), dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the group's events: %v: %s", err, out)
	}
	evs, err := LoadEvents(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	var ev *decode.Event
	for _, e := range evs {
		if e.Group == group {
			ev = e
		}
	}
	if ev == nil {
		t.Fatalf("%s/e not loaded (%d events)", group, len(evs))
	}
	idb, err := os.ReadFile(filepath.Join(tf.Dir, "events", group, "e", "id"))
	if err != nil {
		t.Fatal(err)
	}
	if strconv.Itoa(int(ev.ID)) != strings.TrimSpace(string(idb)) || ev.Name != "e" {
		t.Errorf("event %+v, id file %q", ev, idb)
	}
	want := []decode.Arg{{Type: decode.U64, Offset: 16, Size: 8}, {Name: "b", Type: decode.X32, Offset: 24, Size: 4},
		{Type: decode.S32, Offset: 28, Size: 4}, {Name: "c", Type: decode.U32, Offset: 32, Size: 4}}
	if fmt.Sprint(ev.Args) != fmt.Sprint(want) {
		t.Errorf("args %+v, want %+v", ev.Args, want)
	}
	live, err := tf.Event(group, "e", spec)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(*live) != fmt.Sprint(*ev) {
		t.Errorf("Tracefs.Event %+v, LoadEvents %+v", *live, *ev)
	}
}

// FuzzParseFormat checks that no format text panics and that what parses
// has sane arguments.
func FuzzParseFormat(f *testing.F) {
	f.Add("\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:u32 b;\toffset:24;\tsize:4;\tsigned:0;\n" +
		"print fmt: \"(%lx) b=0x%x\", REC->__probe_ip, REC->b\n")
	f.Add("field:int x;\toffset:1;\n")
	f.Add("\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:__data_loc char[] s;\toffset:16;\tsize:4;\tsigned:1;\n" +
		"\tfield:u8 c;\toffset:20;\tsize:1;\tsigned:0;\n\tfield:s64 n;\toffset:21;\tsize:8;\tsigned:1;\n" +
		`print fmt: "(%lx) s=\"%s\" c='%c' n=%Ld", REC->__probe_ip, __get_str(s), REC->c, REC->n` + "\n")
	f.Fuzz(func(t *testing.T, s string) {
		ev, err := ParseFormat(strings.NewReader(s))
		if err != nil || ev == nil {
			return
		}
		for _, a := range ev.Args {
			if a.Type.Size() != a.Size || a.Offset < 0 {
				t.Fatalf("arg %+v", a)
			}
		}
	})
}
