package main

import (
	"bytes"
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
			want := testkit.GzipLines(t, filepath.Join(run, "expected.branches.gz"))
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

// ptsim builds ../shared/tools/ptsim (read-only there) into a temp dir
// and records programs with it.
type ptsim struct{ tools, bin string }

// newPtsim builds ptsim's tracer and encoder into t's temp dir.
func newPtsim(t *testing.T) *ptsim {
	t.Helper()
	p := &ptsim{tools: filepath.Join(testkit.Root(t), "..", "shared", "tools", "ptsim"), bin: filepath.Join(t.TempDir(), "bin")}
	if _, err := os.Stat(filepath.Join(p.tools, "ptsim-run")); err != nil {
		testkit.Unavailable(t, "ptsim not found: %v", err)
	}
	if b, err := exec.Command("make", "-s", "-C", p.tools, "BIN="+p.bin).CombinedOutput(); err != nil {
		testkit.Unavailable(t, "cannot build ptsim: %v\n%s", err, b)
	}
	return p
}

// record runs prog single-stepped into out (trace.pt, insns.bin,
// expected.branches, maps.txt, mem/), with ptsim-run's options opts. Where
// this machine's single step loses the step after CPUID (stepLost), the
// encoder refuses the recording; record restores the lost instructions
// (repairStepLost) and encodes it as ptsim-run would have.
func (p *ptsim) record(t *testing.T, out string, opts []string, prog ...string) {
	t.Helper()
	args := append(append(append([]string{"--no-validate"}, opts...), out), prog...)
	cmd := exec.Command(filepath.Join(p.tools, "ptsim-run"), args...)
	cmd.Env = append(os.Environ(), "PTSIM_BIN="+p.bin)
	b, err := cmd.CombinedOutput()
	if err == nil {
		return
	}
	lost := stepLost(t)
	if lost == "" {
		testkit.Unavailable(t, "ptsim-run cannot record here: %v\n%s", err, b)
	}
	// The encoder's count of inconsistencies comes once it has checked
	// the whole recording: ptsim-trace finished (ptsim-run stops at its
	// failure) and only the recording's flow is in question.
	if !bytes.Contains(b, []byte(" inconsistencies between the recording and the decoded code\n")) {
		t.Skipf("ptsim-run cannot record here, and no repair applies: this machine's single step is not exact (testdata/sstep.c: %s, the step after CPUID, which the hypervisor emulates, is lost) and the recording failed before its encoder checked it: %v\n%s", lost, err, b)
	}
	enc, probes, err := ptsimEncodeOpts(opts)
	if err != nil {
		t.Fatal(err)
	}
	n, err := repairStepLost(out, probes)
	if err != nil {
		t.Fatalf("this machine's single step loses the step after CPUID (testdata/sstep.c: %s), and the recording cannot be repaired: %v\nptsim-run: %s", lost, err, b)
	}
	t.Logf("restored %d instructions, each right after a CPUID, whose single step this machine loses (testdata/sstep.c: %s)", n, lost)
	if b, err := exec.Command(filepath.Join(p.bin, "ptsim-encode"), append(enc, out)...).CombinedOutput(); err != nil {
		t.Fatalf("ptsim-encode %q of the repaired recording: %v\n%s", enc, err, b)
	}
}

// stepLost runs testdata/sstep.c and returns "" if ptrace's single step is
// exact over CPUID here, else what it printed ("skips ADDR").
func stepLost(t *testing.T) string {
	t.Helper()
	b, err := exec.Command(buildC(t, "sstep", "sstep")).Output()
	out := strings.TrimSpace(string(b))
	if err != nil || (out != "exact" && !strings.HasPrefix(out, "skips ")) {
		t.Fatalf("sstep: %v %q", err, out)
	}
	if out == "exact" {
		return ""
	}
	return out
}

// encode writes the PT trace of the recording in out, encoded with other
// ptsim-encode options, to file (the branches are the recording's).
func (p *ptsim) encode(t *testing.T, out, file string, opts ...string) {
	t.Helper()
	if b, err := exec.Command(filepath.Join(p.bin, "ptsim-encode"), append(append(opts, "-o", file), out)...).CombinedOutput(); err != nil {
		t.Fatalf("ptsim-encode %q: %v\n%s", opts, err, b)
	}
}

// ptsimRecArgs are the --branches images of a recording: its maps
// snapshots (files read where they are) and the dumps of code no file
// holds that maps.txt names: the vDSO as --vdso, others as --raw.
func ptsimRecArgs(t *testing.T, out string) []string {
	t.Helper()
	maps := filepath.Join(out, "maps.txt")
	text, err := os.ReadFile(maps)
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := images.ParseMapsSnapshots(text)
	if err != nil {
		t.Fatalf("%s: %v", maps, err)
	}
	args := []string{"--maps", maps}
	vdso := map[[2]uint64]bool{}
	for _, s := range snaps {
		for _, m := range s.Maps {
			if m.Path == "[vdso]" {
				vdso[[2]uint64{m.Start, m.End}] = true
			}
		}
	}
	for _, s := range snaps {
		for _, d := range s.Dumps {
			if vdso[[2]uint64{d.Start, d.End}] {
				args = append(args, "--vdso", filepath.Join(out, d.File))
			} else {
				args = append(args, "--raw", filepath.Join(out, d.File)+":0x"+strconv.FormatUint(d.Start, 16))
			}
		}
	}
	return args
}

// ptsimExact holds ptfs decode --branches on a ptsim recording in out
// (its trace, or the trace file given) to the ground truth: every branch
// (address, target, kind) of expected.branches and every instruction of
// insns.bin, no gap and no error. It returns the branch lines and the
// number of VEX and EVEX instructions executed.
func ptsimExact(t *testing.T, out, trace string) (lines string, vex, evex int) {
	t.Helper()
	args := ptsimRecArgs(t, out)
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
	insns, err := os.ReadFile(filepath.Join(out, "insns.bin"))
	if err != nil {
		t.Fatal(err)
	}
	wantSum := "branch summary: branches=" + strconv.Itoa(len(want)) + " insns=" + strconv.Itoa(len(insns)/8) + " gaps=0"
	if n := len(rest); n < 2 || rest[n-2] != wantSum || rest[n-1] != "summary: records=0 dropped=0 stray=0 unknown=0 errors=0" {
		t.Errorf("summaries %q, want %q and no error", rest[max(0, n-2):], wantSum)
	}

	s, data := decodeImages(t, append(args, trace))
	c := &vexCounter{insnChecker: insnChecker{Handler: flow.NewBranches(io.Discard, s, s, nil), want: insns}, mem: s}
	flow.New(s, flow.Options{}).Decode(data, c)
	if c.bad != 0 || c.n*8 != len(insns) {
		t.Fatalf("%d instructions, want %d; %d differ, the first at %d", c.n, len(insns)/8, c.bad, c.at)
	}
	t.Logf("%s: %d instructions, %d branches equal (%d bytes of trace)", filepath.Base(trace), c.n, len(got), len(data))
	return stdout, c.vex, c.evex
}

// TestBranchesPtsimRuns records programs with ptsim, built into a temp
// dir, and holds ptfs decode --branches to each run's ground truth
// (ptsimExact): dynamic linking (ld.so), libc's vector string functions,
// the vDSO (dumped, no file), signals (asynchronous ones: FUP + TIP.PGD,
// then TIP.PGE at the handler, an `async` branch), system programs (one
// cut by --max), and a trace encoded with a PSB+ at almost every
// instruction boundary and with the return stack flushed at each
// disable. ptsim follows one thread only (its README: other threads and
// children are not stepped), so no run has threads.
func TestBranchesPtsimRuns(t *testing.T) {
	if testkit.Race {
		t.Skip("single-threaded recording and decoding: the race detector only slows them many times over")
	}
	p := newPtsim(t)
	tests := filepath.Join(p.tools, "tests")
	for _, tc := range []struct {
		name  string
		opts  []string
		prog  func(t *testing.T) []string
		check func(t *testing.T, out, lines string, vex, evex int)
	}{{
		name: "strings",
		prog: func(t *testing.T) []string { return []string{testkit.BuildC(t, "testdata/ptsim-strings.c")} },
		check: func(t *testing.T, out, lines string, vex, evex int) {
			if !strings.Contains(lines, "(/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2)") || !strings.Contains(lines, "(/usr/lib/x86_64-linux-gnu/libc.so.6)") {
				t.Errorf("no branch names ld.so and libc")
			}
			// The point of the run: vector code was stepped over.
			if vex == 0 {
				t.Errorf("no VEX/EVEX instruction executed")
			}
			t.Logf("%d VEX, %d EVEX instructions", vex, evex)
		},
	}, {
		name: "flow",
		prog: func(t *testing.T) []string { return []string{testkit.BuildC(t, filepath.Join(tests, "flow.c"))} },
		check: func(t *testing.T, out, lines string, vex, evex int) {
			vdsoBranches(t, lines, 1)
			// The same recording, encoded with a PSB+ at almost every
			// boundary (also while disabled in syscalls), and with the
			// return stack cleared at every TIP.PGD.
			for _, enc := range []struct {
				name string
				opts []string
			}{{"psb16.pt", []string{"-psb-period", "16"}}, {"retflush.pt", []string{"-ret-flush-on-disable"}}} {
				pt := filepath.Join(out, enc.name)
				p.encode(t, out, pt, enc.opts...)
				ptsimExact(t, out, pt)
			}
		},
	}, {
		name: "vdso",
		prog: func(t *testing.T) []string { return []string{testkit.BuildC(t, "testdata/ptsim-vdso.c")} },
		check: func(t *testing.T, out, lines string, vex, evex int) {
			vdsoBranches(t, lines, 1000)
		},
	}, {
		name: "sigs",
		prog: func(t *testing.T) []string { return []string{testkit.BuildC(t, filepath.Join(tests, "sigs.c"))} },
		check: func(t *testing.T, out, lines string, vex, evex int) {
			// The SIGSEGV interrupts user code, and so do the SIGALRMs
			// that do not come at a syscall's exit (under load, some
			// do); SIGUSR1 comes at a syscall's exit (a syscall
			// branch to its handler). ptsimExact held the kinds to
			// the ground truth.
			n := strings.Count(lines, " async\n")
			if n == 0 {
				t.Errorf("no async branch")
			}
			t.Logf("%d async branches", n)
			if !strings.Contains(lines, "syscall\n") || strings.Contains(lines, "trace: stop at") {
				t.Errorf("a stop line, or no syscall branch")
			}
		},
	}, {
		name: "true",
		prog: func(t *testing.T) []string { return []string{"/bin/true"} },
	}, {
		name: "date-max",
		opts: []string{"--max", "100000"},
		prog: func(t *testing.T) []string { return []string{"/bin/date"} },
		check: func(t *testing.T, out, lines string, vex, evex int) {
			// --max ends the trace with FUP + TIP.PGD.
			if !strings.Contains(lines, "trace: stop at ") {
				t.Errorf("no stop line at the end")
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			p.record(t, out, tc.opts, tc.prog(t)...)
			lines, vex, evex := ptsimExact(t, out, filepath.Join(out, "trace.pt"))
			if tc.check != nil {
				tc.check(t, out, lines, vex, evex)
			}
		})
	}
}

// vdsoBranches checks that at least atLeast branch lines leave from the vDSO.
func vdsoBranches(t *testing.T, lines string, atLeast int) {
	t.Helper()
	n := 0
	for l := range strings.Lines(lines) {
		if f := strings.Fields(l); len(f) == 9 && f[0] == "branch:" && f[3] == "([vdso])" {
			n++
		}
	}
	if n < atLeast {
		t.Errorf("%d branches from the vDSO, want %d or more", n, atLeast)
	}
	t.Logf("%d branches from the vDSO", n)
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
