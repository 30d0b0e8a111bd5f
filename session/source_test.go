package session

import (
	"errors"
	"testing"

	"ptfs/engine"
	"ptfs/perfio"
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

// TestAppendPTStatus checks the kernel-side lines of ptw mode's status: the
// ring sizes with their reason, how many CPUs trace, and a line with the
// reason for each CPU that does not.
func TestAppendPTStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   perfio.PTStatus
		want string
	}{
		{
			name: "all tracing",
			st: perfio.PTStatus{AuxPages: 1024, DataPages: 64, Buffers: "privileged defaults: CAP_IPC_LOCK",
				CPUs: []perfio.CPUStatus{{CPU: 0}, {CPU: 1}}},
			want: "pt buffers: aux=1024 pages data=64 pages (privileged defaults: CAP_IPC_LOCK)\n" +
				"pt cpus: 2 of 2 tracing\npt reader: records=5 errors=1 (malformed records, failed ioctls) reconfigured=3\n",
		},
		{
			name: "offline, busy, error, hotplug",
			st: perfio.PTStatus{AuxPages: 32, DataPages: 64, Buffers: "unprivileged defaults: why",
				CPUs: []perfio.CPUStatus{{CPU: 0}, {CPU: 1, State: perfio.CPUOffline}, {CPU: 2, State: perfio.CPUBusy},
					{CPU: 3, State: perfio.CPUError, Err: errors.New("mmap: operation not permitted")},
					{CPU: 4, State: perfio.CPUWentOffline}, {CPU: 5, State: perfio.CPUCameOnline}}},
			want: "pt buffers: aux=32 pages data=64 pages (unprivileged defaults: why)\n" +
				"pt cpus: 1 of 6 tracing\n" +
				"pt cpu 1: offline\n" +
				"pt cpu 2: busy (EBUSY: another PT or LBR user)\n" +
				"pt cpu 3: error: mmap: operation not permitted\n" +
				"pt cpu 4: went offline (not traced until the next start)\n" +
				"pt cpu 5: came online (traced from the next start)\n" +
				"pt reader: records=5 errors=1 (malformed records, failed ioctls) reconfigured=3\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(appendPTStatus(nil, tc.st, perfio.PTStats{Records: 5, Errors: 1, Switches: 3})); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}
