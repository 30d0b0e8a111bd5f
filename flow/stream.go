package flow

import (
	"errors"
	"fmt"
	"io"
	"iter"

	"ptfs/decode"
)

// ErrLost is the error of a hole in a stream (Stream.Gap): trace the
// kernel lost. Decoding resynchronises at the next PSB after it.
var ErrLost = errors.New("trace lost")

// ErrStreamClosed: a Stream was written to after Close.
var ErrStreamClosed = errors.New("trace stream closed")

// Stream window sizes.
const (
	// streamWindow is the bytes of trace a Stream holds: the packet
	// decoder's buffer, refilled from the caller's chunks.
	streamWindow = 64 << 10
	// lookBack is what the window keeps before the next packet: a
	// resynchronisation searches for a PSB from 15 bytes before it.
	lookBack = 16
)

// StreamCounters count what a Stream was fed.
type StreamCounters struct {
	// Bytes counts the trace bytes written.
	Bytes uint64
	// Gaps counts the holes (Gap calls).
	Gaps uint64
}

// Stream decodes one trace that arrives in chunks of any size, cut at any
// byte (AUX data as the kernel hands it over): a packet cut by the end of a
// chunk is completed by the next (the packet decoder bounds a packet at 16
// bytes, a CYC at 15, so the carry is too), and the flow (IP, return stack, pending
// TNT bits and events, the clock) goes on across chunks, so that the
// Handler sees exactly what Decode of the whole trace gives. Memory is a
// fixed window (64 KiB) besides the decoder's images and block cache,
// whatever the trace's length. Write feeds bytes, Gap marks a hole, Close
// ends the trace; the Handler is called from within them. A Stream is not
// safe for concurrent use, nor is its Decoder while the Stream is open.
type Stream struct {
	d   *Decoder
	h   Handler
	win []byte
	// in is the part of the chunk being written that win has not taken.
	in  []byte
	gap error
	end bool
	// resume runs the decoder until it wants more bytes or ends; the
	// decoder runs as a coroutine (iter.Pull) that yields where it would
	// read past the window.
	resume func() (struct{}, bool)
	stop   func()
	yield  func(struct{}) bool
	done   bool
	c      StreamCounters
}

// NewStream returns a Stream that decodes with d (its block cache and
// counters go on from what d decoded before) and reports to h.
func NewStream(d *Decoder, h Handler) *Stream {
	return &Stream{d: d, h: h, win: make([]byte, 0, streamWindow)}
}

// Counters returns what s was fed so far.
func (s *Stream) Counters() StreamCounters { return s.c }

// Write decodes the next bytes of the trace as far as they go; the rest
// of a packet they cut waits for the next call. It returns len(p).
func (s *Stream) Write(p []byte) (int, error) {
	if s.end {
		return 0, ErrStreamClosed
	}
	s.c.Bytes += uint64(len(p))
	s.in = p
	s.run()
	s.in = nil
	return len(p), nil
}

// Gap marks trace lost between what was written and what comes next: the
// decoder reports an EvError at that offset whose error wraps ErrLost and
// cause (nil: ErrLost alone), the path is unknown until decoding
// resynchronises at the next PSB, and a packet cut by the hole is dropped.
func (s *Stream) Gap(cause error) {
	if s.end {
		return
	}
	s.c.Gaps++
	s.gap = ErrLost
	if cause != nil {
		s.gap = fmt.Errorf("%w: %w", ErrLost, cause)
	}
	s.run()
}

// Close ends the trace: the decoder finishes as Decode does at the end of
// its buffer (a packet cut by the end is an error).
func (s *Stream) Close() error {
	if s.end {
		return nil
	}
	s.end = true
	s.run()
	return nil
}

// run lets the decoder go on until it needs bytes that were not fed.
func (s *Stream) run() {
	if s.done {
		return
	}
	if s.resume == nil {
		s.resume, s.stop = iter.Pull(s.decode)
	}
	if _, ok := s.resume(); !ok {
		s.done = true
		s.stop()
	}
}

// decode is the coroutine: Decode's loop over the window.
func (s *Stream) decode(yield func(struct{}) bool) {
	s.yield = yield
	d := s.d
	d.src, d.base = s, 0
	defer func() { d.src = nil }()
	d.decode(s.win, s.h)
}

// more is called where the packet decoder ran dry (err: io.EOF, or a
// packet cut by the end of its buffer): on a Stream it returns nil once
// more bytes are in the buffer, else the error to go on with.
func (d *Decoder) more(err error) error {
	if d.src == nil {
		return err
	}
	return d.src.refill(err)
}

// refill waits for more bytes (yielding to Write) and moves them into the
// window, keeping the bytes from lookBack before the first packet not
// decoded. It returns err itself at the end of the trace and for an error
// other than running dry; the hole's error at a Gap, after dropping what
// the window held.
func (s *Stream) refill(err error) error {
	pd := &s.d.pd
	from := int(pd.Pos())
	var pe *decode.PacketError
	switch {
	case errors.As(err, &pe) && errors.Is(err, decode.ErrTruncated):
		from = int(pe.Offset)
	case !errors.Is(err, io.EOF):
		return err
	}
	for len(s.in) == 0 {
		if s.gap != nil {
			gap := s.gap
			s.gap = nil
			s.d.base += uint64(len(s.win))
			s.win = s.win[:0]
			pd.Reset(s.win)
			s.d.fp.noPos = -1 // a window position
			return gap
		}
		if s.end || !s.yield(struct{}{}) {
			return err
		}
	}
	keep := 0
	if len(s.win)+len(s.in) > cap(s.win) {
		keep = max(0, from-lookBack)
		s.win = s.win[:copy(s.win, s.win[keep:])]
		s.d.base += uint64(keep)
	}
	n := min(len(s.in), cap(s.win)-len(s.win))
	s.win = append(s.win, s.in[:n]...)
	s.in = s.in[n:]
	pd.Slide(s.win, keep)
	s.d.fp.noPos = -1 // a window position: the fast path may try again
	return nil
}

// MemoryChanged drops the decoded code that the block cache holds, for a
// Memory whose bytes changed under the decoder (a process switch, an
// mmap or exec from the side band). A Handler may call it from Event
// (an enable, a disable) or Branch: blocks are looked up again from the
// next packet with an IP on; until then the walk finishes the block it is
// in and follows the successors that block links to, as decoded before
// (perfflow calls it only from Event, never from Branch).
func (d *Decoder) MemoryChanged() {
	d.cache.drop()
	if d.gen != nil {
		d.cache.gen = d.gen.Generation()
	}
}
