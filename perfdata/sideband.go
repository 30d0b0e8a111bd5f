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

// cstr returns the NUL-terminated string at the start of b.
func cstr(b []byte, what string, off uint64) (string, error) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return "", fmt.Errorf("%s record at %d: unterminated name: %w", what, off, ErrCorrupt)
	}
	return string(b[:i]), nil
}

// sideBand decodes a side-band record of type typ (rec includes the
// header); ok is false for other types.
func sideBand(typ uint32, rec []byte, off uint64) (ev Event, ok bool, err error) {
	misc := binary.LittleEndian.Uint16(rec[4:])
	le := binary.LittleEndian
	need := func(n int, what string) error {
		if len(rec) < n {
			return fmt.Errorf("%s record at %d: %d bytes, want %d: %w", what, off, len(rec), n, ErrCorrupt)
		}
		return nil
	}
	switch typ {
	case recMmap:
		if err := need(41, "mmap"); err != nil {
			return ev, true, err
		}
		ev = Event{Kind: Mmap, PID: int32(le.Uint32(rec[8:])), TID: int32(le.Uint32(rec[12:])),
			Addr: le.Uint64(rec[16:]), Len: le.Uint64(rec[24:]), PgOff: le.Uint64(rec[32:])}
		ev.Name, err = cstr(rec[40:], "mmap", off)
	case recMmap2:
		if err := need(73, "mmap2"); err != nil {
			return ev, true, err
		}
		ev = Event{Kind: Mmap, PID: int32(le.Uint32(rec[8:])), TID: int32(le.Uint32(rec[12:])),
			Addr: le.Uint64(rec[16:]), Len: le.Uint64(rec[24:]), PgOff: le.Uint64(rec[32:]),
			Prot: le.Uint32(rec[64:]), Flags: le.Uint32(rec[68:])}
		if misc&miscMmapBuildID != 0 {
			n := int(rec[40])
			if n > buildIDMax {
				return ev, true, fmt.Errorf("mmap2 record at %d: build id of %d bytes: %w", off, n, ErrCorrupt)
			}
			ev.BuildID = bytes.Clone(rec[44 : 44+n])
		} else {
			ev.Maj, ev.Min, ev.Ino = le.Uint32(rec[40:]), le.Uint32(rec[44:]), le.Uint64(rec[48:])
		}
		ev.Name, err = cstr(rec[72:], "mmap2", off)
	case recComm:
		if err := need(17, "comm"); err != nil {
			return ev, true, err
		}
		ev = Event{Kind: Comm, PID: int32(le.Uint32(rec[8:])), TID: int32(le.Uint32(rec[12:])), Exec: misc&miscCommExec != 0}
		ev.Name, err = cstr(rec[16:], "comm", off)
	case recFork, recExit:
		if err := need(24, "fork/exit"); err != nil {
			return ev, true, err
		}
		ev = Event{Kind: Fork, PID: int32(le.Uint32(rec[8:])), PPID: int32(le.Uint32(rec[12:])),
			TID: int32(le.Uint32(rec[16:])), PTID: int32(le.Uint32(rec[20:]))}
		if typ == recExit {
			ev.Kind = Exit
		}
	case recItraceStart:
		if err := need(16, "itrace start"); err != nil {
			return ev, true, err
		}
		ev = Event{Kind: ItraceStart, PID: int32(le.Uint32(rec[8:])), TID: int32(le.Uint32(rec[12:]))}
	case recSwitch, recSwitchCPUWide:
		// After a switch in the trailer's task runs (setSample); after
		// a CPU-wide switch out, next_prev_pid/tid; after a per-task
		// one, a task it does not name.
		ev = Event{Kind: Switch, Out: misc&miscSwitchOut != 0, PID: -1, TID: -1}
		if typ == recSwitchCPUWide && ev.Out {
			if err := need(16, "switch"); err != nil {
				return ev, true, err
			}
			ev.PID, ev.TID = int32(le.Uint32(rec[8:])), int32(le.Uint32(rec[12:]))
		}
	case recAux:
		if err := need(32, "aux"); err != nil {
			return ev, true, err
		}
		ev = Event{Kind: Aux, AuxOffset: le.Uint64(rec[8:]), AuxSize: le.Uint64(rec[16:]), AuxFlags: le.Uint64(rec[24:])}
	case recLost:
		if err := need(24, "lost"); err != nil {
			return ev, true, err
		}
		ev = Event{Kind: Lost, Lost: le.Uint64(rec[16:])}
	default:
		return ev, false, nil
	}
	return ev, true, err
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
		name, err := cstr(b[36:size], "build id", base)
		if err != nil {
			return err
		}
		ids[name] = bytes.Clone(b[12 : 12+n])
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
