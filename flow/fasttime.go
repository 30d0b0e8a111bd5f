package flow

// fastTime takes the timing packets at k.pos that a clock sees (TSC, MTC,
// CYC, TMA, PADs between them) as nextPacket does: each read with the
// packet decoder's own checks (fastState.pd, RawNext) and handed to the
// clock, which has the one copy of its rules; it stops before any other
// packet, an error or the window's last 16 bytes (the slow path's, as in
// the kernel), and tells whether it took any. The branches gathered go
// first: a branch's time is the clock's when its Handler gets it.
func (d *Decoder) fastTime(k *kern) bool {
	d.flush()
	buf, pos := k.buf, k.pos
	end := len(buf) - 16
	pd, p := &d.fp.pd, &d.fp.pk
	pd.Reset(buf)
	took := false
	for pos <= end {
		if buf[pos] == 0 {
			pos = padRun(buf, pos)
			continue
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
