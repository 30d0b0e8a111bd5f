package session

import (
	"fmt"

	"ptfs/decode"
	"ptfs/engine"
	"ptfs/perfio"
)

// source is the record source of a mode: classic uprobe samples or the
// decoded PT stream. Both route records by event id and deliver them in
// time order to Session.deliver.
type source interface {
	Add(ev *decode.Event) error
	Remove(id uint16) error
	Close() error
	// shared returns what the source counts for all targets together:
	// losses and decoder counters that no event id attributes to one
	// target. Every target's summary includes them.
	shared() decode.Counters
	// appendStatus appends the source's status lines.
	appendStatus(b []byte) []byte
	// running describes the capture while probes are active.
	running() string
	// settle returns once every hit whose handlers were running when it
	// was called has run them all: between the new event's enable and
	// the old one's disable when a probe is replaced at its own site.
	settle() error
}

// classicSource reads classic uprobes through perf tracepoint rings.
type classicSource struct{ *perfio.Classic }

func (c classicSource) shared() decode.Counters {
	st := c.Stats()
	return decode.Counters{Errors: st.Lost + st.Errors}
}

func (c classicSource) appendStatus(b []byte) []byte {
	st := c.Stats()
	return fmt.Appendf(b, "lost: %d (samples dropped by full kernel rings, all targets)\nlost counted: %s\n"+
		"capture errors: %d\nunknown samples: %d\nlate: %d (records out of time order)\n"+
		"filtered: %d (records of other processes, dropped by %%pid/%%comm; not losses)\n"+
		"process names lost: %d (exec and exit records dropped by full kernel rings; names read from /proc again)\n",
		st.Lost, st.LostBy, st.Errors, st.Unknown, st.Late, st.Filtered, st.TaskLost)
}

func (classicSource) running() string { return "running (classic uprobes, perf tracepoint rings)" }

func (classicSource) settle() error { return perfio.SyncUprobes() }

// ptwSource decodes ptwrite uprobe records from Intel PT; pt is the kernel
// side, nil when a replayed trace stands in for it.
type ptwSource struct {
	*engine.PTW
	pt *perfio.PT
}

func (p ptwSource) shared() decode.Counters {
	st := p.Stats()
	c := st.Decode
	c.Records = 0
	return c
}

func (p ptwSource) appendStatus(b []byte) []byte {
	st := p.Stats()
	sd := st.Side
	b = fmt.Appendf(b, "trace: %d bytes decoded\n", st.Bytes)
	b = append(b, "trace losses:"...)
	for k, n := range st.Losses {
		b = fmt.Appendf(b, " %s=%d", engine.LossKind(k), n)
	}
	b = append(b, '\n')
	b = fmt.Appendf(b, "side band: itrace_start=%d switch_in=%d switch_out=%d comm=%d mmap2=%d exit=%d\n",
		sd.ITraceStart, sd.SwitchIn, sd.SwitchOut, sd.Comm, sd.Mmap2, sd.Exit)
	b = appendTimeStatus(b, &st)
	b = fmt.Appendf(b, "manual ptwrites: %d (no target owns them; counted as stray)\n"+
		"unattributed: %d (records without tid: the side band did not say which thread ran)\n"+
		"untimed: %d (records without time and tid)\nlate: %d (records out of time order)\n"+
		"filtered: %d (records of other or unknown processes, dropped by %%pid/%%comm; not losses)\n",
		st.Manual, st.Unattributed, st.Untimed, st.Late, st.Filtered)
	if p.pt != nil {
		b = appendPTStatus(b, p.pt.Status(), p.pt.Stats())
	}
	return b
}

// appendTimeStatus appends the `time:` line: where record times come from.
// Whether the kernel converts TSC to perf time (cap_user_time_zero of the
// mmap page) is known only once a CPU passes trace.
func appendTimeStatus(b []byte, st *engine.PTWStats) []byte {
	switch {
	case st.CPUs == 0:
		return append(b, "time: not known until a CPU passes trace (cap_user_time_zero of its mmap page)\n"...)
	case st.NoTimeConv == 0:
		return append(b, "time: perf time (TSC converted by the mmap page)\n"...)
	}
	return fmt.Appendf(b, "time: none on %d of %d CPUs: the kernel gave no TSC conversion (cap_user_time_zero clear, "+
		"as under kvm-clock); their records have no time= and no tid=\n", st.NoTimeConv, st.CPUs)
}

// appendPTStatus appends the kernel side of ptw mode: ring sizes and why,
// the CPUs traced and each one that is not, with its reason.
func appendPTStatus(b []byte, st perfio.PTStatus, cnt perfio.PTStats) []byte {
	b = fmt.Appendf(b, "pt buffers: aux=%d pages data=%d pages (%s)\n", st.AuxPages, st.DataPages, st.Buffers)
	tracing := 0
	for _, c := range st.CPUs {
		if c.State == perfio.CPUTracing {
			tracing++
		}
	}
	b = fmt.Appendf(b, "pt cpus: %d of %d tracing\n", tracing, len(st.CPUs))
	for _, c := range st.CPUs {
		if c.State == perfio.CPUTracing {
			continue
		}
		b = fmt.Appendf(b, "pt cpu %d: %s", c.CPU, c.State)
		if c.State == perfio.CPUError && c.Err != nil {
			b = fmt.Appendf(b, ": %v", c.Err)
		}
		b = append(b, '\n')
	}
	return fmt.Appendf(b, "pt reader: records=%d errors=%d (malformed records, failed ioctls) reconfigured=%d\n", cnt.Records, cnt.Errors, cnt.Switches)
}

func (ptwSource) running() string { return "running (ptwrite uprobes, Intel PT)" }

// settle has nothing to wait for: a ptw probe at its own site goes before
// its replacement comes (replaceAtSite), so two never overlap.
func (ptwSource) settle() error { return nil }
