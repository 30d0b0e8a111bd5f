package tracefs_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"ptfs/decode"
	"ptfs/internal/testkit"
	"ptfs/probes"
	"ptfs/tracefs"
	"ptfs/tracefs/tracefstest"
)

// TestHostileLines feeds probe lines with hostile paths, names and
// arguments to AddProbe, on the simulated kernel (which, like the real
// one, runs every line of what it is given) and on this machine's kernel:
// uprobe_events gains exactly the intended line or nothing.
func TestHostileLines(t *testing.T) {
	bin := testkit.BuildC(t, filepath.Join("..", "probes", "testdata", "sites.c"))
	// A symlink whose name carries an injected probe: opened through it,
	// the binary is probed by its descriptor, so the name never matters.
	evilDir := filepath.Join(t.TempDir(), "load:0x10\np:evil")
	if err := os.Mkdir(evilDir, 0o755); err != nil {
		t.Fatal(err)
	}
	evilPath := filepath.Join(evilDir, "e "+bin[1:]+":0x10 x=%di\n#load")
	if err := os.MkdirAll(filepath.Dir(evilPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, evilPath); err != nil {
		t.Fatal(err)
	}
	b, err := probes.Open(evilPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	site, err := b.Resolve(&probes.Spec{Symbol: "sites"})
	if err != nil {
		t.Fatal(err)
	}
	good := spec(t, "sites a=%di b=+8(%si):u32")
	long := "/" + strings.Repeat("a", 4095)
	arg := func(name, fetch string) *probes.Spec {
		return &probes.Spec{Args: []probes.Arg{{Name: name, Fetch: fetch, Type: decode.U64}}}
	}

	kernels := map[string]*tracefs.Tracefs{"simulated": tracefstest.New(t, tracefstest.Options{}).Tracefs}
	if os.Geteuid() == 0 {
		real, err := tracefs.FindTracefs()
		if err != nil {
			t.Fatalf("no tracefs as root: %v", err)
		}
		kernels["real"] = real
	} else {
		t.Log("not root: the real kernel is left out")
	}
	for kname, tf := range kernels {
		t.Run(kname, func(t *testing.T) {
			group := tracefs.GroupName(os.Getpid(), "hostile")
			// What the attacks would create, if any got through.
			evil := []string{"evil", group}
			t.Cleanup(func() { removeGroups(t, tf, evil) })
			tests := []struct {
				name        string
				event, path string
				spec        *probes.Spec
				ok          bool
			}{
				{"fd path of a hostile symlink", "e", b.FDPath(), good, true},
				{"newline in path", "e", "/tmp/x/load:0x13c0\np:evil/e " + bin + ":0x13c0 x=%di\n#/load", good, false},
				{"CR in path", "e", bin + "\r", good, false},
				{"NUL in path", "e", bin + "\x00p:evil/e " + bin, good, false},
				{"space in path", "e", bin + " x", good, false},
				{"colon in path", "e", bin + ":0x10", good, false},
				{"percent in path", "e", bin + "%return", good, false},
				{"hash in path", "e", bin + "#x", good, false},
				{"greater in path", "e", bin + ">x", good, false},
				{"relative path", "e", "sites", good, false},
				{"4096-byte path", "e", long, good, false},
				{"newline in event", "e\np:evil/e " + bin + ":0x10", b.FDPath(), good, false},
				{"colon in event", "e:x", b.FDPath(), good, false},
				{"space in event", "e x", b.FDPath(), good, false},
				{"long event", strings.Repeat("e", 64), b.FDPath(), good, false},
				{"newline in argument name", "e", b.FDPath(), arg("a\np:evil/e", "%di"), false},
				{"hash in argument name", "e", b.FDPath(), arg("a#", "%di"), false},
				{"newline in fetch", "e", b.FDPath(), arg("a", "%di\np:evil/e "+bin+":0x10"), false},
				{"space in fetch", "e", b.FDPath(), arg("a", "%di %si"), false},
				{"greater in fetch", "e", b.FDPath(), arg("a", ">%di"), false},
				{"CR in fetch", "e", b.FDPath(), arg("a", "%di\r"), false},
				{"every type", "e", b.FDPath(), spec(t, "sites a=%di:s8 b=%si:x16 c=+0(%si):string d=+0(%di):ustring e=+1(%si):char f=%ax:b3@2/16 g=%bx:s64"), true},
				{"string on a register", "e", b.FDPath(), &probes.Spec{Args: []probes.Arg{{Name: "s", Fetch: "%di", Type: decode.String}}}, false},
				{"quote after a string fetch", "e", b.FDPath(), arg("s", `+0(%si):string"`), false},
				{"immediate string", "e", b.FDPath(), arg("s", `\"p:evil/e"`), false},
				{"newline after a string type", "e", b.FDPath(), &probes.Spec{Args: []probes.Arg{{Name: "s", Fetch: "+0(%si):string\np:evil/e " + bin + ":0x10", Type: decode.String}}}, false},
				{"bitfield outside its container", "e", b.FDPath(), &probes.Spec{Args: []probes.Arg{{Name: "s", Fetch: "%di", Type: decode.U8, Bits: decode.Bitfield{Width: 8, Offset: 4}}}}, false},
			}
			for _, tt := range tests {
				before := events(t, tf)
				line, err := tracefs.Line(false, group, tt.event, tt.path, site.Offset, tt.spec)
				if err == nil {
					err = tf.AddProbe(line)
				} else if raw := tracefs.ClassicLine(group, tt.event, tt.path, site.Offset, tt.spec); tracefs.CheckCommand(raw) != nil {
					// AddProbe refuses it too, whoever built it.
					if aerr := tf.AddProbe(raw); !errors.Is(aerr, tracefs.ErrBadLine) {
						t.Errorf("%s: AddProbe(%q) = %v, want ErrBadLine", tt.name, raw, aerr)
					}
				}
				gained := added(before, events(t, tf), bin, b.FDPath())
				if tt.ok {
					if err != nil || len(gained) != 1 || !strings.HasPrefix(gained[0], "p:"+group+"/"+tt.event+" "+tt.path+":") {
						t.Errorf("%s: AddProbe = %v, gained %q; want the one line %q", tt.name, err, gained, line)
					}
				} else if !errors.Is(err, tracefs.ErrBadLine) || !errors.Is(err, syscall.EINVAL) || len(gained) != 0 {
					t.Errorf("%s: AddProbe(%q) = %v, gained %q; want ErrBadLine and nothing", tt.name, line, err, gained)
				}
				removeGroups(t, tf, evil)
			}
			if err := tf.RemoveProbe("evil\ne", "x"); !errors.Is(err, tracefs.ErrBadLine) {
				t.Errorf("RemoveProbe with a newline in the group: %v, want ErrBadLine", err)
			}
		})
	}
}

// added returns the lines of after that before does not have and that this
// test can have made: of its own group or the attacks' "evil", or naming one
// of its files. Other packages' tests run beside this one (go test ./...)
// and add probes meanwhile: their mounts' groups, and the stand-ins that
// their ptw trials leave in group uprobes for a moment.
func added(before, after []string, files ...string) []string {
	mine := tracefs.GroupName(os.Getpid(), "")
	var out []string
	for _, l := range after {
		if slices.Contains(before, l) {
			continue
		}
		pl, err := tracefs.ParseLine(l)
		ours := err != nil || strings.HasPrefix(pl.Group, mine) || pl.Group == "evil" ||
			slices.ContainsFunc(files, func(f string) bool { return strings.Contains(l, f) })
		if ours {
			out = append(out, l)
		}
	}
	return out
}

// removeGroups removes every probe of the given groups.
func removeGroups(t *testing.T, tf *tracefs.Tracefs, groups []string) {
	t.Helper()
	for _, l := range events(t, tf) {
		if pl, err := tracefs.ParseLine(l); err == nil && slices.Contains(groups, pl.Group) {
			if err := tf.RemoveProbe(pl.Group, pl.Event); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
}

// TestCheckCommand checks the grammar gate on its own.
func TestCheckCommand(t *testing.T) {
	tests := []struct {
		cmd string
		ok  bool
	}{
		{"p:g/e /proc/1/fd/3:0x1180", true},
		{"p:g/e /proc/1/fd/3:0x1180 a=%di +8(%si):u32 \\-0x2a $stack3", true},
		{"ptw:g/e /proc/1/fd/3:0x1180%multinop %di %nopace", true},
		{"-:g/e", true},
		{"p:g/e /proc/1/fd/3:0x1180%multinop", false},
		{"p:g/e /proc/1/fd/3:0x1180 %nopace", false},
		{"r:g/e /bin/true:0x10", true},
		{"r:g/e /bin/true:0x10 r=$retval", true},
		{"p:g/e /bin/true:0x10 r=$retval", false},
		{"ptw:g/e /bin/true:0x10 $retval", false},
		{"r:g/e /bin/true:0x10%multinop", false},
		{"p:g/e /bin/true:0x10  %di", false},
		{"p:g/e /bin/true:0x10 %di ", false},
		{"p:g/e /bin/true:0X10", false},
		{"p:g/e /bin/true:16", false},
		{"p:g/e /bin/true:0x10\n", false},
		{"p:g/e /bin/true:0x10 a=%di:u16 +9(%di):char %si:s64 %ax:x8 +24(%di):b4@4/32 %bx:b64@0/64", true},
		{"p:g/e /bin/true:0x10 s=+0(%si):string u=-8(%sp):ustring", true},
		{"ptw:g/e /bin/true:0x10 %di:u32 %si:s32 %ax:x32 %bx", true},
		{"ptw:g/e /bin/true:0x10 %di:u8", false},
		{"ptw:g/e /bin/true:0x10 %di:s64", false},
		{"ptw:g/e /bin/true:0x10 %di:b4@4/32", false},
		{"ptw:g/e /bin/true:0x10 +0(%si):string", false},
		{"p:g/e /bin/true:0x10 %di:u64", false},
		{"p:g/e /bin/true:0x10 %di:string", false},
		{"p:g/e /bin/true:0x10 $stack:ustring", false},
		{"p:g/e /bin/true:0x10 +0(%si):string\"", false},
		{"p:g/e /bin/true:0x10 +0(%si):\"string\"", false},
		{"p:g/e /bin/true:0x10 \\\"x\":string", false},
		{"p:g/e /bin/true:0x10 +0(%si):string#", false},
		{"p:g/e /bin/true:0x10 +0(%si):symbol", false},
		{"p:g/e /bin/true:0x10 +0(%si):u8[4]", false},
		{"p:g/e /bin/true:0x10 %di:b4@04/32", false},
		{"p:g/e /bin/true:0x10 %di:b4@0x4/32", false},
		{"p:g/e /bin/true:0x10 %di:b4@30/32", false},
		{"p:g/e /bin/true:0x10 %di:b32@0/32", true},
		{"p:g/e /bin/true:0x10 a=%DI", false},
		{"p:g/e\t/bin/true:0x10", false},
		{"p:g /bin/true:0x10", false},
		{"p:/e /bin/true:0x10", false},
		{"-:g/e\n-:g/f", false},
		{"-:g/e f", false},
		{"-:g", false},
		{"", false},
		{"# comment", false},
	}
	for _, tt := range tests {
		err := tracefs.CheckCommand(tt.cmd)
		if (err == nil) != tt.ok || err != nil && !errors.Is(err, tracefs.ErrBadLine) {
			t.Errorf("CheckCommand(%q) = %v, want ok %v", tt.cmd, err, tt.ok)
		}
	}
}

// FuzzCheckCommand: whatever CheckCommand passes is one line without a
// comment, control byte or character outside the grammar's.
func FuzzCheckCommand(f *testing.F) {
	for _, s := range []string{"p:g/e /proc/1/fd/3:0x1180 a=%di", "ptw:g/e /a:0x1%multinop \\1 %nopace", "-:g/e",
		"p:g/e /a:0x1 s=+0(%si):string c=+1(%di):char", "p:g/e /a:0x1 %di:b4@4/32 %si:s64", "ptw:g/e /a:0x1 %di:x32"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cmd string) {
		if tracefs.CheckCommand(cmd) != nil {
			return
		}
		for i := 0; i < len(cmd); i++ {
			if c := cmd[i]; c < ' ' || c > '~' || c == '#' || c == '>' || c == '\'' || c == '"' {
				t.Fatalf("passed %q with byte %q", cmd, c)
			}
		}
		if _, err := tracefs.ParseLine(cmd); err != nil && !strings.HasPrefix(cmd, "-:") {
			t.Fatalf("passed %q, which ParseLine refuses: %v", cmd, err)
		}
	})
}
