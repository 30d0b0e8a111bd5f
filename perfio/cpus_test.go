package perfio

import (
	"errors"
	"slices"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"0\n", []int{0}},
		{"0-1\n", []int{0, 1}},
		{"0-3,5,7-8", []int{0, 1, 2, 3, 5, 7, 8}},
		{"2-2", []int{2}},
		{"", nil},
		{"\n", nil},
		{"a", nil},
		{"1-", nil},
		{"-1", nil},
		{"3-1", nil},
		{"0,,1", nil},
		{"1,0", nil},
		{"0-3,2", nil},
		{"0-4294967296", nil},
		{"65536", nil},
	} {
		got, err := parseCPUList([]byte(tc.in))
		if tc.want == nil {
			if !errors.Is(err, ErrCPUList) {
				t.Errorf("%q: %v, %v; want ErrCPUList", tc.in, got, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestOnlineCPUs(t *testing.T) {
	cpus, err := onlineCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) == 0 {
		t.Fatal("no online cpu")
	}
}

// FuzzParseCPUList: an error or an ascending list, never a panic.
func FuzzParseCPUList(f *testing.F) {
	f.Add("0-3,5\n")
	f.Add("0-65535")
	f.Fuzz(func(t *testing.T, in string) {
		cpus, err := parseCPUList([]byte(in))
		if err == nil && (len(cpus) == 0 || !slices.IsSorted(cpus)) {
			t.Fatalf("%q: %v", in, cpus)
		}
	})
}
