package testkit

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// fatalTB records Bounded's failure and ends its goroutine, as a
// testing.T's Fatalf does.
type fatalTB struct {
	testing.TB
	msg string
}

func (t *fatalTB) Helper() {}

func (t *fatalTB) Fatalf(format string, args ...any) {
	t.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestBounded: Bounded fails code that spins past its CPU time, and not
// code that takes longer than that in wall time without using the CPU (a
// thread kept off the CPU by the machine's load is the same to it).
func TestBounded(t *testing.T) {
	var stop atomic.Bool
	defer stop.Store(true)
	for _, tc := range []struct {
		name string
		f    func()
		fail bool
	}{
		{"returns", func() {}, false},
		{"sleeps past the limit", func() { time.Sleep(300 * time.Millisecond) }, false},
		{"spins", func() {
			for !stop.Load() {
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &fatalTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				Bounded(ft, 100*time.Millisecond, tc.name, tc.f)
			}()
			<-done
			if failed := ft.msg != ""; failed != tc.fail {
				t.Errorf("failed %v (%q); want %v", failed, ft.msg, tc.fail)
			}
		})
	}
}
