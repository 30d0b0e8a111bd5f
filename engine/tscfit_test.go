package engine

import (
	"errors"
	"math/rand/v2"
	"testing"

	"ptfs/perfdata"
)

// TestTSCFit feeds brackets around the times a known conversion gives (a
// 2.5 GHz TSC, as the mmap page of a host would describe it) and checks
// that every estimate is within its bound, and the bound within the
// documented 5/3 of half the widest bracket inside the span it fitted.
func TestTSCFit(t *testing.T) {
	tc := perfdata.TimeConv{Shift: 31, Mult: 858993459, Zero: 12_345_678_901_234} // 0.4 ns a tick
	const width = 20_000                                                          // ns
	f, err := NewTSCFit(width)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tsc := uint64(3_000_000_000_000_000) // two weeks of uptime
	var first uint64
	for i := range 300 {
		tsc += 10_000_000 + rng.Uint64N(1_000_000) // ~4 ms apart
		if i == 0 {
			first = tsc
		}
		truth := tc.NS(tsc)
		w := rng.Uint64N(width + 1)
		lo := truth - rng.Uint64N(w+1)
		if err := f.Add(tsc, lo, lo+w); err != nil {
			t.Fatal(err)
		}
		if i+1 < fitMinPairs {
			if f.Ready() || f.NS(tsc) != 0 || f.Bound(tsc) != 0 {
				t.Fatalf("ready after %d brackets", i+1)
			}
			continue
		}
		// Across the window, and a little beyond its newest bracket.
		lo0 := f.at(0).tsc
		for x := lo0; x <= tsc+5_000_000; x += (tsc - lo0) / 16 {
			got, want, b := f.NS(x), tc.NS(x), f.Bound(x)
			if diff := max(got, want) - min(got, want); got == 0 || diff > b {
				t.Fatalf("after %d brackets: NS(%d) = %d, true %d: off by %d, bound %d", i+1, x, got, want, diff, b)
			}
			if x <= tsc && b > 5*width/6+2 && f.n == fitPairs {
				t.Errorf("after %d brackets: bound %d at %d inside the window, want at most %d", i+1, b, x, 5*width/6+2)
			}
		}
	}
	if f.NS(first) == 0 {
		t.Error("no estimate of a time before the window")
	}
	if f.Refused() != 0 {
		t.Errorf("%d brackets refused", f.Refused())
	}
}

// TestTSCFitBadInput: a fit refuses what cannot keep its bound and never
// converts from one TSC value.
func TestTSCFitBadInput(t *testing.T) {
	if _, err := NewTSCFit(0); !errors.Is(err, ErrOptions) {
		t.Errorf("NewTSCFit(0): %v", err)
	}
	f, err := NewTSCFit(100)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][2]uint64{{10, 5}, {0, 101}, {0, 1<<64 - 1}} {
		if err := f.Add(7, b[0], b[1]); !errors.Is(err, ErrBracket) {
			t.Errorf("bracket [%d, %d]: %v", b[0], b[1], err)
		}
	}
	if f.Refused() != 3 {
		t.Errorf("%d refused, want 3", f.Refused())
	}
	for range 2 * fitMinPairs {
		if err := f.Add(7, 1000, 1010); err != nil {
			t.Fatal(err)
		}
	}
	if f.Ready() || f.NS(7) != 0 {
		t.Error("a fit of one TSC value converts")
	}
	// A line that puts TSC 0 before perf time 0 gives no time there, not a
	// wrapped one.
	g, err := NewTSCFit(10)
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(fitMinPairs) {
		if err := g.Add(1000+i*100, i*100, i*100); err != nil {
			t.Fatal(err)
		}
	}
	if got := g.NS(1100); got != 100 {
		t.Errorf("NS(1100) = %d, want 100", got)
	}
	if got := g.NS(0); got != 0 {
		t.Errorf("NS(0) = %d, want 0 (before perf time 0)", got)
	}
}
