package engine

import (
	"errors"

	"ptfs/decode"
)

// Sink receives records in time order (exceptions are counted as Late),
// a batch at a time (never empty), from one goroutine at a time: what one
// pass of the source releases, split where the source bounds its batches
// (perfio.Classic: 1,024 records), so that a sink takes its locks once a
// batch, not once a record. The records and their storage are reused
// after Sink returns: copy what you keep, and change none of them (a
// source refills them in place from what it wrote: perfio.Classic clears
// only the argument words beyond a new record's count that the last one
// used). A Sink must not call methods of the source that calls it.
type Sink func(rs []decode.Record)

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
