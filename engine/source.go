package engine

import (
	"errors"

	"ptfs/decode"
)

// Sink receives records in time order (exceptions are counted as Late),
// from one goroutine at a time. The record and its storage are reused after
// Sink returns: copy what you keep. A Sink must not call methods of the
// source that calls it.
type Sink func(r *decode.Record)

// MaxPending is the default bound of the records a source holds back for
// ordering; beyond it the oldest go out early (and may be counted Late).
const MaxPending = 1 << 16

// Sentinel errors of the record sources (PTW here, perfio.Classic).
var (
	// ErrClosed reports a call after Close.
	ErrClosed = errors.New("source closed")
	// ErrExists reports Add of an event id already added.
	ErrExists = errors.New("event already added")
	// ErrNotFound reports Remove of an event id not added.
	ErrNotFound = errors.New("no such event")
	// ErrBadEvent reports an Event that is nil or whose argument layout
	// cannot be read.
	ErrBadEvent = errors.New("bad event layout")
	// ErrOptions reports invalid options of a source or a nil Sink.
	ErrOptions = errors.New("bad options")
)
