// Package testkit holds what the tests of several packages need: the shared
// corpus, C test programs built with gcc, and function offsets read from
// ELF files independently of the probes package.
package testkit

import (
	"compress/gzip"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Unavailable stops a test that lacks something of its environment (root,
// FUSE, tracefs, gcc, libipt, the corpus): it skips, except when the CI
// variable is set, where the run must not pass by skipping, so it fails.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set, so this cannot be skipped: "+format, args...)
	}
	t.Skipf(format, args...)
}

// Root returns the repository root: the nearest directory above the test's
// working directory that holds go.mod.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// CorpusPath returns where the reference corpus should be: $PTFS_CORPUS,
// else ../shared/corpus beside the repository.
func CorpusPath(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("PTFS_CORPUS"); dir != "" {
		return dir
	}
	return filepath.Join(Root(t), "..", "shared", "corpus")
}

// Corpus returns the reference corpus directory (CorpusPath). Without it, the
// test is Unavailable.
func Corpus(t testing.TB) string {
	t.Helper()
	dir := CorpusPath(t)
	if _, err := os.Stat(dir); err != nil {
		Unavailable(t, "corpus absent at %s (set PTFS_CORPUS): %v", dir, err)
	}
	return dir
}

// BuildC compiles the C file src (relative to the test's directory) with
// gcc -O2 and flags into the test's temp dir and returns the binary. It
// is Unavailable without gcc.
func BuildC(t testing.TB, src string, flags ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		Unavailable(t, "gcc not found: cannot build the test program")
	}
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".c"))
	args := append([]string{"-O2", "-o", out, src}, flags...)
	if b, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return out
}

// FuncOffset returns the file offset of function sym in the ELF file bin,
// through the PT_LOAD segment that maps it.
func FuncOffset(t testing.TB, bin, sym string) uint64 {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	for _, s := range syms {
		if s.Name != sym || elf.ST_TYPE(s.Info) != elf.STT_FUNC {
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && s.Value >= p.Vaddr && s.Value < p.Vaddr+p.Filesz {
				return s.Value - p.Vaddr + p.Off
			}
		}
	}
	t.Fatalf("%s: no function %s", bin, sym)
	return 0
}

// Gunzip returns the contents of a gzipped file.
func Gunzip(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}
