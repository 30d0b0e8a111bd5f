package perfio

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"ptfs/engine"

	"golang.org/x/sys/unix"
)

// sampleIDSize is the sample_id trailer that sample_id_all appends to every
// record of a PT data ring with ptSampleType: u32 pid, tid; u64 time; u32
// cpu, res; u64 id (PERF_SAMPLE_IDENTIFIER).
const sampleIDSize = 32

// Body sizes (after the header, before the trailer) of the fixed parts of
// the side-band records (include/uapi/linux/perf_event.h).
const (
	pidTIDSize      = 8            // u32 pid, tid
	mmapFixedSize   = 8 + 3*8      // pid, tid, addr, len, pgoff
	mmap2FixedSize  = 8 + 3*8 + 32 // then maj/min/ino/ino_gen or build id (24), prot, flags
	exitSize        = 4*4 + 8      // pid, ppid, tid, ptid, time
	switchWideSize  = 8            // next_prev_pid, next_prev_tid
	itraceStartSize = pidTIDSize
)

// nameCache keeps the last string made from a record's bytes so that the
// same comm or file name seen again costs no allocation.
type nameCache struct{ last string }

// get returns b as a string, reusing the last one when equal.
func (c *nameCache) get(b []byte) string {
	if string(b) != c.last {
		c.last = string(b)
	}
	return c.last
}

// sideParser turns side-band records into SideEvents; its caches make
// repeated names free.
type sideParser struct {
	comm, file nameCache
	// idSize is the size of the records' sample_id trailer; 0 means
	// sampleIDSize (a PT data ring's).
	idSize int
}

// isSide tells whether records of type typ are side band that parse
// understands.
func isSide(typ uint32) bool {
	switch typ {
	case unix.PERF_RECORD_ITRACE_START, unix.PERF_RECORD_COMM, unix.PERF_RECORD_MMAP,
		unix.PERF_RECORD_MMAP2, unix.PERF_RECORD_EXIT, unix.PERF_RECORD_SWITCH,
		unix.PERF_RECORD_SWITCH_CPU_WIDE:
		return true
	}
	return false
}

// parse decodes rec, a whole side-band record of type typ (isSide) with its
// sample_id trailer, into ev.
func (p *sideParser) parse(typ uint32, misc uint16, rec []byte, ev *engine.SideEvent) error {
	idSize := p.idSize
	if idSize == 0 {
		idSize = sampleIDSize
	}
	if len(rec) < headerSize+idSize {
		return fmt.Errorf("%w: side-band record type %d of %d bytes", ErrMalformed, typ, len(rec))
	}
	tr := rec[len(rec)-idSize:]
	body := rec[headerSize : len(rec)-idSize]
	*ev = engine.SideEvent{
		PID:  int32(binary.LittleEndian.Uint32(tr)),
		TID:  int32(binary.LittleEndian.Uint32(tr[4:])),
		Time: binary.LittleEndian.Uint64(tr[8:]),
	}
	need := 0
	switch typ {
	case unix.PERF_RECORD_ITRACE_START:
		ev.Kind, need = engine.SideITraceStart, itraceStartSize
	case unix.PERF_RECORD_COMM:
		ev.Kind, need = engine.SideComm, pidTIDSize+1
	case unix.PERF_RECORD_MMAP:
		ev.Kind, need = engine.SideMmap2, mmapFixedSize+1
	case unix.PERF_RECORD_MMAP2:
		ev.Kind, need = engine.SideMmap2, mmap2FixedSize+1
	case unix.PERF_RECORD_EXIT:
		ev.Kind, need = engine.SideExit, exitSize
	case unix.PERF_RECORD_SWITCH:
		ev.Kind = engine.SideSwitchIn
	case unix.PERF_RECORD_SWITCH_CPU_WIDE:
		ev.Kind, need = engine.SideSwitchIn, switchWideSize
	default:
		return fmt.Errorf("%w: record type %d is not side band", ErrMalformed, typ)
	}
	if len(body) < need {
		return fmt.Errorf("%w: side-band record type %d: body of %d bytes, want %d", ErrMalformed, typ, len(body), need)
	}
	switch typ {
	case unix.PERF_RECORD_ITRACE_START, unix.PERF_RECORD_COMM, unix.PERF_RECORD_MMAP, unix.PERF_RECORD_MMAP2:
		ev.PID = int32(binary.LittleEndian.Uint32(body))
		ev.TID = int32(binary.LittleEndian.Uint32(body[4:]))
	case unix.PERF_RECORD_EXIT:
		ev.PID = int32(binary.LittleEndian.Uint32(body))
		ev.TID = int32(binary.LittleEndian.Uint32(body[8:]))
	}
	switch typ {
	case unix.PERF_RECORD_COMM:
		s, err := cString(body[pidTIDSize:])
		if err != nil {
			return fmt.Errorf("comm: %w", err)
		}
		ev.Comm = p.comm.get(s)
		ev.Exec = misc&unix.PERF_RECORD_MISC_COMM_EXEC != 0
	case unix.PERF_RECORD_MMAP, unix.PERF_RECORD_MMAP2:
		ev.Addr = binary.LittleEndian.Uint64(body[8:])
		ev.Len = binary.LittleEndian.Uint64(body[16:])
		ev.PgOff = binary.LittleEndian.Uint64(body[24:])
		name := body[mmapFixedSize:]
		if typ == unix.PERF_RECORD_MMAP2 {
			name = body[mmap2FixedSize:]
			// Unless the record carries a build id in their place.
			if misc&unix.PERF_RECORD_MISC_MMAP_BUILD_ID == 0 {
				ev.Maj = binary.LittleEndian.Uint32(body[32:])
				ev.Min = binary.LittleEndian.Uint32(body[36:])
				ev.Ino = binary.LittleEndian.Uint64(body[40:])
			}
		}
		s, err := cString(name)
		if err != nil {
			return fmt.Errorf("mmap: %w", err)
		}
		ev.Filename = p.file.get(s)
	case unix.PERF_RECORD_SWITCH, unix.PERF_RECORD_SWITCH_CPU_WIDE:
		// The trailer names the task that runs the switch: the one going
		// out, or the one coming in.
		ev.NextPID, ev.NextTID = -1, -1
		if misc&unix.PERF_RECORD_MISC_SWITCH_OUT != 0 {
			ev.Kind = engine.SideSwitchOut
			if typ == unix.PERF_RECORD_SWITCH_CPU_WIDE {
				ev.NextPID = int32(binary.LittleEndian.Uint32(body))
				ev.NextTID = int32(binary.LittleEndian.Uint32(body[4:]))
			}
		}
	}
	return nil
}

// cString returns b up to its first NUL; the kernel pads names with NULs to
// 8 bytes, so a name without one is malformed.
func cString(b []byte) ([]byte, error) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return nil, fmt.Errorf("%w: name without NUL", ErrMalformed)
	}
	return b[:i], nil
}
