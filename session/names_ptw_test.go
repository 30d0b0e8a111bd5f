package session

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"ptfs/internal/testkit"
	"ptfs/probes"
	"ptfs/tracefs/tracefstest"
)

// The C++ specs in ptw mode on the simulated ptwrite kernel: quoted sites
// with comments install with the site check's verdict in the probe file;
// a temp file staged at a probe's site and renamed over it replaces the
// probe as a rewrite does (one ptw probe a site: the old one goes first);
// a renamed probe keeps its kernel probe and its records carry the new
// name.
func TestPTWCppSpecs(t *testing.T) {
	s, _, k, rep := newPTWSession(t, tracefstest.Options{PTW: true})
	bin := testkit.BuildC(t, filepath.Join("..", "testdata", "names.cc"))
	n, err := s.addTarget("n", bin)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := probes.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	for name, spec := range map[string]string{
		"area":  `"geo::detail::area(long, long)" w=%di h=%si # entry`,
		"get":   `"Buf<long, 4>::get(int)" %si`,
		"scale": `_ZN3geo5scaleEd`,
	} {
		sp, err := probes.Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		site, err := ref.Resolve(sp)
		if err != nil {
			t.Fatal(err)
		}
		err = n.SetProbe(name, spec)
		text, _ := n.ProbeText(name)
		// The probe file carries the site check's verdict, installed or
		// refused for it.
		if verr := site.Verdict.Err(); verr != nil {
			if !errors.Is(err, syscall.EOPNOTSUPP) || !strings.Contains(string(text), "# error: ") {
				t.Errorf("%s: %v, want the verdict's refusal %v:\n%s", spec, err, verr, text)
			}
			continue
		}
		if err != nil || !strings.Contains(string(text), "# "+site.Verdict.String()+"\n") || !strings.Contains(string(text), "# tracefs: ptw:"+n.group+"/"+name+" ") {
			t.Errorf("%s: %v, probe file:\n%s\nwant installed with %q", spec, err, text, site.Verdict)
		}
	}
	if text, _ := n.ProbeText("area"); !strings.HasPrefix(string(text), `"geo::detail::area(long, long)" w=%di h=%si`+"\n") {
		t.Fatalf("area:\n%s", text)
	}
	if err := n.SetProbe("bad", "demo::pick %di"); !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "_ZN4demo4pick17hfedcba9876543210E at 0x") {
		t.Errorf("ambiguous in ptw mode: %v", err)
	}
	if err := n.RemoveProbe("bad"); err != nil {
		t.Fatal(err)
	}

	// sed -i: the temp file's spec is at area's site: staged, no kernel
	// command, then the rename replaces area at its site.
	before := len(k.Commands())
	if err := n.StageProbe("sedXYZ", `"geo::detail::area(long, long)" w=%di # state: installed`); err != nil {
		t.Fatalf("StageProbe: %v", err)
	}
	if text, _ := n.ProbeText("sedXYZ"); !strings.Contains(string(text), "# state: staged: ") || !strings.Contains(string(text), "probe area is at file offset") {
		t.Errorf("staged temp file:\n%s", text)
	}
	if err := n.SetProbe("plain", `"geo::detail::area(long, long)" %di`); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("a plain write at a taken site: %v, want EEXIST", err)
	}
	if cmds := k.Commands()[before:]; len(cmds) != 0 {
		t.Errorf("kernel commands for a staged spec: %q", cmds)
	}
	if err := n.RenameProbe("sedXYZ", "area", false); err != nil {
		t.Fatalf("rename the staged file over area: %v", err)
	}
	g := n.group
	if cmds := commandHeads(k)[before:]; !slices.Equal(cmds, []string{"-:" + g + "/area", "ptw:" + g + "/area"}) {
		t.Errorf("kernel commands of the rename: %q", cmds)
	}
	if names := n.Probes(); !slices.Equal(names, []string{"area", "get", "plain", "scale"}) {
		t.Errorf("probes after the rename: %q", names)
	}

	// mv: no kernel command, records named anew.
	before = len(k.Commands())
	if err := n.RenameProbe("area", "a2", true); err != nil {
		t.Fatal(err)
	}
	if err := n.RenameProbe("a2", "get", true); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("rename over with noReplace: %v, want EEXIST", err)
	}
	if cmds := k.Commands()[before:]; len(cmds) != 0 {
		t.Errorf("kernel commands of a rename: %q", cmds)
	}
	id, err := s.tfs.EventID(g, "area")
	if err != nil {
		t.Fatal(err)
	}
	dir := mountSession(t, s)
	replayHits(t, rep, id, [][]uint64{{6}}, 8)
	if recs := readFile(t, dir, "n", "records"); !strings.Contains(recs, "event=ptfs_n/a2 ") || !strings.Contains(recs, "args=[w=6]") {
		t.Errorf("records after the rename:\n%s", recs)
	}
	if _, err := os.Stat(filepath.Join(dir, "n", "probes", "a2")); err != nil {
		t.Error(err)
	}
}
