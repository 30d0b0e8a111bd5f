package capture

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
)

// ErrCPUList reports a malformed CPU list such as /sys/devices/system/cpu/online.
var ErrCPUList = errors.New("capture: bad cpu list")

// maxCPU bounds CPU numbers so that a bad list cannot ask for huge ranges.
const maxCPU = 1 << 16

// onlineCPUs returns the CPUs the kernel lists as online.
func onlineCPUs() ([]int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, fmt.Errorf("capture: online cpus: %w", err)
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
	for part := range bytes.SplitSeq(b, []byte(",")) {
		lo, hi, isRange := bytes.Cut(part, []byte("-"))
		a, err := strconv.ParseUint(string(lo), 10, 31)
		if err != nil || a >= maxCPU {
			return nil, fmt.Errorf("%w: %q", ErrCPUList, part)
		}
		z := a
		if isRange {
			if z, err = strconv.ParseUint(string(hi), 10, 31); err != nil || z >= maxCPU || z < a {
				return nil, fmt.Errorf("%w: %q", ErrCPUList, part)
			}
		}
		for c := a; c <= z; c++ {
			if len(cpus) > 0 && int(c) <= cpus[len(cpus)-1] {
				return nil, fmt.Errorf("%w: %q not ascending", ErrCPUList, part)
			}
			cpus = append(cpus, int(c))
		}
	}
	return cpus, nil
}

// traceCPUs returns the CPUs a source traces: want, checked, or all online
// CPUs when want is empty. A CPU listed twice would get every record twice.
func traceCPUs(want []int) ([]int, error) {
	if len(want) == 0 {
		return onlineCPUs()
	}
	for i, cpu := range want {
		if cpu < 0 || slices.Contains(want[:i], cpu) {
			return nil, fmt.Errorf("%w: cpu %d in %v", ErrOptions, cpu, want)
		}
	}
	return slices.Clone(want), nil
}
