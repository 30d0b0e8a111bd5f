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

// TestNewEvClearsEveryField holds newEv, which writes an event field by
// field, to Event{Kind, IP, HasIP} with the time: a field added to Event
// and not to newEv stays set here and fails.
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
	got := *d.newEv(EvDisabled, 0x1234, false)
	if want := (Event{Kind: EvDisabled, IP: 0x1234}); got != want {
		t.Errorf("newEv made %+v, want %+v", got, want)
	}
}
