package perfio

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"ptfs/decode"
)

// copyPMU copies the intel_pt sysfs tree of testdata into a temp dir, to be
// changed by the test.
func copyPMU(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "intel_pt")
	if err := os.CopyFS(dir, os.DirFS("testdata/sysfs-intel_pt")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// writePMUFile writes s to dir/name, creating directories.
func writePMUFile(t *testing.T, dir, name, s string) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// formatValue reads f's value back from attr: the reverse of set.
func formatValue(f pmuFormat, attr *unix.PerfEventAttr) uint64 {
	w := *f.wordOf(attr)
	var v uint64
	for i, b := range f.bits {
		v |= (w >> b & 1) << i
	}
	return v
}

// decodeAttr reads every field of the PMU's format files back from attr
// and checks that no bit is set outside them.
func decodeAttr(t *testing.T, dir string, attr *unix.PerfEventAttr) map[string]uint64 {
	t.Helper()
	formats, err := readFormats(filepath.Join(dir, "format"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	var covered [3]uint64
	for name, f := range formats {
		out[name] = formatValue(f, attr)
		for _, b := range f.bits {
			covered[f.word] |= 1 << b
		}
	}
	for i, w := range []uint64{attr.Config, attr.Ext1, attr.Ext2} {
		if extra := w &^ covered[i]; extra != 0 {
			t.Errorf("config word %d has bits %#x that no format file names", i, extra)
		}
	}
	return out
}

// TestPTAttr builds the attributes from the real intel_pt format files and
// from a tree where every field sits elsewhere, and reads every field back
// through the format files.
func TestPTAttr(t *testing.T) {
	want := func(over map[string]uint64) map[string]uint64 {
		m := map[string]uint64{"pt": 1, "cyc": 0, "pwr_evt": 0, "fup_on_ptw": 1, "mtc": 0, "tsc": 1,
			"noretcomp": 0, "ptw": 1, "branch": 0, "event": 0, "notnt": 0, "mtc_period": 0,
			"cyc_thresh": 0, "psb_period": 0}
		for k, v := range over {
			m[k] = v
		}
		return m
	}
	moved := func(t *testing.T) string {
		dir := copyPMU(t)
		// Every field at another place, in all three words, ranges split:
		// only a reader of the format files gets these right.
		for name, spec := range map[string]string{
			"pt": "config2:63", "tsc": "config1:7", "ptw": "config:40", "fup_on_ptw": "config2:0",
			"branch": "config1:8", "psb_period": "config:50-51,2-3",
		} {
			writePMUFile(t, dir, "format/"+name, spec+"\n")
		}
		return dir
	}
	for _, tc := range []struct {
		name   string
		dir    func(t *testing.T) string
		cfg    PTConfig
		want   map[string]uint64
		config uint64 // the attr's config word, where known
	}{
		{"default", copyPMU, PTConfig{}, want(nil), 1<<0 | 1<<5 | 1<<10 | 1<<12},
		{"branch", copyPMU, PTConfig{Branch: true}, want(map[string]uint64{"branch": 1}), 1<<0 | 1<<5 | 1<<10 | 1<<12 | 1<<13},
		{"psb period", copyPMU, PTConfig{PSBPeriod: 5}, want(map[string]uint64{"psb_period": 5}), 1<<0 | 1<<5 | 1<<10 | 1<<12 | 5<<24},
		{"moved", moved, PTConfig{PSBPeriod: 5, Branch: true}, want(map[string]uint64{"psb_period": 5, "branch": 1}), 0},
		{"mtc", copyPMU, PTConfig{MTC: true, MTCPeriod: 6}, want(map[string]uint64{"mtc": 1, "mtc_period": 6}), 1<<0 | 1<<5 | 1<<9 | 1<<10 | 1<<12 | 6<<14},
		// Branches of a classic-mode mount: no PTWRITE bits, and none needed.
		{"branch only", copyPMU, PTConfig{Branch: true, NoPTW: true}, want(map[string]uint64{"branch": 1, "ptw": 0, "fup_on_ptw": 0}), 1<<0 | 1<<10 | 1<<13},
		{"branch only without ptwrite", func(t *testing.T) string {
			dir := copyPMU(t)
			writePMUFile(t, dir, "caps/ptwrite", "0\n")
			os.Remove(filepath.Join(dir, "format/ptw"))
			os.Remove(filepath.Join(dir, "format/fup_on_ptw"))
			return dir
		}, PTConfig{Branch: true, NoPTW: true}, map[string]uint64{"pt": 1, "cyc": 0, "pwr_evt": 0, "mtc": 0, "tsc": 1,
			"noretcomp": 0, "branch": 1, "event": 0, "notnt": 0, "mtc_period": 0, "cyc_thresh": 0, "psb_period": 0}, 1<<0 | 1<<10 | 1<<13},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.dir(t)
			cfg := tc.cfg
			cfg.AuxWatermark = 4096
			attr, err := PTAttr(dir, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := decodeAttr(t, dir, attr); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("fields %v\nwant %v", got, tc.want)
			}
			if tc.config != 0 && attr.Config != tc.config {
				t.Errorf("config %#x, want %#x", attr.Config, tc.config)
			}
			if attr.Type != 8 || attr.Size != uint32(unsafe.Sizeof(unix.PerfEventAttr{})) || attr.Aux_watermark != 4096 {
				t.Errorf("type %d size %d aux_watermark %d", attr.Type, attr.Size, attr.Aux_watermark)
			}
			if attr.Sample_type != unix.PERF_SAMPLE_TID|unix.PERF_SAMPLE_TIME|unix.PERF_SAMPLE_CPU|unix.PERF_SAMPLE_IDENTIFIER {
				t.Errorf("sample type %#x", attr.Sample_type)
			}
			// No side band on the PT event: the dummy carries it.
			wantBits := unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv | unix.PerfBitSampleIDAll
			if attr.Bits != wantBits {
				t.Errorf("bits %#x, want %#x", attr.Bits, wantBits)
			}
		})
	}
}

// TestPTAttrErrors checks the errors for machines that cannot trace
// PTWRITE and for malformed trees.
func TestPTAttrErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string)
		cfg    PTConfig
		want   error
	}{
		{"no pmu", func(t *testing.T, dir string) { os.RemoveAll(dir) }, PTConfig{}, ErrNoPT},
		{"no ptw format", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "format/ptw")) }, PTConfig{}, ErrNoPTW},
		{"no fup_on_ptw format", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "format/fup_on_ptw")) }, PTConfig{}, ErrNoPTW},
		{"cpu without ptwrite", func(t *testing.T, dir string) { writePMUFile(t, dir, "caps/ptwrite", "0\n") }, PTConfig{}, ErrNoPTW},
		{"bad caps", func(t *testing.T, dir string) { writePMUFile(t, dir, "caps/ptwrite", "yes\n") }, PTConfig{}, ErrPMUFormat},
		{"no caps/ptwrite", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "caps/ptwrite")) }, PTConfig{}, ErrNoPTW},
		{"no type", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "type")) }, PTConfig{}, ErrPMUFormat},
		{"bad type", func(t *testing.T, dir string) { writePMUFile(t, dir, "type", "intel\n") }, PTConfig{}, ErrPMUFormat},
		{"type too big", func(t *testing.T, dir string) { writePMUFile(t, dir, "type", "4294967296\n") }, PTConfig{}, ErrPMUFormat},
		{"bad format", func(t *testing.T, dir string) { writePMUFile(t, dir, "format/mtc", "config:9-\n") }, PTConfig{}, ErrPMUFormat},
		{"no format dir", func(t *testing.T, dir string) { os.RemoveAll(filepath.Join(dir, "format")) }, PTConfig{}, ErrPMUFormat},
		{"no tsc format", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "format/tsc")) }, PTConfig{}, ErrPTConfig},
		{"ptw two bits", func(t *testing.T, dir string) { writePMUFile(t, dir, "format/ptw", "config:12-13\n") }, PTConfig{}, nil},
		{"psb period not allowed", nil, PTConfig{PSBPeriod: 6}, ErrPTConfig},
		{"psb period negative", nil, PTConfig{PSBPeriod: -1}, ErrPTConfig},
		{"psb period too wide", func(t *testing.T, dir string) {
			writePMUFile(t, dir, "format/psb_period", "config:24-25\n")
			writePMUFile(t, dir, "caps/psb_periods", "ff\n")
		}, PTConfig{PSBPeriod: 5}, ErrPTConfig},
		{"no psb_periods caps", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "caps/psb_periods")) }, PTConfig{PSBPeriod: 1}, ErrPMUFormat},
		{"mtc period not allowed", nil, PTConfig{MTC: true, MTCPeriod: 5}, ErrPTConfig},
		{"nothing to trace", nil, PTConfig{NoPTW: true}, ErrPTConfig},
		{"branch only without branch format", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "format/branch")) }, PTConfig{Branch: true, NoPTW: true}, ErrPTConfig},
		{"no mtc format", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "format/mtc")) }, PTConfig{MTC: true, MTCPeriod: 3}, ErrPTConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyPMU(t)
			if tc.change != nil {
				tc.change(t, dir)
			}
			attr, err := PTAttr(dir, tc.cfg)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("%v, want success", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("PTAttr: %v (attr %v), want %v", err, attr, tc.want)
			}
			t.Log(err)
		})
	}
}

// TestCheckPTWrite covers the one PTWRITE capability check that PTAttr and
// `ptfs check` share: the sentinel for callers and the reason for people.
func TestCheckPTWrite(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string)
		want   error
		why    string
	}{
		{"ptwrite", nil, nil, ""},
		{"caps 0", func(t *testing.T, dir string) { writePMUFile(t, dir, "caps/ptwrite", "0\n") }, ErrNoPTW,
			"CPU without PTWRITE (intel_pt/caps/ptwrite is 0)"},
		// Stricter than trusting the format bits: see CheckPTWrite.
		{"no caps/ptwrite", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "caps/ptwrite")) }, ErrNoPTW,
			"intel_pt without caps/ptwrite (kernel too old to report PTWRITE)"},
		{"caps not a number", func(t *testing.T, dir string) { writePMUFile(t, dir, "caps/ptwrite", "yes\n") }, ErrPMUFormat,
			`intel_pt/caps/ptwrite is "yes", not a number`},
		{"no ptw format", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "format/ptw")) }, ErrNoPTW,
			"kernel without the intel_pt ptw format bits (format/ptw missing)"},
		{"no format dir", func(t *testing.T, dir string) { os.RemoveAll(filepath.Join(dir, "format")) }, ErrNoPTW,
			"kernel without the intel_pt ptw format bits (format/ptw, format/fup_on_ptw missing)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyPMU(t)
			if tc.change != nil {
				tc.change(t, dir)
			}
			why, err := CheckPTWrite(dir)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) || why != tc.why {
				t.Fatalf("CheckPTWrite: %q, %v; want %q, %v", why, err, tc.why, tc.want)
			}
			if err != nil && !strings.Contains(err.Error(), tc.why) {
				t.Errorf("error %q does not say %q", err, tc.why)
			}
		})
	}
}

// TestParseFormat covers the format file syntax.
func TestParseFormat(t *testing.T) {
	for _, tc := range []struct {
		in   string
		word int
		bits []uint8
		bad  bool
	}{
		{in: "config:0\n", word: 0, bits: []uint8{0}},
		{in: "config:14-17", word: 0, bits: []uint8{14, 15, 16, 17}},
		{in: "config1:0-3", word: 1, bits: []uint8{0, 1, 2, 3}},
		{in: "config2:63", word: 2, bits: []uint8{63}},
		{in: "config:0-7,32-35", word: 0, bits: []uint8{0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 35}},
		{in: "config:21,0-1", word: 0, bits: []uint8{0, 1, 21}},
		{in: "config:0-63", word: 0, bits: func() []uint8 {
			var b []uint8
			for i := range uint8(64) {
				b = append(b, i)
			}
			return b
		}()},
		{in: "", bad: true},
		{in: "config", bad: true},
		{in: "config:", bad: true},
		{in: "config3:1", bad: true},
		{in: "event:1", bad: true},
		{in: "config:64", bad: true},
		{in: "config:-1", bad: true},
		{in: "config:5-3", bad: true},
		{in: "config:1-", bad: true},
		{in: "config:1,,2", bad: true},
		{in: "config:1,1", bad: true},
		{in: "config:0-4,3", bad: true},
		{in: "config:x", bad: true},
		{in: "config: 1", bad: true},
		{in: "config:256", bad: true},
	} {
		f, err := parseFormat(tc.in)
		if tc.bad {
			if !errors.Is(err, ErrPMUFormat) {
				t.Errorf("%q: %v, want ErrPMUFormat", tc.in, err)
			}
			continue
		}
		if err != nil || f.word != tc.word || !reflect.DeepEqual(f.bits, tc.bits) {
			t.Errorf("%q: %+v %v, want word %d bits %v", tc.in, f, err, tc.word, tc.bits)
		}
	}
}

// TestFormatSet checks that values land in the listed bits from the lowest
// up, replace what was there, and must fit.
func TestFormatSet(t *testing.T) {
	f, err := parseFormat("config:50-51,2-3")
	if err != nil {
		t.Fatal(err)
	}
	attr := &unix.PerfEventAttr{Config: ^uint64(0)}
	if err := f.set(attr, 0b1001); err != nil {
		t.Fatal(err)
	}
	if want := ^uint64(0) &^ (1<<3 | 1<<50); attr.Config != want {
		t.Errorf("config %#x, want %#x", attr.Config, want)
	}
	if got := formatValue(f, attr); got != 0b1001 {
		t.Errorf("read back %#b", got)
	}
	if err := f.set(attr, 16); !errors.Is(err, ErrPTConfig) {
		t.Errorf("value wider than the field: %v", err)
	}
	all, _ := parseFormat("config1:0-63")
	if err := all.set(attr, ^uint64(0)); err != nil || attr.Ext1 != ^uint64(0) {
		t.Errorf("64-bit field: %v %#x", err, attr.Ext1)
	}
}

// FuzzParseFormat: any text gives a format or an error, and a format's
// values round-trip.
func FuzzParseFormat(f *testing.F) {
	for _, s := range []string{"config:0", "config:14-17", "config1:0-7,32-35", "config2:63", "config:1,1"} {
		f.Add(s, uint64(5))
	}
	f.Fuzz(func(t *testing.T, s string, v uint64) {
		fm, err := parseFormat(s)
		if err != nil {
			return
		}
		if len(fm.bits) < 64 {
			v &= 1<<len(fm.bits) - 1
		}
		var attr unix.PerfEventAttr
		if err := fm.set(&attr, v); err != nil {
			t.Fatal(err)
		}
		if got := formatValue(fm, &attr); got != v {
			t.Fatalf("%q: set %#x, read %#x", s, v, got)
		}
	})
}

// TestPTTiming picks the MTC period and the TSC:ART ratio from the PMU
// description, and gives up on records timed by MTC when any of it is
// missing.
func TestPTTiming(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string)
		want   decode.Timing
		ok     bool
	}{
		{"real tree", nil, decode.Timing{MTCPeriod: 6, ARTNum: 188, ARTDen: 2}, true},
		{"only short periods", func(t *testing.T, dir string) { writePMUFile(t, dir, "caps/mtc_periods", "9\n") }, decode.Timing{MTCPeriod: 3, ARTNum: 188, ARTDen: 2}, true},
		{"only long periods", func(t *testing.T, dir string) { writePMUFile(t, dir, "caps/mtc_periods", "200\n") }, decode.Timing{}, false},
		{"no mtc", func(t *testing.T, dir string) { writePMUFile(t, dir, "caps/mtc", "0\n") }, decode.Timing{}, false},
		{"no mtc_period format", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "format/mtc_period")) }, decode.Timing{}, false},
		{"unknown ratio", func(t *testing.T, dir string) { writePMUFile(t, dir, "tsc_art_ratio", "0:0\n") }, decode.Timing{}, false},
		{"bad ratio", func(t *testing.T, dir string) { writePMUFile(t, dir, "tsc_art_ratio", "188/2\n") }, decode.Timing{}, false},
		{"no ratio", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "tsc_art_ratio")) }, decode.Timing{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyPMU(t)
			if tc.change != nil {
				tc.change(t, dir)
			}
			got, ok := PTTiming(dir)
			if got != tc.want || ok != tc.ok {
				t.Errorf("PTTiming: %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
