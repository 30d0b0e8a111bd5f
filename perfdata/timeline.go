package perfdata

// Timeline is side band in time order: a queue that a trace's decoder
// drains up to the time its trace has reached (Next), while more may be
// pushed as it arrives (Push). Events of equal time keep the order they
// were pushed in; an event without a time (HasTime false) counts as time
// 0, due at once.
type Timeline struct {
	evs  []Event
	head int
}

// Push adds e in time order. Side band comes nearly in order, so it is
// inserted from the back.
func (t *Timeline) Push(e Event) {
	if t.head > 64 && t.head > len(t.evs)/2 {
		t.evs = t.evs[:copy(t.evs, t.evs[t.head:])]
		t.head = 0
	}
	t.evs = append(t.evs, e)
	i := len(t.evs) - 1
	for ; i > t.head && t.evs[i-1].Time > e.Time; i-- {
		t.evs[i] = t.evs[i-1]
	}
	t.evs[i] = e
}

// Peek returns the next event without taking it.
func (t *Timeline) Peek() (Event, bool) {
	if t.head == len(t.evs) {
		return Event{}, false
	}
	return t.evs[t.head], true
}

// Next takes the next event if it is due at now.
func (t *Timeline) Next(now uint64) (Event, bool) {
	e, ok := t.Peek()
	if !ok || e.Time > now {
		return Event{}, false
	}
	t.evs[t.head] = Event{}
	t.head++
	return e, true
}

// Len returns how many events wait.
func (t *Timeline) Len() int { return len(t.evs) - t.head }

// Timeline returns the side band that the trace of b is decoded with, in
// time order: the events of every process (MMAP, COMM, FORK, EXIT), and
// the events of b's CPU (its thread for a per-thread buffer): ITRACE_START,
// switches, AUX records and LOST records (those with no CPU known too).
func (f *File) Timeline(b *Buffer) *Timeline {
	t := &Timeline{}
	for i := range f.Events {
		if concerns(&f.Events[i], b) {
			t.Push(f.Events[i])
		}
	}
	return t
}

// AuxRecords returns the AUX records of b's CPU (thread), in file order:
// by AUX offset.
func (f *File) AuxRecords(b *Buffer) []Event {
	var out []Event
	for i := range f.Events {
		if e := &f.Events[i]; e.Kind == Aux && concerns(e, b) {
			out = append(out, *e)
		}
	}
	return out
}

// concerns tells whether the trace of b is decoded with e.
func concerns(e *Event, b *Buffer) bool {
	switch e.Kind {
	case ItraceStart, Switch, Aux:
		return b.CPU >= 0 && e.CPU == b.CPU || b.CPU < 0 && e.TID == b.TID
	case Lost:
		return e.CPU < 0 || e.CPU == b.CPU
	}
	return true
}
