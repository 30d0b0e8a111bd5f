package session

import (
	"testing"

	"ptfs/engine"
)

// TestTimeStatus: the status says where ptw record times come from, and
// why there are none.
func TestTimeStatus(t *testing.T) {
	for _, tc := range []struct {
		cpus, noTC int
		want       string
	}{
		{0, 0, "time: not known until a CPU passes trace (cap_user_time_zero of its mmap page)\n"},
		{4, 0, "time: perf time (TSC converted by the mmap page)\n"},
		{4, 1, "time: none on 1 of 4 CPUs: the kernel gave no TSC conversion (cap_user_time_zero clear, " +
			"as under kvm-clock); their records have no time= and no tid=\n"},
	} {
		st := engine.PTWStats{CPUs: tc.cpus, NoTimeConv: tc.noTC}
		if got := string(appendTimeStatus(nil, &st)); got != tc.want {
			t.Errorf("%d CPUs, %d without TimeConv:\n got %q\nwant %q", tc.cpus, tc.noTC, got, tc.want)
		}
	}
}
