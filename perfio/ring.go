package perfio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// headerSize is the size of struct perf_event_header.
const headerSize = 8

// maxRecord bounds one perf record: its size field is a u16.
const maxRecord = 1 << 16

// ErrRingLayout reports a memory area that is not laid out like a perf mmap.
var ErrRingLayout = errors.New("bad perf ring layout")

// Ring reads the records of one perf ring buffer: a data area whose size is a
// power of two, written by the kernel up to *head and released by the reader
// through *tail. The same type serves the data area of a perf mmap (data_head,
// data_tail) and, with NewRing, any ring that uses the same protocol (an AUX
// area's aux_head, aux_tail).
//
// A Ring is not safe for concurrent use.
type Ring struct {
	head, tail *uint64
	data       []byte
	mask       uint64
	// pos is the read position of the current batch, end the head value
	// loaded by Begin; the kernel may not overwrite [tail, end) until End
	// stores pos into tail.
	pos, end uint64
	// scratch holds a record that wraps around the end of data; allocated
	// once, at its maximum size, on first use.
	scratch []byte
	errors  uint64
}

// NewRing returns a Ring over data, whose length must be a power of two, with
// the producer's position at *head and the consumer's at *tail. head and tail
// must be 8-byte aligned; they are read and written atomically.
func NewRing(data []byte, head, tail *uint64) (*Ring, error) {
	n := uint64(len(data))
	if n == 0 || n&(n-1) != 0 {
		return nil, fmt.Errorf("%w: data size %d is not a power of two", ErrRingLayout, n)
	}
	if uintptr(unsafe.Pointer(head))%8 != 0 || uintptr(unsafe.Pointer(tail))%8 != 0 {
		return nil, fmt.Errorf("%w: head or tail not 8-byte aligned", ErrRingLayout)
	}
	return &Ring{head: head, tail: tail, data: data, mask: n - 1}, nil
}

// NewDataRing returns a Ring over the data area of a perf mmap: mem starts
// with the perf_event_mmap_page (one page of pageSize bytes) and the data area
// follows, at data_offset/data_size when the kernel fills them, else right
// after the first page.
func NewDataRing(mem []byte, pageSize int) (*Ring, error) {
	if pageSize <= 0 || len(mem) < pageSize || pageSize < int(unsafe.Sizeof(unix.PerfEventMmapPage{})) {
		return nil, fmt.Errorf("%w: %d bytes with page size %d", ErrRingLayout, len(mem), pageSize)
	}
	if uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return nil, fmt.Errorf("%w: mapping not 8-byte aligned", ErrRingLayout)
	}
	page := (*unix.PerfEventMmapPage)(unsafe.Pointer(&mem[0]))
	off, size := page.Data_offset, page.Data_size
	if off == 0 && size == 0 {
		// Kernels before 4.1 leave both zero and put the data right after
		// the control page.
		off, size = uint64(pageSize), uint64(len(mem)-pageSize)
	}
	if off < uint64(pageSize) || off > uint64(len(mem)) || size > uint64(len(mem))-off {
		return nil, fmt.Errorf("%w: data area [%d,+%d) outside %d-byte mapping", ErrRingLayout, off, size, len(mem))
	}
	return NewRing(mem[off:off+size:off+size], &page.Data_head, &page.Data_tail)
}

// Begin starts a batch: it loads the producer position, after which Next
// returns the records written before that point. The atomic load orders it
// before the reads of the data (the kernel's smp_rmb).
func (r *Ring) Begin() {
	r.pos = atomic.LoadUint64(r.tail)
	r.end = atomic.LoadUint64(r.head)
	if r.end-r.pos > uint64(len(r.data)) {
		// A head more than a ring ahead of tail is corrupt; skip it all.
		r.errors++
		r.pos = r.end
	}
}

// Next returns the type, misc field and whole bytes (header included) of the
// next record of the batch, or ok false at its end. The bytes stay valid until
// the next call of Next or End. A header whose size is too small or runs past
// head counts an error and drops the rest of the batch, which resyncs the
// reader at head.
func (r *Ring) Next() (typ uint32, misc uint16, rec []byte, ok bool) {
	avail := r.end - r.pos
	if avail == 0 {
		return 0, 0, nil, false
	}
	if avail < headerSize {
		r.errors++
		r.pos = r.end
		return 0, 0, nil, false
	}
	start := r.pos & r.mask
	var hdr []byte
	if start+headerSize <= uint64(len(r.data)) {
		hdr = r.data[start : start+headerSize]
	} else {
		// The header wraps (the kernel aligns records to 8 bytes, so
		// only a foreign layout does this): copy it out.
		var buf [headerSize]byte
		r.copyOut(buf[:], r.pos)
		hdr = buf[:]
	}
	typ, misc, size, ok := parseHeader(hdr, avail)
	if !ok {
		r.errors++
		r.pos = r.end
		return 0, 0, nil, false
	}
	if start+size <= uint64(len(r.data)) {
		rec = r.data[start : start+size : start+size]
	} else {
		if r.scratch == nil {
			r.scratch = make([]byte, maxRecord)
		}
		rec = r.scratch[:size:size]
		r.copyOut(rec, r.pos)
	}
	r.pos += size
	return typ, misc, rec, true
}

// parseHeader returns the type, misc field and size of the record whose
// header is hdr (headerSize bytes), ok false when the size is below a
// header's or beyond the avail bytes left: malformed.
func parseHeader(hdr []byte, avail uint64) (typ uint32, misc uint16, size uint64, ok bool) {
	typ = binary.LittleEndian.Uint32(hdr[0:])
	misc = binary.LittleEndian.Uint16(hdr[4:])
	size = uint64(binary.LittleEndian.Uint16(hdr[6:]))
	return typ, misc, size, size >= headerSize && size <= avail
}

// nextRecord returns the type and whole bytes of the record at the start
// of b, records laid out as in a ring but in linear memory (a batch
// copied out with readRest), ok false when b is empty or its header
// malformed (as Next).
func nextRecord(b []byte) (typ uint32, rec []byte, ok bool) {
	if len(b) < headerSize {
		return 0, nil, false
	}
	typ, _, size, ok := parseHeader(b[:headerSize], uint64(len(b)))
	if !ok {
		return 0, nil, false
	}
	return typ, b[:size:size], true
}

// left returns the bytes of the batch not read yet.
func (r *Ring) left() int { return int(r.end - r.pos) }

// readRest copies the rest of the batch, left bytes, into dst and reads
// past it: a reader that walks the records in its own copy of them
// (Classic's held samples) copies a batch at once, in one or two
// copies, instead of each record by itself.
func (r *Ring) readRest(dst []byte) {
	r.copyOut(dst, r.pos)
	r.pos += uint64(len(dst))
}

// copyOut copies len(dst) bytes starting at ring position pos into dst,
// wrapping around the end of data.
func (r *Ring) copyOut(dst []byte, pos uint64) {
	start := pos & r.mask
	n := copy(dst, r.data[start:])
	copy(dst[n:], r.data)
}

// End releases the records read in this batch to the producer. The atomic
// store is a full barrier on amd64, which orders the reads of the data before
// the kernel can reuse the space (the kernel's smp_mb before data_tail).
func (r *Ring) End() {
	atomic.StoreUint64(r.tail, r.pos)
}

// Errors returns the number of times malformed ring contents were skipped.
func (r *Ring) Errors() uint64 { return r.errors }

// unread moves the read position back by n bytes, so that the record just
// returned by Next is returned again by the next batch (End stores the
// position before it).
func (r *Ring) unread(n uint64) { r.pos -= n }
