package perfio

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFilterText builds filter texts and checks them against the kernel's
// grammar (perf_event_parse_addr_filter: items split at ' ', ',' and '\n',
// each `filter START/SIZE@FILE`, START and SIZE parsed by kstrtoull with
// base 0) with parseFilterText, a copy of that grammar; hostile paths are
// refused, never cut into another file.
func TestFilterText(t *testing.T) {
	fd := "/proc/4711/fd/9"
	for _, tc := range []struct {
		name string
		fs   []AddrFilter
		max  int
		want string
		err  string
	}{
		{"one", []AddrFilter{{0x1000, 0x78000, fd}}, 2, "filter 0x1000/0x78000@/proc/4711/fd/9", ""},
		{"two", []AddrFilter{{0x1000, 0x10, fd}, {0x5000, 0x20, "/usr/lib/x86_64-linux-gnu/libc.so.6"}}, 2,
			"filter 0x1000/0x10@/proc/4711/fd/9,filter 0x5000/0x20@/usr/lib/x86_64-linux-gnu/libc.so.6", ""},
		{"offset 0", []AddrFilter{{0, 1, fd}}, 1, "filter 0x0/0x1@/proc/4711/fd/9", ""},
		{"none", nil, 2, "", "no range"},
		{"more than the pmu has", []AddrFilter{{0, 1, fd}, {2, 1, fd}, {4, 1, fd}}, 2, "", "3 ranges, the PMU has 2"},
		{"pmu without filters", []AddrFilter{{0, 1, fd}}, 0, "", "the PMU has 0"},
		{"empty range", []AddrFilter{{0x1000, 0, fd}}, 2, "", "empty or wraps"},
		{"wrapping range", []AddrFilter{{^uint64(0), 2, fd}}, 2, "", "empty or wraps"},
		{"space", []AddrFilter{{0, 1, "/tmp/a b"}}, 2, "", "byte 0x20"},
		{"comma", []AddrFilter{{0, 1, "/tmp/a,filter 0x0/0x1@/bin/sh"}}, 2, "", "byte 0x2c"},
		{"newline", []AddrFilter{{0, 1, "/tmp/a\nfilter"}}, 2, "", "byte 0xa"},
		{"tab", []AddrFilter{{0, 1, "/tmp/a\tb"}}, 2, "", "byte 0x9"},
		{"nul", []AddrFilter{{0, 1, "/tmp/a\x00b"}}, 2, "", "byte 0x0"},
		{"utf-8", []AddrFilter{{0, 1, "/tmp/é"}}, 2, "", "byte 0xc3"},
		{"relative", []AddrFilter{{0, 1, "tmp/a"}}, 2, "", "not absolute"},
		{"unclean", []AddrFilter{{0, 1, "/tmp/../etc/x"}}, 2, "", "not absolute and clean"},
		{"too long", []AddrFilter{{0, 1, "/" + strings.Repeat("a", 4094)}}, 2, "", "the kernel takes at most 4095"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FilterText(tc.fs, tc.max)
			if tc.err != "" {
				if !errors.Is(err, ErrFilter) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("%q, %v; want ErrFilter with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("%q, %v; want %q", got, err, tc.want)
			}
			back, err := parseFilterText(got)
			if err != nil {
				t.Fatalf("the kernel's grammar refuses %q: %v", got, err)
			}
			if len(back) != len(tc.fs) {
				t.Fatalf("parsed %v, want %v", back, tc.fs)
			}
			for i := range back {
				if back[i] != tc.fs[i] {
					t.Errorf("parsed %v, want %v", back[i], tc.fs[i])
				}
			}
		})
	}
}

// parseFilterText parses a filter text as the kernel does for file
// filters (kernel/events/core.c perf_event_parse_addr_filter), the oracle
// of TestFilterText: written from the grammar, not from FilterText.
func parseFilterText(s string) ([]AddrFilter, error) {
	var out []AddrFilter
	for _, item := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' || r == '\n' }) {
		// The kernel's tokens are split the same way: "filter" is one
		// item and the range another.
		if item == "filter" {
			continue
		}
		rng, file, ok := strings.Cut(item, "@")
		start, size, ok2 := strings.Cut(rng, "/")
		if !ok || !ok2 || file == "" {
			return nil, errors.New("bad item " + item)
		}
		var f AddrFilter
		var err error
		if f.Offset, err = parseKernelUint(start); err != nil {
			return nil, err
		}
		if f.Size, err = parseKernelUint(size); err != nil {
			return nil, err
		}
		f.File = file
		out = append(out, f)
	}
	return out, nil
}

func parseKernelUint(s string) (uint64, error) {
	var v uint64
	if !strings.HasPrefix(s, "0x") {
		return 0, errors.New("want hex: " + s)
	}
	for _, c := range s[2:] {
		d := strings.IndexRune("0123456789abcdef", c)
		if d < 0 {
			return 0, errors.New("bad digit in " + s)
		}
		v = v<<4 | uint64(d)
	}
	return v, nil
}

// TestNrAddrFilters reads nr_addr_filters from sysfs trees.
func TestNrAddrFilters(t *testing.T) {
	dir := copyPMU(t)
	if n, err := NrAddrFilters(dir); n != 2 || err != nil {
		t.Errorf("testdata: %d, %v; want 2", n, err)
	}
	writePMUFile(t, dir, "nr_addr_filters", "0\n")
	if n, err := NrAddrFilters(dir); n != 0 || err != nil {
		t.Errorf("0: %d, %v", n, err)
	}
	writePMUFile(t, dir, "nr_addr_filters", "two\n")
	if _, err := NrAddrFilters(dir); !errors.Is(err, ErrPMUFormat) {
		t.Errorf("bad: %v, want ErrPMUFormat", err)
	}
	if err := os.Remove(filepath.Join(dir, "nr_addr_filters")); err != nil {
		t.Fatal(err)
	}
	if n, err := NrAddrFilters(dir); n != 0 || err != nil {
		t.Errorf("missing: %d, %v; want 0 (a PMU without filters)", n, err)
	}
}

// FuzzFilterText feeds FilterText hostile paths and ranges: it never
// panics, and a text it accepts parses back, by the kernel's grammar, to
// exactly the ranges given (no path split into another item).
func FuzzFilterText(f *testing.F) {
	f.Add("/proc/1/fd/3", uint64(0x1000), uint64(0x10), "/usr/lib/libc.so.6", uint64(0), uint64(1))
	f.Add("/tmp/a b", uint64(1), uint64(1), "/x,filter 0x0/0x1@/bin/sh", uint64(2), uint64(3))
	f.Add("/a\nb", ^uint64(0), uint64(2), "", uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, p1 string, o1, s1 uint64, p2 string, o2, s2 uint64) {
		fs := []AddrFilter{{o1, s1, p1}, {o2, s2, p2}}
		text, err := FilterText(fs, 2)
		if err != nil {
			if !errors.Is(err, ErrFilter) {
				t.Fatalf("error %v is not ErrFilter", err)
			}
			return
		}
		back, err := parseFilterText(text)
		if err != nil || len(back) != 2 || back[0] != fs[0] || back[1] != fs[1] {
			t.Fatalf("%q parses to %v, %v; want %v", text, back, err, fs)
		}
	})
}
