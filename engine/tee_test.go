package engine

import (
	"errors"
	"testing"

	"ptfs/perfdata"
)

// logSink records the calls it gets, in order.
type logSink struct{ calls []string }

func (l *logSink) TimeConv(int, perfdata.TimeConv) { l.calls = append(l.calls, "timeconv") }
func (l *logSink) Trace(_ int, data []byte)        { l.calls = append(l.calls, "trace "+string(data)) }
func (l *logSink) Loss(int, LossKind, uint64)      { l.calls = append(l.calls, "loss") }
func (l *logSink) Side(_ int, ev *SideEvent)       { l.calls = append(l.calls, "side") }
func (l *logSink) Round(flush bool) {
	if flush {
		l.calls = append(l.calls, "flush")
	} else {
		l.calls = append(l.calls, "round")
	}
}

// TestTee passes every call of a source to both sinks, the Start's first.
func TestTee(t *testing.T) {
	src := &stepSource{}
	var a, b logSink
	tee := Tee(src, &b)
	if err := tee.Start(&a); err != nil {
		t.Fatal(err)
	}
	src.sink.TimeConv(0, perfdata.TimeConv{})
	src.sink.Trace(1, []byte("x"))
	src.sink.Loss(1, LossHole, 1)
	src.sink.Side(1, &SideEvent{})
	if err := tee.Stop(); err != nil {
		t.Fatal(err)
	}
	want := []string{"timeconv", "trace x", "loss", "side", "flush"}
	for _, l := range []*logSink{&a, &b} {
		if len(l.calls) != len(want) {
			t.Fatalf("calls %q, want %q", l.calls, want)
		}
		for i := range want {
			if l.calls[i] != want[i] {
				t.Fatalf("calls %q, want %q", l.calls, want)
			}
		}
	}
	if src.starts != 1 || src.stops != 1 {
		t.Errorf("starts %d stops %d", src.starts, src.stops)
	}
}

// TestPTWKeep: Keep(true) runs the source without events (the live
// branches of ptw mode), the last Remove then only flushes, Keep(false)
// stops it once no event is left, and a failed start is reported.
func TestPTWKeep(t *testing.T) {
	p, src, _, _ := newTestPTW(t, PTWOptions{})
	if err := p.Keep(true); err != nil || src.starts != 1 {
		t.Fatalf("keep: %v, %d starts", err, src.starts)
	}
	if err := p.Add(evA); err != nil || src.starts != 1 {
		t.Fatalf("add while kept: %v, %d starts", err, src.starts)
	}
	if err := p.Remove(evA.ID); err != nil || src.stops != 0 || src.flushes != 1 {
		t.Fatalf("remove while kept: %v, %d stops, %d flushes", err, src.stops, src.flushes)
	}
	if err := p.Add(evA); err != nil {
		t.Fatal(err)
	}
	if err := p.Keep(false); err != nil || src.stops != 0 {
		t.Fatalf("unkeep with an event: %v, %d stops", err, src.stops)
	}
	if err := p.Remove(evA.ID); err != nil || src.stops != 1 {
		t.Fatalf("last remove: %v, %d stops", err, src.stops)
	}
	if err := p.Keep(true); err != nil || src.starts != 2 {
		t.Fatalf("keep again: %v, %d starts", err, src.starts)
	}
	if err := p.Keep(false); err != nil || src.stops != 2 {
		t.Fatalf("unkeep: %v, %d stops", err, src.stops)
	}
	src.startErr = errors.New("busy")
	if err := p.Keep(true); err == nil || src.starts != 2 {
		t.Fatalf("failed start: %v", err)
	}
	if err := p.Add(evA); err == nil {
		t.Fatal("add after a failed keep started nothing and succeeded")
	}
}
