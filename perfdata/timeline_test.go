package perfdata

import (
	"encoding/binary"
	"reflect"
	"testing"
)

func TestTimeline(t *testing.T) {
	ev := func(time uint64, name string) Event { return Event{Kind: Comm, Time: time, HasTime: true, Name: name} }
	tests := []struct {
		name string
		push []Event
		// now are the times Next is asked at, in turn; want the names
		// each gives (one string per call, "" for none).
		now  []uint64
		want []string
	}{
		{"in order", []Event{ev(1, "a"), ev(2, "b"), ev(3, "c")}, []uint64{0, 1, 1, 3, 3, 3}, []string{"", "a", "", "b", "c", ""}},
		{"out of order", []Event{ev(3, "c"), ev(1, "a"), ev(2, "b")}, []uint64{5, 5, 5, 5}, []string{"a", "b", "c", ""}},
		{"equal times keep their order", []Event{ev(2, "x"), ev(1, "a"), ev(2, "y"), ev(2, "z")}, []uint64{2, 2, 2, 2}, []string{"a", "x", "y", "z"}},
		{"no time is due at once", []Event{ev(5, "late"), {Kind: Comm, Name: "untimed"}}, []uint64{0, 4, 5}, []string{"untimed", "", "late"}},
		{"empty", nil, []uint64{0, ^uint64(0)}, []string{"", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tl Timeline
			for _, e := range tt.push {
				tl.Push(e)
			}
			var got []string
			for _, now := range tt.now {
				e, ok := tl.Next(now)
				if ok != (e.Name != "" || e.Kind != 0) {
					t.Fatalf("Next(%d): %+v, %v", now, e, ok)
				}
				got = append(got, e.Name)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestTimelineLong pushes and takes many events: the queue's memory is
// what waits, not what went through it.
func TestTimelineLong(t *testing.T) {
	var tl Timeline
	for i := range uint64(100000) {
		tl.Push(Event{Time: i, HasTime: true})
		tl.Push(Event{Time: i, HasTime: true})
		for range 2 {
			if e, ok := tl.Next(i); !ok || e.Time != i {
				t.Fatalf("at %d: %+v, %v", i, e, ok)
			}
		}
	}
	if tl.Len() != 0 || cap(tl.evs) > 1024 {
		t.Errorf("%d left, %d held", tl.Len(), cap(tl.evs))
	}
}

// TestFileTimeline: a buffer's timeline has every process's events and its
// own CPU's switches, AUX and LOST records, in time order, with the times,
// CPUs and tasks of their sample_id trailers.
func TestFileTimeline(t *testing.T) {
	const st = sampleTID | sampleTime | sampleCPU | sampleIdentifier
	trailer := func(pid, tid uint32, time uint64, cpu uint32) []byte {
		b := binary.LittleEndian.AppendUint32(nil, pid)
		b = binary.LittleEndian.AppendUint32(b, tid)
		b = append(b, u64s(time)...)
		b = binary.LittleEndian.AppendUint32(b, cpu)
		b = binary.LittleEndian.AppendUint32(b, 0)
		return append(b, u64s(42)...)
	}
	var b builder
	b.rec(recComm, append(append(u32s(100, 100), pad8("a")...), trailer(100, 100, 10, 1)...), nil)
	b.rec(recItraceStart, append(u32s(100, 100), trailer(100, 100, 11, 0)...), nil)
	b.rec(recItraceStart, append(u32s(300, 300), trailer(300, 300, 11, 1)...), nil)
	b.auxtrace(0, 0, -1, 0, []byte("pt"))
	b.auxtrace(0, 1, -1, 1, []byte("pt"))
	// Out of time order in the file, as per-CPU rings are written.
	b.rec(recSwitchCPUWide, append(u32s(200, 201), trailer(200, 201, 30, 0)...), nil)
	b.recMisc(recSwitchCPUWide, miscSwitchOut, append(u32s(200, 201), trailer(100, 100, 20, 0)...))
	b.rec(recAux, append(u64s(0, 2, AuxTruncated), trailer(200, 201, 40, 0)...), nil)
	b.rec(recLost, append(u64s(1, 5), trailer(0, 0, 50, 1)...), nil)
	f, err := Parse(b.pipe(st))
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		kind     Kind
		time     uint64
		cpu      int32
		pid, tid int32
		out      bool
	}
	want := [][]row{
		{{Comm, 10, 1, 100, 100, false}, {ItraceStart, 11, 0, 100, 100, false}, {Switch, 20, 0, 200, 201, true}, {Switch, 30, 0, 200, 201, false}, {Aux, 40, 0, 200, 201, false}},
		{{Comm, 10, 1, 100, 100, false}, {ItraceStart, 11, 1, 300, 300, false}, {Lost, 50, 1, 0, 0, false}},
	}
	for i, buf := range f.Buffers {
		tl := f.Timeline(buf)
		var got []row
		for {
			e, ok := tl.Next(^uint64(0))
			if !ok {
				break
			}
			if !e.HasTime {
				t.Errorf("buffer %d: %+v has no time", i, e)
			}
			got = append(got, row{e.Kind, e.Time, e.CPU, e.PID, e.TID, e.Out})
		}
		if !reflect.DeepEqual(got, want[i]) {
			t.Errorf("buffer %d (cpu %d):\n got %v\nwant %v", i, buf.CPU, got, want[i])
		}
	}
}
