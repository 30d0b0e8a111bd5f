package flow

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ptfs/images"
	"ptfs/internal/testkit"
	"ptfs/x86insn"
)

// benchTrace is a trace and the memory it ran from.
type benchTrace struct {
	trace []byte
	path  string
	space *images.Space
}

// loadBench returns one of the benchmark traces: mruby (libxdc's kAFL
// trace with its page dump), mruby-mtc (mruby with timing packets, timed)
// or ptsim (run-static, flow-static and its vDSO).
func loadBench(t testing.TB, name string) benchTrace {
	t.Helper()
	corpus := testkit.Corpus(t)
	s := images.NewSpace()
	var path string
	switch name {
	case "mruby", "mruby-mtc":
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
	if name == "mruby-mtc" {
		trace = timed(trace, 64, false)
	}
	return benchTrace{trace: trace, path: path, space: s}
}

// counter is a Handler that only counts.
type counter struct{ insns, branches, errors int }

func (c *counter) Insn(*Insn)                       { c.insns++ }
func (c *counter) Branch(_, _ uint64, _ BranchKind) { c.branches++ }
func (c *counter) Edges(batch [][]Edge) {
	for _, e := range batch {
		c.branches += len(e)
	}
}
func (c *counter) Event(e *Event) {
	if e.Kind == EvError {
		c.errors++
	}
}

// libiptBlk runs testdata/ptblk.c (libipt's block decoder) on bt; each call
// of the returned function decodes the whole trace once with a fresh
// decoder and returns its instruction and error counts and the CPU time
// the pass took.
func libiptBlk(t testing.TB, bt benchTrace) func() (insns, errors int, cpu time.Duration) {
	t.Helper()
	if _, err := os.Stat("/usr/include/intel-pt.h"); err != nil {
		testkit.Unavailable(t, "libipt header /usr/include/intel-pt.h missing: apt-get install libipt-dev")
	}
	bin := testkit.BuildC(t, filepath.Join("testdata", "ptblk.c"), "-Wall", "-lipt")
	// The same memory as ptfs reads: every mapping of the space.
	args := []string{bt.path}
	for _, m := range bt.space.Mappings() {
		args = append(args, fmt.Sprintf("%s:%x:%x:%x", m.Name, m.Off, m.End-m.Start, m.Start))
	}
	ask := testkit.Harness(t, bin, args...)
	return func() (int, int, time.Duration) {
		line := ask("go")
		var insns, errors int
		var cpu time.Duration
		if _, err := fmt.Sscan(line, &insns, &errors, &cpu); err != nil {
			t.Fatalf("libipt block harness answered %q: %v", line, err)
		}
		return insns, errors, cpu
	}
}

// reportCPU reports the throughput of b.N passes over size bytes in cpu.
func reportCPU(b *testing.B, size int, cpu time.Duration) {
	if cpu > 0 {
		b.ReportMetric(float64(size)*float64(b.N)/cpu.Seconds()/1e6, "MB/cpu-s")
	}
}

var benchNames = []string{"mruby", "ptsim"}

// BenchmarkFlow decodes each trace with ptfs's flow decoder for a reader of
// branches (NoInsns): cold (a new decoder, empty block cache, every pass;
// the pass before's decoder is closed first, as the product ends one, so
// that the new one is made over its memory)
// and warm (one decoder, the cache kept across passes, as a live mount
// decodes the same images); warm-slow is warm without the fast path
// (fast.go), warm-insns also reports every instruction. mruby-mtc is mruby
// with an MTC every 64 bytes (timed), decoded with a clock, as a live
// mount decodes its traces (MTC on, Options.Time).
func BenchmarkFlow(b *testing.B) {
	for _, name := range append(benchNames, "mruby-mtc") {
		bt := loadBench(b, name)
		for _, mode := range []string{"cold", "warm", "warm-slow", "warm-insns"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				opts := Options{NoInsns: mode != "warm-insns"}
				if name == "mruby-mtc" {
					opts.Time = &timeConfig
				}
				d := New(bt.space, opts)
				d.fp.off = mode == "warm-slow"
				var c counter
				d.Decode(bt.trace, &c) // fills the cache for warm
				b.SetBytes(int64(len(bt.trace)))
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := testkit.CPUTime()
				for i := 0; i < b.N; i++ {
					if mode == "cold" {
						d.Close()
						d = New(bt.space, opts)
					}
					c = counter{}
					d.Decode(bt.trace, &c)
				}
				b.StopTimer()
				reportCPU(b, len(bt.trace), testkit.CPUTime()-cpu0)
				if c.errors != 0 || c.branches == 0 {
					b.Fatalf("%d branches, %d errors", c.branches, c.errors)
				}
				b.ReportMetric(float64(c.branches), "branches/op")
				if mode == "cold" {
					// What a cold pass decodes: each block once.
					blocks, insns := cached(&d.cache)
					b.ReportMetric(float64(blocks), "blocks/op")
					b.ReportMetric(float64(insns), "decoded-insns/op")
				}
			})
		}
	}
}

// cached counts the blocks the cache holds and their instructions (its
// insns also counts the runs' share of the bound).
func cached(c *blockCache) (blocks, insns int) {
	for _, s := range c.slots {
		if s != 0 {
			blocks++
			insns += int(c.at(s).n)
		}
	}
	return blocks, insns
}

// coldBlocks returns a decoder over mruby after one pass, the blocks the
// pass decoded and their instructions.
func coldBlocks(b *testing.B) (bt benchTrace, d *Decoder, starts []*block, insns int) {
	bt = loadBench(b, "mruby")
	d = New(bt.space, Options{NoInsns: true})
	var c counter
	d.Decode(bt.trace, &c)
	for _, s := range d.cache.slots {
		if s != 0 {
			starts = append(starts, d.cache.at(s))
		}
	}
	_, insns = cached(&d.cache)
	return bt, d, starts, insns
}

// BenchmarkBlockDecode times the cold path alone: decoding, into an empty
// block cache each pass, the blocks that a cold pass over mruby decodes;
// ns/insn is per instruction decoded.
func BenchmarkBlockDecode(b *testing.B) {
	_, d, starts, insns := coldBlocks(b)
	b.ReportAllocs()
	cpu0 := testkit.CPUTime()
	for b.Loop() {
		d.cache = blockCache{}
		d.cache.init()
		for _, s := range starts {
			d.block(s.ip, s.mode)
		}
	}
	if _, got := cached(&d.cache); got != insns {
		b.Fatalf("decoded %d instructions, the pass %d", got, insns)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*insns), "ns/insn")
	b.ReportMetric(float64((testkit.CPUTime()-cpu0).Nanoseconds())/float64(b.N*insns), "cpu-ns/insn")
}

// BenchmarkBlockRun times BenchmarkBlockDecode's length decoding alone:
// x86insn.Run over each block's bytes, viewed before the timing, with no
// cache (the blocks within MaxLen of their mapping's end, which Run leaves
// to Step, are left out); ns/insn is per instruction Run decoded.
func BenchmarkBlockRun(b *testing.B) {
	bt, _, starts, _ := coldBlocks(b)
	var views [][]byte
	var ips []uint64
	for _, s := range starts {
		if base, v, err := bt.space.View(s.ip); err == nil && uint64(len(v))-(s.ip-base) >= x86insn.MaxLen {
			views, ips = append(views, v[s.ip-base:]), append(ips, s.ip)
		}
	}
	var lens [maxBlock]uint8
	insns := 0
	cpu0 := testkit.CPUTime()
	for b.Loop() {
		for k, v := range views {
			n, _, _, _ := x86insn.Run(v, ips[k], lens[:])
			insns += n
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(insns), "ns/insn")
	b.ReportMetric(float64((testkit.CPUTime()-cpu0).Nanoseconds())/float64(insns), "cpu-ns/insn")
}

// BenchmarkLibiptBlock times libipt's block decoder (a fresh decoder each
// pass, with ptxed's image section cache) on the same traces and memory.
func BenchmarkLibiptBlock(b *testing.B) {
	for _, name := range benchNames {
		b.Run(name, func(b *testing.B) {
			bt := loadBench(b, name)
			run := libiptBlk(b, bt)
			// Untimed: libipt maps its image sections on first use;
			// ptfs's images are loaded before its timing too.
			run()
			b.SetBytes(int64(len(bt.trace)))
			b.ResetTimer()
			var cpu time.Duration
			for i := 0; i < b.N; i++ {
				_, _, c := run()
				cpu += c
			}
			reportCPU(b, len(bt.trace), cpu)
		})
	}
}

// TestLibiptBlockSame holds the benchmarks' traces to libipt's block
// decoder: as many instructions, no errors on either side.
func TestLibiptBlockSame(t *testing.T) {
	for _, name := range benchNames {
		t.Run(name, func(t *testing.T) {
			bt := loadBench(t, name)
			d := New(bt.space, Options{NoInsns: true})
			var c counter
			d.Decode(bt.trace, &c)
			insns, errors, _ := libiptBlk(t, bt)()
			if got := d.Counters(); int(got.Insns) != insns || int(got.Errors) != errors || errors != 0 {
				t.Errorf("ptfs decodes %d instructions with %d errors, libipt %d with %d", got.Insns, got.Errors, insns, errors)
			}
		})
	}
}

// libxdcHarness builds testdata/xdcbench.c against the libxdc in
// $PTFS_LIBXDC (libxdc.h, and libxdc.so there or in its build/ as
// libxdc's Makefiles leave it) and returns the binary and its arguments
// for mruby: the trace, its page dump and libxdc's filter for it (the
// corpus README's range). Without PTFS_LIBXDC the test is skipped, also
// under CI: nothing packages libxdc.
func libxdcHarness(t testing.TB) (bin string, args []string) {
	t.Helper()
	dir := os.Getenv("PTFS_LIBXDC")
	if dir == "" {
		t.Skip("PTFS_LIBXDC not set: libxdc is not packaged; see docs/DESIGN.md §7")
	}
	lib := filepath.Join(dir, "build")
	bin = testkit.BuildC(t, filepath.Join("testdata", "xdcbench.c"), "-Wall",
		"-I"+dir, "-L"+dir, "-L"+lib, "-lxdc", "-Wl,-rpath,"+dir, "-Wl,-rpath,"+lib)
	mruby := filepath.Join(testkit.Corpus(t), "libxdc", "mruby")
	return bin, []string{filepath.Join(mruby, "trace"), filepath.Join(mruby, "data.addr"),
		filepath.Join(mruby, "data.dump"), "400000", "4b6000"}
}

// xdcPass is what the libxdc harness answers for one pass.
type xdcPass struct {
	result int    // libxdc's decoder_result_t
	hash   string // of the coverage bitmap the pass filled
	edges  int    // reported to the edge callback (warm-edges)
	cpu    time.Duration
}

// libxdcPasses starts the libxdc harness on mruby; each call of the
// returned function decodes the whole trace once in mode (warm, cold or
// warm-edges: testdata/xdcbench.c says what each keeps) and fails the test
// unless libxdc reports success (with or without mruby's overflow).
func libxdcPasses(t testing.TB) func(mode string) xdcPass {
	t.Helper()
	bin, args := libxdcHarness(t)
	ask := testkit.Harness(t, bin, args...)
	return func(mode string) xdcPass {
		line := ask(mode)
		var p xdcPass
		if _, err := fmt.Sscan(line, &p.result, &p.hash, &p.edges, &p.cpu); err != nil {
			t.Fatalf("libxdc harness answered %q: %v", line, err)
		}
		// decoder_success, decoder_success_pt_overflow.
		if p.result != 0 && p.result != 1 {
			t.Fatalf("libxdc %s pass: decoder result %d", mode, p.result)
		}
		return p
	}
}

// BenchmarkLibxdc times libxdc (github.com/nyx-fuzz/libxdc, kAFL's
// decoder; built apart, see docs/DESIGN.md §7) on mruby, the trace and
// memory of BenchmarkFlow's mruby: warm is one decoder decoding the trace
// again and again, as libxdc's own benchmark does, its trace cache
// replaying runs of TNT bits into kAFL's coverage bitmap (the work
// libxdc's 429-455 MB/s of issue 10 measures; it reports no edges); cold
// a fresh decoder each pass; warm-edges warm in libxdc's trace mode, every
// edge to a callback as ptfs hands edges to its Handler. Compare with
// BenchmarkFlow/mruby/warm and cold of the same run.
func BenchmarkLibxdc(b *testing.B) {
	run := libxdcPasses(b)
	bt := loadBench(b, "mruby")
	for _, mode := range []string{"warm", "cold", "warm-edges"} {
		b.Run("mruby/"+mode, func(b *testing.B) {
			// Untimed: fills the warm decoders' caches, as
			// BenchmarkFlow's warm fills ptfs's.
			first := run(mode)
			b.SetBytes(int64(len(bt.trace)))
			b.ResetTimer()
			var cpu time.Duration
			for i := 0; i < b.N; i++ {
				p := run(mode)
				if p.hash != first.hash || p.edges != first.edges {
					b.Fatalf("pass %d: bitmap %s, %d edges; first pass %s, %d", i, p.hash, p.edges, first.hash, first.edges)
				}
				cpu += p.cpu
			}
			reportCPU(b, len(bt.trace), cpu)
			if mode == "warm-edges" {
				b.ReportMetric(float64(first.edges), "edges/op")
			}
		})
	}
}

// TestLibxdcEdges holds the libxdc harness to the corpus: the edges its
// edge callback reports for mruby are ref.edges.gz line for line (libxdc's
// own output; the libxdc of commit 31347a8 gives them, newer ones differ,
// see docs/DESIGN.md §7), and a warm pass (trace cache) fills the same
// coverage bitmap as a cold one.
func TestLibxdcEdges(t *testing.T) {
	bin, args := libxdcHarness(t)
	out, err := exec.Command(bin, append([]string{"-edges"}, args...)...).Output()
	if err != nil {
		t.Fatalf("%s -edges: %v", bin, err)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	want := testkit.GzipLines(t, filepath.Join(testkit.Corpus(t), "libxdc", "mruby", "ref.edges.gz"))
	for i := 0; i < len(got) && i < len(want); i++ {
		if got[i] != want[i] {
			t.Fatalf("edge %d: libxdc reports %s, ref.edges.gz %s (%d edges against %d)", i+1, got[i], want[i], len(got), len(want))
		}
	}
	if len(got) != len(want) {
		t.Fatalf("libxdc reports %d edges, ref.edges.gz %d", len(got), len(want))
	}

	run := libxdcPasses(t)
	cold := run("cold")
	for i := 0; i < 3; i++ {
		if warm := run("warm"); warm.hash != cold.hash {
			t.Errorf("warm pass %d fills bitmap %s, a cold one %s", i, warm.hash, cold.hash)
		}
	}
}
