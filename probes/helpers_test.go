package probes

import (
	"path/filepath"
	"testing"

	"ptfs/internal/testkit"
)

// buildC compiles testdata/NAME.c with gcc into a temp dir.
func buildC(t testing.TB, name string, flags ...string) string {
	t.Helper()
	return testkit.BuildC(t, filepath.Join("testdata", name+".c"), flags...)
}

// openBinary opens path and closes it when the test ends.
func openBinary(t testing.TB, path string) *Binary {
	t.Helper()
	b, err := Open(path)
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

func mustParse(t testing.TB, spec string) *Spec {
	t.Helper()
	s, err := Parse(spec)
	if err != nil {
		t.Fatalf("Parse(%q): %v", spec, err)
	}
	return s
}
