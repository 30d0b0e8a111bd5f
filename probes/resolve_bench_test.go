package probes

import (
	"os"
	"testing"

	"ptfs/internal/testkit"
)

// libcPath is this machine's C library: a large shared object with
// thousands of functions, the load that symbol lookups meet in practice.
const libcPath = "/lib/x86_64-linux-gnu/libc.so.6"

func openLibc(b *testing.B) *Binary {
	b.Helper()
	if _, err := os.Stat(libcPath); err != nil {
		testkit.Unavailable(b, "no libc at %s: %v", libcPath, err)
	}
	return openBinary(b, libcPath)
}

// BenchmarkOpenLibc opens and parses libc: the cost of adding a target or
// following its path to a new file.
func BenchmarkOpenLibc(b *testing.B) {
	openLibc(b) // skip early without libc
	b.ReportAllocs()
	for b.Loop() {
		bin, err := Open(libcPath)
		if err != nil {
			b.Fatal(err)
		}
		bin.Close()
	}
}

// BenchmarkResolveLibc resolves a site at the start of every function of
// libc by file offset: the address lookup and the decode of the site.
func BenchmarkResolveLibc(b *testing.B) {
	bin := openLibc(b)
	fns := bin.Functions()
	b.ReportAllocs()
	for b.Loop() {
		for i := range fns {
			if _, err := bin.Resolve(&Spec{Offset: fns[i].Offset}); err != nil {
				b.Fatalf("%s: %v", fns[i].Name, err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(fns)), "ns/site")
}
