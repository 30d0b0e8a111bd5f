package flow

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
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
		bad := slices.Clone(bt.trace)
		for i := 5000; i < len(bad); i += 50000 {
			bad[i] ^= 0x5a
		}
		for _, tc := range []struct {
			name  string
			trace []byte
		}{{"whole", bt.trace}, {"truncated", bt.trace[:len(bt.trace)*2/3]}, {"corrupted", bad}} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				if c := sameFlow(t, bt.space, tc.trace, Options{}); tc.name == "corrupted" && c.Errors == 0 {
					t.Fatal("the corrupted trace decodes without an error")
				}
			})
		}
	}
	var errs uint64
	for _, lt := range libiptTraces(t) {
		t.Run(lt.name, func(t *testing.T) {
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

// FuzzNoInsns holds chaining blocks (NoInsns) to the instruction walk, and
// the fast path (fast.go) to chaining, on random and mutated traces and
// code: the same branches, events and counters; the fast path with a
// MaxInsns below and at tletBudget (tracelets taken only at it).
func FuzzNoInsns(f *testing.F) {
	fuzzSeeds(f)
	// Tracelets' traces (TNT.8 packets together, compressed returns),
	// with code of a length that has them taken.
	r := rand.New(rand.NewPCG(1, 2))
	f.Add(recurseTrace(r, 40, 12, true), append(slices.Clone(recurseCode), 0, 0), uint64(0x1000))
	var groups []jeGroup
	for range 40 {
		g := jeGroup{r.IntN(16), []byte{byte(r.IntN(64)), byte(r.IntN(64)), byte(r.IntN(64))}}
		groups = append(groups, g, g)
	}
	f.Add(jeTrace(r, 64, groups), jeCode(64), uint64(0x1000))
	f.Fuzz(func(t *testing.T, trace, code []byte, base uint64) {
		if len(trace) > 1<<16 || len(code) > 1<<16 {
			return
		}
		mem, opts := &blob{base: base, code: code}, Options{MaxInsns: 1 << 12, ResyncOnError: len(code)%2 == 1}
		sameFlow(t, mem, trace, opts)
		if len(trace)%2 == 1 {
			// A clock: the fast path's timing packets, and the
			// branches' times compared too.
			opts.Time = &timeConfig
		}
		if len(code)%4 >= 2 {
			// A budget that lets the kernel take tracelets (the
			// walk's bound is checked unread only past it).
			opts.MaxInsns = tletBudget
		}
		sameFast(t, mem, trace, opts)
	})
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
