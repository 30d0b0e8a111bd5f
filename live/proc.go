package live

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

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
// is read from /proc/self/mem at the [vdso] mapping of /proc/self/maps,
// through an unlinked temp file (images reads ELF files). Close releases
// it.
func OwnVDSO() (*images.ELF, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, fmt.Errorf("vdso: %w", err)
	}
	defer f.Close()
	var start, end uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasSuffix(line, " [vdso]") {
			continue
		}
		e, err := images.ParseMaps([]byte(line + "\n"))
		if err != nil || len(e) != 1 {
			return nil, fmt.Errorf("vdso: bad maps line %q: %v", line, err)
		}
		start, end = e[0].Start, e[0].End
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("vdso: %w", err)
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
