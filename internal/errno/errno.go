// Package errno makes sentinel errors that carry the errno the FUSE layer
// returns for them, so that callers use errors.Is with the sentinel and
// errors.As with syscall.Errno on the same error.
package errno

import "syscall"

type sentinel struct {
	msg   string
	errno syscall.Errno
}

func (e *sentinel) Error() string { return e.msg }

func (e *sentinel) Unwrap() error { return e.errno }

// New returns a sentinel error with text msg that unwraps to e.
func New(msg string, e syscall.Errno) error { return &sentinel{msg, e} }
