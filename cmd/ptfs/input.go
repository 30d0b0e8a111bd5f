package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"ptfs/decode"
)

// maxPerfRead is the most perf.data that is read into memory: a pipe, or
// a file too small to map. A regular file is mapped whatever its size.
const maxPerfRead = 1 << 30

// errPerfTooLarge: perf.data through a pipe beyond maxPerfRead.
var errPerfTooLarge = errors.New("perf.data read from a pipe is too large")

// psbLook is the look-back a PSB search keeps from one piece to the next:
// a PSB may begin in the last 15 bytes of a piece.
const psbLook = 15

// traceFile is an open input of ptfs decode, the one reader of every mode:
// its head (the first feedSize bytes, which tell perf.data from raw PT) is
// mapped or read, then the rest is mapped (mapFile) or read a piece at a
// time into one buffer, so that memory does not grow with a raw trace
// (nor with bytes that never sync).
type traceFile struct {
	name   string
	f      *os.File
	closeF func()
	mem    []byte // the mapped file; nil when read
	// buf is the read buffer: psbLook bytes of look-back, then a piece.
	buf  []byte
	head []byte
}

// openInput opens the trace file name ("-": standard input) and reads or
// maps its head.
func openInput(name string) (*traceFile, error) {
	f, closeF, err := openTrace(name)
	if err != nil {
		return nil, err
	}
	t := &traceFile{name: name, f: f, closeF: closeF, mem: mapFile(f)}
	if t.mem != nil {
		t.head = t.mem[:feedSize] // mapFile maps only larger files
		return t, nil
	}
	t.buf = make([]byte, psbLook+feedSize)
	n, err := io.ReadFull(f, t.buf[psbLook:])
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		t.close()
		return nil, fmt.Errorf("read trace: %w", err)
	}
	t.head = t.buf[psbLook : psbLook+n]
	return t, nil
}

// close unmaps and closes the file.
func (t *traceFile) close() {
	if t.mem != nil {
		_ = unix.Munmap(t.mem)
		t.mem = nil
	}
	t.closeF()
}

// perfData returns the whole file, the mapping or, read, at most limit
// bytes: beyond that it is refused (perf.data is parsed whole: its
// side band and AUX buffers are indexed across the file).
func (t *traceFile) perfData(limit int64) ([]byte, error) {
	if t.mem != nil {
		return t.mem, nil
	}
	if len(t.head) < feedSize {
		return t.head, nil // the whole file
	}
	var b bytes.Buffer
	b.Write(t.head)
	if _, err := b.ReadFrom(io.LimitReader(t.f, limit-int64(len(t.head))+1)); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if int64(b.Len()) > limit {
		return nil, fmt.Errorf("%s: more than %d MiB: save it to a file (which is mapped, not read): %w", t.name, limit>>20, errPerfTooLarge)
	}
	return b.Bytes(), nil
}

// pieces returns the next function of the raw trace t from its head on:
// pieces of at most feedSize (+psbLook) bytes, valid until the next call.
// Bytes before the first PSB cannot be decoded: with skip they are not
// handed out (the first piece starts at the PSB), else they are (a flow
// decoder or ptdump searches for the PSB itself); either way their count
// goes to notes (nil: nowhere) once the PSB is found, and an input
// without a PSB is errNoTrace at its end. Memory is t's buffer whatever
// the input's length.
func (t *traceFile) pieces(skip bool, notes io.Writer) (func() ([]byte, bool, error), error) {
	note := func(n int64) {
		if n > 0 && notes != nil {
			fmt.Fprintf(notes, "ptfs decode: %s: gap: %d bytes before the first PSB skipped\n", t.name, n)
		}
	}
	if t.mem != nil {
		at := decode.IndexPSB(t.mem)
		if at < 0 {
			return nil, t.noPSB(int64(len(t.mem)))
		}
		note(int64(at))
		if !skip {
			at = 0
		}
		return memPieces([][]byte{t.mem[at:]}, []bool{false}), nil
	}
	var (
		first  = true
		synced = false
		look   = 0        // look-back bytes before buf[psbLook:]
		off    = int64(0) // the input offset of buf[psbLook]
	)
	return func() ([]byte, bool, error) {
		for {
			piece := t.head
			if first {
				first = false
			} else {
				n, err := io.ReadFull(t.f, t.buf[psbLook:])
				if n == 0 {
					if err == io.EOF {
						if !synced {
							return nil, false, t.noPSB(off)
						}
						return nil, false, io.EOF
					}
					return nil, false, fmt.Errorf("read trace: %w", err)
				}
				piece = t.buf[psbLook : psbLook+n]
			}
			if synced {
				off += int64(len(piece))
				return piece, false, nil
			}
			w := t.buf[psbLook-look : psbLook+len(piece)]
			if at := decode.IndexPSB(w); at >= 0 {
				synced = true
				note(off - int64(look) + int64(at))
				off += int64(len(piece))
				if skip {
					return w[at:], false, nil
				}
				return piece, false, nil
			}
			// Keep the look-back where the next piece's window begins.
			look = min(psbLook, len(w))
			copy(t.buf[psbLook-look:psbLook], w[len(w)-look:])
			off += int64(len(piece))
			if !skip {
				return piece, false, nil
			}
		}
	}, nil
}

// noPSB is the error of an input of n bytes without a PSB.
func (t *traceFile) noPSB(n int64) error {
	return fmt.Errorf("%s: neither perf.data nor raw Intel PT (no PSB packet in %d bytes): %w", t.name, n, errNoTrace)
}
