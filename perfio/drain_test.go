package perfio

import (
	"bytes"
	"cmp"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"ptfs/decode"
	"ptfs/engine"

	"golang.org/x/sys/unix"
)

// fakeClassic is a Classic over fake rings, for the read path without a
// kernel: no reader goroutine, no fds.
func fakeClassic(t testing.TB, rings ...*fakeMmap) *Classic {
	c := &Classic{events: make(map[uint16]*classicEvent), merge: engine.NewMerger[held](len(rings), engine.MaxPending), raw: make([]rawQueue, len(rings)),
		comms: engine.NewComms(nil), side: sideParser{idSize: classicIDSize}}
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

// taskRecord is a COMM (with comm) or EXIT record of a task ring at time,
// with classicSampleType's sample_id trailer.
func taskRecord(typ uint32, time uint64, pid, tid uint32, comm string) []byte {
	var body []byte
	if typ == 3 { // PERF_RECORD_COMM: pid, tid, comm padded to 8
		body = append(le(4, uint64(pid)), le(4, uint64(tid))...)
		body = append(body, comm...)
		body = append(body, make([]byte, 8-len(comm)%8)...)
	} else { // PERF_RECORD_EXIT: pid, ppid, tid, ptid, time
		body = append(le(4, uint64(pid)), le(4, 1)...)
		body = append(body, le(4, uint64(tid))...)
		body = append(body, le(4, 1)...)
		body = append(body, le(8, 0)...)
	}
	id := append(append(le(4, uint64(pid)), le(4, uint64(tid))...), le(8, time)...)
	return makeRecord(typ, 0, append(append(body, id...), make([]byte, classicIDSize-len(id))...))
}

// TestDrain checks the read path over two CPU rings: samples become
// records in time order with their process and its name, the task ring's
// COMM and EXIT records keep the names, and every other kind of record is
// counted.
func TestDrain(t *testing.T) {
	r0, r1, task0 := newFakeMmap(1024, true), newFakeMmap(1024, true), newFakeMmap(1024, true)
	badSample := pairSample(1, 25, 0, 0, 0)
	badSample[sampleRawOff] = 0xff // raw size beyond the record
	for _, rec := range [][]byte{
		taskRecord(3, 5, 1, 1, "one"),
		taskRecord(3, 6, 2, 3, "thread"), // a thread's own name: not its process's
		makeRecord(3, 0, seq(0, 16)),     // COMM without NUL: an error
	} {
		task0.write(rec)
	}
	for _, rec := range [][]byte{
		pairSample(1, 10, 0, 1, 2),
		lostRecord(5),
		makeSample(1, 1, 15, 0, makeRaw(8, 1, le(8, 0))), // unknown event
		badSample,
		makeSample(1, 1, 26, 0, makeRaw(pairEvent.ID, 1, le(8, 0))), // too short for the event
		makeRecord(3, 0, seq(0, 16)),                                // COMM in the samples' ring: not read
		pairSample(1, 30, 0, 3, 4),
		makeRecord(recordLost, 0, le(8, 1)), // truncated LOST
	} {
		r0.write(rec)
	}
	r1.write(pairSample(2, 20, 1, 5, 6))
	r1.write(pairSample(2, 40, 1, 7, 8))
	r1.write(makeRecord(recordSample, 0, nil)[:4]) // partial header
	c := fakeClassic(t, r0, r1)
	tr, err := NewDataRing(task0.mem, fakePage)
	if err != nil {
		t.Fatal(err)
	}
	c.cpus[0].task = &taskRing{ring: tr}
	c.events[pairEvent.ID] = newClassicEvent(pairEvent)
	c.drainLocked()
	got := releaseAll(c, 35, nil)
	want := []decode.Record{
		{Event: pairEvent, N: 2, Args: [8]uint64{1, 2}, TID: 1, CPU: 0, Time: 10, PID: 1, Comm: "one"},
		{Event: pairEvent, N: 2, Args: [8]uint64{5, 6}, TID: 2, CPU: 1, Time: 20, PID: 2},
		{Event: pairEvent, N: 2, Args: [8]uint64{3, 4}, TID: 1, CPU: 0, Time: 30, PID: 1, Comm: "one"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d: %+v", len(got), len(want), got)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("record %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if got := releaseAll(c, ^uint64(0), nil); len(got) != 1 || got[0].Time != 40 {
		t.Errorf("held back: %+v", got)
	}
	// A LOST record adds nothing (each event counts its own losses, see
	// eventLost); a truncated one is an error.
	if s := c.Stats(); s.Lost != 0 || s.Unknown != 1 || s.Errors != 5 {
		t.Errorf("lost %d unknown %d errors %d, want 0 1 5", s.Lost, s.Unknown, s.Errors)
	}
	// An exit forgets a name, a new process of the pid gets its own, and
	// a lost task record forgets them all.
	for _, rec := range [][]byte{
		taskRecord(4, 50, 1, 1, ""),
		taskRecord(3, 60, 1, 1, "uno"),
		taskRecord(3, 80, 1, 1, "dos"),
	} {
		task0.write(rec)
	}
	r0.write(pairSample(1, 70, 0, 9, 9))
	r0.write(pairSample(1, 90, 0, 9, 9))
	r1.write(pairSample(2, 75, 1, 9, 9))
	c.drainLocked()
	// Each record is named by the events before it, whichever ring.
	got = releaseAll(c, ^uint64(0), nil)
	if len(got) != 3 || got[0].Comm != "uno" || got[1].PID != 2 || got[2].Comm != "dos" {
		t.Errorf("after exit and execs: %+v", got)
	}
	// A process first seen with a rename of it still to come: /proc
	// would give the later name, so none.
	task0.write(taskRecord(3, 200, 7, 7, "later"))
	r0.write(pairSample(7, 100, 0, 9, 9))
	c.drainLocked()
	if got := releaseAll(c, 150, nil); len(got) != 1 || got[0].PID != 7 || got[0].Comm != "" {
		t.Errorf("before a pending rename: %+v", got)
	}
	// %pid and %comm filters drop records, counted apart from losses.
	fev := &decode.Event{ID: 9, Group: "g", Name: "f", Args: pairEvent.Args, Filter: decode.Filter{Comm: "later"}}
	c.events[fev.ID] = newClassicEvent(fev)
	c.lastEv = nil
	r0.write(makeSample(7, 7, 300, 0, makeRaw(fev.ID, 7, le(8, 1), le(8, 2))))
	r0.write(makeSample(8, 8, 310, 0, makeRaw(fev.ID, 8, le(8, 3), le(8, 4))))
	c.drainLocked()
	if got := releaseAll(c, ^uint64(0), nil); len(got) != 1 || got[0].PID != 7 || got[0].Comm != "later" || c.filtered.Load() != 1 {
		t.Errorf("filtered %d: %+v", c.filtered.Load(), got)
	}
	task0.write(makeRecord(recordLost, 0, append(le(8, 77), le(8, 3)...)))
	if c.comms.Len() == 0 {
		t.Fatal("no names before the loss")
	}
	c.drainLocked()
	if c.taskLost.Load() != 3 || c.comms.Len() != 0 {
		t.Errorf("task lost %d, %d names kept, want 3 and none", c.taskLost.Load(), c.comms.Len())
	}
	for i, f := range []*fakeMmap{r0, r1} {
		if f.page.Data_tail != f.page.Data_head {
			t.Errorf("ring %d not released", i)
		}
	}
}

// TestDrainRandom drives the batch copy of the drain (drainSamples: a
// batch copied at once into the raw queue, the samples moved down over
// what is not queued) and the release of the merge's runs through random
// passes: two rings that wrap, samples of the event mixed with LOST
// records, samples of an unknown event and malformed ones, arguments of
// varied lengths (a string: samples of varied sizes), released in
// batches up to a watermark that lags. Every sample comes out once, in
// time order across the rings, with its own arguments, and every other
// record is counted as it was.
func TestDrainRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	strEv := &decode.Event{ID: 7, Group: "g", Name: "s", Args: []decode.Arg{
		{Offset: 16, Size: 8}, {Offset: 24, Size: 4, Type: decode.String},
	}}
	rings := []*fakeMmap{newFakeMmap(1<<15, true), newFakeMmap(1<<15, true)}
	rings[1].reset(1<<15 - 200) // wraps early
	c := fakeClassic(t, rings...)
	c.events[strEv.ID] = newClassicEvent(strEv)
	type want struct {
		time, arg uint64
		str       string
	}
	var pending []want // queued, not released yet
	var unknown, errs uint64
	var out []decode.Record
	now := uint64(1000)
	for round := range 300 {
		for q, f := range rings {
			for range rng.IntN(60) {
				now++
				tm := 2*now + uint64(q) // unique across rings
				switch k := rng.IntN(20); {
				case k == 0:
					f.write(lostRecord(3))
				case k == 1:
					f.write(makeSample(1, 1, tm, uint32(q), makeRaw(8, 1, le(8, 0))))
					unknown++
				case k == 2:
					bad := makeSample(1, 1, tm, uint32(q), makeRaw(strEv.ID, 1, le(8, 0), le(4, 0)))
					bad[sampleRawOff] = 0xff // raw size beyond the record
					f.write(bad)
					errs++
				default:
					str := strings.Repeat("x", rng.IntN(30))
					data := append([]byte(str), 0)
					// __data_loc: offset 28 (after the word and the loc),
					// length with the NUL.
					raw := makeRaw(strEv.ID, 1, le(8, tm), le(4, uint64(28|len(data)<<16)), data)
					f.write(makeSample(1, 1, tm, uint32(q), raw))
					pending = append(pending, want{tm, tm, str + "\x00"})
				}
			}
		}
		c.drainLocked()
		slices.SortFunc(pending, func(a, b want) int { return cmp.Compare(a.time, b.time) })
		watermark := 2*now - min(2*now, uint64(rng.IntN(200)))
		if round == 299 {
			watermark = ^uint64(0)
		}
		for more := true; more; {
			out, more = c.releaseLocked(watermark, out[:0])
			for i := range out {
				r := &out[i]
				if len(pending) == 0 {
					t.Fatalf("round %d: released %+v, none pending", round, r)
				}
				w := pending[0]
				pending = pending[1:]
				if r.Time != w.time || r.Args[0] != w.arg || r.CPU != int32(w.time%2) {
					t.Fatalf("round %d: released time %d arg %d cpu %d, want time %d arg %d", round, r.Time, r.Args[0], r.CPU, w.time, w.arg)
				}
				// The string's bytes, copied from the sample into the
				// record's own storage: the one string of the record.
				if r.Data == nil {
					t.Fatalf("round %d: time %d: no string, want %q", round, w.time, w.str)
				}
				if string(*r.Data) != w.str {
					t.Fatalf("round %d: time %d: string %q, want %q", round, w.time, *r.Data, w.str)
				}
			}
		}
		if len(pending) > 0 && pending[0].time <= watermark {
			t.Fatalf("round %d: time %d held past watermark %d", round, pending[0].time, watermark)
		}
	}
	if len(pending) != 0 {
		t.Errorf("%d samples never released", len(pending))
	}
	if s := c.Stats(); s.Unknown != unknown || s.Errors != errs || s.Late != 0 {
		t.Errorf("unknown %d errors %d late %d, want %d %d 0", s.Unknown, s.Errors, s.Late, unknown, errs)
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

// TestDrainTasksOrder: the task events of several CPUs are applied in
// time order, across the rings and across drains.
func TestDrainTasksOrder(t *testing.T) {
	r0, r1 := newFakeMmap(1024, true), newFakeMmap(1024, true)
	t0, t1 := newFakeMmap(1024, true), newFakeMmap(1024, true)
	t0.write(taskRecord(3, 10, 1, 1, "a"))
	t0.write(taskRecord(3, 30, 1, 1, "c"))
	t1.write(taskRecord(3, 20, 1, 1, "b"))
	c := fakeClassic(t, r0, r1)
	for i, m := range []*fakeMmap{t0, t1} {
		tr, err := NewDataRing(m.mem, fakePage)
		if err != nil {
			t.Fatal(err)
		}
		c.cpus[i].task = &taskRing{ring: tr}
	}
	c.drainLocked()
	t1.write(taskRecord(3, 25, 1, 1, "b2"))
	c.drainLocked()
	var got []string
	for _, e := range c.tasks {
		got = append(got, e.comm)
	}
	if want := []string{"a", "b", "b2", "c"}; !slices.Equal(got, want) {
		t.Errorf("task events %q, want %q", got, want)
	}
}

// TestDrainNoAlloc checks that the steady-state read path (naming the
// records included) does not allocate.
func TestDrainNoAlloc(t *testing.T) {
	f := newFakeMmap(1<<16, true)
	f.reset(1 << 15) // the samples wrap around the end
	n := fillRing(f)
	c := fakeClassic(t, f)
	c.events[pairEvent.ID] = newClassicEvent(pairEvent)
	var out []decode.Record
	round := func() {
		f.page.Data_tail = 1 << 15
		c.drainLocked()
		out = releaseAll(c, ^uint64(0), out[:0])
	}
	round() // grow the buffers once
	if len(out) != n {
		t.Fatalf("%d records, want %d", len(out), n)
	}
	if a := testing.AllocsPerRun(20, round); a != 0 {
		t.Errorf("%v allocations per round of %d records", a, n)
	}
}

// BenchmarkDrain measures the sample parse, merge and naming path per
// record: two CPUs' rings whose samples alternate (every record a change
// of queue), and the samples of one CPU beside an idle one (a traced
// thread that stays on its CPU: the merge's runs).
func BenchmarkDrain(b *testing.B) {
	for _, bc := range []struct {
		name  string
		rings int
	}{{"alternate", 2}, {"one-cpu", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			f := []*fakeMmap{newFakeMmap(1<<20, true), newFakeMmap(1<<20, true)}
			n := 0
			for _, m := range f[:bc.rings] {
				n += fillRing(m)
			}
			c := fakeClassic(b, f...)
			c.events[pairEvent.ID] = newClassicEvent(pairEvent)
			var out []decode.Record
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				f[0].page.Data_tail, f[1].page.Data_tail = 0, 0
				c.drainLocked()
				out = releaseAll(c, ^uint64(0), out[:0])
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
			if len(out) != n {
				b.Fatalf("%d records, want %d", len(out), n)
			}
		})
	}
}

// pushRaw puts rec into b as drainSamples puts a batch's samples: in a
// room with extra bytes (a LOST record after it, say) that commit leaves
// out.
func pushRaw(b *rawQueue, rec []byte, extra int) {
	room := b.room(len(rec) + 8*extra)
	for i := range room {
		room[i] = 0xee // what commit leaves out must not come out
	}
	copy(room, rec)
	b.commit(len(rec))
	b.commit(0) // a batch of nothing kept
}

// TestRawQueue checks the held samples' byte queue: samples come out in
// the order they went in, byte for byte, and under a steady backlog the
// buffer stays within four times what is held, or one huge page (growth
// by doubling, the front reused once taken); a room's bytes beyond what
// is committed are not held. A backlog beyond the first buffer (a busy
// CPU's) is held in a mapping aligned to huge pages (rawBuffer), which
// free unmaps.
func TestRawQueue(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backlog int // samples held
		mapped  bool
	}{
		{"heap", 300, false},     // within minRawQueue
		{"one-page", 2000, true}, // beyond it: one huge page
		{"mapped", 40000, true},  // about 3.5 MB held
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b rawQueue
			defer b.free()
			total := tc.backlog * 10
			rec := func(i int) []byte {
				// Sizes that vary (take finds each in its header), so
				// that samples meet the end of the buffer at every
				// offset.
				return makeSample(uint32(i), uint32(i), uint64(i), 0, makeRaw(7, int32(i), le(8, uint64(i)), make([]byte, 8*(i%7))))
			}
			var maps [][]byte // every mapping the queue had
			for i := range total {
				pushRaw(&b, rec(i), i%3)
				if b.mem != nil && (len(maps) == 0 || unsafe.SliceData(maps[len(maps)-1]) != unsafe.SliceData(b.mem)) {
					maps = append(maps, b.mem)
				}
				if i < tc.backlog {
					continue
				}
				k := i - tc.backlog
				if got, want := b.take(), rec(k); string(got) != string(want) {
					t.Fatalf("sample %d: %x, want %x", k, got, want)
				}
			}
			var want, got []byte
			for k := total - tc.backlog; k < total; k++ {
				want = append(want, rec(k)...)
				got = append(got, b.take()...)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the %d samples held came out wrong", tc.backlog)
			}
			if c := len(b.buf); c > max(4*len(want), hugePage) {
				t.Errorf("buffer grew to %d bytes for a backlog of %d bytes", c, len(want))
			}
			at := uintptr(unsafe.Pointer(unsafe.SliceData(b.buf)))
			if mapped := b.mem != nil; mapped != tc.mapped || mapped && (at%hugePage != 0 || len(b.buf)%hugePage != 0) {
				t.Errorf("buffer of %d bytes at %#x mapped %v, want mapped %v (whole huge pages)", len(b.buf), at, mapped, tc.mapped)
			}
			// A steady flow reuses the buffer: no new one, no byte moved.
			buf := unsafe.SliceData(b.buf)
			for i := range total {
				pushRaw(&b, rec(i), 0)
				if i >= tc.backlog {
					b.take()
				}
			}
			if unsafe.SliceData(b.buf) != buf {
				t.Errorf("a steady flow of the same backlog made a new buffer")
			}
			// A buffer the queue grew out of is unmapped, and free
			// unmaps the last.
			for i, m := range maps[:max(len(maps)-1, 0)] {
				if isMapped(m) {
					t.Errorf("mapping %d of %d bytes left mapped after the queue grew", i, len(m))
				}
			}
			b.free()
			if len(maps) > 0 && isMapped(maps[len(maps)-1]) {
				t.Errorf("mapping of %d bytes left mapped after free", len(maps[len(maps)-1]))
			}
		})
	}
}

// isMapped tells whether any page of m is mapped (mincore fails with
// ENOMEM for a range with unmapped pages; only m's first page is asked).
func isMapped(m []byte) bool {
	page := uintptr(unsafe.Pointer(unsafe.SliceData(m))) &^ 4095
	var vec [1]byte
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, page, 4096, uintptr(unsafe.Pointer(&vec[0])))
	return errno == 0
}

// TestHugeAligned checks the aligned range rawBuffer takes in its mapping,
// for mappings at every kind of address (a kernel before 6.7 does not
// align them; this one does, so they are made here from one buffer).
func TestHugeAligned(t *testing.T) {
	const size = 2 * hugePage
	backing := make([]byte, size+3*hugePage)
	for _, at := range []int{0, 1, 4096, hugePage - 4096, hugePage - 1, hugePage, hugePage + 8192} {
		mem := backing[at : at+size+hugePage]
		buf := hugeAligned(mem, size)
		start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
		got := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
		if got%hugePage != 0 || got < start || got-start >= hugePage || len(buf) != size || cap(buf) != size {
			t.Errorf("mapping at %#x: %d bytes (cap %d) at %#x, want %d at the first huge page boundary", start, len(buf), cap(buf), got, size)
		}
	}
}

// TestRawBuffer checks the raw queue's buffers: up to minRawQueue bytes
// on the Go heap, exactly as asked; beyond, whole huge pages (the fewest
// that hold the size), at a huge page's address, inside their mapping,
// writable to their last byte.
func TestRawBuffer(t *testing.T) {
	for _, tc := range []struct {
		size, want int
		mapped     bool
	}{
		{100, 100, false},
		{minRawQueue, minRawQueue, false},
		{minRawQueue + 1, hugePage, true},
		{hugePage - 1, hugePage, true},
		{hugePage, hugePage, true},
		{hugePage + 1, 2 * hugePage, true},
		{3 * hugePage, 3 * hugePage, true},
	} {
		buf, mem := rawBuffer(tc.size)
		b := rawQueue{buf: buf, mem: mem}
		at := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
		start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
		inside := mem == nil || at >= start && at+uintptr(len(buf)) <= start+uintptr(len(mem))
		if len(buf) != tc.want || cap(buf) != tc.want || (mem != nil) != tc.mapped || tc.mapped && at%hugePage != 0 || !inside {
			t.Errorf("size %d: %d bytes (cap %d) at %#x, mapping of %d at %#x; want %d bytes, mapped %v, aligned to %d",
				tc.size, len(buf), cap(buf), at, len(mem), start, tc.want, tc.mapped, hugePage)
		}
		buf[len(buf)-1] = 1
		b.free()
	}
}

// TestDrainRemoved checks that a sample queued before its event was
// removed (Remove drains, forgets the event, then flushes) is released
// with its event, and one read after the removal counts as unknown.
func TestDrainRemoved(t *testing.T) {
	f := newFakeMmap(1024, true)
	c := fakeClassic(t, f)
	c.events[pairEvent.ID] = newClassicEvent(pairEvent)
	f.write(pairSample(1, 10, 0, 1, 2))
	c.drainLocked()
	delete(c.events, pairEvent.ID)
	c.lastEv = nil
	f.write(pairSample(1, 20, 0, 3, 4))
	c.drainLocked()
	got := releaseAll(c, ^uint64(0), nil)
	if len(got) != 1 || got[0].Event != pairEvent || got[0].Args[0] != 1 || c.unknown.Load() != 1 {
		t.Errorf("released %+v, unknown %d; want the first sample, one unknown", got, c.unknown.Load())
	}
}

// releaseAll releases every batch that watermark lets out, appended to out.
func releaseAll(c *Classic, watermark uint64, out []decode.Record) []decode.Record {
	for more := true; more; {
		out, more = c.releaseLocked(watermark, out)
	}
	return out
}

// TestReleaseBatches checks that a release of more than maxBatch records
// goes out in batches of maxBatch, in time order across the batches, and
// that the watermark's task events wait for the last batch.
func TestReleaseBatches(t *testing.T) {
	f0, f1 := newFakeMmap(1<<16, true), newFakeMmap(1<<16, true)
	n := 0
	for tm := uint64(1); ; tm++ {
		rec := pairSample(1, 2*tm, 0, tm, 0)
		if f0.page.Data_head+uint64(len(rec)) > uint64(len(f0.data)) {
			break
		}
		f0.write(rec)
		f1.write(pairSample(2, 2*tm+1, 1, tm, 0))
		n += 2
	}
	if n <= maxBatch {
		t.Fatalf("%d samples, want more than %d", n, maxBatch)
	}
	c := fakeClassic(t, f0, f1)
	c.events[pairEvent.ID] = newClassicEvent(pairEvent)
	c.tasks = []taskEvent{{time: 1 << 40, pid: 5, comm: "x"}}
	c.drainLocked()
	var last uint64
	got := 0
	for i := 0; ; i++ {
		out, more := c.releaseLocked(1<<41, nil)
		if more && len(out) != maxBatch {
			t.Fatalf("batch %d: %d records with more to come, want %d", i, len(out), maxBatch)
		}
		for _, r := range out {
			if r.Time <= last {
				t.Fatalf("batch %d: time %d after %d", i, r.Time, last)
			}
			last = r.Time
		}
		got += len(out)
		if more != (len(c.tasks) == 1) {
			t.Fatalf("batch %d: more %v with %d task events left", i, more, len(c.tasks))
		}
		if !more {
			break
		}
	}
	if got != n {
		t.Errorf("%d records, want %d", got, n)
	}
}

// FuzzDrain drains arbitrary ring contents and positions through the
// batch copy (drainSamples): it must neither panic nor loop, must release
// the whole batch to the kernel, and every sample it holds must come out
// once, leaving the byte queue empty.
func FuzzDrain(f *testing.F) {
	f.Add(append(pairSample(1, 10, 0, 1, 2), lostRecord(3)...), uint64(0), uint64(88))
	f.Add(append(lostRecord(3), pairSample(1, 10, 0, 1, 2)...), uint64(500), uint64(588))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0xff, 0xff}, uint64(250), uint64(1<<40))
	f.Fuzz(func(t *testing.T, data []byte, tail, head uint64) {
		m := newFakeMmap(512, true)
		copy(m.data, data)
		m.page.Data_tail, m.page.Data_head = tail, head
		c := fakeClassic(t, m)
		c.events[pairEvent.ID] = newClassicEvent(pairEvent)
		c.drainLocked()
		if m.page.Data_tail != head {
			t.Fatalf("tail %d, head %d after the drain", m.page.Data_tail, head)
		}
		held := c.merge.Pending()
		got := releaseAll(c, ^uint64(0), nil)
		if len(got) > held || c.merge.Pending() != 0 {
			t.Fatalf("%d records out of %d held, %d pending", len(got), held, c.merge.Pending())
		}
		if q := &c.raw[0]; q.r != q.w || q.wrap != 0 {
			t.Fatalf("byte queue not empty after the release: r %d w %d wrap %d", q.r, q.w, q.wrap)
		}
	})
}

// TestDrainGrowConcurrent runs the drain and the release as Classic's
// goroutines do: samples drained into the raw queue under mu by one
// goroutine (as Add, Remove and Stats drain) while another releases them
// under mu and reads the batch without it (as run hands it to the sink).
// The watermark lags by half of what was written, so the backlog grows to
// megabytes and the queue through buffers that grow unmaps: a released
// record that still pointed into a raw queue (its string, say) would be
// read after its buffer was unmapped (a SIGSEGV) or overwritten (a wrong
// string). Run with -race too.
func TestDrainGrowConcurrent(t *testing.T) {
	strEv := &decode.Event{ID: 7, Group: "g", Name: "s", Args: []decode.Arg{
		{Offset: 16, Size: 8}, {Offset: 24, Size: 4, Type: decode.String},
	}}
	const total = 120000
	ring := newFakeMmap(1<<20, true)
	ring.reset(1<<20 - 100) // a sample across the ring's end at once
	c := fakeClassic(t, ring)
	defer c.raw[0].free()
	c.events[strEv.ID] = newClassicEvent(strEv)
	str := func(tm uint64) string { return strings.Repeat("abcdefghij", int(tm%7)) + "\x00" }
	var written atomic.Uint64 // times of the samples drained: 1 to written
	var drains atomic.Uint64  // drains done
	var grown []int           // the raw queue's buffer sizes, as drains saw them
	done := make(chan struct{})
	go func() {
		defer close(done)
		tm := uint64(0)
		for tm < total {
			// Fill the free part of the ring, then drain it.
			for tm < total {
				data := []byte(str(tm + 1))
				raw := makeRaw(strEv.ID, 1, le(8, tm+1), le(4, uint64(28|len(data)<<16)), data)
				rec := makeSample(1, 1, tm+1, 0, raw)
				if tm%50 == 0 {
					rec = append(lostRecord(1), rec...) // moved down over it
				}
				if ring.page.Data_head+uint64(len(rec))-atomic.LoadUint64(&ring.page.Data_tail) > uint64(len(ring.data)) {
					break
				}
				ring.write(rec)
				tm++
			}
			c.mu.Lock()
			c.drainLocked()
			drains.Add(1)
			if n := len(c.raw[0].buf); len(grown) == 0 || grown[len(grown)-1] != n {
				grown = append(grown, n)
			}
			c.mu.Unlock()
			written.Store(tm)
		}
	}()
	var out []decode.Record
	next := uint64(1)
	for next <= total {
		w := written.Load()
		watermark := w - w/2
		if w == total {
			watermark = ^uint64(0)
		}
		c.mu.Lock()
		out, _ = c.releaseLocked(watermark, out[:0])
		d := drains.Load()
		c.mu.Unlock()
		// Read without mu, after the next drain (which writes over the
		// bytes taken or grows the queue), unless it was the last.
		for len(out) > 0 && drains.Load() == d && written.Load() < total {
			runtime.Gosched()
		}
		for i := range out {
			r := &out[i]
			if r.Time != next || r.Args[0] != next || r.Data == nil || string(*r.Data) != str(next) {
				t.Fatalf("record %d: time %d arg %d %+v", next, r.Time, r.Args[0], r)
			}
			next++
		}
		if e := c.errs.Load(); e != 0 {
			<-done
			t.Fatalf("%d errors in the release, at record %d", e, next)
		}
		if len(out) == 0 {
			runtime.Gosched()
		}
	}
	<-done
	if c.merge.Pending() != 0 || c.errs.Load() != 0 {
		t.Errorf("%d pending, %d errors after all were released", c.merge.Pending(), c.errs.Load())
	}
	// The backlog reached megabytes: the queue grew into mapped buffers.
	if n := grown[len(grown)-1]; n < 2*hugePage || c.raw[0].mem == nil {
		t.Errorf("raw queue buffers %v, want one of two huge pages or more, mapped", grown)
	}
	t.Logf("raw queue buffers %v", grown)
}
