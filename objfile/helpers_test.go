package objfile

import (
	"os"
	"path/filepath"
	"testing"

	"ptfs/internal/testkit"
)

// libcPath is this machine's C library: a large stripped shared object
// (.dynsym only) with IFUNCs and versioned aliases.
const libcPath = "/lib/x86_64-linux-gnu/libc.so.6"

// buildC compiles probes/testdata/NAME.c, the test programs of the code
// that resolves probe sites in these files, with gcc into a temp dir.
func buildC(t testing.TB, name string, flags ...string) string {
	t.Helper()
	return testkit.BuildC(t, filepath.Join("..", "probes", "testdata", name+".c"), flags...)
}

// openFile opens path and closes it when the test ends.
func openFile(t testing.TB, path string) *File {
	t.Helper()
	f, err := Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return f
}

// openLibc opens libc, skipping the test where there is none.
func openLibc(t testing.TB) *File {
	t.Helper()
	if _, err := os.Stat(libcPath); err != nil {
		testkit.Unavailable(t, "no libc at %s: %v", libcPath, err)
	}
	return openFile(t, libcPath)
}

// linearSymbolAt is the linear scan that SymbolAt replaced, kept as the
// reference its answers and speed are measured against.
func linearSymbolAt(syms []Symbol, addr uint64) int {
	found := -1
	for i := range syms {
		f := &syms[i]
		if f.Addr > addr {
			break
		}
		if addr < f.Addr+f.Size || f.Addr == addr {
			found = i
		}
	}
	return found
}

// forEachFile runs fn in a subtest on each build of sites.c and on libc
// (skipped where there is none).
func forEachFile(t *testing.T, fn func(t *testing.T, name, path string, f *File)) {
	files := map[string]string{"libc": libcPath}
	for _, bd := range builds {
		files[bd.name] = buildC(t, "sites", bd.flags...)
	}
	for name, path := range files {
		t.Run(name, func(t *testing.T) {
			if _, err := os.Stat(path); err != nil {
				testkit.Unavailable(t, "no %s: %v", path, err)
			}
			fn(t, name, path, openFile(t, path))
		})
	}
}
