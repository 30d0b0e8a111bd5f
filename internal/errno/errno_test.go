package errno

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

func TestNew(t *testing.T) {
	a, b := New("a", syscall.EINVAL), New("b", syscall.EINVAL)
	err := fmt.Errorf("context: %w", a)
	var e syscall.Errno
	if !errors.As(err, &e) || e != syscall.EINVAL {
		t.Errorf("errno %v, want EINVAL", e)
	}
	if !errors.Is(err, a) || !errors.Is(err, syscall.EINVAL) || errors.Is(err, b) {
		t.Errorf("errors.Is on %v: a %v, EINVAL %v, b %v", err, errors.Is(err, a), errors.Is(err, syscall.EINVAL), errors.Is(err, b))
	}
	if a.Error() != "a" {
		t.Errorf("text %q", a.Error())
	}
}
