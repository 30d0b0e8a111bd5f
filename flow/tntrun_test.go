package flow

import (
	"reflect"
	"testing"
)

// TestRunAddKeepsEveryField holds runCache.add, which copies a run field by
// field, to keeping every field: one added to tntRun and not to add fails
// here.
func TestRunAddKeepsEveryField(t *testing.T) {
	var c runCache
	b := &block{ip: 0x1000}
	end := &block{ip: 0x2000}
	r := tntRun{end: end, errIP: 0x1234, insns: 1, pre: 2, post: 3, steps: 4, used: 5, bit: true, pat: 6, nrets: 1}
	// Every field of r set: reflect sees a zero one (but the links add
	// sets, and the padding).
	v := reflect.ValueOf(r)
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		if name != "edges" && name != "next" && name != "_" && v.Field(i).IsZero() {
			t.Fatalf("test run leaves %s zero: set it", name)
		}
	}
	edges := []Edge{{From: 1, To: 2, Kind: BrCond}, {From: 3}}
	kept := c.add(b, &r, edges)
	want := r
	want.edges = edges[:1]
	if !reflect.DeepEqual(*kept, want) {
		t.Errorf("kept %+v, want %+v", *kept, want)
	}
	if got := kept.rets(); len(got) != 1 || got[0].From != 3 {
		t.Errorf("rets %v", got)
	}
	if b.runs != kept {
		t.Error("block does not list the run")
	}
	second := c.add(b, &r, edges)
	if b.runs != second || second.next != kept {
		t.Error("second run not listed first, before the first")
	}
}
