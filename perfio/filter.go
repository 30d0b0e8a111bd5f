package perfio

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrFilter reports an address filter that cannot be given to the kernel:
// a path the filter grammar cannot hold, an empty range, more ranges than
// the PMU has, a text too long for the ioctl.
var ErrFilter = errors.New("bad address filter")

// AddrFilter is one range of the intel_pt PMU's address filters: the code
// at file offsets [Offset, Offset+Size) of File, in every process that maps
// it. The kernel turns it into an IP range per mapping (kernel
// perf_event_addr_filters_apply: file offsets, not virtual addresses).
type AddrFilter struct {
	Offset, Size uint64
	// File is the absolute path the kernel resolves (kern_path with
	// LOOKUP_FOLLOW, a regular file): ptfs gives /proc/PID/fd/N of the
	// file it checked, as in its tracefs lines.
	File string
}

// maxFilterText bounds the filter text: PERF_EVENT_IOC_SET_FILTER copies
// at most a page less its NUL (strndup_user(arg, PAGE_SIZE)).
const maxFilterText = 4095

// FilterText returns the text of PERF_EVENT_IOC_SET_FILTER for fs, in the
// kernel's grammar (perf_event_parse_addr_filter): `filter START/SIZE@FILE`
// items separated by commas, START and SIZE in hex. The kernel splits the
// text at spaces, commas and newlines and takes FILE up to the next one,
// so a path holding any of them (or a NUL, or any other control or
// non-ASCII byte) is refused, never cut short into another file; so are a
// relative path, an empty or wrapping range and more than max ranges (the
// PMU's nr_addr_filters).
func FilterText(fs []AddrFilter, max int) (string, error) {
	if len(fs) == 0 {
		return "", fmt.Errorf("%w: no range", ErrFilter)
	}
	if len(fs) > max {
		return "", fmt.Errorf("%w: %d ranges, the PMU has %d address filters", ErrFilter, len(fs), max)
	}
	var b strings.Builder
	for i, f := range fs {
		if err := checkFilterPath(f.File); err != nil {
			return "", err
		}
		if f.Size == 0 || f.Offset+f.Size < f.Offset {
			return "", fmt.Errorf("%w: range 0x%x/0x%x of %s is empty or wraps", ErrFilter, f.Offset, f.Size, f.File)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "filter 0x%x/0x%x@%s", f.Offset, f.Size, f.File)
	}
	if b.Len() > maxFilterText {
		return "", fmt.Errorf("%w: %d bytes, the kernel takes at most %d", ErrFilter, b.Len(), maxFilterText)
	}
	return b.String(), nil
}

// checkFilterPath accepts an absolute, clean path of printable ASCII bytes
// other than the filter grammar's separators.
func checkFilterPath(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("%w: path %q is not absolute and clean", ErrFilter, p)
	}
	if len(p) > maxFilterText {
		return fmt.Errorf("%w: path of %d bytes", ErrFilter, len(p))
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c == ',' || c >= 0x7f {
			return fmt.Errorf("%w: path %q has byte %#x at %d (the filter grammar splits at spaces, commas and newlines)", ErrFilter, p, c, i)
		}
	}
	return nil
}

// NrAddrFilters returns how many address ranges the PMU described in dir
// filters on (its nr_addr_filters file; the kernel omits the file for a PMU
// without filters, which reads as 0).
func NrAddrFilters(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "nr_addr_filters"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrPMUFormat, err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 16)
	if err != nil {
		return 0, fmt.Errorf("%w: %s/nr_addr_filters: %q is not a number", ErrPMUFormat, dir, strings.TrimSpace(string(b)))
	}
	return int(n), nil
}
