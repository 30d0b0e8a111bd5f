package flow

import (
	"reflect"
	"runtime"
	"testing"
)

// TestBatchPinnedAcrossDrop holds the fast path's batch, whose entries
// refer to runs' edges by words the collector does not see (edgeRef), to
// the pin: a drop while the fast path runs (a Handler's MemoryChanged as it
// reads a batch, a lookup's) keeps the chunks it forgets, so that the
// edges a batch refers to are not freed and reused under it. Without the
// pin the run's edges below are the batch's alone: a collection frees them
// and the allocations after it write over them.
func TestBatchPinnedAcrossDrop(t *testing.T) {
	want := []Edge{{0x1000, 0x2000, BrCond}, {0x2004, 0x3000, BrCall}, {0x3008, 0x4000, BrJump}}
	var c blockCache
	c.init()
	c.pinned = true
	var f fastState
	func() {
		// The block and its run, referred to by the batch alone
		// once the drop forgets them.
		b := c.next(0x1000, Mode64)
		r := c.runs.add(b, &tntRun{pat: 3}, want)
		f.batch[0], f.n = refOf(r.edges), 1
	}()
	c.drop()
	var junk [][]Edge
	for range 4 {
		runtime.GC()
		for range 512 {
			e := make([]Edge, edgeSlabLo)
			for i := range e {
				e[i] = Edge{^uint64(0), ^uint64(0), BrInterrupt}
			}
			junk = append(junk, e)
		}
	}
	got := f.slices()[0]
	if len(got) != len(want) {
		t.Fatalf("batch entry has %d edges, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("edge %d is %+v after a drop and a collection, want %+v", i, got[i], want[i])
		}
	}
	runtime.KeepAlive(junk)
	c.unpin()
	if len(c.old) != 0 {
		t.Errorf("unpin keeps %d chunk lists", len(c.old))
	}
}

// TestNewEvClearsEveryField holds newEv to Event{Kind, IP, HasIP} with the
// time, from an event with every field set, with and without an IP: a field
// newEv leaves set, or hasIP not taken, fails.
func TestNewEvClearsEveryField(t *testing.T) {
	d := New(nil, Options{NoInsns: true})
	v := reflect.ValueOf(&d.qEv).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(7)
		case reflect.Array:
			for j := range f.Len() {
				f.Index(j).SetUint(7)
			}
		case reflect.Interface:
			f.Set(reflect.ValueOf(ErrBadInsn))
		default:
			t.Fatalf("test cannot set Event.%s (%s): add it", v.Type().Field(i).Name, f.Kind())
		}
		if f.IsZero() {
			t.Fatalf("Event.%s left zero", v.Type().Field(i).Name)
		}
	}
	set := d.qEv
	for _, hasIP := range []bool{false, true} {
		d.qEv = set
		got := *d.newEv(EvDisabled, 0x1234, hasIP)
		if want := (Event{Kind: EvDisabled, IP: 0x1234, HasIP: hasIP}); got != want {
			t.Errorf("newEv made %+v, want %+v", got, want)
		}
	}
}

// churnLog is an oldLog whose Handler, in every Edges and Event call,
// drops the decoder's block cache (MemoryChanged) and, every few calls,
// collects and then allocates garbage of the slabs' and chunks' sizes
// before it reads the batch: were a batch entry's edges the edgeRef's
// alone, the collection frees them and the garbage (or, under
// GODEBUG=clobberfree=1, the collector) writes over them.
type churnLog struct {
	oldLog
	// drops counts the drops made while a batch was being handed over.
	drops int
	junk  [][]Edge
}

func (l *churnLog) churn() {
	l.drop()
	if l.calls%64 != 0 {
		return
	}
	runtime.GC()
	l.junk = l.junk[:0]
	for _, n := range []int{edgeSlabLo, edgeSlab, 1, 3, 8} {
		for range 8 {
			e := make([]Edge, n)
			for i := range e {
				e[i] = Edge{^uint64(0), ^uint64(0), BrInterrupt}
			}
			l.junk = append(l.junk, e)
		}
	}
	// A block chunk's size class too: the blocks list the runs.
	runtime.KeepAlive(new([blockChunk]block))
}

func (l *churnLog) Edges(batch [][]Edge) {
	l.churn()
	l.drops++
	l.edgeLog.Edges(batch)
}

func (l *churnLog) Event(e *Event) {
	l.churn()
	l.edgeLog.Event(e)
}

// TestBatchSurvivesHandlerDrops decodes the corpus with a Handler that
// drops the block cache in every call and collects and allocates in every
// 64th (churnLog), and holds the fast path's branches and events to the
// slow path's: the batch's edges (runs', kept walks', the batch's own)
// must outlive drops made while the fast path runs, as blockCache.pinned
// keeps them. Run it with GODEBUG=clobberfree=1 (and -race) to have freed
// memory overwritten.
func TestBatchSurvivesHandlerDrops(t *testing.T) {
	var drops, maxOld int
	for _, ft := range fastCorpus(t) {
		t.Run(ft.name, func(t *testing.T) {
			// A large trace's start: every call drops the cache,
			// so that the decode is a cold one throughout.
			trace := ft.trace[:min(len(ft.trace), 1<<16)]
			opts := Options{NoInsns: true}
			ds, df := New(ft.mem, opts), New(ft.mem, opts)
			ds.fp.off, df.fp.wndAt = true, 0
			for pass := range 2 {
				var slow fullLog
				fast := churnLog{oldLog: oldLog{edgeLog: edgeLog{t: t}, d: df}}
				ds.c, df.c = Counters{}, Counters{}
				ds.Decode(trace, &slow)
				df.Decode(trace, &fast)
				if df.cache.pinned || len(df.cache.old) != 0 {
					t.Errorf("pass %d: the cache is left pinned (%v) with %d chunk lists kept", pass, df.cache.pinned, len(df.cache.old))
				}
				maxOld = max(maxOld, fast.maxOld)
				drops += fast.drops
				sameLogs(t, pass, ds, df, &slow, &fast.fullLog)
			}
		})
	}
	if drops == 0 {
		t.Errorf("no batch was handed over: the drops went untested")
	}
	t.Logf("%d drops while a batch was handed over; old held at most %d chunk lists", drops, maxOld)
}

// sameWithDrops decodes trace twice on two decoders, one on the slow path,
// the other on the fast path with a Handler that drops the block cache in
// every call (oldLog: the kernel goes on in old blocks), and holds them to
// the same log and counters each pass; it returns the batches the fast
// path handed over in each pass.
func sameWithDrops(t *testing.T, mem Memory, trace []byte) (calls [2]int) {
	t.Helper()
	ds, df := New(mem, Options{NoInsns: true}), New(mem, Options{NoInsns: true})
	ds.fp.off, df.fp.wndAt = true, 0
	for pass := range calls {
		var slow fullLog
		fast := oldLog{edgeLog: edgeLog{t: t}, d: df}
		ds.c, df.c = Counters{}, Counters{}
		ds.Decode(trace, &slow)
		df.Decode(trace, &fast)
		sameLogs(t, pass, ds, df, &slow, &fast.fullLog)
		calls[pass] = fast.calls
	}
	return calls
}

// oldLog is an edgeLog whose Edges drops the block cache and notes how
// many chunk lists the cache keeps for the batch.
type oldLog struct {
	edgeLog
	d      *Decoder
	calls  int
	maxOld int
}

// drop drops the block cache as a Handler's MemoryChanged does.
func (l *oldLog) drop() {
	l.d.MemoryChanged()
	l.calls++
	l.maxOld = max(l.maxOld, len(l.d.cache.old))
}

func (l *oldLog) Edges(batch [][]Edge) {
	l.drop()
	l.edgeLog.Edges(batch)
}

// TestPinnedDropsBounded: a Handler that drops the block cache in every
// Edges call while the fast path goes round a loop it already decoded
// (its blocks kept, no block decoded again) has the cache keep no more for
// the batch: a drop keeps only chunks, not a list for each drop.
func TestPinnedDropsBounded(t *testing.T) {
	mem, trace := loopTrace(20000)
	d := New(mem, Options{NoInsns: true})
	h := oldLog{edgeLog: edgeLog{t: t}, d: d}
	d.Decode(trace, &h)
	if h.calls < 100 {
		t.Fatalf("%d batches handed over: the drops went untested", h.calls)
	}
	if h.maxOld > 2 {
		t.Errorf("the cache kept %d chunk lists over %d drops of a loop decoded once", h.maxOld, h.calls)
	}
	if d.Counters().Errors != 0 {
		t.Errorf("counters %+v", d.Counters())
	}
}
