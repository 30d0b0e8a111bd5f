package session

import (
	"fmt"
	"testing"

	"ptfs/decode"
	"ptfs/stream"
)

// TestSwapDrop feeds record sequences of a replacement at one site (old
// event 1, new event 2; hits seen by both give new then old, per thread)
// and checks which records are kept.
func TestSwapDrop(t *testing.T) {
	type rec struct {
		ev  uint16
		tid int32
	}
	old, nu := &decode.Event{ID: 1}, &decode.Event{ID: 2}
	for _, c := range []struct {
		name string
		recs []rec
		keep string // one letter a record: k kept, d dropped
	}{
		{"old only", []rec{{1, 7}, {1, 7}}, "kk"},
		{"new only", []rec{{2, 7}, {2, 7}}, "kk"},
		{"overlap", []rec{{1, 7}, {2, 7}, {1, 7}, {2, 7}, {1, 7}, {2, 7}}, "kkdkdk"},
		{"two threads interleaved", []rec{{2, 7}, {2, 8}, {1, 8}, {1, 7}, {1, 9}}, "kkddk"},
		// The old event is disabled on the CPU of the first hit, not yet on
		// the CPU of the second.
		{"old disabled on one CPU", []rec{{2, 7}, {2, 7}, {1, 7}, {2, 7}}, "kkdk"},
		// The new event is enabled on the CPU of the first hit, not yet on
		// the CPU of the second.
		{"new enabled on one CPU", []rec{{2, 7}, {1, 7}, {1, 7}, {2, 7}, {1, 7}}, "kdkkd"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := &swap{newID: nu.ID, paired: map[int32]bool{}}
			got := ""
			for _, r := range c.recs {
				ev := old
				if r.ev == nu.ID {
					ev = nu
				}
				if w.drop(&decode.Record{Event: ev, TID: r.tid}) {
					got += "d"
				} else {
					got += "k"
				}
			}
			if got != c.keep {
				t.Errorf("%v: kept %s, want %s", fmt.Sprint(c.recs), got, c.keep)
			}
		})
	}
}

// BenchmarkDeliver measures the record path through the routes against
// the emit it ends in, in the same run, per record of batches of 256: the
// routing (and the swap check) should cost nothing beside it.
func BenchmarkDeliver(b *testing.B) {
	s := &Session{opts: Options{Stream: stream.Options{Limit: 1 << 20}}}
	tg := newTarget(s, "t", "/bin/t", "g", nil)
	p := &probe{target: tg, name: "e"}
	s.routes.Store(&map[uint16]*route{5: {p: p}})
	batch := make([]decode.Record, 256)
	for i := range batch {
		batch[i] = decode.Record{Event: &decode.Event{ID: 5, Group: "ptfs_t", Name: "e"}, N: 2, Args: [8]uint64{1, 2}, TID: 7, CPU: 1, Time: 12345}
	}
	b.Run("emit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tg.beginEmit()
			for i := range batch {
				tg.emit(&batch[i])
			}
			tg.endEmit()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/record")
	})
	b.Run("deliver", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.deliver(batch)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/record")
	})
}

// emitOne writes one record to t's records, as deliver does.
func emitOne(t *Target, r *decode.Record) {
	t.beginEmit()
	t.emit(r)
	t.endEmit()
}
