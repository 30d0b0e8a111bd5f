package decode

import (
	"encoding/binary"
	"testing"

	"ptfs/decode/ptenc"
)

// TestRawIP holds IPSize and ApplyIP to the packet decoder: for every IP
// packet kind and compression, the IP bytes after the first byte, applied
// to the last IP, give the IP and the last IP that Next gives.
func TestRawIP(t *testing.T) {
	const last = 0xffff_8000_1234_5678
	for _, kind := range []ptenc.IPKind{ptenc.TIP, ptenc.TIPPGE, ptenc.TIPPGD, ptenc.FUP} {
		for _, ipc := range []int{0, 1, 2, 3, 4, 6} {
			e := ptenc.New()
			e.PSB()
			e.IP(ptenc.FUP, last)
			e.IPC(kind, ipc, 0x0000_7fff_cafe_f00d)
			e.IP(ptenc.TIP, 0x0000_7fff_cafe_f00d) // shows the last IP after it
			buf := append(e.Bytes(), make([]byte, 16)...)
			d := NewPacketDecoder(buf)
			var p Packet
			for d.Next(&p) == nil && !(p.Kind == FUP && p.IP == last) {
			}
			b, pos, lastIP, ok := d.Raw()
			if !ok || lastIP != last {
				t.Fatalf("kind %x ipc %d: Raw gives last IP %#x, ok %v", kind, ipc, lastIP, ok)
			}
			n := IPSize(b[pos])
			if n != int(ipCompressions[ipc].size) {
				t.Errorf("kind %x ipc %d: IPSize %d, want %d", kind, ipc, n, ipCompressions[ipc].size)
			}
			// The whole word, the next packet's bytes behind the IP's:
			// ApplyIP masks them off.
			got := ApplyIP(b[pos], binary.LittleEndian.Uint64(b[pos+1:]), lastIP)
			if err := d.Next(&p); err != nil {
				t.Fatal(err)
			}
			if ipc != 0 && got != p.IP || ipc == 0 && got != last {
				t.Errorf("kind %x ipc %d: ApplyIP gives %#x, Next %#x", kind, ipc, got, p.IP)
			}
			if _, _, after, _ := d.Raw(); after != got {
				t.Errorf("kind %x ipc %d: last IP %#x after the packet, ApplyIP %#x", kind, ipc, after, got)
			}
		}
	}
	for _, b := range []byte{5 << 5, 7 << 5} {
		if n := IPSize(b | 0x0d); n != -1 {
			t.Errorf("reserved IPBytes %d: IPSize %d, want -1", b>>5, n)
		}
	}
}

// TestSetRaw: a position and last IP that Raw gave, set again after
// decoding on (and after an error), decode the same packets again.
func TestSetRaw(t *testing.T) {
	e := ptenc.New()
	e.PSB()
	e.IP(ptenc.FUP, 0x401000)
	e.PSBEnd()
	e.IP(ptenc.TIP, 0x401234)
	e.TNT(0b101, 3)
	e.Raw(0x02, 0xff) // bad opcode
	buf := e.Bytes()
	d := NewPacketDecoder(buf)
	var p Packet
	for d.Next(&p) == nil && p.Kind != PSBEnd {
	}
	_, pos, last, ok := d.Raw()
	var first []Packet
	for d.Next(&p) == nil {
		first = append(first, p)
	}
	if _, _, _, ok := d.Raw(); ok {
		t.Error("Raw is ok after an error")
	}
	d.SetRaw(pos, last)
	if !ok || len(first) != 2 {
		t.Fatalf("ok %v, %d packets before the error, want 2", ok, len(first))
	}
	for i := range first {
		if err := d.Next(&p); err != nil || p != first[i] {
			t.Errorf("packet %d again: %+v (%v), want %+v", i, p, err, first[i])
		}
	}
	if err := d.Next(&p); err == nil {
		t.Error("the bad opcode decodes after SetRaw")
	}
}

// TestRawNext holds RawNext to SetRaw and Next: the same packet, position,
// last IP and error at each packet of a PSB+ group and at bad bytes.
func TestRawNext(t *testing.T) {
	e := ptenc.New()
	e.PSB()
	e.Pad()
	e.ModeTSX(true, false)
	e.ModeExec(true, false)
	e.IP(ptenc.FUP, 0x4000_1234)
	e.PIP(0x1234000, true)
	e.VMCS(0x5000)
	e.CBR(25)
	e.MNT(7)
	e.PSBEnd()
	e.IPC(ptenc.TIP, 1, 0x4000_5678)
	e.Raw(0x99, 0xc0)       // MODE with a bad leaf
	e.Raw(0x02, 0x82, 0x02) // a PSB cut short
	e.Raw(0x02, 0xff)       // no such opcode
	buf := append(e.Bytes(), make([]byte, 16)...)
	var want, got Packet
	ref, raw := NewPacketDecoder(buf), NewPacketDecoder(buf)
	for pos, last := 0, uint64(0); pos < len(e.Bytes()); {
		ref.SetRaw(pos, last)
		werr := ref.Next(&want)
		_, wpos, wlast, _ := ref.Raw()
		next, glast, gerr := raw.RawNext(pos, last, &got)
		if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
			t.Fatalf("at %d: RawNext's error %v, Next's %v", pos, gerr, werr)
		}
		if werr != nil {
			// Past the bad bytes: the next opcode's byte.
			pos++
			continue
		}
		if got != want || next != wpos || glast != wlast {
			t.Fatalf("at %d: RawNext gives %+v, %d, %#x; Next %+v, %d, %#x", pos, got, next, glast, want, wpos, wlast)
		}
		pos, last = next, glast
	}
}
