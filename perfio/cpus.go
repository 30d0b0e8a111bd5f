package perfio

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"ptfs/engine"
	"slices"
	"strconv"
	"strings"
)

// ErrCPUList reports a malformed CPU list such as /sys/devices/system/cpu/online.
var ErrCPUList = errors.New("bad cpu list")

// maxCPU bounds CPU numbers so that a bad list cannot ask for huge ranges.
const maxCPU = 1 << 16

// cpuSysDir is where the kernel lists the CPUs.
const cpuSysDir = "/sys/devices/system/cpu"

// onlineCPUs returns the CPUs the kernel lists as online.
func onlineCPUs() ([]int, error) { return onlineCPUsIn(cpuSysDir) }

// onlineCPUsIn returns the CPUs listed in dir/online, dir being cpuSysDir
// or, in tests, a tree made like it.
func onlineCPUsIn(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "online"))
	if err != nil {
		return nil, fmt.Errorf("online cpus: %w", err)
	}
	return parseCPUList(b)
}

// parseCPUList parses the kernel's cpu list format: "0-3,5,7-8\n".
func parseCPUList(b []byte) ([]int, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrCPUList)
	}
	var cpus []int
	err := forRanges(string(b), maxCPU-1, func(lo, hi uint64) error {
		for c := lo; c <= hi; c++ {
			if len(cpus) > 0 && int(c) <= cpus[len(cpus)-1] {
				return fmt.Errorf("cpu %d not ascending", c)
			}
			cpus = append(cpus, int(c))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCPUList, err)
	}
	return cpus, nil
}

// forRanges calls fn with the bounds of every element of list, a
// comma-separated list of numbers N and ranges N-M: the kernel's syntax for
// CPU lists and for the bits of PMU format files. Each element is checked
// first: lo <= hi <= limit.
func forRanges(list string, limit uint64, fn func(lo, hi uint64) error) error {
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 64)
		if err != nil || a > limit {
			return fmt.Errorf("bad number %q (want 0-%d)", part, limit)
		}
		z := a
		if isRange {
			if z, err = strconv.ParseUint(hi, 10, 64); err != nil || z > limit || z < a {
				return fmt.Errorf("bad range %q (want N-M, N <= M <= %d)", part, limit)
			}
		}
		if err := fn(a, z); err != nil {
			return err
		}
	}
	return nil
}

// traceCPUs returns the CPUs a source traces: want, checked, or all online
// CPUs when want is empty. A CPU listed twice would get every record twice.
func traceCPUs(want []int) ([]int, error) {
	if len(want) == 0 {
		return onlineCPUs()
	}
	if err := checkCPUs(want); err != nil {
		return nil, err
	}
	return slices.Clone(want), nil
}

// checkCPUs refuses a negative CPU or one listed twice.
func checkCPUs(want []int) error {
	for i, cpu := range want {
		if cpu < 0 || cpu >= maxCPU || slices.Contains(want[:i], cpu) {
			return fmt.Errorf("%w: cpu %d in %v", engine.ErrOptions, cpu, want)
		}
	}
	return nil
}
