package flow

import (
	"reflect"
	"testing"

	"ptfs/decode/ptenc"
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

// TestRunLongest holds the longest run (each of its runBits bits behind
// runJumps calls that push, 102 edges and 96 return addresses: the most a
// run's walk writes into tmp by index) to the slow path's flow, and to
// being kept whole.
func TestRunLongest(t *testing.T) {
	var code []byte
	for range runBits {
		for range runJumps {
			code = append(code, 0xe8, 2, 0, 0, 0, 0x66, 0x90) // call over a nop: pushes
		}
		code = append(code, 0x74, 2, 0x66, 0x90) // je over a nop
	}
	code = append(code, 0xc3) // ret: the flow waits for trace
	mem := &blob{base: 0x1000, code: code}
	e := ptenc.New()
	start(e, 0x1000)
	e.TNT(1<<runBits-1, runBits)
	sameFast(t, mem, e.Bytes(), Options{})
	d := New(mem, Options{NoInsns: true})
	d.Decode(e.Bytes(), &counter{})
	b := d.cache.known(0x1000, Mode64)
	if b == nil || b.runs == nil {
		t.Fatal("no run kept from the first block")
	}
	r := b.runs
	if len(r.edges) != runBits*(runJumps+1) || int(r.nrets) != runBits*runJumps || r.used != runBits {
		t.Errorf("run of %d edges, %d return addresses, %d bits; want %d, %d, %d",
			len(r.edges), r.nrets, r.used, runBits*(runJumps+1), runBits*runJumps, runBits)
	}
	if rets := r.rets(); rets[0].From != 0x1005 || rets[len(rets)-1].From != 0x1000+uint64(len(code))-1-4-2 {
		t.Errorf("return addresses %#x ... %#x", rets[0].From, rets[len(rets)-1].From)
	}
}
