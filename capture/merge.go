package capture

import (
	"ptfs/decode"
)

// merger orders the records of all CPU rings by time. Each ring is in time
// order, so each CPU gets a queue and release merges the queue heads. A live
// stream cannot know whether another CPU still holds an earlier sample, so
// each record is held back until the watermark (now minus the latency)
// passes its time. The pending total is bounded by max: beyond it the
// oldest records go out early.
type merger struct {
	queues []recQueue
	n      int // records pending in all queues
	max    int
	last   uint64 // latest time released
	late   uint64 // records released after a later one (order broken)
}

// recQueue is a FIFO of records that reuses its storage.
type recQueue struct {
	recs  []decode.Record
	start int // recs[start:] are pending
}

// newMerger returns a merger of n queues holding at most max records.
func newMerger(n, max int) merger {
	return merger{queues: make([]recQueue, n), max: max}
}

// addQueue adds an empty queue and returns its index, for sources whose
// CPUs become known one by one.
func (m *merger) addQueue() int {
	m.queues = append(m.queues, recQueue{})
	return len(m.queues) - 1
}

// push returns a slot at the end of queue q; drop undoes it when the
// caller cannot fill it. Slots are reused, so steady state does not
// allocate.
func (m *merger) push(q int) *decode.Record {
	qu := &m.queues[q]
	if len(qu.recs) == cap(qu.recs) && qu.start > 0 {
		k := copy(qu.recs, qu.recs[qu.start:])
		qu.recs, qu.start = qu.recs[:k], 0
	}
	if len(qu.recs) < cap(qu.recs) {
		qu.recs = qu.recs[:len(qu.recs)+1]
	} else {
		qu.recs = append(qu.recs, decode.Record{})
	}
	m.n++
	return &qu.recs[len(qu.recs)-1]
}

// drop removes the slot that push(q) returned last.
func (m *merger) drop(q int) {
	qu := &m.queues[q]
	qu.recs = qu.recs[:len(qu.recs)-1]
	m.n--
}

// release appends to out, in time order, the pending records whose time is
// at or before watermark, plus the oldest ones beyond max, and returns out.
func (m *merger) release(watermark uint64, out []decode.Record) []decode.Record {
	for m.n > 0 {
		// Linear over the CPUs: few CPUs hold records at once.
		var best *recQueue
		for i := range m.queues {
			q := &m.queues[i]
			if q.start < len(q.recs) && (best == nil || q.recs[q.start].Time < best.recs[best.start].Time) {
				best = q
			}
		}
		r := &best.recs[best.start]
		if r.Time > watermark && m.n <= m.max {
			break
		}
		if r.Time < m.last {
			m.late++
		} else {
			m.last = r.Time
		}
		out = append(out, *r)
		m.n--
		if best.start++; best.start == len(best.recs) {
			best.recs, best.start = best.recs[:0], 0
		}
	}
	return out
}
