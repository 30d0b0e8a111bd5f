package perfio

import (
	"encoding/binary"
	"errors"
	"fmt"

	"ptfs/decode"
	"ptfs/engine"

	"golang.org/x/sys/unix"
)

// Perf record types Classic reads (include/uapi/linux/perf_event.h).
const (
	recordLost   = unix.PERF_RECORD_LOST
	recordSample = unix.PERF_RECORD_SAMPLE
)

// classicSampleType is the sample layout Classic asks the kernel for; the
// parser below reads exactly this layout.
const classicSampleType = unix.PERF_SAMPLE_TID | unix.PERF_SAMPLE_TIME | unix.PERF_SAMPLE_CPU | unix.PERF_SAMPLE_RAW

// classicIDSize is the sample_id trailer of classicSampleType (RAW is not
// part of it): u32 pid, tid; u64 time; u32 cpu, res. The ring owner's
// COMM and EXIT records carry it.
const classicIDSize = 24

// Offsets in a PERF_RECORD_SAMPLE of classicSampleType, header included.
const (
	sampleTIDOff  = headerSize     // u32 pid, u32 tid
	sampleTimeOff = headerSize + 8 // u64 time
	sampleCPUOff  = headerSize + 16
	sampleRawOff  = headerSize + 24 // u32 size, then the raw bytes
	sampleMinSize = sampleRawOff + 4
)

// rawArgsOff is where arguments may start in a uprobe's raw data: after the
// 8 bytes of common fields and the u64 __probe_ip.
const rawArgsOff = 16

// Sentinel errors of this file.
var (
	// ErrMalformed reports a perf record that does not match its layout.
	ErrMalformed = errors.New("malformed perf record")
)

// sample is the decoded fixed part of a classic sample; raw aliases the ring.
type sample struct {
	pid  uint32
	tid  uint32
	cpu  uint32
	time uint64
	raw  []byte
}

// parseSample decodes rec, a whole PERF_RECORD_SAMPLE record of
// classicSampleType, into s.
func parseSample(rec []byte, s *sample) error {
	if len(rec) < sampleMinSize {
		return fmt.Errorf("%w: sample of %d bytes", ErrMalformed, len(rec))
	}
	s.pid = binary.LittleEndian.Uint32(rec[sampleTIDOff:])
	s.tid = binary.LittleEndian.Uint32(rec[sampleTIDOff+4:])
	s.time = binary.LittleEndian.Uint64(rec[sampleTimeOff:])
	s.cpu = binary.LittleEndian.Uint32(rec[sampleCPUOff:])
	n := uint64(binary.LittleEndian.Uint32(rec[sampleRawOff:]))
	if n < rawArgsOff || n > uint64(len(rec)-sampleMinSize) {
		return fmt.Errorf("%w: raw size %d in a %d-byte sample", ErrMalformed, n, len(rec))
	}
	s.raw = rec[sampleMinSize : sampleMinSize+n]
	return nil
}

// rawEventID returns common_type, the tracefs event id, of raw data that
// parseSample accepted.
func rawEventID(raw []byte) uint16 { return binary.LittleEndian.Uint16(raw) }

// fillRecord sets r from the sample s of event ev. ev must have passed
// checkEvent; a raw area too short for its arguments is an error.
func fillRecord(ev *decode.Event, s *sample, r *decode.Record) error {
	fillHead(ev, len(ev.Args), s, r)
	strs := false // r.Data emptied for this record's strings
	for i := range ev.Args {
		a := &ev.Args[i]
		if a.Offset+a.Size > len(s.raw) {
			return fmt.Errorf("%w: argument %d at %d+%d beyond %d raw bytes of event %d",
				ErrMalformed, i, a.Offset, a.Size, len(s.raw), ev.ID)
		}
		b := s.raw[a.Offset:]
		if a.Type.IsString() {
			// A __data_loc word: the string's offset in the raw data
			// (low 16 bits) and its length with the NUL (high 16; 0
			// when the read faulted). Its bytes go into the record's
			// own storage: the ring is reused.
			loc := binary.LittleEndian.Uint32(b)
			off, n := int(loc&0xffff), int(loc>>16)
			if off+n > len(s.raw) {
				return fmt.Errorf("%w: string argument %d at %d+%d beyond %d raw bytes of event %d",
					ErrMalformed, i, off, n, len(s.raw), ev.ID)
			}
			if r.Data == nil {
				r.Data = new([]byte) // once per slot: slots are reused
			}
			if !strs {
				*r.Data, strs = (*r.Data)[:0], true
			}
			r.Args[i] = decode.StringRef(len(*r.Data), n)
			*r.Data = append(*r.Data, s.raw[off:off+n]...)
			continue
		}
		switch a.Size {
		case 1:
			r.Args[i] = uint64(b[0])
		case 2:
			r.Args[i] = uint64(binary.LittleEndian.Uint16(b))
		case 4:
			r.Args[i] = uint64(binary.LittleEndian.Uint32(b))
		default:
			r.Args[i] = binary.LittleEndian.Uint64(b)
		}
	}
	return nil
}

// fillHead sets r's event, thread, CPU and time from s, and its count to
// n. Slots are reused: it clears the arguments a longer record left
// behind, so that a slot's Args beyond its N are always zero.
func fillHead(ev *decode.Event, n int, s *sample, r *decode.Record) {
	r.Event = ev
	r.PID = int32(s.pid)
	r.TID = int32(s.tid)
	r.CPU = int32(s.cpu)
	r.Time = s.time
	if r.N > n {
		clear(r.Args[n:r.N])
	}
	r.N = n
}

// wordOffsets returns the offsets of ev's arguments in the raw data when
// every one is an 8-byte value (no string), with the end of the last
// (the raw bytes a sample needs), for fillWords; nil when one is not.
func wordOffsets(ev *decode.Event) (offs []int, end int) {
	for _, a := range ev.Args {
		if a.Size != 8 || a.Type.IsString() {
			return nil, 0
		}
		offs, end = append(offs, a.Offset), max(end, a.Offset+8)
	}
	return offs, end
}

// fillWords is fillRecord for an event of 8-byte arguments at offs (see
// wordOffsets), in a sample whose raw data holds them: no type or size to
// look at per argument.
func fillWords(ev *decode.Event, offs []int, s *sample, r *decode.Record) {
	fillHead(ev, len(offs), s, r)
	for i, off := range offs {
		r.Args[i] = binary.LittleEndian.Uint64(s.raw[off:])
	}
}

// checkEvent verifies that ev's arguments can be read from raw sample data.
func checkEvent(ev *decode.Event) error {
	if len(ev.Args) > len(decode.Record{}.Args) {
		return fmt.Errorf("%w: event %s/%s has %d arguments, at most %d", engine.ErrBadEvent,
			ev.Group, ev.Name, len(ev.Args), len(decode.Record{}.Args))
	}
	for i, a := range ev.Args {
		switch {
		case a.Type.IsString() && a.Size != 4:
			return fmt.Errorf("%w: event %s/%s string argument %d has size %d", engine.ErrBadEvent, ev.Group, ev.Name, i, a.Size)
		case a.Size == 1 || a.Size == 2 || a.Size == 4 || a.Size == 8:
		default:
			return fmt.Errorf("%w: event %s/%s argument %d has size %d", engine.ErrBadEvent, ev.Group, ev.Name, i, a.Size)
		}
		if a.Offset < rawArgsOff || a.Offset > maxRecord {
			return fmt.Errorf("%w: event %s/%s argument %d at offset %d", engine.ErrBadEvent, ev.Group, ev.Name, i, a.Offset)
		}
	}
	return nil
}
