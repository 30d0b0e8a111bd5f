package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"ptfs/decode"
)

// pushTimes adds records with the given times on cpu, args[0] = time.
func pushTimes(m *Merger[decode.Record], cpu int32, times ...uint64) {
	for _, tm := range times {
		r := m.Push(int(cpu), tm)
		*r = decode.Record{CPU: cpu, Time: tm, N: 1, Args: [8]uint64{tm}}
	}
}

func times(recs []decode.Record) []uint64 {
	var out []uint64
	for _, r := range recs {
		out = append(out, r.Time)
	}
	return out
}

func TestMerger(t *testing.T) {
	type round struct {
		cpu0, cpu1 []uint64 // drained this round
		watermark  uint64
		want       []uint64 // released this round
	}
	for _, tc := range []struct {
		name   string
		max    int
		rounds []round
		late   uint64
	}{
		{name: "interleaved cpus", max: 100, rounds: []round{
			{cpu0: []uint64{10, 30, 50}, cpu1: []uint64{20, 40}, watermark: 35, want: []uint64{10, 20, 30}},
			{cpu0: []uint64{60}, cpu1: []uint64{45}, watermark: 100, want: []uint64{40, 45, 50, 60}},
		}},
		{name: "held back until the watermark", max: 100, rounds: []round{
			{cpu0: []uint64{100, 200}, watermark: 99},
			{cpu1: []uint64{150}, watermark: 150, want: []uint64{100, 150}},
			{watermark: 1000, want: []uint64{200}},
		}},
		{name: "equal times keep ring order", max: 100, rounds: []round{
			{cpu0: []uint64{5, 5}, cpu1: []uint64{5}, watermark: 5, want: []uint64{5, 5, 5}},
		}},
		{name: "flush", max: 100, rounds: []round{
			{cpu0: []uint64{1, ^uint64(0) - 1}, watermark: ^uint64(0), want: []uint64{1, ^uint64(0) - 1}},
		}},
		{name: "bound releases the oldest early", max: 2, rounds: []round{
			{cpu0: []uint64{1, 2, 3, 4, 5}, watermark: 0, want: []uint64{1, 2, 3}},
			{watermark: 4, want: []uint64{4}},
		}},
		{name: "out of order within a ring counted", max: 100, late: 1, rounds: []round{
			{cpu0: []uint64{10, 5, 20}, watermark: 30, want: []uint64{10, 5, 20}},
		}},
		{name: "late sample counted", max: 100, late: 1, rounds: []round{
			{cpu0: []uint64{10, 20}, watermark: 30, want: []uint64{10, 20}},
			{cpu1: []uint64{15}, watermark: 30, want: []uint64{15}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMerger[decode.Record](2, tc.max)
			for i, rd := range tc.rounds {
				pushTimes(&m, 0, rd.cpu0...)
				pushTimes(&m, 1, rd.cpu1...)
				got := times(m.Release(rd.watermark, nil))
				if len(got) != len(rd.want) {
					t.Fatalf("round %d: released %v, want %v", i, got, rd.want)
				}
				for j := range got {
					if got[j] != rd.want[j] {
						t.Fatalf("round %d: released %v, want %v", i, got, rd.want)
					}
				}
			}
			if m.Late() != tc.late {
				t.Errorf("late %d, want %d", m.Late(), tc.late)
			}
		})
	}
}

// TestMergerReuse checks that queues reuse their storage: a steady flow
// through a bounded backlog does not grow them without bound.
func TestMergerReuse(t *testing.T) {
	m := NewMerger[decode.Record](1, 1000)
	var out []decode.Record
	for tm := range uint64(10000) {
		pushTimes(&m, 0, tm)
		out = m.Release(tm-min(tm, 50), out[:0])
	}
	// A queue's ring doubles only when full: less than twice the
	// backlog, within a loose bound.
	if c := cap(m.queues[0].items); c > 4*51 {
		t.Errorf("queue grew to %d slots for a backlog of 51", c)
	}
	if m.Pending() != 50 || m.QueueLen(0) != 50 || m.Late() != 0 {
		t.Errorf("pending %d (queue %d) late %d", m.Pending(), m.QueueLen(0), m.Late())
	}
	m.Push(0, 20000).Time = 20000
	if out = m.Release(^uint64(0), out[:0]); len(out) != 51 || out[50].Time != 20000 {
		t.Errorf("flush: %d records, last %+v", len(out), out[len(out)-1])
	}
}

// TestMergerPop checks the offline merge: Pop takes the earliest head
// whatever its time, the lower queue first on equal times, and says which
// queue it came from so that the caller can refill it.
func TestMergerPop(t *testing.T) {
	m := NewMerger[decode.Record](3, 0)
	pushTimes(&m, 0, 5, 9)
	pushTimes(&m, 1, 5, 7)
	pushTimes(&m, 2, 1)
	var got, oldest []uint64
	var qs []int
	for {
		o, ook := m.Oldest()
		r, q, ok := m.Pop()
		if ook != ok {
			t.Fatalf("Oldest says pending %v, Pop %v", ook, ok)
		}
		if !ok {
			break
		}
		got, qs, oldest = append(got, r.Time), append(qs, q), append(oldest, o)
	}
	if !slices.Equal(oldest, got) {
		t.Errorf("Oldest before each Pop %v, popped %v", oldest, got)
	}
	if want := []uint64{1, 5, 5, 7, 9}; !slices.Equal(got, want) {
		t.Errorf("popped times %v, want %v", got, want)
	}
	if want := []int{2, 0, 1, 1, 0}; !slices.Equal(qs, want) {
		t.Errorf("popped queues %v, want %v", qs, want)
	}
	if m.Pending() != 0 || m.Late() != 0 {
		t.Errorf("pending %d late %d after popping all", m.Pending(), m.Late())
	}
}

// TestMergerOwnedStorage: storage that an item owns (a record's Data, a
// pointer reused with its slot) is never shared between a pending item and
// a released one, across releases, wrapping and growth, and is reused:
// a steady flow allocates no new buffers.
func TestMergerOwnedStorage(t *testing.T) {
	m := NewMerger[decode.Record](2, 1000)
	var out []decode.Record
	bufs := 0
	push := func(q int, tm uint64) {
		r := m.Push(q, tm)
		if r.Data == nil {
			r.Data = new([]byte)
			bufs++
		}
		*r.Data = append((*r.Data)[:0], byte(tm))
		r.Time = tm
	}
	for tm := uint64(1); tm < 5000; tm++ {
		push(int(tm%2), tm)
		if tm%7 == 0 {
			push(int(tm%2), tm) // a burst: queues wrap and grow
		}
		out = m.Release(tm-min(tm, 30), out[:0])
		seen := map[*[]byte]bool{}
		for i := range out {
			if r := &out[i]; (*r.Data)[0] != byte(r.Time) || seen[r.Data] {
				t.Fatalf("time %d: released record %d has data %v or a shared buffer", tm, r.Time, *r.Data)
			}
			seen[out[i].Data] = true
		}
		for q := range m.queues {
			qu := &m.queues[q]
			for i := range qu.n {
				it := qu.at(i)
				if seen[it.V.Data] || (*it.V.Data)[0] != byte(it.V.Time) {
					t.Fatalf("time %d: pending record %d shares a buffer with a released one or lost its data", tm, it.V.Time)
				}
				seen[it.V.Data] = true
			}
		}
	}
	if bufs > 200 {
		t.Errorf("%d buffers made for a backlog of about 35", bufs)
	}
}

// TestMergerRingWraps: a queue whose ring has wrapped keeps its order
// when it grows, and its slots are reused once the ring is big enough.
func TestMergerRingWraps(t *testing.T) {
	m := NewMerger[decode.Record](1, 1<<20)
	next, want := uint64(0), uint64(0)
	pop := func() {
		r, _, ok := m.Pop()
		if !ok || r.Time != want {
			t.Fatalf("popped %v %v, want time %d", r, ok, want)
		}
		want++
	}
	push := func() {
		m.Push(0, next).Time = next
		next++
	}
	for range minQueue - 8 {
		push()
	}
	for range minQueue / 2 {
		pop()
	}
	// The ring wraps, then fills and grows with its first item in the
	// middle.
	for range minQueue + 40 {
		push()
	}
	if n := len(m.queues[0].items); n != 2*minQueue {
		t.Errorf("ring of %d slots, want %d", n, 2*minQueue)
	}
	for m.Pending() > 0 {
		pop()
	}
	if want != next {
		t.Errorf("popped %d of %d", want, next)
	}
	for range 10 * minQueue {
		push()
		pop()
	}
	if n := len(m.queues[0].items); n != 2*minQueue {
		t.Errorf("ring of %d slots after a steady flow, want %d", n, 2*minQueue)
	}
}

// takeN takes runs of m (TakeRun) up to n items in all, as a bounded
// batch of the classic reader does, checking that each run holds the
// items of one queue (pushTimes: the record's CPU), and returns copies.
func takeN(t *testing.T, m *Merger[decode.Record], watermark uint64, n int) []decode.Record {
	t.Helper()
	var out []decode.Record
	for len(out) < n {
		run, q := m.TakeRun(watermark, n-len(out))
		if len(run) == 0 {
			break
		}
		for i := range run {
			if int(run[i].V.CPU) != q || run[i].Time != run[i].V.Time {
				t.Fatalf("run of queue %d holds %+v", q, run[i])
			}
			out = append(out, run[i].V)
		}
	}
	return out
}

// TestMergerTakeRun checks that runs taken up to n items give the
// earliest, and leave the rest, in order, to the next call; that a run
// ends at another queue's head (the lower queue first on equal times)
// and at the end of a queue's ring, and counts what goes out of order.
func TestMergerTakeRun(t *testing.T) {
	m := NewMerger[decode.Record](2, 1000)
	pushTimes(&m, 0, 1, 4, 5)
	pushTimes(&m, 1, 2, 3, 9)
	var got [][]uint64
	for _, n := range []int{2, 0, 2, 5} {
		got = append(got, times(takeN(t, &m, 5, n)))
	}
	want := "[[1 2] [] [3 4] [5]]"
	if s := fmt.Sprint(got); s != want {
		t.Errorf("batches %s, want %s", s, want)
	}
	if m.Pending() != 1 {
		t.Errorf("%d pending, want the one past the watermark", m.Pending())
	}
	var runs []string // each run's queue and times
	run := func(w uint64) {
		var ts []uint64
		items, q := m.TakeRun(w, 100)
		for _, it := range items {
			ts = append(ts, it.Time)
		}
		runs = append(runs, fmt.Sprint(q, ts))
	}
	// Ties: queue 0 goes first, its run ends before queue 1's equal head.
	// A run of no items asked for, or with nothing pending, is queue -1's.
	pushTimes(&m, 0, 9, 9, 12)
	if items, q := m.TakeRun(100, 0); items != nil || q != -1 {
		t.Errorf("run of 0 items: %v of queue %d, want none of queue -1", items, q)
	}
	run(100)
	run(100)
	run(100)
	run(100)
	if s := fmt.Sprint(runs); s != "[0 [9 9] 1 [9] 0 [12] -1 []]" {
		t.Errorf("runs %s, want [0 [9 9] 1 [9] 0 [12] -1 []]", s)
	}
	// A ring that wrapped: the run ends at its storage's end, the next
	// one goes on from its front.
	m = NewMerger[decode.Record](1, 1000)
	for tm := range uint64(minQueue / 2) {
		pushTimes(&m, 0, tm)
	}
	takeN(t, &m, ^uint64(0), minQueue/2)
	for tm := range uint64(minQueue) {
		pushTimes(&m, 0, 100+tm)
	}
	if run, _ := m.TakeRun(^uint64(0), 1000); len(run) != minQueue/2 {
		t.Errorf("run of %d items up to the ring's end, want %d", len(run), minQueue/2)
	}
	if run, _ := m.TakeRun(^uint64(0), 1000); len(run) != minQueue/2 || m.Pending() != 0 {
		t.Errorf("run of %d items from the ring's front, want %d; %d pending", len(run), minQueue/2, m.Pending())
	}
	m = NewMerger[decode.Record](1, 1000)
	pushTimes(&m, 0, 50, 40, 60, 30)
	takeN(t, &m, ^uint64(0), 10)
	if m.Late() != 2 {
		t.Errorf("late %d, want 2 (40 and 30 after 50)", m.Late())
	}
}

// TestMergerRunsRandom checks the runs (TakeRun, in batches of at most n
// as the classic reader takes them) against the merge's rule taken item
// by item (the earliest head, the lower queue on equal times, up to the
// watermark or beyond max): random queues with long runs, ties across
// queues and bounded batches give the same items in the same order, and
// the same count of late ones.
func TestMergerRunsRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 100 {
		nq := 1 + rng.IntN(4)
		maxPending := 1 + rng.IntN(200)
		m, ref := NewMerger[decode.Record](nq, maxPending), NewMerger[decode.Record](nq, maxPending)
		last := make([]uint64, nq)
		var now uint64
		for round := range 20 {
			for range rng.IntN(100) {
				// Runs of one queue; times that often tie across queues,
				// now and then one out of order.
				q := int32(rng.IntN(nq))
				for range 1 + rng.IntN(8) {
					last[q] = max(last[q], now) + uint64(rng.IntN(3))
					tm := last[q]
					if rng.IntN(50) == 0 {
						tm -= min(tm, 5)
					}
					pushTimes(&m, q, tm)
					pushTimes(&ref, q, tm)
				}
			}
			now += uint64(rng.IntN(40))
			watermark := now - min(now, uint64(rng.IntN(60)))
			for {
				n := 1 + rng.IntN(50)
				got := takeN(t, &m, watermark, n)
				var want []decode.Record
				for ref.n > 0 && len(want) < n {
					best := ref.head()
					if q := &ref.queues[best]; q.items[q.first].Time > watermark && ref.n <= ref.max {
						break
					}
					want = append(want, *ref.take(best))
				}
				if !slices.Equal(got, want) {
					t.Fatalf("trial %d round %d: released %v, want %v", trial, round, got, want)
				}
				if m.Late() != ref.Late() {
					t.Fatalf("trial %d round %d: late %d, want %d", trial, round, m.Late(), ref.Late())
				}
				if len(got) < n {
					break
				}
			}
		}
	}
}
