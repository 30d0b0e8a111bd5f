package session

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
)

// The root status lists why the last keepRefused targets were refused,
// oldest first, one quoted line each.
func TestRefusedTargets(t *testing.T) {
	s := newSession(t)
	for i := range keepRefused + 2 {
		name := fmt.Sprint("t", i)
		if _, err := s.AddTarget(name, fmt.Sprintf("/nonexistent/%d\nx", i)); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("AddTarget of a missing file: %v, want ENOENT", err)
		}
	}
	var got []string
	for _, l := range strings.Split(string(s.Status()), "\n") {
		if r, ok := strings.CutPrefix(l, "refused target: "); ok {
			got = append(got, r)
		}
	}
	if len(got) != keepRefused {
		t.Fatalf("%d refused targets listed, want %d:\n%s", len(got), keepRefused, s.Status())
	}
	for i, r := range got {
		want := fmt.Sprintf("%q -> %q: target t%d: open binary: ", fmt.Sprint("t", i+2), fmt.Sprintf("/nonexistent/%d\nx", i+2), i+2)
		if !strings.HasPrefix(r, want) {
			t.Errorf("line %d = %q, want it to start with %q", i, r, want)
		}
	}
}
