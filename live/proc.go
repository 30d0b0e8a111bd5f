package live

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"ptfs/images"
)

// procMaps reads /proc/PID/maps: the mappings of a process that ran before
// tracing began, which no MMAP2 record announces (perf synthesizes the same
// from /proc for a system-wide record).
func procMaps(pid int32) ([]images.MapsEntry, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/maps")
	if err != nil {
		return nil, fmt.Errorf("maps of pid %d: %w", pid, err)
	}
	entries, err := images.ParseMaps(data)
	if err != nil {
		return nil, fmt.Errorf("maps of pid %d: %w", pid, err)
	}
	return entries, nil
}

// OwnVDSO returns the code of ptfs's own vDSO, with its ELF symbols: the
// kernel maps one image into every process, so it stands for theirs. It
// is read from /proc/self/mem at the [vdso] mapping of its maps (procMaps),
// through an unlinked temp file (images reads ELF files). Close releases
// it.
func OwnVDSO() (*images.ELF, error) {
	maps, err := procMaps(int32(os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("vdso: %w", err)
	}
	var start, end uint64
	for _, e := range maps {
		if e.Path == "[vdso]" {
			start, end = e.Start, e.End
		}
	}
	if end <= start {
		return nil, fmt.Errorf("vdso: no [vdso] mapping in /proc/self/maps")
	}
	mem, err := os.Open("/proc/self/mem")
	if err != nil {
		return nil, fmt.Errorf("vdso: %w", err)
	}
	defer mem.Close()
	buf := make([]byte, end-start)
	if _, err := mem.ReadAt(buf, int64(start)); err != nil {
		return nil, fmt.Errorf("vdso: read %#x-%#x: %w", start, end, err)
	}
	tmp, err := os.CreateTemp("", "ptfs-vdso-*.so")
	if err != nil {
		return nil, fmt.Errorf("vdso: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(buf)
	if err := errors.Join(werr, tmp.Close()); err != nil {
		return nil, fmt.Errorf("vdso: %w", err)
	}
	e, err := images.OpenELF(tmp.Name())
	if err != nil {
		return nil, fmt.Errorf("vdso: %w", err)
	}
	return e, nil
}
