package decode

import (
	"bufio"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"ptfs/decode/ptenc"
	"ptfs/internal/testkit"
)

// decodeAll decodes buf to the end, resynchronizing after errors, and
// returns the packets and the errors.
func decodeAll(buf []byte) (pkts []Packet, errs []error) {
	d := NewPacketDecoder(buf)
	var p Packet
	for {
		err := d.Next(&p)
		if errors.Is(err, io.EOF) {
			return pkts, errs
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pkts = append(pkts, p)
	}
}

// perfField returns the hex or decimal number after key in a perf
// description ("CTC 0x201" → 0x201).
func perfField(t *testing.T, desc, key string) uint64 {
	t.Helper()
	i := strings.Index(desc, key)
	if i < 0 {
		t.Fatalf("%q: no %q", desc, key)
	}
	f := strings.Fields(desc[i+len(key):])
	if len(f) == 0 {
		t.Fatalf("%q: nothing after %q", desc, key)
	}
	v, err := strconv.ParseUint(strings.Trim(f[0], "()"), 0, 64)
	if err != nil {
		t.Fatalf("%q: %q: %v", desc, key, err)
	}
	return v
}

// TestPerfVectors decodes Linux perf's packet-decoder test vectors and checks
// the packet type and every field perf's description names.
func TestPerfVectors(t *testing.T) {
	f, err := os.Open(filepath.Join(testkit.Corpus(t), "perf", "perf-pkt-vectors.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		hexs, desc, ok := strings.Cut(sc.Text(), "\t")
		if !ok {
			t.Fatalf("bad line %q", sc.Text())
		}
		raw, err := hex.DecodeString(hexs)
		if err != nil {
			t.Fatalf("%q: %v", hexs, err)
		}
		n++
		checkPerfVector(t, raw, desc)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 120 {
		t.Errorf("decoded %d vectors, want 120", n)
	}
}

func checkPerfVector(t *testing.T, raw []byte, desc string) {
	t.Helper()
	name, _, _ := strings.Cut(desc, " ")
	in := raw
	// Block items exist only after a BBP, which gives their size.
	if name == "BIP" {
		sz := byte(0x80)
		if len(raw) == 9 {
			sz = 0
		}
		in = append([]byte{0x02, 0x63, sz}, raw...)
	}
	d := NewPacketDecoder(in)
	var p Packet
	if name == "BIP" {
		if err := d.Next(&p); err != nil || p.Kind != BBP {
			t.Fatalf("%x: BBP prefix: %v %v", in, p.Kind, err)
		}
	}
	if err := d.Next(&p); err != nil {
		t.Errorf("%x (%s): %v", raw, desc, err)
		return
	}
	if int(p.Size) != len(raw) {
		t.Errorf("%x (%s): size %d, want %d", raw, desc, p.Size, len(raw))
	}
	errorf := func(field string, got, want any) {
		t.Errorf("%x (%s): %s = %v, want %v", raw, desc, field, got, want)
	}
	want := func(field string, got, w uint64) {
		if got != w {
			errorf(field, got, w)
		}
	}
	kind := func(k Kind) {
		if p.Kind != k {
			errorf("kind", p.Kind, k)
		}
	}
	flag := func(f uint16, key string) {
		want(key, uint64(p.Flags&f)/uint64(f), perfField(t, desc, key))
	}
	switch name {
	case "PAD":
		kind(Pad)
	case "TNT":
		if len(raw) == 1 {
			kind(TNT8)
		} else {
			kind(TNT64)
		}
		bits := strings.Fields(desc)[1]
		want("bits", uint64(p.Bits), perfField(t, desc, "("))
		var v uint64
		for _, c := range bits {
			v <<= 1
			if c == 'T' {
				v |= 1
			}
		}
		want("payload", p.Payload, v)
	case "TIP", "TIP.PGE", "TIP.PGD", "FUP":
		kind(map[string]Kind{"TIP": TIP, "TIP.PGE": TIPPGE, "TIP.PGD": TIPPGD, "FUP": FUP}[name])
		want("ipc", uint64(p.IPC), uint64(raw[0]>>5))
		if strings.HasSuffix(desc, "no ip") {
			if !p.Suppressed() {
				errorf("suppressed", false, true)
			}
		} else {
			want("payload", p.Payload, perfField(t, desc, name))
		}
	case "PIP":
		kind(PIP)
		want("cr3>>5", p.Payload>>5, perfField(t, desc, "PIP"))
		flag(FlagNR, "NR=")
	case "MODE.Exec":
		kind(ModeExec)
		flag(FlagIF, "IF:")
		mode := map[string]uint16{"16": 0, "64": FlagCSL, "32": FlagCSD}[strings.Fields(desc)[2]]
		want("cs", uint64(p.Flags&(FlagCSL|FlagCSD)), uint64(mode))
	case "MODE.TSX":
		kind(ModeTSX)
		flag(FlagAbort, "TXAbort:")
		flag(FlagInTX, "InTX:")
	case "TraceSTOP":
		kind(Stop)
	case "CBR":
		kind(CBR)
		want("ratio", p.Payload, perfField(t, desc, "CBR"))
	case "TSC":
		kind(TSC)
		want("tsc", p.Payload, perfField(t, desc, "TSC"))
	case "MTC":
		kind(MTC)
		want("ctc", p.Payload, perfField(t, desc, "MTC"))
	case "TMA":
		kind(TMA)
		want("ctc", p.Payload, perfField(t, desc, "CTC"))
		want("fc", uint64(p.Aux), perfField(t, desc, "FC"))
	case "CYC":
		kind(CYC)
		want("cyc", p.Payload, perfField(t, desc, "CYC"))
	case "VMCS":
		kind(VMCS)
		want("vmcs>>12", p.Payload>>12, perfField(t, desc, "VMCS"))
	case "OVF":
		kind(OVF)
	case "PSB":
		kind(PSB)
	case "PSBEND":
		kind(PSBEnd)
	case "MNT":
		kind(MNT)
		want("payload", p.Payload, perfField(t, desc, "MNT"))
	case "PTWRITE":
		kind(PTW)
		want("payload", p.Payload, perfField(t, desc, "PTWRITE"))
		want("bytes", uint64(p.Bits), uint64(len(raw)-2))
		flag(FlagIP, "IP:")
	case "EXSTOP":
		kind(Exstop)
		flag(FlagIP, "IP:")
	case "MWAIT":
		kind(Mwait)
		want("payload", p.Payload|uint64(p.Aux)<<32, perfField(t, desc, "MWAIT"))
		want("hints", p.Payload&0xff, perfField(t, desc, "Hints"))
		want("ext", uint64(p.Aux&3), perfField(t, desc, "Extensions"))
	case "PWRE":
		kind(Pwre)
		want("payload", p.Payload, perfField(t, desc, "PWRE"))
		flag(FlagHW, "HW:")
		want("cstate", uint64(p.Type>>4), perfField(t, desc, " CState:"))
		want("subcstate", uint64(p.Type&0xf), perfField(t, desc, "Sub-CState:"))
	case "PWRX":
		kind(Pwrx)
		want("payload", p.Payload, perfField(t, desc, "PWRX"))
		want("last", uint64(p.Type>>4), perfField(t, desc, "Last CState:"))
		want("deepest", uint64(p.Type&0xf), perfField(t, desc, "Deepest CState:"))
		want("wake", uint64(p.Aux), perfField(t, desc, "Wake Reason"))
	case "BBP":
		kind(BBP)
		sz4 := strings.Contains(desc, "4-byte")
		if p.Has(FlagSZ) != sz4 {
			errorf("sz4", p.Has(FlagSZ), sz4)
		}
		want("type", uint64(p.Type), perfField(t, desc, "Type"))
	case "BIP":
		kind(BIP)
		want("id", uint64(p.Type), perfField(t, desc, "ID"))
		want("value", p.Payload, perfField(t, desc, "Value"))
	case "BEP":
		kind(BEP)
		flag(FlagIP, "IP:")
	case "CFE":
		kind(CFE)
		flag(FlagIP, "IP:")
		want("type", uint64(p.Type), perfField(t, desc, "Type"))
		want("vector", p.Payload, perfField(t, desc, "Vector"))
	case "EVD":
		kind(EVD)
		want("type", uint64(p.Type), perfField(t, desc, "Type"))
		want("payload", p.Payload, perfField(t, desc, "Payload"))
	default:
		t.Errorf("%x: unhandled perf description %q", raw, desc)
	}
}

// TestPacketDecoderTable covers decoding, last-IP decompression and the
// errors on hand-made byte sequences.
func TestPacketDecoderTable(t *testing.T) {
	psb := string(psbPattern[:])
	type want struct {
		kind Kind
		ip   uint64
		off  uint64
	}
	for _, c := range []struct {
		name string
		in   string
		want []want
		errs []error
	}{
		{"empty", "", nil, nil},
		{"ip decompression", "\xdd\x08\x07\x06\x05\x04\x03\x02\x01" + "\x2d\x34\x12" + "\x4d\x78\x56\x34\x12" +
			"\x8d\x66\x55\x44\x33\x22\x11" + "\x6d\x00\x00\x00\x00\x00\x80",
			[]want{{FUP, 0x0102030405060708, 0}, {TIP, 0x0102030405061234, 9}, {TIP, 0x0102030412345678, 12},
				{TIP, 0x0102112233445566, 17}, {TIP, 0xffff800000000000, 24}}, nil},
		{"psb resets last ip", "\xdd\x08\x07\x06\x05\x04\x03\x02\x01" + psb + "\x2d\x34\x12",
			[]want{{FUP, 0x0102030405060708, 0}, {PSB, 0, 9}, {TIP, 0x1234, 25}}, nil},
		{"suppressed keeps last ip", "\x2d\x34\x12\x0d\x31\x78\x56",
			[]want{{TIP, 0x1234, 0}, {TIP, 0, 3}, {TIPPGE, 0x5678, 4}}, nil},
		{"reserved ipc", "\xad\x00\x00", nil, []error{ErrBadPacket}},
		{"bad opcode then eof", "\xc9", nil, []error{ErrBadOpcode}},
		{"bad ext opcode", "\x02\x04", nil, []error{ErrBadOpcode}},
		{"bad mnt ext2", "\x02\xc3\x00", nil, []error{ErrBadOpcode}},
		{"bad mode leaf", "\x99\x40", nil, []error{ErrBadPacket}},
		{"reserved ptw size", "\x02\x52\x00\x00\x00\x00", nil, []error{ErrBadPacket}},
		{"tnt64 without stop bit", "\x02\xa3\x00\x00\x00\x00\x00\x00", nil, []error{ErrBadPacket}},
		{"tma reserved fc", "\x02\x73\x00\x00\x00\x00\x02", nil, []error{ErrBadPacket}},
		{"broken psb", "\x02\x82\x02\x82\x00" + psb[5:], nil, []error{ErrBadPacket}},
		{"short psb", "\x02\x82\x02\x82", nil, []error{ErrTruncated}},
		{"truncated tsc", "\x19\x00\x00", nil, []error{ErrTruncated}},
		{"truncated ext", "\x02", nil, []error{ErrTruncated}},
		{"truncated cyc", "\x07\x01", nil, []error{ErrTruncated}},
		{"overlong cyc", "\x07" + strings.Repeat("\x01", 15), nil, []error{ErrBadPacket}},
		{"error then resync", "\x00\xc9\x00" + psb + "\x00",
			[]want{{Pad, 0, 0}, {PSB, 0, 3}, {Pad, 0, 19}}, []error{ErrBadOpcode}},
		{"bip only in a block", "\x04" + "\x02\x63\x80" + "\x0c\x01\x02\x03\x04" + "\x02\x33" + "\x04",
			[]want{{TNT8, 0, 0}, {BBP, 0, 1}, {BIP, 0, 4}, {BEP, 0, 9}, {TNT8, 0, 11}}, nil},
		{"trig with icnt", "\xd9\xc0\x07\x05\x00", []want{{Trig, 0, 0}}, nil},
	} {
		pkts, errs := decodeAll([]byte(c.in))
		if len(pkts) != len(c.want) {
			t.Errorf("%s: got %d packets %+v, want %d", c.name, len(pkts), pkts, len(c.want))
			continue
		}
		for i, w := range c.want {
			p := pkts[i]
			if p.Kind != w.kind || p.IP != w.ip || p.Offset != w.off {
				t.Errorf("%s: packet %d = %v ip %#x at %d, want %v ip %#x at %d",
					c.name, i, p.Kind, p.IP, p.Offset, w.kind, w.ip, w.off)
			}
		}
		if len(errs) != len(c.errs) {
			t.Errorf("%s: errors %v, want %v", c.name, errs, c.errs)
			continue
		}
		for i, e := range c.errs {
			var pe *PacketError
			if !errors.Is(errs[i], e) || !errors.As(errs[i], &pe) {
				t.Errorf("%s: error %d = %v, want a *PacketError wrapping %v", c.name, i, errs[i], e)
			}
		}
	}
}

// TestSyncForward checks libipt's resynchronization rules: a PSB partly
// swallowed by a bogus packet is found again, and the current PSB skipped.
func TestSyncForward(t *testing.T) {
	psb := string(psbPattern[:])
	// pad×6, PSB at 6, "02 c3 88" (MNT swallowing 8 bytes of the next PSB),
	// PSB at 0x19: the layout of libipt's ptdump-trunc-resync test.
	buf := []byte("\x00\x00\x00\x00\x00\x00" + psb + "\x02\xc3\x88" + psb + "\x7d\x00\x10\x00\xa0\x00\x00\x02\x23")
	d := NewPacketDecoder(buf)
	if err := d.SyncForward(); err != nil || d.Pos() != 6 {
		t.Fatalf("first sync: pos %d, %v; want 6", d.Pos(), err)
	}
	var p Packet
	for _, k := range []Kind{PSB, MNT} {
		if err := d.Next(&p); err != nil || p.Kind != k {
			t.Fatalf("got %v %v, want %v", p.Kind, err, k)
		}
	}
	if err := d.Next(&p); !errors.Is(err, ErrBadPacket) {
		t.Fatalf("at the swallowed PSB: %v, want %v", err, ErrBadPacket)
	}
	if err := d.SyncForward(); err != nil || d.Pos() != 0x19 {
		t.Fatalf("resync: pos %#x, %v; want 0x19", d.Pos(), err)
	}
	if err := d.SyncForward(); !errors.Is(err, io.EOF) {
		t.Fatalf("sync past the last PSB: %v, want EOF", err)
	}
	if err := d.Next(&p); !errors.Is(err, io.EOF) {
		t.Fatalf("after EOF sync: %v", err)
	}
	if err := d.SyncSet(uint64(len(buf) + 1)); err == nil {
		t.Fatal("SyncSet beyond the buffer succeeded")
	}
}

// TestPacketDecoderGenerated decodes generated streams of every profile:
// no errors, packets tile the stream, PSBs every PSBPeriod bytes or so.
func TestPacketDecoderGenerated(t *testing.T) {
	for _, prof := range []ptenc.Profile{ptenc.Mixed, ptenc.PTWHeavy, ptenc.TNTHeavy} {
		buf := ptenc.Generate(prof, 1<<20, 7)
		pkts, errs := decodeAll(buf)
		if len(errs) > 0 {
			t.Fatalf("%v: %d errors, first %v", prof, len(errs), errs[0])
		}
		var next uint64
		psbs := 0
		for _, p := range pkts {
			if p.Offset != next {
				t.Fatalf("%v: packet at %d, want %d", prof, p.Offset, next)
			}
			next += uint64(p.Size)
			if p.Kind == PSB {
				psbs++
			}
		}
		if next != uint64(len(buf)) {
			t.Fatalf("%v: packets cover %d of %d bytes", prof, next, len(buf))
		}
		if psbs < len(buf)/ptenc.PSBPeriod {
			t.Errorf("%v: %d PSBs in %d bytes", prof, psbs, len(buf))
		}
	}
}

func TestPacketDecoderNoAlloc(t *testing.T) {
	buf := ptenc.Generate(ptenc.Mixed, 1<<16, 3)
	d := NewPacketDecoder(nil)
	var p Packet
	allocs := testing.AllocsPerRun(5, func() {
		d.Reset(buf)
		for d.Next(&p) == nil {
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per pass, want 0", allocs)
	}
}

// FuzzPacketDecoder checks that no input makes the decoder panic, loop or
// return inconsistent packets, and that the listing never fails.
func FuzzPacketDecoder(f *testing.F) {
	// Seeds from the corpus when it is there; the fuzzer works without.
	base := testkit.CorpusPath(f)
	files, _ := filepath.Glob(filepath.Join(base, "libipt", "*.pt"))
	for _, name := range files {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	if b, err := os.ReadFile(filepath.Join(base, "libxdc", "icelake_tip", "ptlog")); err == nil {
		f.Add(b)
	}
	f.Add(ptenc.Generate(ptenc.Mixed, 2048, 1))
	f.Add([]byte{0x02, 0x63, 0x80, 0x0c, 1, 2, 3, 4, 0x02, 0x33})
	f.Fuzz(func(t *testing.T, buf []byte) {
		// The batch path (fast loop plus one) and the general one-packet
		// path must agree packet for packet and error for error.
		batch, slow := NewPacketDecoder(buf), NewPacketDecoder(buf)
		// slowNext is Next through the general path only.
		slowNext := func(q *Packet) error {
			if slow.failed {
				if err := slow.SyncForward(); err != nil {
					return err
				}
			}
			return slow.one(q)
		}
		var out [7]Packet
		var q Packet
		for steps := 0; ; steps++ {
			if steps > 2*len(buf)+2 {
				t.Fatalf("no progress after %d steps", steps)
			}
			n, berr := batch.Decode(out[:])
			for _, p := range out[:n] {
				if err := slowNext(&q); err != nil || q != p {
					t.Fatalf("batch %+v, one %+v %v", p, q, err)
				}
				if p.Size == 0 || p.Offset+uint64(p.Size) > uint64(len(buf)) {
					t.Fatalf("bad packet %+v in %d bytes", p, len(buf))
				}
			}
			if berr == nil {
				continue
			}
			serr := slowNext(&q)
			if serr == nil || serr.Error() != berr.Error() {
				t.Fatalf("batch error %v, one %v %+v", berr, serr, q)
			}
			if errors.Is(berr, io.EOF) {
				break
			}
			var pe *PacketError
			if !errors.As(berr, &pe) || pe.Offset > uint64(len(buf)) {
				t.Fatalf("bad error %v", berr)
			}
		}
		if err := WritePtdump(io.Discard, buf, PtdumpOptions{LastIP: true, Time: true, MTCFreq: 3, CPUID15EAX: 1, CPUID15EBX: 2}); err != nil {
			t.Fatal(err)
		}
	})
}
