package perfio

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"ptfs/decode"
)

// PTSysfsDir is where the kernel describes the Intel PT PMU.
const PTSysfsDir = "/sys/bus/event_source/devices/intel_pt"

// Sentinel errors of the Intel PT attributes.
var (
	// ErrNoPT reports a machine without the intel_pt PMU.
	ErrNoPT = errors.New("no intel_pt PMU")
	// ErrNoPTW reports an intel_pt PMU that cannot trace PTWRITE: the CPU
	// lacks it (caps/ptwrite is 0), the kernel does not say (no
	// caps/ptwrite) or its driver has no ptw or fup_on_ptw format; see
	// CheckPTWrite.
	ErrNoPTW = errors.New("intel_pt cannot trace ptwrite")
	// ErrPMUFormat reports a PMU sysfs file that cannot be parsed.
	ErrPMUFormat = errors.New("bad PMU sysfs description")
	// ErrPTConfig reports a PTConfig the PMU does not support.
	ErrPTConfig = errors.New("unsupported intel_pt configuration")
)

// PTConfig selects what PTAttr asks of Intel PT.
type PTConfig struct {
	// Branch turns on branch tracing (TNT/TIP packets); off, PT emits
	// only PTWRITE, timing and mode packets.
	Branch bool
	// PSBPeriod is the psb_period field: a PSB every 2^(PSBPeriod+11)
	// bytes of trace; 0 keeps the hardware default (2 KiB). It must be
	// allowed by caps/psb_periods.
	PSBPeriod int
	// AuxWatermark is how many bytes of AUX data wake the reader; 0 lets
	// the kernel choose (half the AUX ring).
	AuxWatermark uint32
	// MTC turns on MTC packets every 2^MTCPeriod crystal clocks, which
	// time the trace between TSC packets. The period must be allowed by
	// caps/mtc_periods.
	MTC       bool
	MTCPeriod int
	// NoPTW leaves PTWRITE tracing off and does not need it: branch
	// tracing alone, as `branches` of a classic-mode mount runs it on any
	// CPU with Intel PT. It needs Branch.
	NoPTW bool
}

// ptSampleType is the sample_id layout of every record in a PT data ring,
// the PT event's own (ITRACE_START, AUX, LOST) and those of the side-band
// event that writes into it: pid/tid, time, cpu and, last, the id, as perf
// uses when events share a ring. Both events have it, so that one trailer
// layout (sampleIDSize) parses every record.
const ptSampleType = unix.PERF_SAMPLE_TID | unix.PERF_SAMPLE_TIME | unix.PERF_SAMPLE_CPU | unix.PERF_SAMPLE_IDENTIFIER

// ptBits are the flag bits of the PT event: no side band of its own, since
// the kernel sends side band only to an enabled event and every flush
// disables it (see SideBandAttr).
const ptBits = unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv | unix.PerfBitSampleIDAll

// sideBandBits are the flag bits of the side-band event: the PT event's,
// and the records that attribute trace to threads and code.
const sideBandBits = ptBits | unix.PerfBitComm | unix.PerfBitCommExec | unix.PerfBitTask |
	unix.PerfBitMmap | unix.PerfBitMmap2 | unix.PerfBitContextSwitch

// SideBandAttr returns the attributes of the per-CPU event that carries the
// side band of PT, as perf's tracking event for intel_pt//: a software dummy
// event (it counts nothing) with comm, task, mmap and context switches, the
// PT event's sample_type and exclusions. Its records go into the PT event's
// data ring (PERF_EVENT_IOC_SET_OUTPUT), and it stays enabled while the PT
// event is stopped for flushes and truncations, so no switch is missed.
func SideBandAttr() unix.PerfEventAttr {
	return unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Config:      unix.PERF_COUNT_SW_DUMMY,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Sample:      1,
		Sample_type: ptSampleType,
		Bits:        sideBandBits,
	}
}

// PTAttr builds the attributes of a system-wide, user-mode Intel PT event
// with PTWRITE tracing (unless NoPTW) from the PMU description in dir
// (PTSysfsDir on a real machine): the type from dir/type and every config
// bit where dir/format/ says, never hard-coded. It asks for no side band:
// SideBandAttr's event carries it.
func PTAttr(dir string, o PTConfig) (*unix.PerfEventAttr, error) {
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s does not exist (the CPU has no Intel PT, a hypervisor hides it, or the kernel lacks CONFIG_PERF_EVENTS_INTEL_PT)", ErrNoPT, dir)
		}
		return nil, fmt.Errorf("intel_pt pmu: %w", err)
	}
	typ, err := readSysfsUint(filepath.Join(dir, "type"), 10, 32)
	if err != nil {
		return nil, err
	}
	formats, err := readFormats(filepath.Join(dir, "format"))
	if err != nil {
		return nil, err
	}
	if o.NoPTW && !o.Branch {
		return nil, fmt.Errorf("%w: neither ptwrite nor branch tracing", ErrPTConfig)
	}
	if !o.NoPTW {
		if _, err := CheckPTWrite(dir); err != nil {
			return nil, err
		}
	}
	attr := &unix.PerfEventAttr{
		Type:          uint32(typ),
		Size:          uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Sample_type:   ptSampleType,
		Bits:          ptBits,
		Aux_watermark: o.AuxWatermark,
	}
	branch := uint64(0)
	if o.Branch {
		branch = 1
	}
	// pt=1 tells the driver to take branch from config instead of forcing
	// it on; without it branch=0 is refused.
	fields := []fieldValue{{"pt", 1}, {"tsc", 1}, {"branch", branch}}
	if !o.NoPTW {
		fields = append(fields, fieldValue{"ptw", 1}, fieldValue{"fup_on_ptw", 1})
	}
	for _, f := range fields {
		fm, ok := formats[f.name]
		if !ok {
			return nil, fmt.Errorf("%w: %s/format/%s missing", ErrPTConfig, dir, f.name)
		}
		if err := fm.set(attr, f.v); err != nil {
			return nil, fmt.Errorf("intel_pt %s: %w", f.name, err)
		}
	}
	if o.PSBPeriod != 0 {
		if err := setPeriod(dir, formats, attr, "psb_period", o.PSBPeriod); err != nil {
			return nil, err
		}
	}
	if o.MTC {
		fm, ok := formats["mtc"]
		if !ok {
			return nil, fmt.Errorf("%w: %s/format/mtc missing", ErrPTConfig, dir)
		}
		if err := fm.set(attr, 1); err != nil {
			return nil, fmt.Errorf("intel_pt mtc: %w", err)
		}
		if err := setPeriod(dir, formats, attr, "mtc_period", o.MTCPeriod); err != nil {
			return nil, err
		}
	}
	return attr, nil
}

// fieldValue is a value for one format field of the PMU.
type fieldValue struct {
	name string
	v    uint64
}

// CheckPTWrite tells whether the intel_pt PMU described in dir can trace
// PTWRITE: the CPU has it (caps/ptwrite is non-zero) and the driver has the
// ptw and fup_on_ptw format bits. When it cannot, err wraps ErrNoPTW, or
// ErrPMUFormat for a caps file that is no number, and why says what is
// missing, for `ptfs check`.
//
// A missing caps/ptwrite counts as no PTWRITE: the kernel has exported it
// since PTWRITE support came in (4.x), whenever the CPU enumerates
// CPUID.(EAX=14H,ECX=0):EBX[4], so its absence means a kernel that predates
// PTWRITE and whose driver cannot be told to use it; the format bits alone
// would not show that the CPU executes PTWRITE at all.
func CheckPTWrite(dir string) (why string, err error) {
	caps, rerr := os.ReadFile(filepath.Join(dir, "caps", "ptwrite"))
	if rerr != nil {
		why = "intel_pt without caps/ptwrite (kernel too old to report PTWRITE)"
		if !errors.Is(rerr, fs.ErrNotExist) {
			why = fmt.Sprintf("intel_pt/caps/ptwrite unreadable: %v", rerr)
		}
		return why, fmt.Errorf("%w: %s: %s", ErrNoPTW, dir, why)
	}
	v, perr := strconv.ParseUint(string(bytes.TrimSpace(caps)), 16, 32)
	if perr != nil {
		why = fmt.Sprintf("intel_pt/caps/ptwrite is %q, not a number", bytes.TrimSpace(caps))
		return why, fmt.Errorf("%w: %s: %s", ErrPMUFormat, dir, why)
	}
	if v == 0 {
		why = "CPU without PTWRITE (intel_pt/caps/ptwrite is 0)"
		return why, fmt.Errorf("%w: %s: %s", ErrNoPTW, dir, why)
	}
	var noBits []string
	for _, f := range []string{"ptw", "fup_on_ptw"} {
		if _, err := os.Stat(filepath.Join(dir, "format", f)); err != nil {
			noBits = append(noBits, "format/"+f)
		}
	}
	if len(noBits) > 0 {
		why = "kernel without the intel_pt ptw format bits (" + strings.Join(noBits, ", ") + " missing)"
		return why, fmt.Errorf("%w: %s: %s", ErrNoPTW, dir, why)
	}
	return "", nil
}

// maxMTCPeriod is the longest MTC period ptfs asks for: an MTC every 64
// crystal clocks, a few microseconds, which times records finely enough at
// a fraction of the trace that perf's default (3) costs.
const maxMTCPeriod = 6

// PTTiming returns the MTC period and TSC:ART ratio for timing records
// between TSC packets, from the PMU description in dir: the longest period
// up to six that caps/mtc_periods allows, when caps/mtc is set, the mtc
// and mtc_period formats exist and tsc_art_ratio is known. ok is false when
// any of it is missing: records then have the time of the last TSC packet.
func PTTiming(dir string) (t decode.Timing, ok bool) {
	formats, err := readFormats(filepath.Join(dir, "format"))
	if err != nil || formats["mtc"].bits == nil || formats["mtc_period"].bits == nil {
		return t, false
	}
	if v, err := readSysfsUint(filepath.Join(dir, "caps", "mtc"), 16, 32); err != nil || v == 0 {
		return t, false
	}
	periods, err := readSysfsUint(filepath.Join(dir, "caps", "mtc_periods"), 16, 32)
	if err != nil {
		return t, false
	}
	b, err := os.ReadFile(filepath.Join(dir, "tsc_art_ratio"))
	if err != nil {
		return t, false
	}
	num, den, found := strings.Cut(strings.TrimSpace(string(b)), ":")
	n, nerr := strconv.ParseUint(num, 10, 32)
	d, derr := strconv.ParseUint(den, 10, 32)
	if !found || nerr != nil || derr != nil || n == 0 || d == 0 {
		return t, false
	}
	for p := maxMTCPeriod; p >= 0; p-- {
		if periods&(1<<p) != 0 {
			return decode.Timing{MTCPeriod: uint8(p), ARTNum: uint32(n), ARTDen: uint32(d)}, true
		}
	}
	return t, false
}

// setPeriod sets the psb_period or mtc_period field after checking
// caps/psb_periods or caps/mtc_periods, the bit mask of the periods the CPU
// supports.
func setPeriod(dir string, formats map[string]pmuFormat, attr *unix.PerfEventAttr, field string, p int) error {
	fm, ok := formats[field]
	if !ok {
		return fmt.Errorf("%w: %s %d: %s/format/%s missing", ErrPTConfig, field, p, dir, field)
	}
	if p < 0 || p > 31 {
		return fmt.Errorf("%w: %s %d out of range", ErrPTConfig, field, p)
	}
	caps := strings.TrimSuffix(field, "_period") + "_periods"
	allowed, err := readSysfsUint(filepath.Join(dir, "caps", caps), 16, 32)
	if err != nil {
		return err
	}
	if allowed&(1<<p) == 0 {
		return fmt.Errorf("%w: %s %d not in caps/%s %#x", ErrPTConfig, field, p, caps, allowed)
	}
	if err := fm.set(attr, uint64(p)); err != nil {
		return fmt.Errorf("intel_pt %s: %w", field, err)
	}
	return nil
}

func readSysfsUint(path string, base, bits int) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrPMUFormat, err)
	}
	v, err := strconv.ParseUint(string(bytes.TrimSpace(b)), base, bits)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %q is not a base-%d number", ErrPMUFormat, path, bytes.TrimSpace(b), base)
	}
	return v, nil
}

// pmuFormat is one format file of a PMU: the attribute word it lives in and
// the bits of that word, lowest first, that hold the field's value bits in
// order.
type pmuFormat struct {
	word int // 0 config, 1 config1, 2 config2
	bits []uint8
}

// maxFormatFiles bounds how many format files a PMU directory may hold.
const maxFormatFiles = 256

// readFormats parses every file of a PMU's format directory.
func readFormats(dir string) (map[string]pmuFormat, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPMUFormat, err)
	}
	if len(ents) > maxFormatFiles {
		return nil, fmt.Errorf("%w: %d files in %s", ErrPMUFormat, len(ents), dir)
	}
	out := make(map[string]pmuFormat, len(ents))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrPMUFormat, err)
		}
		f, err := parseFormat(string(b))
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", dir, e.Name(), err)
		}
		out[e.Name()] = f
	}
	return out, nil
}

// parseFormat parses the text of a PMU format file: a word (config, config1,
// config2) and a comma-separated list of bits N or ranges N-M, as in
// "config:0-7,32-35". Value bits fill the listed bits from the lowest up, as
// perf fills them.
func parseFormat(s string) (pmuFormat, error) {
	s = strings.TrimSpace(s)
	word, spec, ok := strings.Cut(s, ":")
	var f pmuFormat
	switch word {
	case "config":
		f.word = 0
	case "config1":
		f.word = 1
	case "config2":
		f.word = 2
	default:
		return f, fmt.Errorf("%w: %q: unknown attribute word %q", ErrPMUFormat, s, word)
	}
	if !ok || spec == "" {
		return f, fmt.Errorf("%w: %q: no bits", ErrPMUFormat, s)
	}
	var used uint64
	err := forRanges(spec, 63, func(lo, hi uint64) error {
		for b := lo; b <= hi; b++ {
			if used&(1<<b) != 0 {
				return fmt.Errorf("bit %d twice", b)
			}
			used |= 1 << b
		}
		return nil
	})
	if err != nil {
		return f, fmt.Errorf("%w: %q: %w", ErrPMUFormat, s, err)
	}
	// perf's bitmap walk fills value bits into the field's bits in
	// ascending order, whatever order the list gave.
	for b := range uint8(64) {
		if used&(1<<b) != 0 {
			f.bits = append(f.bits, b)
		}
	}
	return f, nil
}

// wordOf returns the attribute word of attr that f lives in.
func (f pmuFormat) wordOf(attr *unix.PerfEventAttr) *uint64 {
	switch f.word {
	case 1:
		return &attr.Ext1
	case 2:
		return &attr.Ext2
	}
	return &attr.Config
}

// set stores v in f's bits of attr, clearing what was there.
func (f pmuFormat) set(attr *unix.PerfEventAttr, v uint64) error {
	if len(f.bits) < 64 && v>>len(f.bits) != 0 {
		return fmt.Errorf("%w: value %d does not fit in %d bits", ErrPTConfig, v, len(f.bits))
	}
	w := f.wordOf(attr)
	for i, b := range f.bits {
		*w = *w&^(1<<b) | (v>>i&1)<<b
	}
	return nil
}
