package decode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"ptfs/decode/ptenc"
	"ptfs/internal/testkit"
)

// buildLibipt compiles the libipt harness testdata/ptpkt.c into dir, or
// skips when libipt or gcc is missing.
func buildLibipt(t testing.TB, dir string) string {
	t.Helper()
	if _, err := os.Stat("/usr/include/intel-pt.h"); err != nil {
		testkit.Unavailable(t, "libipt header /usr/include/intel-pt.h missing: apt-get install libipt-dev")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		testkit.Unavailable(t, "gcc missing: needed to build the libipt harness")
	}
	bin := filepath.Join(dir, "ptpkt")
	out, err := exec.Command("gcc", "-O2", "-Wall", "-o", bin, filepath.Join("testdata", "ptpkt.c"), "-lipt").CombinedOutput()
	if err != nil {
		t.Fatalf("build libipt harness: %v\n%s", err, out)
	}
	return bin
}

// appendDiffLine formats a packet like the harness's dump mode.
func appendDiffLine(b []byte, p *Packet) []byte {
	b = strconv.AppendUint(b, p.Offset, 16)
	b = append(b, ' ')
	b = append(b, p.Kind.String()...)
	hex := func(v uint64) {
		b = append(b, ' ')
		b = strconv.AppendUint(b, v, 16)
	}
	flag := func(f uint16) {
		if p.Has(f) {
			b = append(b, " 1"...)
		} else {
			b = append(b, " 0"...)
		}
	}
	switch p.Kind {
	case TNT8, TNT64:
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(p.Bits), 10)
		hex(p.Payload)
	case TIP, TIPPGE, TIPPGD, FUP:
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(p.IPC), 10)
		hex(p.Payload)
	case ModeExec:
		flag(FlagCSL)
		flag(FlagCSD)
	case ModeTSX:
		flag(FlagInTX)
		flag(FlagAbort)
	case PIP:
		hex(p.Payload)
		flag(FlagNR)
	case CBR:
		b = append(b, ' ')
		b = strconv.AppendUint(b, p.Payload, 10)
	case VMCS, TSC, MTC, CYC, MNT:
		hex(p.Payload)
	case TMA, Mwait:
		hex(p.Payload)
		hex(uint64(p.Aux))
	case Exstop:
		flag(FlagIP)
	case Pwre:
		hex(uint64(p.Type >> 4))
		hex(uint64(p.Type & 0xf))
	case Pwrx:
		hex(uint64(p.Type >> 4))
		hex(uint64(p.Type & 0xf))
		hex(uint64(p.Aux & 0xd)) // bit 1 is reserved; libipt drops it
	case PTW:
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(p.Bits), 10)
		hex(p.Payload)
		flag(FlagIP)
	}
	return append(b, '\n')
}

// ptfsDump lists buf like `ptpkt dump`: from offset 0, an error line and a
// resync at each undecodable packet.
func ptfsDump(buf []byte) []byte {
	var out []byte
	d := NewPacketDecoder(buf)
	var p Packet
	for {
		err := d.Next(&p)
		if err == nil {
			out = appendDiffLine(out, &p)
			continue
		}
		if err == io.EOF {
			return out
		}
		var pe *PacketError
		if !errors.As(err, &pe) {
			return append(out, fmt.Sprintf("unexpected error %v\n", err)...)
		}
		code := "bad_opc"
		switch {
		case errors.Is(err, ErrBadPacket):
			code = "bad_packet"
		case errors.Is(err, ErrTruncated):
			code = "eos"
		}
		out = fmt.Appendf(out, "%x error %s\n", pe.Offset, code)
		if code == "eos" || d.SyncForward() != nil {
			return out
		}
	}
}

// newerKinds are packets libipt 2.0 (Debian's) does not know; it calls
// their opcodes bad and resynchronizes where ptfs goes on.
var newerKinds = map[string]bool{"bbp": true, "bip": true, "bep": true, "cfe": true, "evd": true, "trig": true}

type diffLine struct {
	off  uint64
	text string
}

func parseDiff(b []byte) []diffLine {
	var ls []diffLine
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		sp := strings.IndexByte(l, ' ')
		off, _ := strconv.ParseUint(l[:sp], 16, 64)
		ls = append(ls, diffLine{off, l})
	}
	return ls
}

// compareDumps compares the two listings. A divergence is accepted only
// where ptfs decodes a packet newer than libipt 2.0 and libipt reports a bad
// opcode at the same offset; comparison resumes at the next PSB both list.
// It returns the number of lines compared and of such divergences, and an
// error describing the first other difference.
func compareDumps(ptfs, ipt []diffLine) (compared, skipped int, err error) {
	i, j := 0, 0
	for i < len(ptfs) && j < len(ipt) {
		if ptfs[i] == ipt[j] {
			compared++
			i++
			j++
			continue
		}
		kind := strings.Fields(ptfs[i].text)[1]
		if !newerKinds[kind] || ipt[j].off != ptfs[i].off || !strings.HasSuffix(ipt[j].text, "error bad_opc") {
			return compared, skipped, fmt.Errorf("first difference:\n ptfs:   %s\n libipt: %s", ptfs[i].text, ipt[j].text)
		}
		skipped++
		at := ptfs[i].off
		psbs := map[uint64]int{}
		for k := i; k < len(ptfs); k++ {
			if ptfs[k].off > at && strings.HasSuffix(ptfs[k].text, " psb") {
				psbs[ptfs[k].off] = k
			}
		}
		i, j = len(ptfs), len(ipt)
		iptPSB := false
		for k := j0(ipt, at); k < len(ipt); k++ {
			if !strings.HasSuffix(ipt[k].text, " psb") {
				continue
			}
			iptPSB = true
			if pk, ok := psbs[ipt[k].off]; ok {
				i, j = pk, k
				break
			}
		}
		if i == len(ptfs) && (len(psbs) > 0 || iptPSB) {
			return compared, skipped, fmt.Errorf("no common PSB after the %s at %#x", kind, at)
		}
	}
	if i < len(ptfs) || j < len(ipt) {
		rest := func(ls []diffLine, k int) string {
			if k < len(ls) {
				return ls[k].text
			}
			return "(end)"
		}
		return compared, skipped, fmt.Errorf("listings end differently:\n ptfs:   %s\n libipt: %s", rest(ptfs, i), rest(ipt, j))
	}
	return compared, skipped, nil
}

// j0 returns the index of the first line after offset at.
func j0(ls []diffLine, at uint64) int {
	for k, l := range ls {
		if l.off > at {
			return k
		}
	}
	return len(ls)
}

// TestLibiptDiff compares ptfs's packet decoder with libipt's on seeded
// random streams, mutated copies of them, random bytes and the corpus.
func TestLibiptDiff(t *testing.T) {
	dir := t.TempDir()
	bin := buildLibipt(t, dir)
	r := rand.New(rand.NewSource(20261129))
	type tc struct {
		name string
		data []byte
	}
	var cases []tc
	profiles := []ptenc.Profile{ptenc.Mixed, ptenc.PTWHeavy, ptenc.TNTHeavy}
	for i := 0; i < 60; i++ {
		p := profiles[i%3]
		s := ptenc.Generate(p, 1024+r.Intn(8192), r.Int63())
		cases = append(cases, tc{fmt.Sprintf("%v-%d", p, i), s})
		// Mutations: flipped bits, random bytes, cut and spliced.
		m := append([]byte(nil), s...)
		for k := 0; k < 1+r.Intn(8); k++ {
			m[r.Intn(len(m))] ^= byte(1 << r.Intn(8))
		}
		cases = append(cases, tc{fmt.Sprintf("%v-%d-bitflip", p, i), m})
		m = append([]byte(nil), s...)
		for k := 0; k < 1+r.Intn(8); k++ {
			m[r.Intn(len(m))] = byte(r.Intn(256))
		}
		cases = append(cases, tc{fmt.Sprintf("%v-%d-bytes", p, i), m})
		a, b := r.Intn(len(s)), r.Intn(len(s))
		cases = append(cases, tc{fmt.Sprintf("%v-%d-splice", p, i), append(append([]byte(nil), s[a:]...), s[:b]...)})
	}
	for i := 0; i < 40; i++ {
		junk := make([]byte, 64+r.Intn(2048))
		r.Read(junk)
		// Sprinkle PSBs so that resynchronization happens.
		for k := 0; k+16 <= len(junk); k += 200 + r.Intn(600) {
			copy(junk[k:], psbPattern[:])
		}
		cases = append(cases, tc{fmt.Sprintf("random-%d", i), junk})
	}
	// Real traces when the corpus is there; the generated streams run
	// without it.
	if corpus := testkit.CorpusPath(t); dirExists(corpus) {
		for _, f := range []string{"perf/intel_pt-4.14-idx0-cpu0.pt", "ptsim/run-static-ptw/trace.pt"} {
			d, err := os.ReadFile(filepath.Join(corpus, f))
			if err != nil {
				t.Fatal(err)
			}
			cases = append(cases, tc{f, d})
		}
	}
	var compared, skipped int
	for k, c := range cases {
		path := filepath.Join(dir, strconv.Itoa(k)+".pt")
		if err := os.WriteFile(path, c.data, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "dump", path).Output()
		if err != nil {
			t.Fatalf("%s: libipt harness: %v", c.name, err)
		}
		n, s, err := compareDumps(parseDiff(ptfsDump(c.data)), parseDiff(out))
		compared += n
		skipped += s
		if err != nil {
			kept := filepath.Join(os.TempDir(), "ptfs-diff-failure.pt")
			if os.WriteFile(kept, c.data, 0o644) == nil {
				t.Logf("stream kept in %s", kept)
			}
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	t.Logf("%d streams, %d packet and error lines equal, %d divergences at packets newer than libipt 2.0",
		len(cases), compared, skipped)
	if compared < 100000 {
		t.Errorf("only %d lines compared", compared)
	}
}

// TestCompareDumps checks that the comparison can fail: a listing that
// differs in one payload, or ends early, is reported; a BBP that libipt 2.0
// calls a bad opcode is not.
func TestCompareDumps(t *testing.T) {
	e := ptenc.New()
	e.PSB()
	e.PTW(5, 8, false)
	e.Raw(0x02, 0x63, 0x00) // BBP
	e.PSB()
	e.PSBEnd()
	ptfs := ptfsDump(e.Bytes())
	ipt := []byte("0 psb\n10 ptw 8 5 0\n1a error bad_opc\n1d psb\n2d psbend\n")
	if _, s, err := compareDumps(parseDiff(ptfs), parseDiff(ipt)); err != nil || s != 1 {
		t.Errorf("bbp: %d skipped, %v\nptfs:\n%s", s, err, ptfs)
	}
	bad := bytes.Replace(ipt, []byte("ptw 8 5 0"), []byte("ptw 8 6 0"), 1)
	if _, _, err := compareDumps(parseDiff(ptfs), parseDiff(bad)); err == nil {
		t.Error("a differing payload went unnoticed")
	}
	short := ipt[:bytes.Index(ipt, []byte("1d psb"))]
	if _, _, err := compareDumps(parseDiff(ptfs), parseDiff(short)); err == nil {
		t.Error("a listing that ends early went unnoticed")
	}
}

func dirExists(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && fi.IsDir()
}
