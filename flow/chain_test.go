package flow

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"ptfs/internal/testkit"
)

// flowLog keeps every branch and event as one line.
type flowLog struct {
	lines []string
	insns int
}

func (l *flowLog) Insn(*Insn) { l.insns++ }
func (l *flowLog) Branch(from, to uint64, kind BranchKind) {
	l.lines = append(l.lines, fmt.Sprintf("%x %x %v", from, to, kind))
}
func (l *flowLog) Event(e *Event) {
	l.lines = append(l.lines, fmt.Sprintf("ev %d %x %v %d %v", e.Kind, e.IP, e.HasIP, e.Offset, e.Err))
}

// TestNoInsnsSameFlow checks that chaining blocks (NoInsns) gives the
// branches, events and counters that the instruction-by-instruction walk
// gives: on the benchmark traces whole, truncated and with corrupted bytes,
// and on every trace of libipt's tests (their events, errors, deferred
// TIPs, mode changes).
func TestNoInsnsSameFlow(t *testing.T) {
	for _, name := range benchNames {
		bt := loadBench(t, name)
		for _, tc := range variants(bt.trace) {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				if c := sameFlow(t, bt.space, tc.trace, Options{}); tc.name == "corrupted" && c.Errors == 0 {
					t.Fatal("the corrupted trace decodes without an error")
				}
			})
		}
	}
	var errs uint64
	for _, lt := range libiptTraces(t) {
		t.Run("libipt/"+lt.name, func(t *testing.T) {
			errs += sameFlow(t, lt.mem, lt.trace, Options{}).Errors
		})
	}
	if errs == 0 {
		t.Error("no libipt test trace met an error: the error paths went untested")
	}
}

// sameFlow decodes trace from mem with opts, with and without NoInsns,
// fails t where the two differ, and returns the counters.
func sameFlow(t *testing.T, mem Memory, trace []byte, opts Options) Counters {
	t.Helper()
	var all, br flowLog
	opts.NoInsns = false
	d := New(mem, opts)
	d.Decode(trace, &all)
	opts.NoInsns = true
	dn := New(mem, opts)
	dn.Decode(trace, &br)
	if br.insns != 0 || all.insns != int(d.Counters().Insns) {
		t.Fatalf("Insn called %d times with NoInsns, %d without for %d instructions", br.insns, all.insns, d.Counters().Insns)
	}
	if d.Counters() != dn.Counters() {
		t.Errorf("counters %+v with NoInsns, %+v without", dn.Counters(), d.Counters())
	}
	if len(all.lines) != len(br.lines) {
		t.Errorf("%d branches and events with NoInsns, %d without", len(br.lines), len(all.lines))
	}
	for i := range min(len(all.lines), len(br.lines)) {
		if all.lines[i] != br.lines[i] {
			t.Fatalf("line %d: %q with NoInsns, %q without", i, br.lines[i], all.lines[i])
		}
	}
	return d.Counters()
}

// FuzzNoInsns holds chaining blocks (NoInsns) to the instruction walk on
// random and mutated traces and code: the same branches, events and
// counters.
func FuzzNoInsns(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, trace, code []byte, base uint64) {
		if len(trace) > 1<<16 || len(code) > 1<<16 {
			return
		}
		sameFlow(t, &blob{base: base, code: code}, trace, Options{MaxInsns: 1 << 12, ResyncOnError: len(code)%2 == 1})
	})
}

// libiptTrace is a libipt test trace with the code it ran (its .bin at the
// .ptt's org).
type libiptTrace struct {
	name  string
	mem   *blob
	trace []byte
}

// libiptTraces returns the corpus's assembled libipt tests that have code.
func libiptTraces(t *testing.T) []libiptTrace {
	t.Helper()
	dir := filepath.Join(testkit.Corpus(t), "libipt")
	ptts, _ := filepath.Glob(filepath.Join(dir, "*.ptt"))
	if len(ptts) == 0 {
		testkit.Unavailable(t, "no libipt tests in %s", dir)
	}
	var out []libiptTrace
	for _, ptt := range ptts {
		base := strings.TrimSuffix(ptt, ".ptt")
		src, err := os.ReadFile(ptt)
		if err != nil {
			t.Fatal(err)
		}
		m := fuzzOrg.FindSubmatch(src)
		code, err1 := os.ReadFile(base + ".bin")
		trace, err2 := os.ReadFile(base + ".pt")
		if m == nil || err1 != nil || err2 != nil {
			continue // not assembled, or no code
		}
		org, err := strconv.ParseUint(string(m[1]), 0, 64)
		if err != nil {
			t.Fatalf("%s: org %s: %v", ptt, m[1], err)
		}
		out = append(out, libiptTrace{filepath.Base(base), &blob{base: org, code: code}, trace})
	}
	return out
}

// variant is a trace as a test decodes it.
type variant struct {
	name  string
	trace []byte
}

// variants are trace whole, truncated to two thirds, and corrupted (a
// byte flipped every 50,000 from the 5,000th).
func variants(trace []byte) []variant {
	bad := slices.Clone(trace)
	for i := 5000; i < len(bad); i += 50000 {
		bad[i] ^= 0x5a
	}
	return []variant{{"whole", trace}, {"truncated", trace[:len(trace)*2/3]}, {"corrupted", bad}}
}
