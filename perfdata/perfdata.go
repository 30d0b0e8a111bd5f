// Package perfdata reads the parts of a perf.data file that offline Intel PT
// decoding needs: the AUX area trace (PERF_RECORD_AUXTRACE payloads) per
// buffer, where data was lost, and the TSC-to-time conversion. Both the file
// format and the pipe format (`perf record -o -`) are read. The layouts are
// those of tools/perf/util/header.h and include/uapi/linux/perf_event.h.
package perfdata

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Sentinel errors, wrapped with the offset where they were found.
var (
	// ErrNotPerfData: the file does not start with the PERFILE2 magic.
	ErrNotPerfData = errors.New("not a perf.data file")
	// ErrTruncated: a header, section or record extends past the end.
	ErrTruncated = errors.New("truncated perf.data")
	// ErrCorrupt: a size or offset that cannot be right.
	ErrCorrupt = errors.New("corrupt perf.data")
	// ErrUnsupported: valid perf.data this package cannot read
	// (zstd-compressed records, big-endian files).
	ErrUnsupported = errors.New("unsupported perf.data")
)

// Record types (PERF_RECORD_*) this package looks at.
const (
	recLost             = 2
	recAux              = 11
	recHeaderAttr       = 64
	recHeaderTracing    = 66
	recAuxtraceInfo     = 70
	recAuxtrace         = 71
	recAuxtraceError    = 72
	recTimeConv         = 79
	recCompressed       = 81
	recCompressed2      = 83
	auxtraceRecordSize  = 48 // struct perf_record_auxtrace
	auxtraceTypeIntelPT = 1
)

// PERF_RECORD_AUX flags (Event.AuxFlags): data the kernel lost.
const (
	// AuxTruncated: the AUX buffer was full; what followed was lost.
	AuxTruncated = 0x01
	// AuxPartial: the record covers a partial snapshot.
	AuxPartial = 0x04
	// AuxCollision: samples collided (data overwritten).
	AuxCollision = 0x08
	auxLossFlags = AuxTruncated | AuxPartial | AuxCollision
)

const magic = "PERFILE2"

// File is what Parse extracts.
type File struct {
	// Pipe is set for the pipe format (no file header sections).
	Pipe bool
	// Buffers are the AUX buffers (one per CPU, or per thread in
	// per-thread mode), in the order their first data appears.
	Buffers []*Buffer
	// Time converts TSC to perf time when the file says how (TIME_CONV
	// or Intel PT's AUXTRACE_INFO); nil otherwise.
	Time *TimeConv
	// LostAux counts PERF_RECORD_AUX records flagged truncated, partial or
	// collision that could not be attributed to a buffer (the others are
	// Buffer.Losses); LostEvents sums PERF_RECORD_LOST counts;
	// AuxtraceErrors counts PERF_RECORD_AUXTRACE_ERROR records.
	LostAux, LostEvents, AuxtraceErrors uint64
	// Events are the side-band records (MMAP, MMAP2, COMM, FORK, EXIT,
	// ITRACE_START, SWITCH, SWITCH_CPU_WIDE, AUX, LOST) in file order.
	Events []Event
	// BuildIDs are the build ids perf recorded (HEADER_BUILD_ID), by
	// file name.
	BuildIDs map[string][]byte
}

// Buffer is the trace of one AUX buffer.
type Buffer struct {
	Idx uint32
	// CPU is the buffer's CPU, -1 in per-thread mode; TID its thread, -1
	// in per-CPU mode.
	CPU, TID int32
	// PID is the process the first ITRACE_START of the buffer names (or
	// the one every ITRACE_START names, when their sample_id trailers do
	// not tell the buffer), -1 if none is known.
	PID int32
	// Chunks are the AUXTRACE payloads in file order. They alias the
	// data given to Parse.
	Chunks []Chunk
	// Losses are AUX offsets after which the kernel lost data
	// (PERF_RECORD_AUX flagged truncated, partial or collision), in order.
	Losses []uint64
}

// Chunk is the payload of one PERF_RECORD_AUXTRACE.
type Chunk struct {
	// Offset is the position of Data in the AUX area's running offset.
	Offset uint64
	Data   []byte
}

// Bytes returns the buffer's chunks concatenated.
func (b *Buffer) Bytes() []byte {
	n := 0
	for _, c := range b.Chunks {
		n += len(c.Data)
	}
	out := make([]byte, 0, n)
	for _, c := range b.Chunks {
		out = append(out, c.Data...)
	}
	return out
}

// Segments calls fn for each stretch of the buffer's trace, in order; gap is
// set when data was lost before the stretch: a hole or overlap between
// consecutive chunks' offsets, or a loss the kernel reported (Losses). A
// final call with no data reports losses after the last chunk.
func (b *Buffer) Segments(fn func(data []byte, gap bool)) {
	li := 0
	pending := false
	var next uint64
	for i, c := range b.Chunks {
		if i > 0 && c.Offset != next {
			pending = true
		}
		data, off := c.Data, c.Offset
		for len(data) > 0 {
			for li < len(b.Losses) && b.Losses[li] <= off {
				pending = true
				li++
			}
			n := uint64(len(data))
			if li < len(b.Losses) && b.Losses[li]-off < n {
				n = b.Losses[li] - off
			}
			fn(data[:n], pending)
			pending = false
			data, off = data[n:], off+n
		}
		next = c.Offset + uint64(len(c.Data))
	}
	if li < len(b.Losses) || pending {
		fn(nil, true)
	}
}

// TimeConv is perf's TSC conversion (struct perf_record_time_conv).
type TimeConv struct {
	Shift uint16
	Mult  uint32
	Zero  uint64
	// Short is set when the counter has only Mask's bits; Cycles is the
	// reference the short value extends.
	Short        bool
	Cycles, Mask uint64
}

// NS converts a TSC value to perf time in nanoseconds, as perf's
// tsc_to_perf_time does.
func (c *TimeConv) NS(tsc uint64) uint64 {
	if c.Short {
		tsc = c.Cycles + (tsc-c.Cycles)&c.Mask
	}
	quot := tsc >> c.Shift
	rem := tsc & (1<<c.Shift - 1)
	return c.Zero + quot*uint64(c.Mult) + rem*uint64(c.Mult)>>c.Shift
}

// Sample-type bits that shape the sample_id trailer of non-sample records.
const (
	sampleTID        = 1 << 1
	sampleTime       = 1 << 2
	sampleID         = 1 << 6
	sampleCPU        = 1 << 7
	sampleStreamID   = 1 << 9
	sampleIdentifier = 1 << 16
	attrSampleIDAll  = 1 << 18 // bit of perf_event_attr's flags word
	trailerBits      = sampleTID | sampleTime | sampleID | sampleCPU | sampleStreamID | sampleIdentifier
)

// attr keeps what the sample_id trailer layout depends on, and the ids
// of the events it was opened for (PERF_SAMPLE_IDENTIFIER tells them).
type attr struct {
	sampleType uint64
	idAll      bool
	ids        []uint64
}

// Parse reads a perf.data file held in memory. The chunks of the result
// alias data.
func Parse(data []byte) (*File, error) {
	if len(data) < 16 {
		return nil, fmt.Errorf("perf.data header: %d bytes: %w", len(data), ErrTruncated)
	}
	if string(data[:8]) != magic {
		if string(data[:8]) == "2ELIFREP" {
			return nil, fmt.Errorf("big-endian perf.data: %w", ErrUnsupported)
		}
		return nil, fmt.Errorf("magic %q: %w", data[:8], ErrNotPerfData)
	}
	p := &parser{f: &File{BuildIDs: map[string][]byte{}}, byIdx: map[uint32]*Buffer{}}
	hsize := binary.LittleEndian.Uint64(data[8:])
	if hsize == 16 {
		p.f.Pipe = true
		if err := p.records(data, 16, uint64(len(data))); err != nil {
			return nil, err
		}
		return p.finish(), nil
	}
	// struct perf_file_header: magic, size, attr_size, attrs, data,
	// event_types (sections of offset and size), adds_features[4].
	if hsize < 72 || hsize > uint64(len(data)) {
		return nil, fmt.Errorf("perf.data header size %d of %d bytes: %w", hsize, len(data), ErrCorrupt)
	}
	attrSize := binary.LittleEndian.Uint64(data[16:])
	attrs, err := section(data, 24, "attrs")
	if err != nil {
		return nil, err
	}
	body, err := section(data, 40, "data")
	if err != nil {
		return nil, err
	}
	if attrSize != 0 {
		if attrSize < 16+16 {
			return nil, fmt.Errorf("attr size %d: %w", attrSize, ErrCorrupt)
		}
		for off := uint64(0); off+attrSize <= uint64(len(attrs)); off += attrSize {
			// perf_file_attr: perf_event_attr then its ids section.
			var ids []byte
			if sec, err := section(data, int(binary.LittleEndian.Uint64(data[24:])+off+attrSize-16), "attr ids"); err == nil {
				ids = sec
			}
			p.addAttr(attrs[off:off+attrSize-16], ids)
		}
	}
	base := binary.LittleEndian.Uint64(data[40:])
	if err := p.records(data, base, base+uint64(len(body))); err != nil {
		return nil, err
	}
	if err := featureBuildIDs(data, p.f.BuildIDs); err != nil {
		return nil, err
	}
	return p.finish(), nil
}

// section returns the file section whose {offset, size} is at data[at:].
func section(data []byte, at int, name string) ([]byte, error) {
	off := binary.LittleEndian.Uint64(data[at:])
	size := binary.LittleEndian.Uint64(data[at+8:])
	if off > uint64(len(data)) || size > uint64(len(data))-off {
		return nil, fmt.Errorf("%s section at %d, %d bytes, in a %d-byte file: %w", name, off, size, len(data), ErrTruncated)
	}
	return data[off : off+size], nil
}

type parser struct {
	f     *File
	byIdx map[uint32]*Buffer
	attrs []attr
	// losses are AUX records with loss flags, attributed after parsing
	// when the trailer layout is known.
	losses []loss
	// starts are the ITRACE_START records, which tell a buffer's pid.
	starts []start
	// trailers are the records of f.Events after their headers, whose
	// sample_id trailers give the events' time and CPU.
	trailers [][]byte
	// layout is the trailer layout every attribute shares (sameLayout),
	// else byID has each attribute's by event id.
	layout     uint64
	sameLayout bool
	byID       map[uint64]uint64
}

type start struct {
	pid, tid int32
	trailer  []byte
}

type loss struct {
	end     uint64 // aux_offset + aux_size
	trailer []byte
}

// addAttr keeps what matters of a perf_event_attr (at least 16 bytes have
// been checked by the caller; shorter versions lack the fields) and the
// ids of its events (u64s).
func (p *parser) addAttr(b, ids []byte) {
	a := attr{}
	for ; len(ids) >= 8; ids = ids[8:] {
		a.ids = append(a.ids, binary.LittleEndian.Uint64(ids))
	}
	if len(b) >= 32 {
		a.sampleType = binary.LittleEndian.Uint64(b[24:])
	}
	if len(b) >= 48 {
		a.idAll = binary.LittleEndian.Uint64(b[40:])&attrSampleIDAll != 0
	}
	p.attrs = append(p.attrs, a)
}

// records walks the records in data[off:end].
func (p *parser) records(data []byte, off, end uint64) error {
	for off < end {
		if end-off < 8 {
			return fmt.Errorf("record header at %d: %w", off, ErrTruncated)
		}
		typ := binary.LittleEndian.Uint32(data[off:])
		size := uint64(binary.LittleEndian.Uint16(data[off+6:]))
		if size < 8 {
			return fmt.Errorf("record at %d: size %d: %w", off, size, ErrCorrupt)
		}
		if size > end-off {
			return fmt.Errorf("record at %d: type %d, %d bytes: %w", off, typ, size, ErrTruncated)
		}
		rec := data[off : off+size]
		next := off + size
		ev, ok, err := sideBand(typ, rec, off)
		if err != nil {
			return err
		}
		if ok {
			p.f.Events = append(p.f.Events, ev)
			p.trailers = append(p.trailers, rec[8:])
			if ev.Kind == ItraceStart {
				p.starts = append(p.starts, start{pid: ev.PID, tid: ev.TID, trailer: rec[16:]})
			}
		}
		switch typ {
		case recAuxtrace:
			n, err := p.auxtrace(data, rec, off, end)
			if err != nil {
				return err
			}
			next += n
		case recHeaderTracing:
			if p.f.Pipe {
				// The tracing data follows the record, padded to 8.
				if size < 12 {
					return fmt.Errorf("tracing data record at %d: %w", off, ErrCorrupt)
				}
				n := uint64(binary.LittleEndian.Uint32(rec[8:]))
				n = (n + 7) &^ 7
				if n > end-next {
					return fmt.Errorf("tracing data at %d: %d bytes: %w", next, n, ErrTruncated)
				}
				next += n
			}
		case recHeaderAttr:
			// struct perf_record_header_attr: the attr, then ids.
			a, ids := rec[8:], []byte(nil)
			if len(a) >= 8 {
				asz := uint64(binary.LittleEndian.Uint32(a[4:]))
				if asz >= 8 && asz <= uint64(len(a)) {
					a, ids = a[:asz], a[asz:]
				}
				p.addAttr(a, ids)
			}
		case recAux:
			if size < 32 {
				return fmt.Errorf("aux record at %d: %w", off, ErrCorrupt)
			}
			auxOff := binary.LittleEndian.Uint64(rec[8:])
			auxSize := binary.LittleEndian.Uint64(rec[16:])
			flags := binary.LittleEndian.Uint64(rec[24:])
			if flags&auxLossFlags != 0 {
				p.losses = append(p.losses, loss{end: auxOff + auxSize, trailer: rec[32:]})
			}
		case recLost:
			if size >= 24 {
				p.f.LostEvents += binary.LittleEndian.Uint64(rec[16:])
			}
		case recAuxtraceError:
			p.f.AuxtraceErrors++
		case recTimeConv:
			p.timeConv(rec)
		case recAuxtraceInfo:
			p.auxtraceInfo(rec)
		case recBuildID:
			if err := buildIDs(rec, off, p.f.BuildIDs); err != nil {
				return err
			}
		case recCompressed, recCompressed2:
			return fmt.Errorf("record at %d: zstd-compressed records (perf record -z): %w", off, ErrUnsupported)
		}
		off = next
	}
	return nil
}

// auxtrace takes one PERF_RECORD_AUXTRACE and returns the size of the
// payload that follows it.
func (p *parser) auxtrace(data, rec []byte, off, end uint64) (uint64, error) {
	if len(rec) < auxtraceRecordSize {
		return 0, fmt.Errorf("auxtrace record at %d: %d bytes: %w", off, len(rec), ErrCorrupt)
	}
	n := binary.LittleEndian.Uint64(rec[8:])
	auxOff := binary.LittleEndian.Uint64(rec[16:])
	idx := binary.LittleEndian.Uint32(rec[32:])
	tid := int32(binary.LittleEndian.Uint32(rec[36:]))
	cpu := int32(binary.LittleEndian.Uint32(rec[40:]))
	start := off + uint64(len(rec))
	if n > end-start {
		return 0, fmt.Errorf("auxtrace payload at %d: %d bytes: %w", start, n, ErrTruncated)
	}
	b := p.byIdx[idx]
	if b == nil {
		b = &Buffer{Idx: idx, CPU: cpu, TID: tid}
		if cpu >= 0 {
			b.TID = -1
		}
		p.byIdx[idx] = b
		p.f.Buffers = append(p.f.Buffers, b)
	}
	b.Chunks = append(b.Chunks, Chunk{Offset: auxOff, Data: data[start : start+n]})
	return n, nil
}

func (p *parser) timeConv(rec []byte) {
	if len(rec) < 32 {
		return
	}
	c := &TimeConv{
		Shift: uint16(binary.LittleEndian.Uint64(rec[8:]) & 63),
		Mult:  uint32(binary.LittleEndian.Uint64(rec[16:])),
		Zero:  binary.LittleEndian.Uint64(rec[24:]),
	}
	// Newer perf appends time_cycles, time_mask and the flags
	// cap_user_time_zero and cap_user_time_short: without time zero the
	// kernel gave no absolute time, and none is better than a wrong one.
	if len(rec) >= 49 && rec[48] == 0 {
		return
	}
	if len(rec) >= 50 && rec[49] != 0 {
		c.Short = true
		c.Cycles = binary.LittleEndian.Uint64(rec[32:])
		c.Mask = binary.LittleEndian.Uint64(rec[40:])
	}
	p.f.Time = c
}

// auxtraceInfo takes the time conversion from Intel PT's private data
// (tools/perf/arch/x86/util/intel-pt.c: pmu type, time shift, time mult,
// time zero, cap_user_time_zero, ...) unless TIME_CONV gave it.
func (p *parser) auxtraceInfo(rec []byte) {
	if len(rec) < 16+5*8 || binary.LittleEndian.Uint32(rec[8:]) != auxtraceTypeIntelPT || p.f.Time != nil {
		return
	}
	priv := rec[16:]
	if binary.LittleEndian.Uint64(priv[32:]) == 0 {
		return
	}
	p.f.Time = &TimeConv{
		Shift: uint16(binary.LittleEndian.Uint64(priv[8:]) & 63),
		Mult:  uint32(binary.LittleEndian.Uint64(priv[16:])),
		Zero:  binary.LittleEndian.Uint64(priv[24:]),
	}
}

// finish attributes the AUX losses to buffers through the sample_id
// trailer, and gives the side-band events their time and CPU.
func (p *parser) finish() *File {
	p.layouts()
	for i := range p.f.Events {
		p.f.Events[i].CPU = -1
		if s, found := p.sample(p.trailers[i]); found {
			p.f.Events[i].setSample(s)
		}
	}
	for _, b := range p.f.Buffers {
		b.PID = -1
	}
	for _, s := range slices.Backward(p.starts) {
		if b := p.buffer(s.trailer); b != nil {
			b.PID = s.pid
		} else if b := p.threadBuffer(s.tid); b != nil {
			b.PID = s.pid
		}
	}
	// Without trailers that tell the buffer, a recording whose
	// ITRACE_STARTs all name one process traced that process.
	if len(p.starts) > 0 && !slices.ContainsFunc(p.starts, func(s start) bool { return s.pid != p.starts[0].pid }) {
		for _, b := range p.f.Buffers {
			if b.PID < 0 {
				b.PID = p.starts[0].pid
			}
		}
	}
	for _, l := range p.losses {
		b := p.buffer(l.trailer)
		if b == nil {
			p.f.LostAux++
			continue
		}
		b.Losses = append(b.Losses, l.end)
	}
	for _, b := range p.f.Buffers {
		slices.Sort(b.Losses)
	}
	return p.f
}

// buffer returns the buffer a record with the sample_id trailer t belongs
// to, nil if that cannot be told.
func (p *parser) buffer(t []byte) *Buffer {
	s, found := p.sample(t)
	if !found {
		return nil
	}
	for _, c := range p.f.Buffers {
		if (c.CPU >= 0 && c.CPU == s.cpu) || (c.CPU < 0 && c.TID == s.tid) {
			return c
		}
	}
	return nil
}

// threadBuffer returns the per-thread buffer of tid, nil if there is none.
func (p *parser) threadBuffer(tid int32) *Buffer {
	for _, c := range p.f.Buffers {
		if c.CPU < 0 && c.TID == tid {
			return c
		}
	}
	return nil
}

// layouts finds how the records' sample_id trailers are laid out: alike
// when every attribute has sample_id_all and the same trailer bits; else,
// when every attribute has sample_id_all and PERF_SAMPLE_IDENTIFIER (the
// trailer's last word is then the event id), per event id.
func (p *parser) layouts() {
	p.sameLayout = len(p.attrs) > 0
	ident := len(p.attrs) > 0
	for i, a := range p.attrs {
		ident = ident && a.idAll && a.sampleType&sampleIdentifier != 0
		if !a.idAll || (i > 0 && a.sampleType&trailerBits != p.layout) {
			p.sameLayout = false
		}
		p.layout = a.sampleType & trailerBits
	}
	if p.sameLayout || !ident {
		return
	}
	p.byID = map[uint64]uint64{}
	for _, a := range p.attrs {
		for _, id := range a.ids {
			p.byID[id] = a.sampleType & trailerBits
		}
	}
}

// sample reads the sample_id trailer that t ends with; found is false
// when its layout is not known.
func (p *parser) sample(t []byte) (s idSample, found bool) {
	if p.sameLayout {
		return trailerIDs(t, p.layout)
	}
	if len(t) < 8 {
		return s, false
	}
	layout, ok := p.byID[binary.LittleEndian.Uint64(t[len(t)-8:])]
	if !ok {
		return s, false
	}
	return trailerIDs(t, layout)
}

// idSample is what a sample_id trailer says; a field the layout lacks is
// -1 (time: hasTime false).
type idSample struct {
	pid, tid, cpu int32
	time          uint64
	hasTime       bool
}

// trailerIDs reads a sample_id trailer with the given layout; found is
// false if the layout has neither CPU nor TID or the trailer is too short.
func trailerIDs(t []byte, layout uint64) (s idSample, found bool) {
	size := 0
	for bits := layout & trailerBits; bits != 0; bits &= bits - 1 {
		size += 8
	}
	if layout&(sampleCPU|sampleTID) == 0 || len(t) < size {
		return s, false
	}
	t = t[len(t)-size:]
	s = idSample{pid: -1, tid: -1, cpu: -1}
	// struct sample_id: {pid, tid}, time, id, stream_id, {cpu, res},
	// identifier (last, unlike in samples).
	if layout&sampleTID != 0 {
		s.pid = int32(binary.LittleEndian.Uint32(t))
		s.tid = int32(binary.LittleEndian.Uint32(t[4:]))
		t = t[8:]
	}
	if layout&sampleTime != 0 {
		s.time, s.hasTime = binary.LittleEndian.Uint64(t), true
		t = t[8:]
	}
	for _, bit := range []uint64{sampleID, sampleStreamID} {
		if layout&bit != 0 {
			t = t[8:]
		}
	}
	if layout&sampleCPU != 0 {
		s.cpu = int32(binary.LittleEndian.Uint32(t))
	}
	return s, true
}
