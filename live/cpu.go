package live

import (
	"bytes"
	"strconv"

	"ptfs/engine"
	"ptfs/flow"
	"ptfs/perfdata"
	"ptfs/perfflow"
)

// cpuState is the decoding of one CPU's trace. Its side band goes into a
// timeline (perfdata.Timeline); while the CPU's events pass trace (from the
// first bytes after they started to the next stop or flush: a run), a
// perfflow.Decoder decodes it and applies the side band as the trace's
// clock passes it: the process and thread of every line are the ones that
// ran then, not the last that the side band named (the kernel writes a
// switch before the AUX data that covers it). The formatter's output is
// routed by Write. Its methods run with the stage's mu held.
type cpuState struct {
	s   *Stage
	cpu int32
	// pid and tid are the task the CPU's side band last named (the one
	// that runs now, whatever the trace has reached).
	pid, tid int32
	// last is the time of the newest side-band record: without a TSC
	// conversion the trace is placed there (arrival order).
	last uint64
	conv func(tsc uint64) uint64 // nil until TimeConv
	tc   perfdata.TimeConv
	// tl is the side band not applied yet; it begins with the task that
	// runs at its start (an ITRACE_START, real or made).
	tl *perfdata.Timeline
	// apid and atid are the task of the side band applied outside a run.
	apid, atid int32
	// run decodes the trace since the events last started; nil between.
	run *perfflow.Decoder
	// errs counts the decoding errors of runs that ended.
	errs uint64
	// recs holds the records of the CPU delivered by another source
	// (Stage.Record) until its lines pass their time; out is the
	// storage they are released into. nil until the first.
	recs *engine.Merger[heldRecord]
	out  []heldRecord
	// lineTime is the time of the CPU's latest line that had one.
	lineTime  uint64
	lineTimed bool
}

// maxIdleSide bounds the side band kept for a CPU that passes no trace:
// beyond it the model takes it at once.
const maxIdleSide = 1 << 12

// newCPU returns the state of cpu, before any side band.
func newCPU(s *Stage, cpu int32) *cpuState {
	c := &cpuState{s: s, cpu: cpu, pid: -1, tid: -1, apid: -1, atid: -1}
	c.seed()
	return c
}

// seed starts a timeline at the task applied last.
func (c *cpuState) seed() {
	c.tl = &perfdata.Timeline{}
	c.tl.Push(perfdata.Event{Kind: perfdata.ItraceStart, PID: c.apid, TID: c.atid, Time: c.last, HasTime: true})
}

// write passes trace bytes to the run (begun with the first) and hands
// the lines out.
func (c *cpuState) write(data []byte) {
	if c.run == nil {
		s := c.s
		c.run = perfflow.New(perfflow.Config{Processes: s.procs, Timeline: c.tl, CPU: c.cpu, TimeConv: c.conv,
			Options: flow.Options{Time: s.opts.Clock}}, func(mem flow.Memory, sym flow.Symbolizer) *flow.Branches {
			return flow.NewBranches(c, mem, sym, s.events)
		})
	}
	if c.conv == nil {
		// No time in the trace: the side band applies as it came.
		c.run.Place(c.last)
	}
	// The stage's Write never fails.
	_, _ = c.run.Write(data)
	_ = c.run.Branches().Flush()
}

// side takes a side-band event of the CPU into its timeline. Outside a
// run a long timeline is applied at once: no trace is coming for it.
func (c *cpuState) side(e perfdata.Event) {
	c.last = max(c.last, e.Time)
	c.tl.Push(e)
	if c.run == nil && c.tl.Len() > maxIdleSide {
		c.drain()
	}
}

// drain applies the whole timeline to the model and starts a new one.
func (c *cpuState) drain() {
	for {
		e, ok := c.tl.Next(^uint64(0))
		if !ok {
			break
		}
		_ = perfflow.ApplyProcess(c.s.procs, &e)
		switch e.Kind {
		case perfdata.ItraceStart, perfdata.Switch:
			c.apid, c.atid = e.PID, e.TID
		case perfdata.Lost:
			c.atid = -1
		}
	}
	c.seed()
}

// end ends the run (the events stopped or were flushed: all their trace
// was passed): its trace is decoded to its end, the side band it did not
// reach is applied, and the next bytes start a new run.
func (c *cpuState) end() {
	if c.run != nil {
		_ = c.run.Close()
		_ = c.run.Branches().Flush()
		c.errs += c.run.Flow().Counters().Errors
		c.run = nil
		// The run applied what its trace reached; drain applies the
		// rest, after which the last task named is the one running.
		c.apid, c.atid = c.pid, c.tid
	}
	// All the trace before the end was passed: what is held is later.
	c.release(^uint64(0))
	c.drain()
}

// gap reports trace lost by cause: a gap line, then the flow resumes at
// the next PSB.
func (c *cpuState) gap(cause error) {
	if c.run == nil {
		return
	}
	c.run.Lose(cause)
	_ = c.run.Branches().Flush()
}

// errors returns the decoding errors so far.
func (c *cpuState) errors() uint64 {
	n := c.errs
	if c.run != nil {
		n += c.run.Flow().Counters().Errors
	}
	return n
}

// Write takes the formatter's lines (whole lines, as flow.Branches writes
// them) and routes each; a run of lines that go to a target goes to its
// stream in one append, without a copy.
func (c *cpuState) Write(p []byte) (int, error) {
	s := c.s
	s.out = p
	held := c.recs != nil && c.recs.Pending() > 0
	last := 0
	for off := 0; off < len(p); {
		i := bytes.IndexByte(p[off:], '\n')
		if i < 0 {
			i = len(p) - off - 1
		}
		if held {
			// Records held go before the first line later than
			// them; only then is each line's time read.
			if tm, ok := lineTime(p[off : off+i]); ok && tm > 0 {
				c.lineTime, c.lineTimed = tm, true
				c.release(tm - 1)
				held = c.recs.Pending() > 0
			}
		}
		s.route(off, off+i+1)
		last = off
		off += i + 1
	}
	if len(p) > 0 {
		if tm, ok := lineTime(p[last : len(p)-1]); ok {
			c.lineTime, c.lineTimed = tm, true
		}
	}
	for _, t := range s.targets {
		t.flush(p)
	}
	s.out = nil
	return len(p), nil
}

// timeField is the time of a line's context (DESIGN §5), its last field.
var timeField = []byte(" time=")

// lineTime returns the time of a line (without its newline), from its
// ` time=SEC.NSEC`, or false when it has none.
func lineTime(line []byte) (uint64, bool) {
	i := bytes.LastIndex(line, timeField)
	if i < 0 {
		return 0, false
	}
	var sec, ns uint64
	frac := -1
	for _, ch := range line[i+len(timeField):] {
		switch {
		case ch == '.' && frac < 0:
			frac = 0
		case ch >= '0' && ch <= '9' && frac < 0:
			sec = sec*10 + uint64(ch-'0')
		case ch >= '0' && ch <= '9' && frac < 9:
			ns = ns*10 + uint64(ch-'0')
			frac++
		default:
			return 0, false
		}
	}
	if frac != 9 {
		return 0, false
	}
	return sec*1e9 + ns, true
}

// Line kinds, by prefix (DESIGN §5).
var (
	prefixBranch = []byte("branch: ")
	prefixTrace  = []byte("trace: ")
	prefixRecord = []byte("record ")
	prefixManual = []byte("manual ptwrite: ")
)

// route hands the line out[start:end] to the targets it belongs to: a
// branch or trace line to those whose file it names, a record to the
// target of its event (numbered in that stream), anything else (gap lines,
// manual ptwrites) to every target. A line no target takes is counted
// (Outside).
func (s *Stage) route(start, end int) {
	line := s.out[start:end]
	switch {
	case bytes.HasPrefix(line, prefixBranch), bytes.HasPrefix(line, prefixTrace):
		branch := line[0] == 'b'
		sent := false
		for _, t := range s.targets {
			for _, own := range t.owns {
				if bytes.Contains(line, own) {
					t.take(s.out, start, end)
					s.st.Lines++
					sent = true
					break
				}
			}
		}
		switch {
		case !sent:
			s.st.Outside++
		case branch:
			s.st.Branches++
		}
	case bytes.HasPrefix(line, prefixRecord):
		for _, t := range s.targets {
			if bytes.Contains(line, t.event) {
				t.record(s.out, line)
				s.st.Lines++
				return
			}
		}
		s.st.Outside++
	default:
		if bytes.HasPrefix(line, prefixManual) {
			s.st.Manual++
		}
		for _, t := range s.targets {
			t.take(s.out, start, end)
			s.st.Lines++
		}
	}
}

// take adds the line p[start:end] to t's run of lines, which goes to its
// stream when a line breaks it (flush).
func (t *Target) take(p []byte, start, end int) {
	if t.runEnd != start || t.runEnd == 0 {
		t.flush(p)
		t.runStart = start
	}
	t.runEnd = end
}

// flush appends t's run of lines of p to its stream.
func (t *Target) flush(p []byte) {
	if t.runEnd > t.runStart {
		t.out.Append(p[t.runStart:t.runEnd])
	}
	t.runStart, t.runEnd = 0, 0
}

// record appends a record line of p numbered in t's stream: `record N:`
// counts the records of this stream from 1.
func (t *Target) record(p, line []byte) {
	i := bytes.IndexByte(line, ':')
	if i < 0 {
		return
	}
	t.flush(p)
	t.seq++
	t.buf = append(t.buf[:0], prefixRecord...)
	t.buf = strconv.AppendUint(t.buf, t.seq, 10)
	t.buf = append(t.buf, line[i:]...)
	t.out.Append(t.buf)
}
