package decode

import (
	"encoding/binary"
	"fmt"
	"math/rand"
	"testing"

	"ptfs/decode/ptenc"
)

func TestIPCompression(t *testing.T) {
	const last = 0xffff_8000_1234_5678
	tests := []struct {
		ipc         uint8
		payload     uint64
		want        uint64
		size        int8
		unknown     int
		wantListing string // appendIPPayload's column
	}{
		{IPCSuppressed, 0, last, 0, 16, "0: ????????????????"},
		{IPCUpdate16, 0xbeef, 0xffff_8000_1234_beef, 2, 12, "1: ????????????beef"},
		{IPCUpdate32, 0xdead_beef, 0xffff_8000_dead_beef, 4, 8, "2: ????????deadbeef"},
		{IPCSext48, 0x7fff_0000_1000, 0x0000_7fff_0000_1000, 6, 0, "3: 00007fff00001000"},
		{IPCSext48, 0x8000_0000_1000, 0xffff_8000_0000_1000, 6, 0, "3: ffff800000001000"},
		{IPCUpdate48, 0x0000_0000_1000, 0xffff_0000_0000_1000, 6, 4, "4: ????000000001000"},
		{IPCFull, 0x1234_5678_9abc_def0, 0x1234_5678_9abc_def0, 8, 0, "6: 123456789abcdef0"},
		{5, 0, 0, -1, 0, "5: 0000000000000000"},
		{7, 0, 0, -1, 0, "7: 0000000000000000"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("ipc%d-%x", tc.ipc, tc.payload), func(t *testing.T) {
			c := &ipCompressions[tc.ipc]
			if got := c.apply(last, tc.payload); got != tc.want {
				t.Errorf("apply = %#x, want %#x", got, tc.want)
			}
			if c.size != tc.size {
				t.Errorf("size = %d, want %d", c.size, tc.size)
			}
			if got := c.unknownDigits(); got != tc.unknown {
				t.Errorf("unknownDigits = %d, want %d", got, tc.unknown)
			}
			p := Packet{IPC: tc.ipc, Payload: tc.payload}
			if got := string(appendIPPayload(nil, &p)); got != tc.wantListing {
				t.Errorf("appendIPPayload = %q, want %q", got, tc.wantListing)
			}
		})
	}
}

// TestIPCompressionPaths checks that every path that decompresses IPs (the
// packet decoder's fast loop and its one-packet step, the assembler's fast
// path, ptdump's last-ip column) gives what ipCompression.apply gives.
func TestIPCompressionPaths(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	kinds := []ptenc.IPKind{ptenc.TIP, ptenc.TIPPGE, ptenc.TIPPGD, ptenc.FUP}
	for _, ipc := range []uint8{IPCSuppressed, IPCUpdate16, IPCUpdate32, IPCSext48, IPCUpdate48, IPCFull} {
		c := &ipCompressions[ipc]
		for i := 0; i < 200; i++ {
			kind := kinds[i%len(kinds)]
			last := rng.Uint64()
			payload := rng.Uint64() & lowMask[c.size]
			want := c.apply(last, payload)
			e := ptenc.New()
			e.IPC(ptenc.FUP, IPCFull, last)
			e.Raw(byte(kind) | ipc<<5)
			e.Raw(binary.LittleEndian.AppendUint64(nil, payload)[:c.size]...)
			short := e.Bytes()
			for range 16 {
				e.Pad()
			}
			name := fmt.Sprintf("ipc %d kind %#x last %#x payload %#x", ipc, kind, last, payload)
			wantIP := want
			if ipc == IPCSuppressed {
				wantIP = 0
			}
			// The fast loop decodes the second packet (16 bytes follow
			// it); one decodes it at the end of the short buffer.
			for _, buf := range [][]byte{e.Bytes(), short} {
				var out [2]Packet
				d := NewPacketDecoder(buf)
				if n, err := d.Decode(out[:]); n != 2 {
					t.Fatalf("%s: decoded %d packets: %v", name, n, err)
				}
				if out[1].IP != wantIP {
					t.Fatalf("%s, %d bytes: IP %#x, want %#x", name, len(buf), out[1].IP, wantIP)
				}
				if d.lastIP != want {
					t.Fatalf("%s, %d bytes: last IP %#x, want %#x", name, len(buf), d.lastIP, want)
				}
				l := NewPtdump(PtdumpOptions{LastIP: true})
				for j := range out {
					l.AppendPacket(nil, &out[j], buf[out[j].Offset:out[j].Offset+uint64(out[j].Size)])
				}
				if l.ip != want || l.suppressed != (ipc == IPCSuppressed) {
					t.Fatalf("%s: ptdump last IP %#x suppressed %v, want %#x", name, l.ip, l.suppressed, want)
				}
			}
			if kind != ptenc.FUP {
				continue
			}
			// The assembler shows a FUP's IP on the manual ptwrite before it.
			a := ptenc.New()
			a.IPC(ptenc.FUP, IPCFull, last)
			a.PTW(1, 4, true)
			a.Raw(short[9:]...)
			got, _ := assemble(a.Bytes(), nil)
			wantLine := "manual ptwrite: payload=0x1\n"
			if ipc != IPCSuppressed {
				wantLine = fmt.Sprintf("manual ptwrite: payload=0x1 ip=%#x\n", want)
			}
			if got != wantLine {
				t.Fatalf("%s: assembler %q, want %q", name, got, wantLine)
			}
		}
	}
}
