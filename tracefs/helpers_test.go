package tracefs

import (
	"path/filepath"
	"testing"

	"ptfs/internal/testkit"
	"ptfs/probes"
)

// builds are the flavours of probes/testdata/sites.c the kernel tests run
// on.
var builds = []struct {
	name  string
	flags []string
}{
	{"pie-cet", []string{"-fPIE", "-pie", "-fcf-protection=full"}},
	{"nopie", []string{"-fno-PIE", "-no-pie", "-fcf-protection=none"}},
}

// buildC compiles probes/testdata/NAME.c with gcc into a temp dir.
func buildC(t testing.TB, name string, flags ...string) string {
	t.Helper()
	return testkit.BuildC(t, filepath.Join("..", "probes", "testdata", name+".c"), flags...)
}

// openBinary opens path and closes it when the test ends.
func openBinary(t testing.TB, path string) *probes.Binary {
	t.Helper()
	b, err := probes.Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

func mustParse(t testing.TB, spec string) *probes.Spec {
	t.Helper()
	s, err := probes.Parse(spec)
	if err != nil {
		t.Fatalf("Parse(%q): %v", spec, err)
	}
	return s
}
