package perfio

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"ptfs/engine"
	"ptfs/perfdata"

	"golang.org/x/sys/unix"
)

// Layout of PERF_RECORD_AUX after the header: u64 aux_offset, aux_size,
// flags; then the sample_id trailer.
const auxRecordSize = headerSize + 24

// Bits of perf_event_mmap_page.capabilities (include/uapi/linux/perf_event.h).
const (
	capUserTimeZero  = 1 << 4
	capUserTimeShort = 1 << 5
)

// maxSeqRetries bounds the retries of the control page's seqlock, so that a
// page whose lock stays odd cannot hang the reader.
const maxSeqRetries = 1000

// ptCounters are the counters of a PT source, shared by its CPU readers and
// read concurrently by Stats.
type ptCounters struct {
	records, bytes, errors atomic.Uint64
	losses                 [engine.NumLossKinds]atomic.Uint64
}

// auxReader reads one CPU's perf mmap of an AUX event: mem is the control
// page and the data ring, aux the AUX ring at the page's aux_offset. It
// passes the PT bytes up to aux_head straight from aux (never copied), as
// perf's auxtrace reader does, the losses the PERF_RECORD_AUX flags report,
// and the side band, then releases the AUX space through aux_tail. The AUX
// records serve for their flags and to place them in the stream, not to
// announce the bytes: a record lost to a full data ring loses no trace. The
// same code serves the real mmaps and, in tests, plain memory laid out like
// them.
//
// An auxReader is not safe for concurrent use.
type auxReader struct {
	cpu  int
	page *unix.PerfEventMmapPage
	ring *Ring
	aux  []byte
	mask uint64
	// pos is the AUX position up to which the bytes were passed on; it is
	// what aux_tail gets.
	pos uint64
	// stalled is set when a record pointed past aux_head and was left in
	// the ring for the next drain; stallAt is its ring position.
	stalled bool
	stallAt uint64
	tc      perfdata.TimeConv
	tcSent  bool
	side    sideParser
	ev      engine.SideEvent
	cnt     *ptCounters
	// ringErrs is the part of ring.Errors already counted.
	ringErrs uint64
}

// newAuxReader returns the reader of cpu's mapping: mem holds the control
// page (pageSize bytes) and the data ring, aux the AUX ring, whose size must
// be the page's aux_size, a power of two.
func newAuxReader(cpu int, mem, aux []byte, pageSize int, cnt *ptCounters) (*auxReader, error) {
	ring, err := NewDataRing(mem, pageSize)
	if err != nil {
		return nil, err
	}
	page := (*unix.PerfEventMmapPage)(unsafe.Pointer(&mem[0]))
	n := uint64(len(aux))
	if n == 0 || n&(n-1) != 0 || page.Aux_size != n {
		return nil, fmt.Errorf("%w: aux area of %d bytes, page says %d", ErrRingLayout, n, page.Aux_size)
	}
	return &auxReader{
		cpu:  cpu,
		page: page,
		ring: ring,
		aux:  aux,
		mask: n - 1,
		pos:  atomic.LoadUint64(&page.Aux_tail),
		cnt:  cnt,
	}, nil
}

// drainResult says what one drain saw.
type drainResult struct {
	// truncated: a PERF_RECORD_AUX flagged TRUNCATED; the kernel disables
	// the event then, so the caller enables it again.
	truncated bool
}

// drain passes everything in the rings to sink: TimeConv first when the
// page's conversion is new, then each record in order, the bytes up to each
// AUX record's end before its flags, and last the bytes up to aux_head that
// no record read yet announced. aux_head is loaded after data_head: the
// kernel writes the record before it publishes aux_head, so every record
// whose bytes it passed is either read now or comes later with its bytes
// already passed, and then gives only its flags.
func (r *auxReader) drain(sink engine.TraceSink) drainResult {
	var res drainResult
	r.timeConv(sink)
	r.ring.Begin()
	head := atomic.LoadUint64(&r.page.Aux_head)
	for {
		typ, misc, rec, ok := r.ring.Next()
		if !ok {
			break
		}
		r.cnt.records.Add(1)
		switch {
		case typ == unix.PERF_RECORD_AUX:
			if !r.auxRecord(rec, &head, sink, &res) {
				// Left for the next drain: everything after it waits
				// too, which keeps the order.
				r.ring.unread(uint64(len(rec)))
				r.cnt.records.Add(^uint64(0))
				r.ring.End()
				r.ringErrors()
				return res
			}
		case typ == unix.PERF_RECORD_LOST:
			// struct { header; u64 id; u64 lost; sample_id }
			if len(rec) < headerSize+16 {
				r.cnt.errors.Add(1)
				continue
			}
			n := binary.LittleEndian.Uint64(rec[headerSize+8:])
			r.loss(sink, engine.LossSideBand, n)
		case isSide(typ):
			if err := r.side.parse(typ, misc, rec, &r.ev); err != nil {
				r.cnt.errors.Add(1)
				continue
			}
			sink.Side(r.cpu, &r.ev)
		}
		// Other records (FORK, THROTTLE, KSYMBOL, ...) say nothing the
		// trace needs.
	}
	r.ring.End()
	r.ringErrors()
	r.passTo(head, sink)
	return res
}

// ringErrors counts the malformed ring contents the Ring skipped.
func (r *auxReader) ringErrors() {
	if e := r.ring.Errors(); e != r.ringErrs {
		r.cnt.errors.Add(e - r.ringErrs)
		r.ringErrs = e
	}
}

// loss passes a loss on and counts it.
func (r *auxReader) loss(sink engine.TraceSink, why engine.LossKind, n uint64) {
	r.cnt.losses[why].Add(n)
	sink.Loss(r.cpu, why, n)
}

// auxRecord handles one PERF_RECORD_AUX: it passes the bytes up to the
// record's end (those of records lost before it too) and reports its flags. It returns false, without doing anything, when the record points
// past *head for the first time: the kernel writes the record before it
// publishes aux_head, so a reader can see the record first. A record that
// cannot be right is counted as an error and ignored: the bytes are read up
// to aux_head all the same.
func (r *auxReader) auxRecord(rec []byte, head *uint64, sink engine.TraceSink, res *drainResult) bool {
	if len(rec) < auxRecordSize {
		r.cnt.errors.Add(1)
		return true
	}
	off := binary.LittleEndian.Uint64(rec[headerSize:])
	size := binary.LittleEndian.Uint64(rec[headerSize+8:])
	flags := binary.LittleEndian.Uint64(rec[headerSize+16:])
	end := off + size
	ringSize := uint64(len(r.aux))
	switch {
	case flags&unix.PERF_AUX_FLAG_OVERWRITE != 0, // only in a read-only (snapshot) mapping, which we never make
		size > ringSize, end < off, // larger than the ring, or wrapping the u64
		end > r.pos && end-r.pos > ringSize: // beyond what the ring can hold after aux_tail
		r.cnt.errors.Add(1)
		return true
	}
	if end > *head {
		*head = atomic.LoadUint64(&r.page.Aux_head)
	}
	if end > *head {
		at := r.ring.pos - uint64(len(rec))
		if !r.stalled || r.stallAt != at {
			r.stalled, r.stallAt = true, at
			return false
		}
		// Still past aux_head a drain later: not the publication race.
		r.stalled = false
		r.cnt.errors.Add(1)
		return true
	}
	r.stalled = false
	// Bytes before the record (their record was lost) go first; a gap
	// inside the record's own bytes comes before them, a truncation after
	// them. When a pass up to aux_head took the record's bytes already,
	// its flags follow them.
	r.passTo(off, sink)
	if flags&unix.PERF_AUX_FLAG_PARTIAL != 0 {
		r.loss(sink, engine.LossPartial, 1)
	}
	if flags&unix.PERF_AUX_FLAG_COLLISION != 0 {
		r.loss(sink, engine.LossCollision, 1)
	}
	r.passTo(end, sink)
	if flags&unix.PERF_AUX_FLAG_TRUNCATED != 0 {
		r.loss(sink, engine.LossTruncated, 1)
		res.truncated = true
	}
	return true
}

// passTo passes the AUX bytes from pos up to end, if any, and releases them.
// A head more than a ring ahead of aux_tail is corrupt: counted, and skipped
// as a hole.
func (r *auxReader) passTo(end uint64, sink engine.TraceSink) {
	if r.stalled || end <= r.pos {
		return
	}
	size, ringSize := end-r.pos, uint64(len(r.aux))
	if size > ringSize {
		r.cnt.errors.Add(1)
		r.loss(sink, engine.LossHole, 1)
		r.pos = end
		atomic.StoreUint64(&r.page.Aux_tail, r.pos)
		return
	}
	start := r.pos & r.mask
	if first := ringSize - start; size > first {
		sink.Trace(r.cpu, r.aux[start:ringSize:ringSize])
		sink.Trace(r.cpu, r.aux[:size-first:size-first])
	} else {
		sink.Trace(r.cpu, r.aux[start:start+size:start+size])
	}
	r.cnt.bytes.Add(size)
	r.pos = end
	// The atomic store orders the reads above before the kernel may
	// overwrite the space (its smp_mb before reading aux_tail).
	atomic.StoreUint64(&r.page.Aux_tail, r.pos)
}

// timeConv passes the page's TSC conversion to sink when the kernel offers
// one (cap_user_time_zero) and it differs from the last one passed.
func (r *auxReader) timeConv(sink engine.TraceSink) {
	tc, ok, consistent := readTimeConv(r.page)
	if !consistent {
		r.cnt.errors.Add(1)
		return
	}
	if !ok || (r.tcSent && tc == r.tc) {
		return
	}
	r.tc, r.tcSent = tc, true
	sink.TimeConv(r.cpu, tc)
}

// readTimeConv reads the time fields of the control page under its seqlock
// (the kernel makes lock odd while it updates them). ok is false when the
// page offers no time_zero; consistent is false when the lock never held
// still.
func readTimeConv(p *unix.PerfEventMmapPage) (tc perfdata.TimeConv, ok, consistent bool) {
	for range maxSeqRetries {
		seq := atomic.LoadUint32(&p.Lock)
		if seq&1 != 0 {
			continue
		}
		caps := atomic.LoadUint64(&p.Capabilities)
		tc = perfdata.TimeConv{
			Shift:  p.Time_shift,
			Mult:   p.Time_mult,
			Zero:   atomic.LoadUint64(&p.Time_zero),
			Short:  caps&capUserTimeShort != 0,
			Cycles: atomic.LoadUint64(&p.Time_cycles),
			Mask:   atomic.LoadUint64(&p.Time_mask),
		}
		if !tc.Short {
			tc.Cycles, tc.Mask = 0, 0
		}
		if atomic.LoadUint32(&p.Lock) == seq {
			return tc, caps&capUserTimeZero != 0, true
		}
	}
	return perfdata.TimeConv{}, false, false
}
