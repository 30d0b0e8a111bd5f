package perfio

import (
	"encoding/binary"
	"fmt"

	"ptfs/engine"
	"ptfs/perfdata"

	"golang.org/x/sys/unix"
)

// sampleIDSize is the sample_id trailer that sample_id_all appends to every
// record of a PT data ring with ptSampleType: u32 pid, tid; u64 time; u32
// cpu, res; u64 id (PERF_SAMPLE_IDENTIFIER).
const sampleIDSize = 32

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
// sample_id trailer, into ev: the record's fields by perfdata.SideBand,
// the one parser of the perf ABI's side band; the names through the
// caches, so that repeated ones cost no allocation.
func (p *sideParser) parse(typ uint32, misc uint16, rec []byte, ev *engine.SideEvent) error {
	idSize := p.idSize
	if idSize == 0 {
		idSize = sampleIDSize
	}
	if len(rec) < headerSize+idSize {
		return fmt.Errorf("%w: side-band record type %d of %d bytes", ErrMalformed, typ, len(rec))
	}
	if !isSide(typ) {
		return fmt.Errorf("%w: record type %d is not side band", ErrMalformed, typ)
	}
	var r perfdata.Event
	name, _, err := perfdata.SideBand(typ, misc, rec[headerSize:len(rec)-idSize], &r)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	// The trailer names the task that wrote the record: the one a switch
	// takes out or brings in.
	tr := rec[len(rec)-idSize:]
	*ev = engine.SideEvent{
		PID:  int32(binary.LittleEndian.Uint32(tr)),
		TID:  int32(binary.LittleEndian.Uint32(tr[4:])),
		Time: binary.LittleEndian.Uint64(tr[8:]),
	}
	switch r.Kind {
	case perfdata.ItraceStart:
		ev.Kind, ev.PID, ev.TID = engine.SideITraceStart, r.PID, r.TID
	case perfdata.Comm:
		ev.Kind, ev.PID, ev.TID = engine.SideComm, r.PID, r.TID
		ev.Comm, ev.Exec = p.comm.get(name), r.Exec
	case perfdata.Mmap:
		// An MMAP2 with a build id in place of the inode leaves it 0.
		ev.Kind, ev.PID, ev.TID = engine.SideMmap2, r.PID, r.TID
		ev.Addr, ev.Len, ev.PgOff = r.Addr, r.Len, r.PgOff
		ev.Maj, ev.Min, ev.Ino = r.Maj, r.Min, r.Ino
		ev.Filename = p.file.get(name)
	case perfdata.Exit:
		ev.Kind, ev.PID, ev.TID = engine.SideExit, r.PID, r.TID
	case perfdata.Switch:
		ev.Kind, ev.NextPID, ev.NextTID = engine.SideSwitchIn, -1, -1
		if r.Out {
			// After a CPU-wide switch out, next_prev names the task
			// that runs next.
			ev.Kind, ev.NextPID, ev.NextTID = engine.SideSwitchOut, r.PID, r.TID
		}
	}
	return nil
}
