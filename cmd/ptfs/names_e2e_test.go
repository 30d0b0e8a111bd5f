package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"ptfs/internal/testkit"
)

// buildCXX compiles testdata/names.cc with g++ -O2 into a temp dir.
func buildCXX(t *testing.T) string {
	t.Helper()
	gxx, err := exec.LookPath("g++")
	if err != nil {
		testkit.Unavailable(t, "needs g++ to build the C++ test program")
	}
	out := filepath.Join(t.TempDir(), "names")
	if b, err := exec.Command(gxx, "-O2", "-o", out, filepath.Join("..", "..", "testdata", "names.cc")).CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, b)
	}
	return out
}

// nmOffsets returns the file offset of each function symbol of bin by raw
// name, from nm and readelf (the references ptfs is checked against).
func nmOffsets(t *testing.T, bin string, raw ...string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, r := range raw {
		out[r] = testkit.FuncOffset(t, bin, r)
	}
	return out
}

// probeErr writes spec to probes/NAME and returns the shell's output and
// the probe file: the write must fail.
func (m *mountProc) probeErr(target, name, spec string) (string, string) {
	m.t.Helper()
	out, err := shell(fmt.Sprintf("echo %s > %s", shellQuote(spec), m.path(target, "probes", name)))
	if err == nil {
		m.t.Fatalf("echo %q > probes/%s succeeded:\n%s", spec, name, m.probeText(target, name))
	}
	return out, m.probeText(target, name)
}

// groupLines returns this mount's uprobe_events lines of target.
func (m *mountProc) groupLines(target string) []string {
	return uprobeLines(m.t, m.group()+target+"/")
}

// recordsOf returns the record lines of event in lines.
func recordsOf(lines []string, event string) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, " event="+event+" ") {
			out = append(out, l)
		}
	}
	return out
}

// TestCppSites: quoted C++ names with spaces as sites, the mangled column
// of symbols and mangled names as sites, the candidates of overloads,
// Rust legacy hashes and GCC clones, on real uprobes.
func TestCppSites(t *testing.T) {
	needKernel(t)
	bin := buildCXX(t)
	offs := nmOffsets(t, bin, "_ZN3geo6detail4areaEll", "_ZN3geo5scaleEl", "_ZN3geo5scaleEd",
		"_ZL6clonlyll.constprop.0", "_ZN4demo4pick17h0123456789abcdefE", "_ZN4demo4pick17hfedcba9876543210E", "_ZN3BufIlLi4EE3getEi")
	m := startMount(t, "n="+bin)

	syms := m.read("n", "symbols")
	for raw, name := range map[string]string{
		"_ZN3geo6detail4areaEll":   "geo::detail::area(long, long)",
		"_ZN3BufIlLi4EE3getEi":     "Buf<long, 4>::get(int)",
		"_ZL6clonlyll.constprop.0": "clonly(long, long) [clone .constprop.0]",
	} {
		line := fmt.Sprintf("0x%x ", offs[raw])
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(line) + `\d+ ` + regexp.QuoteMeta(name+"\t"+raw) + `$`).MatchString(syms) {
			t.Errorf("symbols has no line %q... %q\\t%q:\n%s", line, name, raw, syms)
		}
	}
	if !regexp.MustCompile(`(?m)^0x[0-9a-f]+ \d+ main$`).MatchString(syms) {
		t.Errorf("a C name has no second column:\n%s", syms)
	}

	// A quoted name with spaces, at an offset; the same function by its
	// mangled name; a template method; an overload by its full name.
	m.setProbe("n", "area", `"geo::detail::area(long, long)"+3 w=%di h=%si # the imul`)
	text := m.probeText("n", "area")
	wantSite := fmt.Sprintf("# site: geo::detail::area(long, long)+0x3, file offset 0x%x, ", offs["_ZN3geo6detail4areaEll"]+3)
	if !strings.HasPrefix(text, `"geo::detail::area(long, long)"+3 w=%di h=%si`+"\n# state: installed") || !strings.Contains(text, wantSite) {
		t.Fatalf("probe file of a quoted site:\n%s\nwant %q", text, wantSite)
	}
	m.setProbe("n", "mangled", "_ZN3geo5scaleEl %di")
	m.setProbe("n", "get", `"Buf<long, 4>::get(int)" i=%si`)
	m.setProbe("n", "dbl", `"geo::scale(double)"`)
	if l := m.groupLines("n"); len(l) != 4 {
		t.Fatalf("uprobe_events lines of the mount: %q\nall of them: %q\n%s", l, uprobeLines(t, ""), m.log)
	}
	runProg(t, bin, "5")
	got := m.waitLines(20, "n", "records")
	area, scale, get := recordsOf(got, "ptfs_n/area"), recordsOf(got, "ptfs_n/mangled"), recordsOf(got, "ptfs_n/get")
	if len(area) != 5 || len(scale) != 5 || len(get) != 5 || len(recordsOf(got, "ptfs_n/dbl")) != 5 {
		t.Fatalf("records:\n%s\nstatus:\n%s\n%s", strings.Join(got, "\n"), m.read("n", "status"), m.log)
	}
	for i := range 5 {
		if !strings.Contains(area[i], fmt.Sprintf("args=[w=%d, h=%d]", i, i+1)) || !strings.Contains(scale[i], fmt.Sprintf("args=[%d]", i)) ||
			!strings.Contains(get[i], fmt.Sprintf("args=[i=%d]", i)) {
			t.Errorf("call %d: %q %q %q", i, area[i], scale[i], get[i])
		}
	}

	// Candidates, with their offsets: overloads by the name without
	// parameters, two Rust legacy hashes, a function that GCC only kept
	// as a clone. Each raw name then works.
	for _, c := range []struct{ spec, errno, want string }{
		{"geo::scale %di", msgEINVAL, fmt.Sprintf(`ambiguous symbol: symbol "geo::scale" names 2 functions: _ZN3geo5scaleEl at 0x%x (geo::scale(long)), _ZN3geo5scaleEd at 0x%x (geo::scale(double)): use a raw name or a file offset`,
			offs["_ZN3geo5scaleEl"], offs["_ZN3geo5scaleEd"])},
		{"demo::pick %di", msgEINVAL, fmt.Sprintf(`symbol "demo::pick" names 2 functions: _ZN4demo4pick17h0123456789abcdefE at 0x%x (demo::pick), _ZN4demo4pick17hfedcba9876543210E at 0x%x (demo::pick): use a raw name or a file offset`,
			offs["_ZN4demo4pick17h0123456789abcdefE"], offs["_ZN4demo4pick17hfedcba9876543210E"])},
		{"clonly %di", msgENOENT, fmt.Sprintf(`no function "clonly" in %s, but GCC clones of it: _ZL6clonlyll.constprop.0 at 0x%x (clonly(long, long) [clone .constprop.0]): use a raw name or a file offset`,
			bin, offs["_ZL6clonlyll.constprop.0"])},
		{"printf %di", msgENOENT, "printf is in libc.so.6: add it as a target"},
	} {
		out, text := m.probeErr("n", "bad", c.spec)
		if !strings.Contains(out, c.errno) || !strings.Contains(text, c.want) {
			t.Errorf("%q: %s\nprobe file:\n%s\nwant %q", c.spec, out, text, c.want)
		}
	}
	m.setProbe("n", "pick", "_ZN4demo4pick17hfedcba9876543210E %di")
	m.setProbe("n", "clone", "_ZL6clonlyll.constprop.0 %di")
	if l := m.groupLines("n"); len(l) != 6 {
		t.Fatalf("uprobe_events lines of the mount: %q\nall of them: %q\n%s", l, uprobeLines(t, ""), m.log)
	}
}

// TestSpecEditing: comments, specs written in pieces, sed -i and mv on
// probe files, on real uprobes; nothing half-installed is left behind.
func TestSpecEditing(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t", "-no-pie")
	m := startMount(t, "t="+bin)
	probes := m.path("t", "probes")

	off := testkit.FuncOffset(t, bin, "target")
	m.setProbe("t", "e", "target a=%di # the first argument")
	// Two write()s of one line (bash's builtin printf writes at the end
	// of each call), and a line without newline, parsed at close.
	if out, err := shell(fmt.Sprintf("{ printf 'target+3'; printf ' %%s\\n' 'b=%%si'; } > %s/f && printf '0x%x c=%%%%si' > %s/g",
		probes, off+7, probes)); err != nil {
		t.Fatalf("printf pieces: %v %s", err, out)
	}
	for name, want := range map[string]string{"e": "target a=%di\n# state: installed", "f": "target+3 b=%si\n# state: installed",
		"g": fmt.Sprintf("0x%x c=%%si\n# state: installed", off+7)} {
		if text := m.probeText("t", name); !strings.HasPrefix(text, want) {
			t.Errorf("probe %s:\n%s\nwant it to start %q", name, text, want)
		}
	}

	// sed -i: a temp file in probes/, renamed over e. The temp file's
	// spec is at e's own site: staged, then installed by the rename.
	if out, err := shell("rm " + probes + "/f && sed -i 's/a=%di/a=%di x=%si/' " + probes + "/e"); err != nil {
		t.Fatalf("sed -i: %v %s\n%s", err, out, m.log)
	}
	if names, _ := os.ReadDir(probes); len(names) != 2 {
		t.Errorf("probes/ after sed -i: %v", names)
	}
	if text := m.probeText("t", "e"); !strings.HasPrefix(text, "target a=%di x=%si\n# state: installed") {
		t.Errorf("probe e after sed -i:\n%s", text)
	}
	if l := m.groupLines("t"); len(l) != 2 {
		t.Errorf("uprobe_events lines after sed -i: %q", l)
	}

	// mv renames the probe: the same kernel probe, records named anew.
	before := m.groupLines("t")
	if out, err := shell("mv " + probes + "/e " + probes + "/renamed"); err != nil {
		t.Fatalf("mv: %v %s", err, out)
	}
	if after := m.groupLines("t"); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("uprobe_events changed by mv:\nbefore %q\nafter  %q", before, after)
	}
	runProg(t, bin, "3")
	got := m.waitLines(6, "t", "records")
	if r := recordsOf(got, "ptfs_t/renamed"); len(r) != 3 || !strings.Contains(r[2], "args=[a=2, x=3]") {
		t.Errorf("records after mv:\n%s", strings.Join(got, "\n"))
	}
	// mv over another probe replaces it: its kernel probe goes.
	if out, err := shell("mv " + probes + "/g " + probes + "/renamed"); err != nil {
		t.Fatalf("mv over: %v %s", err, out)
	}
	if l := m.groupLines("t"); len(l) != 1 {
		t.Errorf("uprobe_events lines after mv over: %q", l)
	}
	// A name with a control character is refused as a rename target too.
	if out, err := shell("mv " + probes + "/renamed " + shellQuote(probes+"/a\nb")); err == nil {
		t.Errorf("mv to a name with a newline: %s", out)
	}
	if names, _ := os.ReadDir(probes); len(names) != 1 || names[0].Name() != "renamed" {
		t.Errorf("probes/ at the end: %v", names)
	}
}

// TestSiteHints: a stripped binary, an IFUNC of libc, a Go program.
func TestSiteHints(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t", "-no-pie")
	stripped := filepath.Join(t.TempDir(), "s")
	if out, err := exec.Command("strip", "-o", stripped, bin).CombinedOutput(); err != nil {
		testkit.Unavailable(t, "strip: %v %s", err, out)
	}
	const libc = "/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(libc); err != nil {
		testkit.Unavailable(t, "no libc: %v", err)
	}
	goBin := filepath.Join(t.TempDir(), "goprog")
	if out, err := exec.Command("go", "build", "-o", goBin, filepath.Join("..", "..", "testdata", "goprog.go")).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v %s", err, out)
	}
	m := startMount(t, "s="+stripped, "libc="+libc, "g="+goBin)

	if out, text := m.probeErr("s", "e", "target %di"); !strings.Contains(out, msgENOENT) || !strings.Contains(text, "no symbol table: use a file offset from `objdump -d`") {
		t.Errorf("stripped: %s\n%s", out, text)
	}
	out, text := m.probeErr("libc", "e", "strlen %di")
	ifunc := regexp.MustCompile(`strlen is a GNU IFUNC: the code at file offset 0x[0-9a-f]+ is its resolver, which runs once when the program loads; its implementations: 0x[0-9a-f]+(, 0x[0-9a-f]+)+ `)
	if !strings.Contains(out, msgEOPNOTSUPP) || !ifunc.MatchString(text) {
		t.Errorf("IFUNC: %s\n%s", out, text)
	}
	if l := m.groupLines("libc"); len(l) != 0 {
		t.Errorf("uprobe_events lines after refused probes: %q", l)
	}

	m.setProbe("g", "add", "main.add a=%ax b=%bx")
	m.setProbe("g", "push", "main.(*acc).push v=%bx")
	runProg(t, goBin, "4")
	got := m.waitLines(8, "g", "records")
	add, push := recordsOf(got, "ptfs_g/add"), recordsOf(got, "ptfs_g/push")
	if len(add) != 4 || len(push) != 4 || !strings.Contains(add[3], "args=[a=3, b=4]") || !strings.Contains(push[3], "args=[v=7]") {
		t.Errorf("Go records:\n%s", strings.Join(got, "\n"))
	}
}

// TestMountOnLiveMount: a second `ptfs mount` on a served mount point
// refuses with the reason and leaves the first alone.
func TestMountOnLiveMount(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "target", "t", "-no-pie")
	m := startMount(t, "t="+bin)
	cmd := exec.Command(os.Args[0], "mount", m.dir, "u="+bin)
	cmd.Env = append(os.Environ(), "PTFS_TEST_MAIN=1")
	done := make(chan []byte, 1)
	go func() { out, _ := cmd.CombinedOutput(); done <- out }()
	select {
	case out := <-done:
		want := fmt.Sprintf("ptfs: %s is the mount point of a running ptfs (pid %d): unmount it first", m.dir, m.cmd.Process.Pid)
		if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), want) {
			t.Errorf("second mount: exit %d, %q; want %q", cmd.ProcessState.ExitCode(), out, want)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("a second ptfs mount on a live mount point did not return")
	}
	m.setProbe("t", "e", "target %di")
	if text := m.probeText("t", "e"); !strings.Contains(text, "# state: installed") {
		t.Errorf("the first mount after the refused one:\n%s", text)
	}
}

// What bash prints for the errnos of refused writes.
const (
	msgEINVAL     = "Invalid argument"
	msgENOENT     = "No such file or directory"
	msgEOPNOTSUPP = "Operation not supported"
)
