package live

import (
	"ptfs/engine"
)

// maxHeldRecords bounds the records a CPU holds for its trace (the
// merger's hold-back bound): beyond it the oldest go out early.
const maxHeldRecords = 1 << 12

// heldRecord is a record line held until its CPU's trace passes its time.
type heldRecord struct {
	t    *Target
	line []byte // owned by the merger slot, reused
}

// Record gives target name a record line delivered by a source other than
// the trace (classic mode: perf samples), to be interleaved by time with
// the lines of its CPU (DESIGN §2): it goes before the first line of cpu
// whose time is later than its own. time is in the trace's clock (perf
// time, as the CPU's TimeConv converts it). A record without a time or a
// CPU, on a CPU without a TSC conversion (its lines carry no time), or
// whose CPU's lines are past its time already goes out at once, in
// arrival order; one held goes out at the latest when its CPU's run ends
// (a flush, the stop) or beyond maxHeldRecords. It reports false when
// name is not attached.
func (s *Stage) Record(name string, cpu int, time uint64, line []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.targetLocked(name)
	if t == nil {
		return false
	}
	var c *cpuState
	if cpu >= 0 && time != 0 {
		c = s.cpuLocked(cpu)
	}
	if c == nil || c.conv == nil || c.lineTimed && c.lineTime > time {
		t.out.Append(line)
		s.st.Lines++
		return true
	}
	if c.recs == nil {
		m := engine.NewMerger[heldRecord](1, maxHeldRecords)
		c.recs = &m
	}
	h := c.recs.Push(0, time)
	h.t, h.line = t, append(h.line[:0], line...)
	if c.recs.Pending() > maxHeldRecords {
		c.release(0)
	}
	return true
}

// targetLocked returns the target attached as name, or nil.
func (s *Stage) targetLocked(name string) *Target {
	for _, t := range s.targets {
		if t.name == name {
			return t
		}
	}
	return nil
}

// release appends the held records of c whose time is at or before
// watermark (and the oldest beyond the bound) to their targets' streams,
// after the lines those targets were given of the formatter's output
// being routed. A record of a target detached meanwhile is dropped
// (counted as outside).
func (c *cpuState) release(watermark uint64) {
	if c.recs == nil || c.recs.Pending() == 0 {
		return
	}
	s := c.s
	c.out = c.recs.Release(watermark, c.out[:0])
	for i := range c.out {
		h := &c.out[i]
		if s.targetLocked(h.t.name) != h.t {
			s.st.Outside++
			continue
		}
		h.t.flush(s.out)
		h.t.out.Append(h.line)
		s.st.Lines++
	}
}
