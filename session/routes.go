package session

import (
	"maps"

	"ptfs/decode"
)

// route is where the records of one event id go.
type route struct {
	p *probe
	// swap is set while p is replaced at its own site (see swap).
	swap *swap
	// ev, when set, names the records instead of the source's event: the
	// probe was renamed (mv) after its event was made.
	ev *decode.Event
}

// swap pairs the records of a probe replaced at its own site while its
// old and new events are both live: each hit of that moment is recorded by
// both. A time switch cannot tell the pairs apart (the two records of a hit
// are ~1 µs apart, and a switch time falling between them records the hit
// twice or not at all), but their order can: the kernel runs the newest
// consumer of a uprobe first, so a hit seen by both events gives the new
// event's record, then the old event's, in the same thread, with none of
// that thread's records between. An old record that follows a new one of
// its thread is that hit again and is dropped. Hits before the new event
// was enabled on their CPU come from the old event alone, those after the
// old one was disabled from the new one alone: both are kept.
//
// Only the record path touches a swap (one goroutine at a time); it is
// published with the routes.
type swap struct {
	newID uint16
	// paired[tid] is set when the thread's last record came from the new
	// event and no old record of that hit was seen yet.
	paired map[int32]bool
}

// drop tells whether r is the second record of a hit.
func (w *swap) drop(r *decode.Record) bool {
	if r.Event.ID == w.newID {
		w.paired[r.TID] = true
		return false
	}
	if !w.paired[r.TID] {
		return false
	}
	w.paired[r.TID] = false
	return true
}

// updateRoutes applies change to a copy of the routes and publishes it:
// the record path reads them without a lock.
func (s *Session) updateRoutes(change func(m map[uint16]*route)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := maps.Clone(*s.routes.Load())
	change(m)
	s.routes.Store(&m)
}

// beginSwap routes newID to p, paired with p's installed event oldID (see
// swap) until setRoute(newID, p) ends the pairing, once oldID is removed
// and every record of it delivered.
func (s *Session) beginSwap(p *probe, oldID, newID uint16) {
	w := &swap{newID: newID, paired: map[int32]bool{}}
	s.updateRoutes(func(m map[uint16]*route) {
		var ev *decode.Event // the old event's names, if renamed
		if old := m[oldID]; old != nil {
			ev = old.ev
		}
		m[oldID] = &route{p: p, swap: w, ev: ev}
		m[newID] = &route{p: p, swap: w}
	})
}

// renameRoute makes the records of id carry ev's names from now on.
func (s *Session) renameRoute(id uint16, ev *decode.Event) {
	s.updateRoutes(func(m map[uint16]*route) {
		if rt := m[id]; rt != nil {
			m[id] = &route{p: rt.p, swap: rt.swap, ev: ev}
		}
	})
}
