package ptenc

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"ptfs/internal/testkit"
)

// TestDumpAllPackets re-encodes libipt's dump-all-packets test (packets p01
// to p54, the ones libipt 2.0 also knows) and compares with the bytes
// libipt's pttc produced.
func TestDumpAllPackets(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(testkit.Corpus(t), "libipt", "dump-all-packets.pt"))
	if err != nil {
		t.Fatal(err)
	}
	e := New()
	e.PSBEnd()
	e.PSB()
	e.Pad()
	e.OVF()
	e.TNT(0b10001, 5)
	e.TNT(0b10010010011001001001100100100110010010011001101, 47)
	for _, k := range []IPKind{TIP, TIPPGE, TIPPGD, FUP} {
		var base uint64
		switch k {
		case TIP:
			base = 0x1000
		case TIPPGE:
			base = 0x2000
		case TIPPGD:
			base = 0x3000
		case FUP:
			base = 0x4000
		}
		e.IPC(k, 3, 0xffffffffffff0000|base)
		e.IPC(k, 3, base)
		e.IPC(k, 2, base+1)
		e.IPC(k, 1, base+2)
		e.IPC(k, 0, base+3)
	}
	e.ModeExec(false, false)
	e.ModeExec(false, true)
	e.ModeExec(true, false)
	e.ModeTSX(true, false)
	e.ModeTSX(false, false)
	e.ModeTSX(false, true)
	e.PIP(0xafafaf, false)
	e.PIP(0xafafaf, true)
	e.TSC(0x12345)
	e.CBR(0x24)
	e.TMA(0x12, 0x34)
	e.MTC(0x94)
	e.CYC(0x57)
	e.Stop()
	e.VMCS(0xabcd000)
	e.MNT(0x2a2242e5d4c3b2a1)
	e.IPC(TIP, 6, 0x00cccccccccc4000)
	e.IPC(TIP, 4, 0xffffffff4000)
	e.Exstop(false)
	e.Exstop(true)
	e.Mwait(0xb, 0x1)
	e.Pwre(false, 0xf, 0xf)
	e.Raw(0x02, 0x22, 0x08, 0xff) // pttc puts PWRE's HW flag at bit 3, Pwre at bit 7 (SDM)
	e.Pwrx(0, 5, 1)
	e.Pwrx(0, 5, 4)
	e.Pwrx(0, 5, 8)
	e.PTW(0x90abcdef, 4, true)
	e.PTW(0x1234567890abcdef, 8, false)
	got := e.Bytes()
	if len(want) < len(got) || !bytes.Equal(got, want[:len(got)]) {
		for i := range got {
			if i >= len(want) || got[i] != want[i] {
				t.Fatalf("first difference at offset %#x:\n got % x\nwant % x", i, got[i:min(i+12, len(got))], want[i:min(i+12, len(want))])
			}
		}
	}
	if len(got) != 0x10c {
		t.Errorf("encoded %#x bytes, p55 starts at 0x10c", len(got))
	}
}

// TestPTWFup re-encodes libipt's ptw-fup test.
func TestPTWFup(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(testkit.Corpus(t), "libipt", "ptw-fup.pt"))
	if err != nil {
		t.Fatal(err)
	}
	e := New()
	e.PSB()
	e.PSBEnd()
	e.PTW(0xabcd, 4, true)
	e.IPC(FUP, 3, 0x100000)
	e.PTW(0xef09, 8, true)
	e.IPC(FUP, 3, 0x100001)
	if !bytes.Equal(e.Bytes(), want) {
		t.Fatalf("got % x\nwant % x", e.Bytes(), want)
	}
}

func TestIPCompression(t *testing.T) {
	tests := []struct {
		last, ip uint64
		want     []byte
	}{
		{0, 0x1234, []byte{0x3d, 0x34, 0x12}},
		{0x401000, 0x405678, []byte{0x3d, 0x78, 0x56}},
		{0x401000, 0x12345678, []byte{0x5d, 0x78, 0x56, 0x34, 0x12}},
		{0, 0x7fff00001000, []byte{0x7d, 0x00, 0x10, 0x00, 0x00, 0xff, 0x7f}},
		{0, 0xffffffff81000000, []byte{0x7d, 0, 0, 0, 0x81, 0xff, 0xff}},
		{0, 0x0123456789abcdef, []byte{0xdd, 0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01}},
	}
	for _, tt := range tests {
		e := New()
		e.lastIP = tt.last
		e.IP(FUP, tt.ip)
		if !bytes.Equal(e.Bytes(), tt.want) {
			t.Errorf("last %#x ip %#x: got % x, want % x", tt.last, tt.ip, e.Bytes(), tt.want)
		}
		if e.lastIP != tt.ip {
			t.Errorf("last %#x ip %#x: last IP now %#x", tt.last, tt.ip, e.lastIP)
		}
	}
}

func TestCYCAndTNT(t *testing.T) {
	tests := []struct {
		name string
		f    func(e *Encoder)
		want []byte
	}{
		{"cyc small", func(e *Encoder) { e.CYC(3) }, []byte{0x1b}},
		{"cyc two", func(e *Encoder) { e.CYC(0x57) }, []byte{0xbf, 0x04}},
		{"cyc three", func(e *Encoder) { e.CYC(1 << 12) }, []byte{0x07, 0x01, 0x02}},
		{"tnt one", func(e *Encoder) { e.TNT(1, 1) }, []byte{0x06}},
		{"tnt six", func(e *Encoder) { e.TNT(0, 6) }, []byte{0x80}},
		{"tnt seven", func(e *Encoder) { e.TNT(0x7f, 7) }, []byte{0x02, 0xa3, 0xff, 0, 0, 0, 0, 0}},
		{"pwre hw", func(e *Encoder) { e.Pwre(true, 2, 1) }, []byte{0x02, 0x22, 0x80, 0x21}},
		{"header", func(e *Encoder) { e.PTW(Header(0x6c2, 2), 8, false) },
			[]byte{0x02, 0x32, 0x31, 0x57, 0x52, 0x54, 0x50, 0x02, 0xc2, 0x06}},
	}
	for _, tt := range tests {
		e := New()
		tt.f(e)
		if !bytes.Equal(e.Bytes(), tt.want) {
			t.Errorf("%s: got % x, want % x", tt.name, e.Bytes(), tt.want)
		}
	}
}

func TestGenerate(t *testing.T) {
	for _, p := range []Profile{Mixed, PTWHeavy, TNTHeavy} {
		a := Generate(p, 1<<16, 7)
		b := Generate(p, 1<<16, 7)
		if !bytes.Equal(a, b) {
			t.Errorf("%v: not reproducible", p)
		}
		if len(a) < 1<<16 || len(a) > 1<<16+64 {
			t.Errorf("%v: %d bytes", p, len(a))
		}
		psb := []byte{0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82}
		if n := bytes.Count(a, psb); n < 16 {
			t.Errorf("%v: %d PSBs in 64 KiB", p, n)
		}
		if c := Generate(p, 1<<16, 8); bytes.Equal(a, c) {
			t.Errorf("%v: seed ignored", p)
		}
	}
}
