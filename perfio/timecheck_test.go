package perfio

import (
	"os"
	"testing"

	"ptfs/internal/testkit"
)

// TestTSCConversion reads the capability on this machine's kernel. The
// kernel sets cap_user_time_zero only with the native TSC sched_clock; a
// guest whose clocksource is kvm-clock cannot have it.
func TestTSCConversion(t *testing.T) {
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "perf_event_open of a dummy event may need root (perf_event_paranoid)")
	}
	ok, reason, err := TSCConversion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cap_user_time_zero: %v %s", ok, reason)
	if ok == (reason != "") {
		t.Errorf("ok %v with reason %q", ok, reason)
	}
	cs, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	if err == nil && string(cs) == "kvm-clock\n" && ok {
		t.Errorf("clocksource kvm-clock, yet the kernel offers a TSC conversion")
	}
}
