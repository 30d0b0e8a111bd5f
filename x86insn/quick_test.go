package x86insn

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// pad is code followed by MaxLen zero bytes: Run decodes all of code.
func pad(code []byte) []byte {
	return append(slices.Clip(code), make([]byte, MaxLen)...)
}

// TestRun: Run stops after the first branch, at the lengths' limit, where
// fewer than MaxLen bytes are left, and before an undecodable instruction;
// instructions outside the quick tables (prefixes, escapes, groups) go
// through the general scan in the same run.
func TestRun(t *testing.T) {
	tests := []struct {
		name   string
		code   []byte
		lens   int
		want   []uint8
		class  Class
		target uint64
		err    error
	}{
		{"to call", pad(hexBytes(t, "55 48 89 e5 e8 00 01 00 00 90")), 64, []uint8{1, 3, 5}, Call, 0x1109, nil},
		{"to jcc rel8", pad(hexBytes(t, "48 8b 45 f8 74 fe")), 64, []uint8{4, 2}, CondJump, 0x1004, nil},
		{"to jcc rel32", pad(hexBytes(t, "4c 8b 2c 24 0f 85 f0 ff ff ff")), 64, []uint8{4, 6}, CondJump, 0xffa, nil},
		{"to ret", pad(hexBytes(t, "5d c3")), 64, []uint8{1, 1}, Ret, 0, nil},
		{"to jmp reg", pad(hexBytes(t, "41 ff e3")), 64, []uint8{3}, IndirectJump, 0, nil},
		{"to call mem", pad(hexBytes(t, "ff 14 25 00 10 00 00")), 64, []uint8{7}, IndirectCall, 0, nil},
		{"sib base 5", pad(hexBytes(t, "8b 04 25 00 10 00 00 c3")), 64, []uint8{7, 1}, Ret, 0, nil},
		{"rex 40 and 4f", pad(hexBytes(t, "40 88 c7 4f 8d 04 24 50 c3")), 64, []uint8{3, 4, 1, 1}, Ret, 0, nil},
		{"0f behind rex.w, sib base 5", pad(hexBytes(t, "4c 0f af 04 25 00 10 00 00 0f 84 f0 ff ff ff")), 64,
			[]uint8{9, 6}, CondJump, 0xfff, nil},
		{"rel8 back", pad(hexBytes(t, "90 eb fd")), 64, []uint8{1, 2}, Jump, 0x1000, nil},
		{"ret imm16 has no target", pad(hexBytes(t, "c2 08 00")), 64, []uint8{3}, Ret, 0, nil},
		{"imm64", pad(hexBytes(t, "48 b8 01 02 03 04 05 06 07 08 c3")), 64, []uint8{10, 1}, Ret, 0, nil},
		{"imm by modrm", pad(hexBytes(t, "f7 c0 01 00 00 00 f7 d0 c7 45 f8 01 00 00 00 c3")), 64, []uint8{6, 2, 7, 1}, Ret, 0, nil},
		{"general scan", pad(hexBytes(t, "f3 0f 1e fa 66 90 c5 f8 77 66 2e 0f 1f 84 00 00 00 00 00 c3")), 64,
			[]uint8{4, 2, 3, 10, 1}, Ret, 0, nil},
		{"xbegin is no branch", pad(hexBytes(t, "c7 f8 00 00 00 00 c3")), 64, []uint8{6, 1}, Ret, 0, nil},
		{"xbegin keeps its target", pad(hexBytes(t, "c7 f8 10 00 00 00 c3")), 1, []uint8{6}, NotBranch, 0x1016, nil},
		{"after xbegin", pad(hexBytes(t, "c7 f8 10 00 00 00 48 89 e5 c3")), 2, []uint8{6, 3}, NotBranch, 0, nil},
		{"lens bound", pad(hexBytes(t, "90 90 90 c3")), 2, []uint8{1, 1}, NotBranch, 0, nil},
		{"bytes end", hexBytes(t, "90 90 90 00 00 00 00 00 00 00 00 00 00 00 00 00"), 64, []uint8{1, 1}, NotBranch, 0, nil},
		{"invalid", pad(hexBytes(t, "90 06")), 64, []uint8{1}, NotBranch, 0, ErrInvalid},
		{"invalid first", pad(hexBytes(t, "06")), 64, []uint8{}, NotBranch, 0, ErrInvalid},
		{"truncated is Step's", hexBytes(t, "e8 00"), 64, []uint8{}, NotBranch, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lens := make([]uint8, tt.lens)
			n, end, last, err := Run(tt.code, 0x1000, lens)
			if !slices.Equal(lens[:n], tt.want) || !errors.Is(err, tt.err) || (err == nil) != (tt.err == nil) {
				t.Fatalf("Run(% x) = %v, %v; want %v, %v", tt.code, lens[:n], err, tt.want, tt.err)
			}
			size := 0
			for _, l := range lens[:n] {
				size += int(l)
			}
			if end != size {
				t.Fatalf("Run(% x) ends at %d after %d bytes", tt.code, end, size)
			}
			if n > 0 && (last.Class != tt.class || last.Target != tt.target || last.Len != int(lens[n-1])) {
				t.Fatalf("Run(% x): last %+v, want class %v target 0x%x", tt.code, last, tt.class, tt.target)
			}
		})
	}
}

// TestRunAgrees holds Run's tables to the general scan: on every
// instruction of libc's .text and on random bytes shaped like code (REX,
// 0F, ModRM and SIB bytes of every kind), Run of one instruction gives
// what the scan gives, the same Flow or the same error.
func TestRunAgrees(t *testing.T) {
	check := func(code []byte, pc uint64) {
		t.Helper()
		var l [1]uint8
		n, _, got, err := Run(code, pc, l[:])
		want, werr := stepScan(code, pc)
		if werr != nil {
			if n != 0 || err == nil || errors.Is(werr, ErrInvalid) != errors.Is(err, ErrInvalid) {
				t.Fatalf("% x: Run %d %+v %v, scan %v", code[:MaxLen], n, got, err, werr)
			}
			return
		}
		if n != 1 || err != nil || got != want || int(l[0]) != want.Len {
			t.Fatalf("% x: Run %d %+v %v, scan %+v", code[:MaxLen], n, got, err, want)
		}
	}
	code, addr := libcText(t)
	insns := 0
	for pc := 0; pc+MaxLen <= len(code); insns++ {
		check(code[pc:], addr+uint64(pc))
		in, err := stepScan(code[pc:], addr+uint64(pc))
		if err != nil {
			t.Fatalf("0x%x: %v", addr+uint64(pc), err)
		}
		pc += in.Len
	}
	r := rand.New(rand.NewPCG(1, 2))
	var buf [MaxLen]byte
	for range 200000 {
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		// Bias toward what the tables take: a REX, a 0F escape.
		if r.IntN(2) == 0 {
			copy(buf[1:], buf[:MaxLen-1])
			buf[0] = 0x40 | byte(r.IntN(16))
		}
		if r.IntN(4) == 0 {
			i := int(buf[0]>>4&1) & int(buf[0]>>6&1) // after a REX
			buf[i] = 0x0f
		}
		check(buf[:], 0x7f0000001000)
	}
	t.Logf("%d instructions of libc and 200000 random ones agree", insns)
}

// TestRunTables holds every entry of Run's tables to the general scan:
// each first byte (rexOf's every entry, quick1's row without a REX), each
// opcode of the 1-byte and 0F maps behind no REX, a REX and a REX.W
// (quick1's rows, quick0F), each ModRM byte and each SIB base (modrmLen,
// byModRM), decoded first in a run, after a
// quick instruction and after one of the general scan's (quickRun resumed
// past it): the same lengths, Flow and error as the scan.
func TestRunTables(t *testing.T) {
	// The instructions before: none, nop, and 66 nop (a legacy prefix:
	// the general scan's).
	leads := [][]byte{nil, {0x90}, {0x66, 0x90}}
	var buf [2 * MaxLen]byte
	var lens [2]uint8
	checked := 0
	for _, rex := range []int{-1, 0x41, 0x4c} {
		for _, esc := range []bool{false, true} {
			for op := range 256 {
				for m := range 256 {
					lead := leads[(op+m)%len(leads)]
					code := append(buf[:0], lead...)
					if rex >= 0 {
						code = append(code, byte(rex))
					}
					if esc {
						code = append(code, 0x0f)
					}
					// The SIB's base by op and m: each ModRM
					// meets every base over the opcodes.
					code = append(code, byte(op), byte(m), byte((op+m)&7|0x18))
					for len(code) < len(buf) {
						code = append(code, 0x81)
					}
					pc := uint64(0x7f0000001000)
					k := min(len(lead), 1)
					n, end, got, err := Run(code, pc, lens[:k+1])
					want, werr := stepScan(code[len(lead):], pc+uint64(len(lead)))
					wantN, wantEnd := k+1, len(lead)+want.Len
					if werr != nil {
						wantN, wantEnd = k, len(lead)
					}
					switch {
					case n != wantN || end != wantEnd || (err == nil) != (werr == nil) ||
						errors.Is(err, ErrInvalid) != errors.Is(werr, ErrInvalid):
						t.Fatalf("% x: Run %d %d %v, scan %+v %v", code[:MaxLen], n, end, err, want, werr)
					case werr == nil && (got != want || int(lens[n-1]) != want.Len):
						t.Fatalf("% x: Run %+v, scan %+v", code[:MaxLen], got, want)
					case k > 0 && int(lens[0]) != len(lead):
						t.Fatalf("% x: the lead's length %d", code[:MaxLen], lens[0])
					}
					checked++
				}
			}
		}
	}
	t.Logf("%d instructions agree", checked)
}

// TestQuickRunREX: a REX keeps an instruction of the tables on quickRun's
// path; the general scan would give the same Flow at several times the
// cost, so Run's results alone cannot show a REX sent there.
func TestQuickRunREX(t *testing.T) {
	var lens [1]uint8
	quick := 0
	for rex := 0x40; rex < 0x50; rex++ {
		for _, esc := range [][]byte{nil, {0x0f}} {
			for op := range 256 {
				insn := append(slices.Clone(esc), byte(op), 0xc0) // ModRM: registers
				_, _, e, _ := quickRun(pad(insn), 0, lens[:], 0)
				if e&qSlow != 0 || esc == nil && op&0xf0 == 0x40 { // a REX twice is the scan's
					continue
				}
				quick++
				if _, _, re, _ := quickRun(pad(append([]byte{byte(rex)}, insn...)), 0, lens[:], 0); re&qSlow != 0 {
					t.Fatalf("% x: the general scan's behind REX %x, quickRun's without", insn, rex)
				}
			}
		}
	}
	if quick < 16*256 {
		t.Errorf("%d instructions quick without a REX: too few to check", quick)
	}
}
