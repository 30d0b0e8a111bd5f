package perfio

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"ptfs/cred"
)

// Ring sizes chosen like perf's for intel_pt (tools/perf/arch/x86/util/
// intel-pt.c): 4 MiB of AUX per CPU when no locked-memory limit stops it,
// else 128 KiB of AUX and 256 KiB of data.
const (
	privAuxBytes    = 4 << 20
	unprivAuxBytes  = 128 << 10
	unprivDataBytes = 256 << 10
	// minAuxBytes is the smallest AUX ring perf accepts.
	minAuxBytes = 8 << 10
)

// procDir is where the kernel's limits on perf rings are read.
const procDir = "/proc"

// mlockLimits are what decides how much ring memory the kernel lets this
// process lock: perf_mmap charges each mapping to perf_event_mlock_kb per
// online CPU, then to RLIMIT_MEMLOCK, and refuses what exceeds both with
// EPERM, unless the process has CAP_IPC_LOCK or perf_event_paranoid is -1.
type mlockLimits struct {
	ipcLock  bool
	paranoid int
	mlockKB  uint64 // kernel.perf_event_mlock_kb
	memlock  uint64 // RLIMIT_MEMLOCK in bytes
}

// readMlockLimits reads the limits from dir (procDir, or a tree made like it
// in tests); memlock is RLIMIT_MEMLOCK's soft value.
func readMlockLimits(dir string, memlock uint64) (mlockLimits, error) {
	l := mlockLimits{memlock: memlock}
	status, err := os.ReadFile(filepath.Join(dir, "self", "status"))
	if err != nil {
		return l, fmt.Errorf("capabilities: %w", err)
	}
	caps, err := cred.CapEff(status)
	if err != nil {
		return l, fmt.Errorf("capabilities: %w", err)
	}
	l.ipcLock = caps&(1<<unix.CAP_IPC_LOCK) != 0
	kb, err := readProcInt(filepath.Join(dir, "sys", "kernel", "perf_event_mlock_kb"))
	if err != nil {
		return l, err
	}
	if kb < 0 {
		return l, fmt.Errorf("perf_event_mlock_kb %d is negative", kb)
	}
	l.mlockKB = uint64(kb)
	if l.paranoid, err = readProcInt(filepath.Join(dir, "sys", "kernel", "perf_event_paranoid")); err != nil {
		return l, err
	}
	return l, nil
}

// readProcInt reads a file that holds one decimal number.
func readProcInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("perf limits: %w", err)
	}
	v, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil {
		return 0, fmt.Errorf("perf limits: %s: %q is not a number", path, bytes.TrimSpace(b))
	}
	return v, nil
}

// memlockLimit returns RLIMIT_MEMLOCK's soft value in bytes.
func memlockLimit() (uint64, error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, fmt.Errorf("rlimit memlock: %w", err)
	}
	return r.Cur, nil
}

// chooseBuffers fills o.AuxPages and o.DataPages where they are 0 as perf
// would on this machine for ncpu CPUs, and says which sizes it used and why.
// lerr is the error of reading the limits: then the small sizes are taken.
func chooseBuffers(o *PTOptions, lim mlockLimits, lerr error, ncpu, pageSize int) string {
	if o.AuxPages != 0 && o.DataPages != 0 {
		return "flags"
	}
	why := ""
	small := false
	switch {
	case lerr != nil:
		small, why = true, fmt.Sprintf("limits unknown: %v", lerr)
	case lim.ipcLock:
		why = "CAP_IPC_LOCK"
	case lim.paranoid == -1:
		why = "perf_event_paranoid=-1"
	default:
		aux, data := o.AuxPages*pageSize, o.DataPages*pageSize
		if aux == 0 {
			aux = privAuxBytes
		}
		if data == 0 {
			data = DefaultPTDataPages * pageSize
		}
		need := uint64(ncpu) * uint64(aux+data+pageSize)
		budget := lim.mlockKB<<10*uint64(ncpu) + lim.memlock
		why = fmt.Sprintf("%d KiB of rings, perf_event_mlock_kb=%d x %d cpus + RLIMIT_MEMLOCK %d KiB allow %d KiB",
			need>>10, lim.mlockKB, ncpu, lim.memlock>>10, budget>>10)
		small = need > budget
	}
	kind := "privileged defaults"
	if small {
		kind = "unprivileged defaults"
	}
	if o.AuxPages != 0 || o.DataPages != 0 {
		kind = "flags and " + kind
	}
	if o.AuxPages == 0 {
		o.AuxPages = privAuxBytes / pageSize
		if small {
			o.AuxPages = unprivAuxBytes / pageSize
		}
	}
	if o.DataPages == 0 {
		o.DataPages = DefaultPTDataPages
		if small {
			o.DataPages = unprivDataBytes / pageSize
		}
	}
	return kind + ": " + why
}
