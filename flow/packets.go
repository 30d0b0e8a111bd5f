package flow

import (
	"errors"

	"ptfs/decode"
)

// batchSize is how many packets the decoder decodes ahead: one call of the
// packet decoder's batch loop instead of one per packet.
const batchSize = 32

// packetBatch holds packets decoded ahead of the flow, and the error that
// ended the batch, to be returned once they are used.
type packetBatch struct {
	pkts [batchSize]decode.Packet
	i, n int
	err  error
	// size is how many packets the next batch decodes: after the fast
	// path handed over (fast.go), 1, doubling up to batchSize, so that
	// few packets are decoded ahead when it can take over again.
	size int
	// last0 is the last IP before the batch; raw0 tells whether the
	// fast path could have started there (decode.PacketDecoder.Raw).
	last0 uint64
	raw0  bool
}

// resetPackets starts decoding trace.
func (d *Decoder) resetPackets(trace []byte) {
	d.pd.Reset(trace)
	d.pb.i, d.pb.n, d.pb.err, d.pb.size = 0, 0, nil, batchSize
	d.fp.noPos = -1
}

// nextPacket reads the next packet that the flow uses into d.pk, skipping
// padding and timing packets in the batch (after the clock, if any, saw
// them), where they cost no copy; errors
// come after the packets before them, as the packet decoder's Next gives
// them.
func (d *Decoder) nextPacket() error {
	b := &d.pb
	for {
		for ; b.i < b.n; b.i++ {
			p := &b.pkts[b.i]
			if d.clock != nil {
				// The clock sees every packet, timing ones included.
				d.clock.Packet(p)
			}
			if skipped(p.Kind) {
				continue
			}
			d.pk = *p
			b.i++
			return nil
		}
		if err := b.err; err != nil {
			b.err = nil
			if err = d.more(err); err == nil {
				continue
			}
			return err
		}
		_, _, b.last0, b.raw0 = d.pd.Raw()
		n, err := d.pd.Decode(b.pkts[:b.size])
		b.i, b.n, b.err, b.size = 0, n, err, min(2*b.size, batchSize)
		if n == 0 {
			b.err = nil
			if err = d.more(err); err == nil {
				continue
			}
			return err
		}
	}
}

// skipped tells whether the flow skips packets of kind k: padding, and
// timing packets, which only the clock (if any) sees.
func skipped(k decode.Kind) bool {
	switch k {
	case decode.Pad, decode.TSC, decode.MTC, decode.CYC, decode.TMA:
		return true
	}
	return false
}

// pos is the stream offset of the next packet not read (by nextPacket), or
// of the bytes that failed to decode.
func (d *Decoder) pos() uint64 {
	if d.pb.i < d.pb.n {
		return d.base + d.pb.pkts[d.pb.i].Offset
	}
	return d.base + d.pd.Pos()
}

// rawCursor is where the packets the flow read end, for the fast path: the
// trace, the offset of the first packet not read, and the last IP there;
// ok is false where the fast path cannot start (a batch in or after a PEBS
// block, or decode.PacketDecoder.Raw's cases).
func (d *Decoder) rawCursor() (buf []byte, pos int, last uint64, ok bool) {
	buf, pos, last, ok = d.pd.Raw()
	b := &d.pb
	if b.i == b.n {
		return buf, pos, last, ok && b.err == nil
	}
	if !b.raw0 {
		return buf, 0, 0, false
	}
	for i := range b.pkts[:b.n] {
		if k := b.pkts[i].Kind; k == decode.BBP || k == decode.BIP || k == decode.BEP {
			return buf, 0, 0, false
		}
	}
	// The last IP is the last one a packet before gave.
	last = b.last0
	for i := b.i - 1; i >= 0; i-- {
		p := &b.pkts[i]
		if k := p.Kind; k == decode.PSB {
			last = 0
			break
		} else if (k == decode.TIP || k == decode.TIPPGE || k == decode.TIPPGD || k == decode.FUP) && !p.Suppressed() {
			last = p.IP
			break
		}
	}
	return buf, int(b.pkts[b.i].Offset), last, true
}

// syncForward moves to the next PSB from the next packet not read; on a
// Stream it waits for the bytes to search (more).
func (d *Decoder) syncForward() error {
	pos := d.pos()
	d.pb.i, d.pb.n, d.pb.err = 0, 0, nil
	for {
		err := d.pd.SyncForwardFrom(pos - d.base)
		if err == nil || d.src == nil {
			return err
		}
		if err = d.more(err); errors.Is(err, ErrLost) {
			// A hole while searching: told, and the search goes
			// on after it.
			d.report(err)
		} else if err != nil {
			return err
		}
		pos = d.base + d.pd.Pos()
	}
}
