package flow

// fastTime takes the timing packets at k.pos that a clock sees (TSC, MTC,
// CYC, TMA, PADs between them) as nextPacket does: each read with the
// packet decoder's own checks (fastState.pd, RawNext) and handed to the
// clock, which has the one copy of its rules; it stops before any other
// packet, an error or the window's last 16 bytes (the slow path's, as in
// the kernel), and tells whether it took any. The branches gathered are
// handed over before (fast): a branch's time is the clock's when its
// Handler gets it.
func (d *Decoder) fastTime(k *kern) bool {
	buf, pos := k.buf, k.pos
	end := len(buf) - 16
	pd, p := &d.fp.pd, &d.fp.pk // pd is on buf (fast)
	took := false
	for pos <= end {
		op := onOps[buf[pos]]
		if op == opPad {
			pos = padRun(buf, pos)
			continue
		}
		if op != opExt && (op < opMTC || op > opCYCX) {
			// Not a timing packet (a TMA's first byte is the
			// escape's): no decode to tell.
			break
		}
		next, _, err := pd.RawNext(pos, k.last, p)
		if err != nil || !skipped(p.Kind) {
			break
		}
		d.clock.Packet(p)
		pos, took = next, true
	}
	if took {
		k.pos = pos
	}
	return took
}

// clockPackets hands the packets from pos up to stop, a PSB+ group
// fastPSB read whole (the PSB, the header's TSC, TMA and CBR, ...,
// PSBEND), to the clock, as nextPacket does: read again, but only once
// taken, so that a group left to the slow path is not handed over twice
// (a CYC counted twice moves the time), and without a clock no test per
// packet.
func (d *Decoder) clockPackets(buf []byte, pos, stop int, last uint64) {
	pd, p := &d.fp.pd, &d.fp.pk
	for pos < stop {
		if buf[pos] == 0 {
			// Within the group: 16 bytes or more before the end.
			pos = padRun(buf, pos)
			continue
		}
		// The same bytes decoded without an error just before.
		pos, last, _ = pd.RawNext(pos, last, p)
		d.clock.Packet(p)
	}
}
