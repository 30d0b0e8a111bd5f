package decode

// ClockConfig is what estimating the time from timing packets needs of the
// trace's configuration (the values ptdump and ptxed take as options).
type ClockConfig struct {
	MTCFreq       uint8
	NomFreq       uint8
	CPUID15EAX    uint32
	CPUID15EBX    uint32
	KeepTcalOnOvf bool
}

// Clock estimates the time stamp counter along a trace from its TSC, TMA,
// MTC, CYC and CBR packets, as libipt's query decoder does (the estimate
// ptdump's --time prints), for decoders that put times on what they report.
type Clock struct {
	o        PtdumpOptions
	time     ptTime
	tcal     ptTcal
	inHeader bool
}

// NewClock returns a clock for a trace configured as c.
func NewClock(c ClockConfig) *Clock {
	k := &Clock{o: PtdumpOptions{MTCFreq: c.MTCFreq, NomFreq: c.NomFreq,
		CPUID15EAX: c.CPUID15EAX, CPUID15EBX: c.CPUID15EBX, KeepTcalOnOvf: c.KeepTcalOnOvf}}
	k.Reset()
	return k
}

// Reset forgets the time: a new trace.
func (k *Clock) Reset() {
	k.time = ptTime{}
	k.tcal.init()
	k.inHeader = false
}

// Packet takes the timing information of p; other packets are ignored.
// Packets the estimate cannot use (a CYC before calibration, an MTC
// without a TMA) leave it as it was, as in libipt.
func (k *Clock) Packet(p *Packet) {
	switch p.Kind {
	case PSB:
		k.inHeader = true
	case PSBEnd:
		k.inHeader = false
	case OVF:
		if k.o.KeepTcalOnOvf {
			k.tcal.updateOVF()
		} else {
			k.tcal.init()
		}
	case TSC:
		if k.inHeader {
			k.tcal.headerTSC(p.Payload)
		} else {
			k.tcal.updateTSC(p.Payload)
		}
		k.time.updateTSC(p.Payload)
	case CBR:
		if !k.inHeader {
			k.tcal.init()
		}
		k.tcal.headerCBR(p.Payload, &k.o)
		k.time.updateCBR(p.Payload)
	case TMA:
		k.time.updateTMA(p.Payload, uint64(p.Aux), &k.o)
	case MTC:
		k.tcal.updateMTC(p.Payload, &k.o)
		k.time.updateMTC(p.Payload, &k.o)
	case CYC:
		fcr, _ := k.tcal.getFCR()
		k.tcal.updateCYC(p.Payload)
		k.time.updateCYC(p.Payload, &k.o, fcr)
	}
}

// TSC returns the estimated time stamp counter; relative time (from 0)
// when the trace has given no TSC yet.
func (k *Clock) TSC() uint64 { return k.time.tsc }

// HasTSC tells whether the trace has given a TSC yet: before one, TSC is
// relative and no wall-clock time can be made of it.
func (k *Clock) HasTSC() bool { return k.time.haveTSC }
