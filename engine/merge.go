package engine

import "math"

// Merger orders the items of several queues by time: the one merge of ptfs,
// used by the classic source, PTW and `ptfs decode`. Each queue is in time
// order (one CPU ring, one trace stream), so the merge takes the earliest
// queue head each time, the lower queue first on equal times.
//
// A live stream cannot know whether another queue still gets an earlier
// item, so Release holds each item back until a watermark passes its time;
// the pending total is bounded by max: beyond it the oldest items go out
// early. An offline reader that knows every queue's next item uses Pop.
type Merger[T any] struct {
	queues []queue[T]
	n      int // items pending in all queues
	max    int
	last   uint64 // latest time taken out
	late   uint64 // items taken out after a later one (order broken)
}

// queue is a FIFO of items in a ring that reuses its storage: a push
// writes after the last item and a take reads the first, so neither moves
// the items held back (thousands in the classic reader's hold-back).
type queue[T any] struct {
	items []Item[T] // the ring; its length is a power of two
	first int       // index of the first pending item
	n     int       // pending items
}

// at returns the i-th pending item of q.
func (q *queue[T]) at(i int) *Item[T] { return &q.items[(q.first+i)&(len(q.items)-1)] }

// grow doubles the ring, keeping the pending items in order. The old
// ring's slots (and the storage they own) are dropped with it.
func (q *queue[T]) grow() {
	items := make([]Item[T], max(minQueue, 2*len(q.items)))
	for i := range q.n {
		items[i] = *q.at(i)
	}
	q.items, q.first = items, 0
}

// minQueue is the first ring size of a queue.
const minQueue = 64

// Item is one queued value and the time it is merged by.
type Item[T any] struct {
	Time uint64
	V    T
}

// NewMerger returns a merger of n queues holding at most max items for
// Release.
func NewMerger[T any](n, max int) Merger[T] {
	return Merger[T]{queues: make([]queue[T], n), max: max}
}

// AddQueue adds an empty queue and returns its index, for sources whose
// CPUs become known one by one.
func (m *Merger[T]) AddQueue() int {
	m.queues = append(m.queues, queue[T]{})
	return len(m.queues) - 1
}

// Push returns a slot at the end of queue q for an item of the given time.
// Slots are reused, so steady state does not allocate.
func (m *Merger[T]) Push(q int, time uint64) *T {
	qu := &m.queues[q]
	if qu.n == len(qu.items) {
		qu.grow()
	}
	it := qu.at(qu.n)
	qu.n++
	m.n++
	it.Time = time
	return &it.V
}

// Pending returns the number of items in all queues.
func (m *Merger[T]) Pending() int { return m.n }

// QueueLen returns the number of items in queue q.
func (m *Merger[T]) QueueLen(q int) int {
	return m.queues[q].n
}

// Oldest returns the time of the earliest pending item; ok is false when
// nothing is pending. A live reader sleeps until it is due.
func (m *Merger[T]) Oldest() (time uint64, ok bool) {
	q := m.head()
	if q < 0 {
		return 0, false
	}
	return m.queues[q].items[m.queues[q].first].Time, true
}

// Late returns how many items were taken out after a later one.
func (m *Merger[T]) Late() uint64 { return m.late }

// head returns the index of the queue whose first item is the earliest, the
// lower queue on equal times, or -1 when all are empty. The rule of the
// merge.
func (m *Merger[T]) head() int {
	// Linear over the queues: few CPUs or streams hold items at once.
	best := -1
	var bt uint64
	for i := range m.queues {
		q := &m.queues[i]
		if q.n > 0 && (best < 0 || q.items[q.first].Time < bt) {
			best, bt = i, q.items[q.first].Time
		}
	}
	return best
}

// take removes the first item of q and returns it; it stays valid until
// the next Push to q.
func (m *Merger[T]) take(qi int) *T {
	q := &m.queues[qi]
	it := &q.items[q.first]
	if it.Time < m.last {
		m.late++
	} else {
		m.last = it.Time
	}
	m.n--
	q.n--
	q.first = (q.first + 1) & (len(q.items) - 1)
	return &it.V
}

// Release appends to out, in time order, the pending items whose time is
// at or before watermark, plus the oldest ones beyond max, and returns out.
// Items are swapped out, not copied: each slot gets what out held at that
// position beyond its length, so storage that an item owns (a record's
// Data) moves with it and is reused, never shared between a slot and out.
func (m *Merger[T]) Release(watermark uint64, out []T) []T {
	for {
		run, _ := m.TakeRun(watermark, math.MaxInt)
		if len(run) == 0 {
			return out
		}
		for i := range run {
			if len(out) < cap(out) {
				out = out[:len(out)+1]
			} else {
				var zero T
				out = append(out, zero)
			}
			v, o := &run[i].V, &out[len(out)-1]
			*v, *o = *o, *v
		}
	}
}

// TakeRun takes out the next items that Release would, up to n, as long
// as they lie together in one queue's ring: the earliest queue's items up
// to the head of the next one (one CPU's ring has long runs of its own
// hits) and up to the end of the ring's storage. They are returned in
// place, valid until the next Push to their queue, with that queue: a
// reader that hands them on reads them there, with no copy and no call
// per item, and need not store the queue in each item. An empty run means
// that nothing more is due (its queue is -1 when nothing is pending or n
// is 0, else the earliest queue's, which holds it back); a reader takes
// runs until then (or until it has taken the n of a bounded batch).
func (m *Merger[T]) TakeRun(watermark uint64, n int) (run []Item[T], queue int) {
	if m.n == 0 || n <= 0 {
		return nil, -1
	}
	best, until := m.run()
	q := &m.queues[best]
	items := q.items[q.first : q.first+min(q.n, n, len(q.items)-q.first)]
	// The items' times and the order check in registers, written back
	// once a run.
	last, late, k := m.last, m.late, 0
	for ; k < len(items); k++ {
		t := items[k].Time
		if t > until || t > watermark && m.n-k <= m.max {
			break // another queue's head comes first, or held back
		}
		if t < last {
			late++
		} else {
			last = t
		}
	}
	m.last, m.late = last, late
	m.n -= k
	q.n -= k
	q.first = (q.first + k) & (len(q.items) - 1)
	return items[:k], best
}

// run returns the queue whose first item is the earliest (head's rule)
// and the latest time up to which its items go before any other queue's
// first one: the next earliest head's time, less one for a lower queue
// (which goes first on equal times). One pass finds both. m.n > 0.
func (m *Merger[T]) run() (best int, until uint64) {
	best, second := -1, -1
	var bt, st uint64
	for i := range m.queues {
		q := &m.queues[i]
		if q.n == 0 {
			continue
		}
		// In queue order: on equal times the lower queue stays ahead.
		switch t := q.items[q.first].Time; {
		case best < 0 || t < bt:
			second, st = best, bt
			best, bt = i, t
		case second < 0 || t < st:
			second, st = i, t
		}
	}
	switch {
	case second < 0:
		return best, math.MaxUint64
	case second < best:
		return best, st - 1 // st > bt: the lower queue would have won a tie
	}
	return best, st
}

// Pop takes out the earliest pending item, whatever its time, and returns
// it with its queue; the item stays valid until the next Push to that
// queue. ok is false when nothing is pending. The caller makes sure that
// every queue that may still get items holds one.
func (m *Merger[T]) Pop() (v *T, q int, ok bool) {
	q = m.head()
	if q < 0 {
		return nil, -1, false
	}
	return m.take(q), q, true
}
