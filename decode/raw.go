package decode

// Raw gives a caller that reads the commonest packets itself (the flow
// decoder's fast path) the trace bytes, the offset of the next packet and
// the last IP there; SetRaw gives the position back. ok is false in the
// states only the decoder's own loops go on from: after an error (the next
// call resynchronises) and inside a PEBS block (bytes mean other packets).
func (d *PacketDecoder) Raw() (buf []byte, pos int, lastIP uint64, ok bool) {
	return d.buf, d.pos, d.lastIP, !d.failed && d.ctx == ctxNone
}

// SetRaw moves d to pos, a packet boundary that a reader of Raw's bytes
// reached (or a packet Decode returned), with the last IP there, outside a
// PEBS block; an error after pos is forgotten, to be met again.
func (d *PacketDecoder) SetRaw(pos int, lastIP uint64) {
	d.pos, d.lastIP = min(max(pos, 0), len(d.buf)), lastIP
	d.failed, d.ctx = false, ctxNone
}

// IPSize is the number of IP bytes that follow the first byte b of an IP
// packet (TIP, TIP.PGE, TIP.PGD, FUP); -1 for the reserved IPBytes values,
// which are no packet.
func IPSize(b byte) int { return int(ipCompressions[b>>5].size) }

// ApplyIP is the last IP after an IP packet with first byte b, when the
// last IP was last; word is the 8 bytes after b read little-endian: the IP
// bytes (IPSize(b) of them, the rest masked off here) and what follows. A
// suppressed IP leaves it as it was (and the packet carries no IP).
func ApplyIP(b byte, word, last uint64) uint64 {
	c := &ipCompressions[b>>5]
	return c.apply(last, word&lowMask[uint8(c.size)&15])
}

// RawNext decodes the one packet at pos, a packet boundary outside a PEBS
// block where the last IP is lastIP, into p, as SetRaw(pos, lastIP) and
// Next would (without Next's batch loop, which costs more than it saves
// for one packet), and returns the position after it and the last IP
// there. An error leaves d as Next leaves it.
func (d *PacketDecoder) RawNext(pos int, lastIP uint64, p *Packet) (next int, last uint64, err error) {
	d.SetRaw(pos, lastIP)
	err = d.one(p)
	return d.pos, d.lastIP, err
}
