package main

import (
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"ptfs/flow"
	"ptfs/images"
	"ptfs/internal/testkit"
)

// gzLines returns the lines of a gzipped text file.
func gzLines(t *testing.T, path string) []string {
	t.Helper()
	return strings.Split(strings.TrimSuffix(string(testkit.ReadGzip(t, path)), "\n"), "\n")
}

// decodeImages builds the images that --branches args (ending with the
// trace) describe, released at the test's end, and reads the trace.
func decodeImages(t *testing.T, args []string) (*images.Space, []byte) {
	t.Helper()
	a, err := parseBranchesArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	s, closeAll, err := branchImages(&a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := closeAll(); err != nil {
			t.Error(err)
		}
	})
	trace, err := os.ReadFile(a.trace)
	if err != nil {
		t.Fatal(err)
	}
	return s, trace
}

// ptsimArgs are the --branches images of a ptsim run directory: its maps
// snapshots, the binaries beside the runs, the vDSO dump.
func ptsimArgs(t *testing.T, run, root string) []string {
	t.Helper()
	vdso, _ := filepath.Glob(filepath.Join(run, "vdso-*.bin"))
	if len(vdso) != 1 {
		t.Fatalf("%s: %d vDSO dumps", run, len(vdso))
	}
	return []string{"--maps", filepath.Join(run, "maps.txt"), "--root", root, "--vdso", vdso[0]}
}

// branchTriples turns the branch: lines of out into ptsim's expected form
// `0xFROM => 0xTO KIND`; other lines go to rest.
func branchTriples(t *testing.T, out string) (triples, rest []string) {
	t.Helper()
	for l := range strings.SplitSeq(strings.TrimSuffix(out, "\n"), "\n") {
		if !strings.HasPrefix(l, "branch: ") {
			rest = append(rest, l)
			continue
		}
		f := strings.Fields(l)
		// branch: FROM SYM (DSO) => TO SYM (DSO) KIND
		if len(f) != 9 || f[4] != "=>" {
			t.Fatalf("branch line %q", l)
		}
		triples = append(triples, f[1]+" => "+f[5]+" "+f[8])
	}
	return triples, rest
}

// diffLines fails the test at the first difference of got and want.
func diffLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			t.Fatalf("%s %d: got %q, want %q (of %d, %d)", what, i, got[i], want[i], len(got), len(want))
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d, want %d", what, len(got), len(want))
	}
}

// insnChecker is a flow.Handler that holds the executed instructions to a
// recorded list and passes the flow on.
type insnChecker struct {
	flow.Handler
	want []byte // u64 little-endian addresses
	n    int
	bad  int
	at   int
}

func (c *insnChecker) Insn(in *flow.Insn) {
	if c.n*8+8 > len(c.want) || binary.LittleEndian.Uint64(c.want[c.n*8:]) != in.IP {
		if c.bad == 0 {
			c.at = c.n
		}
		c.bad++
	}
	c.n++
	c.Handler.Insn(in)
}

// TestBranchesPtsim decodes the ptsim runs of the corpus (real executions,
// recorded by single-stepping) with ptfs decode --branches: the branch list
// (address, target, kind) equals expected.branches, the instructions equal
// insns.bin, and in run-static-ptw the probe records equal probes.txt, each
// printed right after the branch into the probed site.
func TestBranchesPtsim(t *testing.T) {
	root := filepath.Join(testkit.Corpus(t), "ptsim")
	for _, name := range []string{"run-static", "run-static-ptw"} {
		t.Run(name, func(t *testing.T) {
			run := filepath.Join(root, name)
			args := append([]string{"--branches"}, ptsimArgs(t, run, root)...)
			probes, err := os.ReadFile(filepath.Join(run, "probes.txt"))
			ptw := err == nil
			if ptw {
				args = append(args, "--events", writeEvent(t, "ptsim", "fib", "1730")) // 0x6c2
			}
			code, out, errs := runDecodeT(append(args, filepath.Join(run, "trace.pt"))...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			got, rest := branchTriples(t, out)
			want := gzLines(t, filepath.Join(run, "expected.branches.gz"))
			diffLines(t, "branch", got, want)

			var recs []string
			var sum []string
			for _, l := range rest {
				switch {
				case strings.HasPrefix(l, "record "):
					recs = append(recs, l)
				case strings.HasPrefix(l, "trace: "), strings.Contains(l, "summary: "):
					sum = append(sum, l)
				default:
					t.Errorf("unexpected line %q", l)
				}
			}
			if sum[0] != "trace: start at 0x4016d0 _start+0x0 (flow-static)" {
				t.Errorf("first line %q", sum[0])
			}
			var wantRecs []string
			if ptw {
				for l := range strings.SplitSeq(strings.TrimSpace(string(probes)), "\n") {
					f := strings.Fields(l)
					if strings.HasPrefix(l, "#") || len(f) < 4 {
						continue
					}
					rdi, err1 := strconv.ParseUint(f[2], 0, 64)
					rsi, err2 := strconv.ParseUint(f[3], 0, 64)
					if err1 != nil || err2 != nil {
						t.Fatalf("probes line %q", l)
					}
					wantRecs = append(wantRecs, "record "+strconv.Itoa(len(wantRecs)+1)+": event=ptsim/fib id=0x6c2 args=["+
						strconv.FormatUint(rdi, 10)+", rsi="+strconv.FormatUint(rsi, 10)+"]")
				}
				if len(wantRecs) != 987 {
					t.Fatalf("%d probe hits in probes.txt", len(wantRecs))
				}
				// Each record follows the branch into fib.
				prev := ""
				for l := range strings.SplitSeq(out, "\n") {
					if strings.HasPrefix(l, "record ") && !strings.Contains(prev, "=> 0x401840 fib+0x0 (flow-static)") {
						t.Fatalf("%q after %q, not after the branch into the site", l, prev)
					}
					prev = l
				}
			}
			diffLines(t, "record", recs, wantRecs)
			wantSum := "summary: records=" + strconv.Itoa(len(wantRecs)) + " dropped=0 stray=0 unknown=0 errors=0"
			if last := sum[len(sum)-1]; last != wantSum {
				t.Errorf("summary %q, want %q", last, wantSum)
			}
			if l := sum[len(sum)-2]; l != "branch summary: branches="+strconv.Itoa(len(want))+" insns=140458 gaps=0" {
				t.Errorf("branch summary %q", l)
			}

			// The instructions, through the same images.
			s, trace := decodeImages(t, append(ptsimArgs(t, run, root), filepath.Join(run, "trace.pt")))
			c := &insnChecker{Handler: flow.NewBranches(io.Discard, s, s, nil), want: testkit.ReadGzip(t, filepath.Join(run, "insns.bin.gz"))}
			flow.New(s, flow.Options{}).Decode(trace, c)
			if c.bad != 0 || c.n*8 != len(c.want) {
				t.Fatalf("%d instructions, want %d; %d differ, the first at %d", c.n, len(c.want)/8, c.bad, c.at)
			}
			t.Logf("%d branches, %d instructions, %d records equal", len(got), c.n, len(recs))
		})
	}
}

// TestBranchesArgs checks that bad --branches input gets a clear error and
// exit status 2, never a panic.
func TestBranchesArgs(t *testing.T) {
	trace := filepath.Join(testkit.Corpus(t), "ptsim", "run-static", "trace.pt")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{trace}, "no code image"},
		{[]string{"--raw", "x:0x1000"}, "no trace FILE"},
		{[]string{"--raw"}, "--raw needs a value"},
		{[]string{"--bogus", trace}, `unknown option "--bogus"`},
		{[]string{"--tid", "-3", "--raw", "x:1", trace}, "want a number"},
		{[]string{"--raw", "x:1", trace, trace}, "more than one trace file"},
		{[]string{"--pages", "nocolon", trace}, "want ADDRFILE:DUMPFILE"},
	} {
		code, _, errs := runDecodeT(append([]string{"--branches"}, tt.args...)...)
		if code != 2 || !strings.Contains(errs, tt.want) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", tt.args, code, errs, tt.want)
		}
	}
	// A missing image file is an error of the run (1), named.
	code, _, errs := runDecodeT("--branches", "--raw", "/nonexistent/code:0x1000", trace)
	if code != 1 || !strings.Contains(errs, "/nonexistent/code") {
		t.Errorf("missing image: exit %d, %q", code, errs)
	}
	code, out, _ := runDecodeT("--branches", "--help")
	if code != 0 || !strings.Contains(out, "--raw FILE[:FROM[-TO]]:BASE") {
		t.Errorf("--help: exit %d, %q", code, out)
	}
}

// TestBranchesPtsimDynamic records a dynamically linked program (ld.so,
// libc's vector string functions on long strings) with ptsim, built into a
// temp dir, and holds ptfs decode --branches to its ground truth: every
// branch (address, target, kind) and every instruction exact, through
// images built from its maps snapshots and the files on disk.
func TestBranchesPtsimDynamic(t *testing.T) {
	tools := filepath.Join(testkit.Root(t), "..", "shared", "tools", "ptsim")
	if _, err := os.Stat(filepath.Join(tools, "ptsim-run")); err != nil {
		testkit.Unavailable(t, "ptsim not found: %v", err)
	}
	prog := testkit.BuildC(t, "testdata/ptsim-strings.c")
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "bin")
	if b, err := exec.Command("make", "-s", "-C", tools, "BIN="+bin).CombinedOutput(); err != nil {
		testkit.Unavailable(t, "cannot build ptsim: %v\n%s", err, b)
	}
	out := filepath.Join(tmp, "out")
	cmd := exec.Command(filepath.Join(tools, "ptsim-run"), "--no-validate", out, prog)
	cmd.Env = append(os.Environ(), "PTSIM_BIN="+bin)
	if b, err := cmd.CombinedOutput(); err != nil {
		testkit.Unavailable(t, "ptsim-run cannot record here: %v\n%s", err, b)
	}
	args := []string{"--maps", filepath.Join(out, "maps.txt")}
	if vdso, _ := filepath.Glob(filepath.Join(out, "mem", "*vdso*")); len(vdso) == 1 {
		args = append(args, "--vdso", vdso[0])
	}
	trace := filepath.Join(out, "trace.pt")
	code, stdout, errs := runDecodeT(append(append([]string{"--branches"}, args...), trace)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	got, rest := branchTriples(t, stdout)
	exp, err := os.ReadFile(filepath.Join(out, "expected.branches"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSuffix(string(exp), "\n"), "\n")
	diffLines(t, "branch", got, want)
	if !strings.Contains(stdout, "(/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2)") || !strings.Contains(stdout, "(/usr/lib/x86_64-linux-gnu/libc.so.6)") {
		t.Errorf("no branch names ld.so and libc")
	}
	if last := rest[len(rest)-1]; last != "summary: records=0 dropped=0 stray=0 unknown=0 errors=0" {
		t.Errorf("summary %q", last)
	}

	s, data := decodeImages(t, append(args, trace))
	insns, err := os.ReadFile(filepath.Join(out, "insns.bin"))
	if err != nil {
		t.Fatal(err)
	}
	c := &vexCounter{insnChecker: insnChecker{Handler: flow.NewBranches(io.Discard, s, s, nil), want: insns}, mem: s}
	flow.New(s, flow.Options{}).Decode(data, c)
	if c.bad != 0 || c.n*8 != len(insns) {
		t.Fatalf("%d instructions, want %d; %d differ, the first at %d", c.n, len(insns)/8, c.bad, c.at)
	}
	// The point of the run: vector code was stepped over.
	if c.vex == 0 {
		t.Errorf("no VEX/EVEX instruction executed")
	}
	t.Logf("%d branches, %d instructions (%d VEX, %d EVEX) equal", len(got), c.n, c.vex, c.evex)
}

// vexCounter counts the executed VEX- and EVEX-encoded instructions.
type vexCounter struct {
	insnChecker
	mem       flow.Memory
	vex, evex int
	b         [1]byte
}

func (c *vexCounter) Insn(in *flow.Insn) {
	if n, _ := c.mem.ReadAt(c.b[:], in.IP); n == 1 {
		switch c.b[0] {
		case 0xc4, 0xc5:
			c.vex++
		case 0x62:
			c.evex++
		}
	}
	c.insnChecker.Insn(in)
}
