package perfio

import (
	"testing"

	"ptfs/decode"
	"ptfs/engine"
)

// fakeClassic is a Classic over fake rings, for the read path without a
// kernel: no reader goroutine, no fds.
func fakeClassic(t testing.TB, rings ...*fakeMmap) *Classic {
	c := &Classic{events: make(map[uint16]*classicEvent), merge: engine.NewMerger[decode.Record](len(rings), engine.MaxPending)}
	for i, f := range rings {
		r, err := NewDataRing(f.mem, fakePage)
		if err != nil {
			t.Fatal(err)
		}
		c.cpus = append(c.cpus, &cpuRing{cpu: i, ring: r})
	}
	return c
}

// pairEvent is a uprobe event with two u64 arguments.
var pairEvent = &decode.Event{ID: 7, Group: "g", Name: "pair", Args: []decode.Arg{
	{Offset: 16, Size: 8}, {Offset: 24, Size: 8},
}}

func pairSample(tid uint32, time uint64, cpu uint32, a, b uint64) []byte {
	return makeSample(tid, tid, time, cpu, makeRaw(pairEvent.ID, int32(tid), le(8, a), le(8, b)))
}

func lostRecord(n uint64) []byte {
	return makeRecord(recordLost, 0, append(le(8, 99), le(8, n)...))
}

// TestDrain checks the read path over two CPU rings: samples become
// records in time order, and every other kind of record is counted.
func TestDrain(t *testing.T) {
	r0, r1 := newFakeMmap(1024, true), newFakeMmap(1024, true)
	badSample := pairSample(1, 25, 0, 0, 0)
	badSample[sampleRawOff] = 0xff // raw size beyond the record
	for _, rec := range [][]byte{
		pairSample(1, 10, 0, 1, 2),
		lostRecord(5),
		makeSample(1, 1, 15, 0, makeRaw(8, 1, le(8, 0))), // unknown event
		badSample,
		makeSample(1, 1, 26, 0, makeRaw(pairEvent.ID, 1, le(8, 0))), // too short for the event
		makeRecord(3, 0, seq(0, 16)),                                // COMM: not ours, skipped
		pairSample(1, 30, 0, 3, 4),
		makeRecord(recordLost, 0, le(8, 1)), // truncated LOST
	} {
		r0.write(rec)
	}
	r1.write(pairSample(2, 20, 1, 5, 6))
	r1.write(pairSample(2, 40, 1, 7, 8))
	r1.write(makeRecord(recordSample, 0, nil)[:4]) // partial header
	c := fakeClassic(t, r0, r1)
	c.events[pairEvent.ID] = &classicEvent{ev: pairEvent}
	c.drainLocked()
	got := c.merge.Release(35, nil)
	want := []decode.Record{
		{Event: pairEvent, N: 2, Args: [8]uint64{1, 2}, TID: 1, CPU: 0, Time: 10},
		{Event: pairEvent, N: 2, Args: [8]uint64{5, 6}, TID: 2, CPU: 1, Time: 20},
		{Event: pairEvent, N: 2, Args: [8]uint64{3, 4}, TID: 1, CPU: 0, Time: 30},
	}
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d: %+v", len(got), len(want), got)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("record %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if got := c.merge.Release(^uint64(0), nil); len(got) != 1 || got[0].Time != 40 {
		t.Errorf("held back: %+v", got)
	}
	if c.lost.Load() != 5 || c.unknown.Load() != 1 || c.errs.Load() != 4 {
		t.Errorf("lost %d unknown %d errors %d, want 5 1 4", c.lost.Load(), c.unknown.Load(), c.errs.Load())
	}
	for i, f := range []*fakeMmap{r0, r1} {
		if f.page.Data_tail != f.page.Data_head {
			t.Errorf("ring %d not released", i)
		}
	}
}

// fillRing fills a ring with samples of pairEvent and returns how many.
func fillRing(f *fakeMmap) int {
	n := 0
	for tm := uint64(1); ; tm++ {
		rec := pairSample(1, tm, 0, tm, tm+1)
		if f.page.Data_head+uint64(len(rec)) > uint64(len(f.data)) {
			return n
		}
		f.write(rec)
		n++
	}
}

// TestDrainNoAlloc checks that the steady-state read path does not allocate.
func TestDrainNoAlloc(t *testing.T) {
	f := newFakeMmap(1<<16, true)
	f.reset(1 << 15) // the samples wrap around the end
	n := fillRing(f)
	c := fakeClassic(t, f)
	c.events[pairEvent.ID] = &classicEvent{ev: pairEvent}
	var out []decode.Record
	round := func() {
		f.page.Data_tail = 1 << 15
		c.drainLocked()
		out = c.merge.Release(^uint64(0), out[:0])
	}
	round() // grow the buffers once
	if len(out) != n {
		t.Fatalf("%d records, want %d", len(out), n)
	}
	if a := testing.AllocsPerRun(20, round); a != 0 {
		t.Errorf("%v allocations per round of %d records", a, n)
	}
}

// BenchmarkDrain measures the sample parse and merge path per record.
func BenchmarkDrain(b *testing.B) {
	f0, f1 := newFakeMmap(1<<20, true), newFakeMmap(1<<20, true)
	n := fillRing(f0) + fillRing(f1)
	c := fakeClassic(b, f0, f1)
	c.events[pairEvent.ID] = &classicEvent{ev: pairEvent}
	var out []decode.Record
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		f0.page.Data_tail, f1.page.Data_tail = 0, 0
		c.drainLocked()
		out = c.merge.Release(^uint64(0), out[:0])
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
	if len(out) != n {
		b.Fatalf("%d records, want %d", len(out), n)
	}
}
