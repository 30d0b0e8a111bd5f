package perfio

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPerfClockOffset measures the offset twice on this kernel: both
// brackets are narrow and the offsets agree within them (the clocks do not
// drift measurably in a few ms).
func TestPerfClockOffset(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("perf_event_open of a dummy event with comm needs root or perf_event_paranoid <= 1")
	}
	a, wa, err := PerfClockOffset()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	b, wb, err := PerfClockOffset()
	if err != nil {
		t.Fatal(err)
	}
	if wa > 1e6 || wb > 1e6 {
		t.Errorf("brackets %d and %d ns wide, want under 1 ms", wa, wb)
	}
	d := a - b
	if d < 0 {
		d = -d
	}
	if uint64(d) > wa+wb+10_000 {
		t.Errorf("offsets %d and %d differ by %d ns (brackets %d, %d)", a, b, d, wa, wb)
	}
	t.Logf("perf time - CLOCK_MONOTONIC = %d ns (±%d), %d ns (±%d)", a, wa, b, wb)
}

// TestMonotonicNow checks that the runtime's clock that monotonicNow reads
// is CLOCK_MONOTONIC, the samples' clock: it falls between two readings
// of clock_gettime.
func TestMonotonicNow(t *testing.T) {
	for range 100 {
		var t0, t1 unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &t0); err != nil {
			t.Fatal(err)
		}
		now := monotonicNow()
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &t1); err != nil {
			t.Fatal(err)
		}
		if lo, hi := uint64(t0.Nano()), uint64(t1.Nano()); now < lo || now > hi {
			t.Fatalf("monotonicNow %d outside clock_gettime's [%d, %d]", now, lo, hi)
		}
	}
}
