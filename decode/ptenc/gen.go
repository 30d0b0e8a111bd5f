package ptenc

import "math/rand"

// Profile selects the packet mix of a generated stream.
type Profile int

// Stream profiles for Generate.
const (
	// Mixed draws from every packet libipt 2.0 knows, in proportions
	// loosely like a branch trace with timing and power packets.
	Mixed Profile = iota
	// PTWHeavy is mostly ptwrite uprobe records (8-byte words, each with
	// its FUP), with some manual 4-byte PTWRITEs, branches and timing.
	PTWHeavy
	// TNTHeavy is mostly short and long TNT packets with a few TIPs.
	TNTHeavy
)

// String names the profile as benchmarks do.
func (p Profile) String() string {
	switch p {
	case PTWHeavy:
		return "ptw"
	case TNTHeavy:
		return "tnt"
	}
	return "mixed"
}

// PSBPeriod is the distance in bytes between the PSB+ that Generate inserts,
// the usual hardware period.
const PSBPeriod = 4096

// GenEventID is the event id Generate uses for a probe with nargs (1 to 8)
// arguments; tests build their event table from it.
func GenEventID(nargs int) uint16 { return 0x100 + uint16(nargs) }

// GenStub is the base address of the stub page the generated FUPs point into.
const GenStub = 0x7ffff0000000

// Generate returns a valid stream of at least size bytes (it stops at the
// first packet boundary past size) with the given profile, reproducible from
// seed, with a PSB+ about every PSBPeriod bytes (at the first packet boundary
// after each multiple).
func Generate(p Profile, size int, seed int64) []byte {
	g := &gen{r: rand.New(rand.NewSource(seed)), ip: 0x401000}
	g.e.buf = make([]byte, 0, size+64)
	next := 0
	for g.e.Len() < size {
		if g.e.Len() >= next {
			g.psbPlus()
			next = (g.e.Len()/PSBPeriod + 1) * PSBPeriod
		}
		switch p {
		case PTWHeavy:
			g.ptw()
		case TNTHeavy:
			g.tnt()
		default:
			g.mixed()
		}
	}
	return g.e.buf
}

type gen struct {
	e   Encoder
	r   *rand.Rand
	ip  uint64
	tsc uint64
}

func (g *gen) psbPlus() {
	g.e.PSB()
	g.tsc += uint64(g.r.Intn(1 << 20))
	g.e.TSC(g.tsc)
	g.e.TMA(uint16(g.r.Intn(1<<16)), uint16(g.r.Intn(1<<9)))
	g.e.CBR(byte(g.r.Intn(64)))
	g.e.ModeExec(true, false)
	g.e.IP(FUP, g.ip)
	g.e.PSBEnd()
}

// nextIP moves the current IP a random distance, mostly nearby, so that all
// IP compressions occur.
func (g *gen) nextIP() uint64 {
	switch g.r.Intn(8) {
	case 0:
		g.ip = 0x7f0000000000 | uint64(g.r.Int63n(1<<40))
	case 1:
		g.ip = 0xffffffff81000000 | uint64(g.r.Intn(1<<24))
	case 2:
		g.ip = 0x400000 + uint64(g.r.Intn(1<<20))
	default:
		g.ip = g.ip&^0xffff | uint64(g.r.Intn(1<<16))
	}
	return g.ip
}

func (g *gen) tntBits() {
	n := 1 + g.r.Intn(47)
	if g.r.Intn(2) == 0 {
		n = 1 + g.r.Intn(6)
	}
	g.e.TNT(g.r.Uint64(), n)
}

func (g *gen) ptw() {
	switch k := g.r.Intn(16); {
	case k < 12:
		n := 1 + g.r.Intn(8)
		args := make([]uint64, 0, 8)
		for i := 0; i < n; i++ {
			args = append(args, g.r.Uint64()>>uint(g.r.Intn(64)))
		}
		g.e.Probe(GenEventID(n), GenStub+uint64(g.r.Intn(16))<<12, true, args...)
	case k == 12:
		g.e.PTW(uint64(g.r.Uint32()), 4, g.r.Intn(2) == 0)
		g.e.IP(FUP, g.nextIP())
	case k == 13:
		g.e.TSC(g.tsc + uint64(g.r.Intn(1000)))
	case k == 14:
		g.tntBits()
	default:
		g.e.IP(TIP, g.nextIP())
	}
}

func (g *gen) tnt() {
	if g.r.Intn(16) == 0 {
		g.e.IP(TIP, g.nextIP())
		return
	}
	g.tntBits()
}

func (g *gen) mixed() {
	r := g.r
	switch k := r.Intn(40); {
	case k < 12:
		g.tntBits()
	case k < 16:
		g.e.IP(TIP, g.nextIP())
	case k < 18:
		g.e.IP(FUP, g.nextIP())
	case k == 18:
		g.e.IP(TIPPGE, g.nextIP())
	case k == 19:
		g.e.IPC(TIPPGD, 0, 0)
	case k == 20:
		g.e.IP(TIPPGD, g.nextIP())
	case k < 24:
		g.e.MTC(byte(r.Intn(256)))
	case k < 26:
		g.e.CYC(uint64(r.Int63n(1 << uint(1+r.Intn(40)))))
	case k == 26:
		g.tsc += uint64(r.Intn(1 << 16))
		g.e.TSC(g.tsc)
	case k == 27:
		g.e.TMA(uint16(r.Intn(1<<16)), uint16(r.Intn(1<<9)))
	case k == 28:
		g.e.ModeExec(r.Intn(2) == 0, false)
	case k == 29:
		g.e.ModeTSX(r.Intn(2) == 0, r.Intn(2) == 0)
	case k == 30:
		g.e.PIP(r.Uint64()&0xffffffffffe0, r.Intn(2) == 0)
	case k == 31:
		g.e.CBR(byte(r.Intn(256)))
	case k == 32:
		g.e.PTW(r.Uint64(), 4<<uint(r.Intn(2)), false)
	case k == 33:
		g.e.PTW(r.Uint64(), 8, true)
		g.e.IP(FUP, g.nextIP())
	case k == 34:
		g.e.Pad()
	case k == 35:
		g.e.VMCS(r.Uint64() & 0xffffffffff000)
	case k == 36:
		switch r.Intn(4) {
		case 0:
			g.e.Exstop(false)
		case 1:
			g.e.Mwait(uint32(r.Intn(256)), uint32(r.Intn(4)))
		case 2:
			g.e.Pwre(r.Intn(2) == 0, byte(r.Intn(16)), byte(r.Intn(16)))
		default:
			g.e.Pwrx(byte(r.Intn(16)), byte(r.Intn(16)), byte(r.Intn(16)))
		}
	case k == 37:
		g.e.MNT(r.Uint64())
	case k == 38:
		if r.Intn(8) == 0 {
			g.e.OVF()
			g.e.IP(FUP, g.nextIP())
		} else {
			g.e.IPC(TIP, 0, 0)
		}
	default:
		g.e.Probe(GenEventID(2), GenStub, true, r.Uint64(), r.Uint64())
	}
}
