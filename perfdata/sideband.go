package perfdata

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Side-band record types and misc flags (include/uapi/linux/perf_event.h).
const (
	recMmap          = 1
	recComm          = 3
	recExit          = 4
	recFork          = 7
	recMmap2         = 10
	recItraceStart   = 12
	recSwitch        = 14
	recSwitchCPUWide = 15
	recBuildID       = 67 // PERF_RECORD_HEADER_BUILD_ID (pipe mode)

	miscCommExec    = 1 << 13
	miscSwitchOut   = 1 << 13
	miscMmapBuildID = 1 << 14
	miscBuildIDSize = 1 << 15

	featBuildID = 2 // HEADER_BUILD_ID feature bit
	buildIDMax  = 20
)

// Kind is the kind of a side-band Event.
type Kind uint8

// Side-band event kinds.
const (
	Mmap        Kind = iota + 1 // PERF_RECORD_MMAP or MMAP2
	Comm                        // PERF_RECORD_COMM (Exec tells an exec)
	Fork                        // PERF_RECORD_FORK
	Exit                        // PERF_RECORD_EXIT
	ItraceStart                 // PERF_RECORD_ITRACE_START
	Switch                      // PERF_RECORD_SWITCH or SWITCH_CPU_WIDE
	Aux                         // PERF_RECORD_AUX
	Lost                        // PERF_RECORD_LOST: side band the ring dropped
)

// Event is one side-band record: what the process memory model needs.
type Event struct {
	Kind     Kind
	PID, TID int32
	// PPID and PTID are the parent of a Fork or Exit.
	PPID, PTID int32
	// Addr, Len and PgOff place a mapping of Name (Mmap); PgOff is a
	// byte offset in the file.
	Addr, Len, PgOff uint64
	// Maj, Min, Ino identify the mapped file (MMAP2 without a build id).
	Maj, Min uint32
	Ino      uint64
	// BuildID is the mapped file's build id when MMAP2 carries it.
	BuildID     []byte
	Prot, Flags uint32
	// Name is the mapped file (Mmap) or the command (Comm).
	Name string
	// Exec is set on a Comm that an exec caused.
	Exec bool
	// Time is the record's perf time (its sample_id trailer; HasTime
	// says whether it has one), CPU the CPU it was recorded on (-1: not
	// known). Parse fills them in when every attribute lays the trailer
	// out alike.
	Time    uint64
	HasTime bool
	CPU     int32
	// Out marks a Switch away from a task; after a Switch, PID and TID
	// are the task that runs on the CPU (-1: not known, a per-task
	// switch out).
	Out bool
	// AuxOffset, AuxSize and AuxFlags are an Aux record's: the AUX data
	// it announces and its loss flags (AuxTruncated, ...).
	AuxOffset, AuxSize, AuxFlags uint64
	// Lost is how many records a Lost event says were dropped. Aux and
	// Lost events have the PID and TID of their sample_id trailer.
	Lost uint64
}

// setSample takes the time, CPU and (for a switch in, an AUX or LOST
// record) the task of a record's sample_id trailer.
func (e *Event) setSample(s idSample) {
	e.Time, e.HasTime, e.CPU = s.time, s.hasTime, s.cpu
	if e.Kind == Switch && !e.Out || e.Kind == Aux || e.Kind == Lost {
		e.PID, e.TID = s.pid, s.tid
	}
}

// cstr returns the NUL-terminated name at the start of b, as bytes of b.
func cstr(b []byte, what string) ([]byte, error) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return nil, fmt.Errorf("%s record: unterminated name: %w", what, ErrCorrupt)
	}
	return b[:i], nil
}

// SideBand decodes the side-band record of type typ (PERF_RECORD_MMAP,
// MMAP2, COMM, FORK, EXIT, ITRACE_START, SWITCH, SWITCH_CPU_WIDE, AUX,
// LOST) whose header has the misc flags misc into ev: the one parser of
// the perf ABI's side band, for perf.data and the live rings. body is
// what follows the 8-byte header; a sample_id trailer may follow the
// fields (the caller reads it: its layout is the attribute's), and a name
// must end with a NUL within body. So that the live reader allocates
// nothing, the name of an MMAP, MMAP2 or COMM is returned as bytes of
// body (ev.Name is left empty) and ev.BuildID aliases body. Task fields
// are the body's: a switch's PID and TID are -1 but after a CPU-wide
// switch out (next_prev_pid/tid); the trailer names the task of a switch
// in, an AUX or a LOST. ok is false for a type that is not side band;
// a body too short for its type is ErrCorrupt.
func SideBand(typ uint32, misc uint16, body []byte, ev *Event) (name []byte, ok bool, err error) {
	le := binary.LittleEndian
	need := func(n int, what string) error {
		if len(body) < n {
			return fmt.Errorf("%s record: body of %d bytes, want %d: %w", what, len(body), n, ErrCorrupt)
		}
		return nil
	}
	switch typ {
	case recMmap:
		if err := need(33, "mmap"); err != nil {
			return nil, true, err
		}
		*ev = Event{Kind: Mmap, PID: int32(le.Uint32(body)), TID: int32(le.Uint32(body[4:])),
			Addr: le.Uint64(body[8:]), Len: le.Uint64(body[16:]), PgOff: le.Uint64(body[24:])}
		name, err = cstr(body[32:], "mmap")
	case recMmap2:
		if err := need(65, "mmap2"); err != nil {
			return nil, true, err
		}
		*ev = Event{Kind: Mmap, PID: int32(le.Uint32(body)), TID: int32(le.Uint32(body[4:])),
			Addr: le.Uint64(body[8:]), Len: le.Uint64(body[16:]), PgOff: le.Uint64(body[24:]),
			Prot: le.Uint32(body[56:]), Flags: le.Uint32(body[60:])}
		if misc&miscMmapBuildID != 0 {
			n := int(body[32])
			if n > buildIDMax {
				return nil, true, fmt.Errorf("mmap2 record: build id of %d bytes: %w", n, ErrCorrupt)
			}
			ev.BuildID = body[36 : 36+n]
		} else {
			ev.Maj, ev.Min, ev.Ino = le.Uint32(body[32:]), le.Uint32(body[36:]), le.Uint64(body[40:])
		}
		name, err = cstr(body[64:], "mmap2")
	case recComm:
		if err := need(9, "comm"); err != nil {
			return nil, true, err
		}
		*ev = Event{Kind: Comm, PID: int32(le.Uint32(body)), TID: int32(le.Uint32(body[4:])), Exec: misc&miscCommExec != 0}
		name, err = cstr(body[8:], "comm")
	case recFork, recExit:
		if err := need(16, "fork/exit"); err != nil {
			return nil, true, err
		}
		*ev = Event{Kind: Fork, PID: int32(le.Uint32(body)), PPID: int32(le.Uint32(body[4:])),
			TID: int32(le.Uint32(body[8:])), PTID: int32(le.Uint32(body[12:]))}
		if typ == recExit {
			ev.Kind = Exit
		}
	case recItraceStart:
		if err := need(8, "itrace start"); err != nil {
			return nil, true, err
		}
		*ev = Event{Kind: ItraceStart, PID: int32(le.Uint32(body)), TID: int32(le.Uint32(body[4:]))}
	case recSwitch, recSwitchCPUWide:
		// After a switch in the trailer's task runs (setSample); after
		// a CPU-wide switch out, next_prev_pid/tid; after a per-task
		// one, a task it does not name.
		*ev = Event{Kind: Switch, Out: misc&miscSwitchOut != 0, PID: -1, TID: -1}
		if typ == recSwitchCPUWide {
			// The kernel writes next_prev_pid/tid either way.
			if err := need(8, "switch"); err != nil {
				return nil, true, err
			}
			if ev.Out {
				ev.PID, ev.TID = int32(le.Uint32(body)), int32(le.Uint32(body[4:]))
			}
		}
	case recAux:
		if err := need(24, "aux"); err != nil {
			return nil, true, err
		}
		*ev = Event{Kind: Aux, AuxOffset: le.Uint64(body), AuxSize: le.Uint64(body[8:]), AuxFlags: le.Uint64(body[16:])}
	case recLost:
		if err := need(16, "lost"); err != nil {
			return nil, true, err
		}
		*ev = Event{Kind: Lost, Lost: le.Uint64(body[8:])}
	default:
		return nil, false, nil
	}
	return name, true, err
}

// sideBand decodes the side-band record rec (header included) at offset
// off of a perf.data file; ok is false for other types. Its name and build
// id are its own, not rec's.
func sideBand(typ uint32, rec []byte, off uint64) (ev Event, ok bool, err error) {
	name, ok, err := SideBand(typ, binary.LittleEndian.Uint16(rec[4:]), rec[8:], &ev)
	if err != nil {
		return ev, ok, fmt.Errorf("record at %d: %w", off, err)
	}
	ev.Name = string(name)
	ev.BuildID = bytes.Clone(ev.BuildID)
	return ev, ok, nil
}

// buildIDs reads a run of build_id events (the HEADER_BUILD_ID feature
// section, or one PERF_RECORD_HEADER_BUILD_ID) into ids by file name.
func buildIDs(b []byte, base uint64, ids map[string][]byte) error {
	for len(b) > 0 {
		if len(b) < 8 {
			return fmt.Errorf("build id at %d: %w", base, ErrTruncated)
		}
		size := uint64(binary.LittleEndian.Uint16(b[6:]))
		misc := binary.LittleEndian.Uint16(b[4:])
		// struct perf_record_header_build_id: header, pid, build_id[24],
		// filename.
		if size < 37 {
			return fmt.Errorf("build id at %d: size %d: %w", base, size, ErrCorrupt)
		}
		if size > uint64(len(b)) {
			return fmt.Errorf("build id at %d: %d bytes: %w", base, size, ErrTruncated)
		}
		n := buildIDMax
		if misc&miscBuildIDSize != 0 {
			n = int(b[32])
			if n > buildIDMax {
				return fmt.Errorf("build id at %d: %d bytes: %w", base, n, ErrCorrupt)
			}
		}
		name, err := cstr(b[36:size], "build id")
		if err != nil {
			return fmt.Errorf("at %d: %w", base, err)
		}
		ids[string(name)] = bytes.Clone(b[12 : 12+n])
		b, base = b[size:], base+size
	}
	return nil
}

// featureBuildIDs reads the HEADER_BUILD_ID feature section, if the file
// has one: the feature sections follow the data section, one per set bit
// of adds_features, in bit order.
func featureBuildIDs(data []byte, ids map[string][]byte) error {
	if len(data) < 104 {
		return nil
	}
	feats := binary.LittleEndian.Uint64(data[72:])
	if feats&(1<<featBuildID) == 0 {
		return nil
	}
	// Sections for bits below featBuildID come first (bit 0 is reserved).
	idx := 0
	for bit := 0; bit < featBuildID; bit++ {
		if feats&(1<<bit) != 0 {
			idx++
		}
	}
	dataEnd := binary.LittleEndian.Uint64(data[40:]) + binary.LittleEndian.Uint64(data[48:])
	at := dataEnd + uint64(idx)*16
	if dataEnd < binary.LittleEndian.Uint64(data[40:]) || at > uint64(len(data)) || uint64(len(data))-at < 16 {
		return fmt.Errorf("feature sections at %d: %w", at, ErrTruncated)
	}
	sec, err := section(data, int(at), "build id")
	if err != nil {
		return err
	}
	return buildIDs(sec, binary.LittleEndian.Uint64(data[at:]), ids)
}
