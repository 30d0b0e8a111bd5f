package decode

import "math"

// ptTime estimates the TSC from TSC, TMA, MTC and CYC packets the way
// libipt's pt_time does, so that ptdump's --time column matches.
type ptTime struct {
	tsc, base, fc uint64
	ctc, ctcCyc   uint32
	lostCYC       uint32
	haveTSC       bool
	haveTMA       bool
	haveMTC       bool
}

// tcalFCRShift is libipt's pt_tcal_fcr_shr: FCR values carry 8 fraction bits.
const tcalFCRShift = 8

// ctcDeltaFC is the distance from CTC last to ctc, correcting one
// wrap-around, in fast-counter units (cpuid 0x15 ratio): libipt's
// pt_time_ctc_delta then pt_time_ctc_fc, which it always calls in a pair.
func ctcDeltaFC(ctc, last uint32, o *PtdumpOptions) (uint64, ptErr) {
	if ctc < last {
		ctc += 1 << (uint(o.MTCFreq) + 8)
		if ctc < last {
			return 0, pteBadPacket
		}
	}
	if o.CPUID15EAX == 0 || o.CPUID15EBX == 0 {
		return 0, pteBadConfig
	}
	return uint64(ctc-last) * uint64(o.CPUID15EBX) / uint64(o.CPUID15EAX), pteOK
}

func (t *ptTime) updateTSC(tsc uint64) {
	t.haveTSC, t.haveTMA, t.haveMTC = true, false, false
	t.tsc, t.base = tsc, tsc
	t.ctc, t.fc = 0, 0
	t.lostCYC = 0
}

// updateCBR only validates: the estimate does not depend on the ratio.
func (t *ptTime) updateCBR(ratio uint64) ptErr {
	if ratio == 0 {
		return pteBadPacket
	}
	return pteOK
}

func (t *ptTime) updateTMA(ctc, fc uint64, o *PtdumpOptions) ptErr {
	if !t.haveTSC || t.haveTMA {
		return pteBadContext
	}
	if t.haveMTC {
		return pteInternal
	}
	mtcHi := uint(o.MTCFreq) + 8
	mask := uint32(1)<<mtcHi - 1
	t.haveTMA = true
	t.base -= fc
	t.fc += fc
	if mtcHi <= 16 {
		t.haveMTC = true
	}
	t.ctc = uint32(ctc) & mask
	t.ctcCyc = t.ctc
	return pteOK
}

func (t *ptTime) updateMTC(payload uint64, o *PtdumpOptions) ptErr {
	haveTSC, haveTMA, haveMTC := t.haveTSC, t.haveTMA, t.haveMTC
	if haveTSC && !haveTMA {
		return pteOK
	}
	base, last := t.base, t.ctc
	ctc := uint32(payload) << o.MTCFreq
	if t.fc != 0 || t.lostCYC != 0 || !haveMTC {
		t.ctcCyc = ctc
	}
	t.haveMTC = true
	t.fc = 0
	t.ctc = ctc
	t.lostCYC = 0
	if !haveMTC {
		if !haveTMA {
			return pteOK
		}
		if last&^0xffff != 0 {
			return pteInternal
		}
		lo, hi := ctc&0xffff, ctc&^0xffff
		if lo < last {
			hi -= 1 << 16
			hi &= 0xff << o.MTCFreq
		}
		last |= hi
	}
	tsc, e := ctcDeltaFC(ctc, last, o)
	if e != pteOK {
		return e
	}
	base += tsc
	t.tsc, t.base = base, base
	return pteOK
}

// adjustCYC removes from a CYC payload the cycles estimated for earlier
// MTC periods (pt_time_adjust_cyc).
func (t *ptTime) adjustCYC(cyc uint64, o *PtdumpOptions, fcr uint64) (uint64, ptErr) {
	if t.ctc == t.ctcCyc {
		return cyc, pteOK
	}
	fc, e := ctcDeltaFC(t.ctc, t.ctcCyc, o)
	if e != pteOK {
		return cyc, e
	}
	old := (fc << tcalFCRShift) / fcr
	if cyc < old {
		cyc = old
	}
	return cyc - old, pteOK
}

func (t *ptTime) updateCYC(cyc uint64, o *PtdumpOptions, fcr uint64) ptErr {
	if fcr == 0 {
		t.lostCYC++
		return pteOK
	}
	fc := t.fc
	if fc == 0 {
		var e ptErr
		if cyc, e = t.adjustCYC(cyc, o, fcr); e != pteOK {
			return e
		}
	}
	fc += (cyc * fcr) >> tcalFCRShift
	t.fc = fc
	t.tsc = t.base + fc
	return pteOK
}

// ptTcal estimates the fast-counter:cycles ratio like libipt's pt_time_cal.
type ptTcal struct {
	fcr, minFCR, maxFCR uint64
	tsc, cycTSC, cycMTC uint64
	ctc                 uint32
	haveMTC             bool
}

func (c *ptTcal) init() { *c = ptTcal{minFCR: math.MaxUint64} }

func (c *ptTcal) haveFCR() bool { return c.minFCR <= c.maxFCR }

func (c *ptTcal) getFCR() (uint64, ptErr) {
	if !c.haveFCR() {
		return 0, pteNoTime
	}
	return c.fcr, pteOK
}

func (c *ptTcal) setFCR(fcr uint64) {
	c.fcr = fcr
	c.minFCR = min(c.minFCR, fcr)
	c.maxFCR = max(c.maxFCR, fcr)
}

// updateTSC: a TSC outside PSB+ is not used for calibration.
func (c *ptTcal) updateTSC(tsc uint64) {
	c.tsc, c.cycTSC = tsc, 0
}

func (c *ptTcal) headerTSC(tsc uint64) ptErr {
	last, cyc := c.tsc, c.cycTSC
	c.tsc, c.cycTSC = tsc, 0
	if last == 0 || cyc == 0 || c.haveMTC {
		return pteOK
	}
	if tsc < last {
		tsc += 1 << 56
		if tsc < last {
			return pteBadPacket
		}
	}
	delta := tsc - last
	if delta&^(math.MaxUint64>>tcalFCRShift) != 0 {
		return pteInternal
	}
	c.setFCR((delta << tcalFCRShift) / cyc)
	return pteOK
}

func (c *ptTcal) headerCBR(cbr uint64, o *PtdumpOptions) ptErr {
	if o.NomFreq == 0 {
		return pteOK
	}
	if cbr == 0 {
		return pteBadPacket
	}
	c.setFCR((uint64(o.NomFreq) << tcalFCRShift) / cbr)
	return pteOK
}

func (c *ptTcal) updateMTC(payload uint64, o *PtdumpOptions) ptErr {
	last, cyc := c.ctc, c.cycMTC
	ctc := uint32(payload) << o.MTCFreq
	if !c.haveMTC {
		c.cycMTC, c.ctc, c.haveMTC = 0, ctc, true
		return pteOK
	}
	if cyc == 0 {
		return pteOK
	}
	c.cycMTC, c.ctc = 0, ctc
	fc, e := ctcDeltaFC(ctc, last, o)
	if e != pteOK {
		return e
	}
	if fc&^(math.MaxUint64>>tcalFCRShift) != 0 {
		return pteInternal
	}
	c.setFCR((fc << tcalFCRShift) / cyc)
	return pteOK
}

func (c *ptTcal) updateCYC(cyc uint64) {
	c.cycMTC += cyc
	c.cycTSC += cyc
}

func (c *ptTcal) updateOVF() {
	c.tsc, c.cycTSC, c.cycMTC, c.ctc, c.haveMTC = 0, 0, 0, 0, false
}
