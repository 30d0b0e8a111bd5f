package engine

import (
	"errors"
	"fmt"
	"math"
)

// ErrBracket reports a TSCFit bracket that is empty, inverted or wider than
// the fit accepts.
var ErrBracket = errors.New("bad tsc bracket")

// fitPairs is the window of a TSCFit: the most recent brackets it fits,
// which follows a clock that drifts (kvm-clock is TSC scaled by a factor
// the host updates).
const fitPairs = 64

// fitMinPairs is how many brackets a TSCFit needs before it converts.
const fitMinPairs = 8

// TSCFit estimates the conversion of TSC values to perf time when the kernel
// publishes none (no cap_user_time_zero, as under kvm-clock). It is fed
// brackets: a TSC value and the perf times between which it was read (side
// band written before and after the trace that holds the TSC packet). It
// fits a line through the brackets' midpoints by least squares over the
// last fitPairs of them.
//
// Accuracy: when no bracket is wider than MaxWidth, each midpoint is off by
// at most MaxWidth/2, and the fitted time at x is off by at most Bound(x) =
// MaxWidth/2 · Σ|wᵢ(x)|, wᵢ being the weights that least squares gives the
// midpoints at x: 1 at the brackets' mean TSC, 5/3 at the ends of evenly
// spread brackets, growing linearly beyond them.
//
// TSCFit has no feeder yet: the engine sees TSC values only at record
// headers, not where their TSC packet lies among the trace chunks, so it
// cannot bracket them; the PT records of a CPU without TimeConv carry no
// time until the record assembler reports TSC packets per chunk.
type TSCFit struct {
	maxWidth uint64
	pairs    [fitPairs]fitPair
	head, n  int
	refused  uint64
	// The fit: ns = y0 + a + b·(tsc − x0), over the window.
	ok     bool
	x0, y0 uint64
	a, b   float64
	mean   float64 // mean of tsc − x0
	sxx    float64 // Σ (tsc − x0 − mean)²
}

type fitPair struct{ tsc, ns uint64 }

// NewTSCFit returns a fit that takes brackets at most maxWidth ns wide.
func NewTSCFit(maxWidth uint64) (*TSCFit, error) {
	if maxWidth == 0 {
		return nil, fmt.Errorf("%w: zero width bound", ErrOptions)
	}
	return &TSCFit{maxWidth: maxWidth}, nil
}

// Add adds that tsc was read while perf time was in [lo, hi]. A bracket
// that is inverted or wider than the fit's bound is refused (and counted):
// it cannot keep the bound.
func (f *TSCFit) Add(tsc, lo, hi uint64) error {
	if hi < lo || hi-lo > f.maxWidth {
		f.refused++
		return fmt.Errorf("%w: tsc %d in [%d, %d] ns, at most %d ns wide", ErrBracket, tsc, lo, hi, f.maxWidth)
	}
	if f.n == len(f.pairs) {
		f.head = (f.head + 1) % len(f.pairs)
		f.n--
	}
	f.pairs[(f.head+f.n)%len(f.pairs)] = fitPair{tsc: tsc, ns: lo + (hi-lo)/2}
	f.n++
	f.refit()
	return nil
}

// Refused returns how many brackets Add refused.
func (f *TSCFit) Refused() uint64 { return f.refused }

// Ready tells whether NS converts: fitMinPairs brackets with at least two
// distinct TSC values.
func (f *TSCFit) Ready() bool { return f.ok }

// at returns the i-th pair of the window, oldest first.
func (f *TSCFit) at(i int) *fitPair { return &f.pairs[(f.head+i)%len(f.pairs)] }

// refit fits the window. Values are taken relative to its oldest pair, so
// that float64 keeps nanoseconds over days of TSC.
func (f *TSCFit) refit() {
	f.ok = false
	if f.n < fitMinPairs {
		return
	}
	f.x0, f.y0 = f.at(0).tsc, f.at(0).ns
	var sx, sy float64
	for i := range f.n {
		p := f.at(i)
		sx += float64(int64(p.tsc - f.x0))
		sy += float64(int64(p.ns - f.y0))
	}
	n := float64(f.n)
	mx, my := sx/n, sy/n
	var sxx, sxy float64
	for i := range f.n {
		p := f.at(i)
		dx := float64(int64(p.tsc-f.x0)) - mx
		sxx += dx * dx
		sxy += dx * (float64(int64(p.ns-f.y0)) - my)
	}
	if sxx == 0 {
		return
	}
	f.b = sxy / sxx
	f.a = my - f.b*mx
	f.mean, f.sxx = mx, sxx
	f.ok = true
}

// NS returns the estimated perf time of tsc, or 0 when the fit is not
// ready or the estimate is not a positive time.
func (f *TSCFit) NS(tsc uint64) uint64 {
	if !f.ok {
		return 0
	}
	d := f.a + f.b*float64(int64(tsc-f.x0))
	ns := float64(f.y0) + d
	if ns < 1 || ns >= math.MaxUint64 {
		return 0
	}
	return f.y0 + uint64(int64(math.Round(d)))
}

// Bound returns the largest error of NS(tsc) in ns (see TSCFit), or 0 when
// the fit is not ready.
func (f *TSCFit) Bound(tsc uint64) uint64 {
	if !f.ok {
		return 0
	}
	x := float64(int64(tsc-f.x0)) - f.mean
	var s float64
	for i := range f.n {
		s += math.Abs(1/float64(f.n) + x*(float64(int64(f.at(i).tsc-f.x0))-f.mean)/f.sxx)
	}
	return uint64(math.Ceil(s*float64(f.maxWidth)/2)) + 1 // +1: rounding of NS
}
