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
}

// resetPackets starts decoding trace.
func (d *Decoder) resetPackets(trace []byte) {
	d.pd.Reset(trace)
	d.pb.i, d.pb.n, d.pb.err = 0, 0, nil
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
			switch p.Kind {
			case decode.Pad, decode.TSC, decode.MTC, decode.CYC, decode.TMA:
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
		n, err := d.pd.Decode(b.pkts[:])
		b.i, b.n, b.err = 0, n, err
		if n == 0 {
			b.err = nil
			if err = d.more(err); err == nil {
				continue
			}
			return err
		}
	}
}

// pos is the stream offset of the next packet not read (by nextPacket), or
// of the bytes that failed to decode.
func (d *Decoder) pos() uint64 {
	if d.pb.i < d.pb.n {
		return d.base + d.pb.pkts[d.pb.i].Offset
	}
	return d.base + d.pd.Pos()
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
