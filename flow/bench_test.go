package flow

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"ptfs/images"
	"ptfs/internal/testkit"
)

// benchTrace is a trace and the memory it ran from.
type benchTrace struct {
	trace []byte
	path  string
	space *images.Space
}

// loadBench returns one of the benchmark traces: mruby (libxdc's kAFL
// trace with its page dump) or ptsim (run-static, flow-static and its vDSO).
func loadBench(t testing.TB, name string) benchTrace {
	t.Helper()
	corpus := testkit.Corpus(t)
	s := images.NewSpace()
	var path string
	switch name {
	case "mruby":
		dir := filepath.Join(corpus, "libxdc", "mruby")
		path = filepath.Join(dir, "trace")
		if err := images.MapPageDump(s, filepath.Join(dir, "data.addr"), filepath.Join(dir, "data.dump")); err != nil {
			t.Fatal(err)
		}
	case "ptsim":
		dir := filepath.Join(corpus, "ptsim")
		path = filepath.Join(dir, "run-static", "trace.pt")
		e, err := images.MapELF(s, filepath.Join(dir, "flow-static"), 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		if err := images.MapRaw(s, filepath.Join(dir, "run-static", "vdso-7ffff7ffd000.bin"), 0x7ffff7ffd000); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("no benchmark trace %q", name)
	}
	trace, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return benchTrace{trace: trace, path: path, space: s}
}

// counter is a Handler that only counts.
type counter struct{ insns, branches, errors int }

func (c *counter) Insn(*Insn)                       { c.insns++ }
func (c *counter) Branch(_, _ uint64, _ BranchKind) { c.branches++ }
func (c *counter) Event(e *Event) {
	if e.Kind == EvError {
		c.errors++
	}
}

// libiptBlk runs testdata/ptblk.c (libipt's block decoder) on bt; each call
// of the returned function decodes the whole trace once with a fresh
// decoder and returns its instruction and error counts.
func libiptBlk(t testing.TB, bt benchTrace) func() (insns, errors int) {
	t.Helper()
	if _, err := os.Stat("/usr/include/intel-pt.h"); err != nil {
		testkit.Unavailable(t, "libipt header /usr/include/intel-pt.h missing: apt-get install libipt-dev")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		testkit.Unavailable(t, "gcc missing: needed to build the libipt harness")
	}
	bin := filepath.Join(t.TempDir(), "ptblk")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-o", bin, filepath.Join("testdata", "ptblk.c"), "-lipt").CombinedOutput(); err != nil {
		t.Fatalf("build libipt block harness: %v\n%s", err, out)
	}
	// The same memory as ptfs reads: every mapping of the space.
	args := []string{bt.path}
	for _, m := range bt.space.Mappings() {
		args = append(args, fmt.Sprintf("%s:%x:%x:%x", m.Name, m.Off, m.End-m.Start, m.Start))
	}
	cmd := exec.Command(bin, args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	out := bufio.NewReader(outPipe)
	return func() (int, int) {
		if _, err := io.WriteString(in, "go\n"); err != nil {
			t.Fatal(err)
		}
		line, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("libipt block harness: %v", err)
		}
		var insns, errors int
		if _, err := fmt.Sscan(strings.TrimSpace(line), &insns, &errors); err != nil {
			t.Fatalf("libipt block harness answered %q: %v", line, err)
		}
		return insns, errors
	}
}

var benchNames = []string{"mruby", "ptsim"}

// BenchmarkFlow decodes each trace with ptfs's flow decoder, cold (a new
// decoder, empty block cache, every pass) and warm (one decoder, the
// cache kept across passes, as a live mount decodes the same images).
func BenchmarkFlow(b *testing.B) {
	for _, name := range benchNames {
		bt := loadBench(b, name)
		for _, warm := range []bool{false, true} {
			mode := "cold"
			if warm {
				mode = "warm"
			}
			b.Run(name+"/"+mode, func(b *testing.B) {
				d := New(bt.space, Options{})
				var c counter
				d.Decode(bt.trace, &c) // fills the cache for warm
				b.SetBytes(int64(len(bt.trace)))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if !warm {
						d = New(bt.space, Options{})
					}
					c = counter{}
					d.Decode(bt.trace, &c)
				}
				b.StopTimer()
				if c.errors != 0 || c.insns == 0 {
					b.Fatalf("%d instructions, %d errors", c.insns, c.errors)
				}
				b.ReportMetric(float64(c.insns), "insns/op")
			})
		}
	}
}

// BenchmarkLibiptBlock times libipt's block decoder (a fresh decoder each
// pass, with ptxed's image section cache) on the same traces and memory,
// and checks that it decodes as many instructions as ptfs.
func BenchmarkLibiptBlock(b *testing.B) {
	for _, name := range benchNames {
		b.Run(name, func(b *testing.B) {
			bt := loadBench(b, name)
			run := libiptBlk(b, bt)
			var c counter
			New(bt.space, Options{}).Decode(bt.trace, &c)
			if insns, errors := run(); insns != c.insns || errors != c.errors {
				b.Fatalf("libipt decodes %d instructions with %d errors, ptfs %d with %d", insns, errors, c.insns, c.errors)
			}
			b.SetBytes(int64(len(bt.trace)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				run()
			}
		})
	}
}
