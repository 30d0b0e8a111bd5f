package images

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"ptfs/internal/testkit"
)

// pttOrg returns the address of the org directive of a libipt .ptt file.
func pttOrg(t *testing.T, path string) uint64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*org\s+(\S+)`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s: no org directive", path)
	}
	org, err := strconv.ParseUint(string(m[1]), 0, 64)
	if err != nil {
		t.Fatalf("%s: org %q: %v", path, m[1], err)
	}
	return org
}

// lstLine is a line of a yasm listing with code: line number, offset,
// then the bytes; a "-" after them continues the bytes on the next line,
// "<rept>" marks a repetition. Only complete lines are compared, and not
// those of relative branches: yasm lists their displacement of an early
// pass (the .bin has the final one).
var (
	lstLine   = regexp.MustCompile(`^\s*\d+ ([0-9A-F]{8}) ([0-9A-F]+)(\S*)\s*(.*)`)
	lstBranch = regexp.MustCompile(`(?i)\b(j[a-z]+|call|loop[a-z]*|xbegin)\b`)
)

// TestLibiptRaw maps each libipt test's .bin at the org of its .ptt (as
// ptxed --raw does) and checks every instruction of its yasm listing.
func TestLibiptRaw(t *testing.T) {
	dir := filepath.Join(testkit.Corpus(t), "libipt")
	ptts, _ := filepath.Glob(filepath.Join(dir, "*.ptt"))
	if len(ptts) == 0 {
		testkit.Unavailable(t, "no libipt tests in %s", dir)
	}
	checked := 0
	for _, ptt := range ptts {
		base := strings.TrimSuffix(ptt, ".ptt")
		org := pttOrg(t, ptt)
		s := NewSpace()
		err := MapRaw(s, base+".bin", org)
		if st, _ := os.Stat(base + ".bin"); st != nil && st.Size() == 0 {
			// A test without code: nothing to map is an error, not an
			// empty mapping.
			if !errors.Is(err, ErrBadMapping) {
				t.Errorf("%s: empty image: %v, want ErrBadMapping", base, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", base, err)
		}
		lst, err := os.ReadFile(base + ".lst")
		if err != nil {
			t.Fatal(err)
		}
		cont := false
		for line := range strings.SplitSeq(string(lst), "\n") {
			m := lstLine.FindStringSubmatch(line)
			wasCont := cont
			cont = m != nil && strings.HasPrefix(m[3], "-")
			if m == nil || wasCont || m[3] != "" || lstBranch.MatchString(m[4]) {
				continue
			}
			off, _ := strconv.ParseUint(m[1], 16, 64)
			want, _ := hex.DecodeString(m[2])
			got := make([]byte, len(want))
			if n, err := s.ReadAt(got, org+off); err != nil || n != len(want) || !bytes.Equal(got, want) {
				t.Fatalf("%s: at 0x%x read % x (%v), listing has % x", filepath.Base(base), org+off, got, err, want)
			}
			checked++
		}
	}
	if checked < 500 {
		t.Errorf("only %d listing lines checked", checked)
	}
	t.Logf("%d instructions of %d tests checked", checked, len(ptts))
}

// TestLibxdcPageDump maps each libxdc memory dump and checks that every
// page reads as its bytes of the dump and that every branch source of
// libxdc's edge list inside the traced range is readable code.
func TestLibxdcPageDump(t *testing.T) {
	dir := filepath.Join(testkit.Corpus(t), "libxdc")
	dumps, _ := filepath.Glob(filepath.Join(dir, "*", "*.dump"))
	if len(dumps) == 0 {
		testkit.Unavailable(t, "no libxdc dumps in %s", dir)
	}
	for _, dump := range dumps {
		name := filepath.Base(filepath.Dir(dump))
		t.Run(name, func(t *testing.T) {
			addrFile := strings.TrimSuffix(dump, ".dump") + ".addr"
			s := NewSpace()
			if err := MapPageDump(s, addrFile, dump); err != nil {
				t.Fatal(err)
			}
			addrs, _ := os.ReadFile(addrFile)
			pages, _ := os.ReadFile(dump)
			last := map[uint64]int{} // a page listed twice: the later wins
			for i := 0; i < len(addrs)/8; i++ {
				last[binary.LittleEndian.Uint64(addrs[8*i:])] = i
			}
			buf := make([]byte, PageSize)
			for a, i := range last {
				if n, err := s.ReadAt(buf, a); err != nil || n < PageSize || !bytes.Equal(buf, pages[i*PageSize:(i+1)*PageSize]) {
					t.Fatalf("page 0x%x: %d bytes, %v, or not the dump's page %d", a, n, err, i)
				}
			}
			edges := 0
			insn := make([]byte, 15)
			for _, l := range testkit.GzipLines(t, filepath.Join(filepath.Dir(dump), "ref.edges.gz")) {
				// An edge to or from ffffffffffffffff ends or starts a
				// traced stretch: the IP there may be outside the dump.
				src, dst, ok := strings.Cut(l, "->")
				if !ok || src == "ffffffffffffffff" || dst == "ffffffffffffffff" {
					continue
				}
				a, err := strconv.ParseUint(src, 16, 64)
				if err != nil {
					t.Fatalf("edge %q: %v", l, err)
				}
				if n, err := s.ReadAt(insn, a); err != nil || n == 0 {
					t.Fatalf("branch at 0x%x (edge %s): %d bytes, %v", a, l, n, err)
				}
				edges++
			}
			if edges == 0 {
				t.Error("no edges checked")
			}
			t.Logf("%d pages, %d edge sources read", len(last), edges)
		})
	}
}

// TestPtsimMaps builds the memory of the ptsim runs from their maps
// snapshots (flow-static from the corpus, the vDSO from its dump) and
// checks every recorded control transfer against the code read there:
// rets are ret instructions, syscalls syscall, direct calls and taken
// conditional jumps reach their recorded targets.
func TestPtsimMaps(t *testing.T) {
	dir := filepath.Join(testkit.Corpus(t), "ptsim")
	runs, _ := filepath.Glob(filepath.Join(dir, "run-*"))
	if len(runs) == 0 {
		testkit.Unavailable(t, "no ptsim runs in %s", dir)
	}
	for _, run := range runs {
		t.Run(filepath.Base(run), func(t *testing.T) {
			text, err := os.ReadFile(filepath.Join(run, "maps.txt"))
			if err != nil {
				t.Fatal(err)
			}
			snaps, err := ParseMapsSnapshots(text)
			if err != nil || len(snaps) == 0 {
				t.Fatalf("%d snapshots, %v", len(snaps), err)
			}
			dumps := map[uint64]string{}
			for _, s := range snaps {
				for _, d := range s.Dumps {
					dumps[d.Start] = d.File
				}
			}
			if len(dumps) != 1 {
				t.Fatalf("%d dumps", len(dumps))
			}
			// The vDSO dump is an ELF image: read as one, it has symbols.
			var vdso *ELF
			var vdsoAddr uint64
			for a, f := range dumps {
				e, err := OpenELF(filepath.Join(run, f))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { e.Close() })
				vdso, vdsoAddr = e, a
			}
			p := NewProcesses(Options{VDSO: vdso, Path: func(name string) string {
				// The binary is beside the runs.
				return filepath.Join(dir, filepath.Base(name))
			}})
			t.Cleanup(func() {
				if err := p.Close(); err != nil {
					t.Error(err)
				}
			})
			const pid = 1000
			p.Exec(pid)
			for _, snap := range snaps {
				if err := p.MapMaps(pid, snap.Maps); err != nil {
					t.Fatal(err)
				}
			}
			if p.Unknown() != 0 {
				t.Errorf("%d mappings of unknown bytes", p.Unknown())
			}
			s, _ := p.Space(pid)
			if m, ok := s.Lookup(vdsoAddr + 0x10); !ok || m.Name != "[vdso]" || m.Src != Source(vdso) {
				t.Fatalf("vDSO at 0x%x: %+v", vdsoAddr, m)
			}
			for _, tt := range []struct {
				addr     uint64
				sym, dso string
				off      uint64
			}{
				{0x401840, "fib", "flow-static", 0},
				{0x7ffff7ffdb94, "__vdso_clock_gettime", "[vdso]", 0xb94 - 0xaf0},
			} {
				sym, off, dso, ok := s.Symbolize(tt.addr)
				// clock_gettime is a weak alias of __vdso_clock_gettime.
				if !ok || strings.TrimPrefix(sym, "__vdso_") != strings.TrimPrefix(tt.sym, "__vdso_") || off != tt.off || dso != tt.dso {
					t.Errorf("Symbolize(0x%x) = %s+0x%x (%s) %v, want %s+0x%x (%s)", tt.addr, sym, off, dso, ok, tt.sym, tt.off, tt.dso)
				}
			}
			kinds := map[string]int{}
			b := make([]byte, 15)
			for _, l := range testkit.GzipLines(t, filepath.Join(run, "expected.branches.gz")) {
				f := strings.Fields(l)
				if len(f) != 4 {
					t.Fatalf("branch line %q", l)
				}
				from, err1 := strconv.ParseUint(f[0], 0, 64)
				to, err2 := strconv.ParseUint(f[2], 0, 64)
				if err1 != nil || err2 != nil {
					t.Fatalf("branch line %q", l)
				}
				kind := f[3]
				n, err := s.ReadAt(b, from)
				if err != nil || n < 15 {
					t.Fatalf("%s: %d bytes, %v", l, n, err)
				}
				if !branchMatches(b, from, to, kind) {
					t.Fatalf("%s: code % x does not do it", l, b)
				}
				kinds[kind]++
			}
			for _, k := range []string{"ret", "syscall", "call", "jcc"} {
				if kinds[k] == 0 {
					t.Errorf("no %s checked", k)
				}
			}
			t.Logf("checked %v", kinds)
		})
	}
}

// branchMatches tells whether the instruction in b at from makes the
// recorded transfer to to of kind, for the kinds whose encoding it knows;
// the others only need readable code.
func branchMatches(b []byte, from, to uint64, kind string) bool {
	rel32 := func(i int) uint64 { return uint64(int64(int32(binary.LittleEndian.Uint32(b[i:])))) }
	switch kind {
	case "ret":
		return b[0] == 0xc3 || b[0] == 0xc2 || (b[0] == 0xf3 || b[0] == 0xf2) && b[1] == 0xc3
	case "syscall":
		return b[0] == 0x0f && b[1] == 0x05
	case "call":
		if b[0] == 0x67 { // addr32 call: glibc's padding of a call
			return b[1] == 0xe8 && from+6+rel32(2) == to
		}
		return b[0] == 0xe8 && from+5+rel32(1) == to
	case "jcc":
		switch {
		case b[0]&0xf0 == 0x70:
			return from+2+uint64(int64(int8(b[1]))) == to
		case b[0] == 0x0f && b[1]&0xf0 == 0x80:
			return from+6+rel32(2) == to
		}
		return false
	}
	return true
}
