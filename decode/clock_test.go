package decode

import (
	"testing"

	"ptfs/decode/ptenc"
)

// TestClock follows the time through timing packets as libipt's query
// decoder does: the TSC of PSB+, CYC scaled by the calibration from
// --nom-freq and CBR, and a CYC without calibration after an overflow.
func TestClock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   ClockConfig
		trace func(e *ptenc.Encoder)
		want  []uint64 // the time after each packet
	}{{
		name: "CYC with nominal frequency 4 at CBR 2: 2 TSC ticks a cycle",
		cfg:  ClockConfig{NomFreq: 4},
		trace: func(e *ptenc.Encoder) {
			e.PSB()
			e.TSC(0xa000)
			e.CBR(2)
			e.PSBEnd()
			e.CYC(4)
			e.CYC(0x12)
		},
		want: []uint64{0, 0xa000, 0xa000, 0xa000, 0xa008, 0xa02c},
	}, {
		name: "no calibration: CYC leaves the time",
		trace: func(e *ptenc.Encoder) {
			e.PSB()
			e.TSC(0x1000)
			e.PSBEnd()
			e.CYC(0x80)
		},
		want: []uint64{0, 0x1000, 0x1000, 0x1000},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := ptenc.New()
			tc.trace(e)
			k := NewClock(tc.cfg)
			d := NewPacketDecoder(e.Bytes())
			var got []uint64
			var p Packet
			for d.Next(&p) == nil {
				k.Packet(&p)
				got = append(got, k.TSC())
			}
			if len(got) != len(tc.want) {
				t.Fatalf("times %x, want %x", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("times %x, want %x", got, tc.want)
				}
			}
		})
	}
}
