package flow

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"ptfs/decode/ptenc"
	"ptfs/images"
	"ptfs/internal/testkit"
)

// ptsimSpace maps a ptsim run of the corpus's static flow program: the
// binary (non-PIE) and its vDSO dump.
func ptsimSpace(t testing.TB, run string) *images.Space {
	t.Helper()
	s := images.NewSpace()
	e, err := images.MapELF(s, filepath.Join(filepath.Dir(run), "flow-static"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if err := images.MapRaw(s, filepath.Join(run, "vdso-7ffff7ffd000.bin"), 0x7ffff7ffd000); err != nil {
		t.Fatal(err)
	}
	return s
}

// ptsimInsns reads a run's ground truth: the address of every executed
// instruction.
func ptsimInsns(t *testing.T, run string) []uint64 {
	t.Helper()
	b := testkit.ReadGzip(t, filepath.Join(run, "insns.bin.gz"))
	ips := make([]uint64, len(b)/8)
	for i := range ips {
		ips[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return ips
}

// stubLog keeps the instruction addresses, the ptwrite payloads and the
// errors of a decode.
type stubLog struct {
	ips    []uint64
	ptw    []uint64
	ptwAt  []int // instructions executed before each ptwrite
	errors []string
}

func (l *stubLog) Insn(in *Insn)                           { l.ips = append(l.ips, in.IP) }
func (l *stubLog) Branch(from, to uint64, kind BranchKind) {}
func (l *stubLog) Event(e *Event) {
	switch e.Kind {
	case EvPTWrite:
		l.ptw = append(l.ptw, e.Payload)
		l.ptwAt = append(l.ptwAt, len(l.ips))
	case EvError:
		l.errors = append(l.errors, e.Err.Error())
	}
}

// TestPtsimRuns decodes the corpus's ptsim runs (ground truth from
// single-stepping): the flow is exactly the executed instructions, and with
// ptw probes (PTW and FUP packets from a stub page no file holds) the
// flow is the same and every probe word is reported.
func TestPtsimRuns(t *testing.T) {
	dir := filepath.Join(testkit.Corpus(t), "ptsim")
	// run-static-ptw's probe: fib (0x401840, cmp $1,%rdi: 4 bytes), its
	// stub at ptsim's default address.
	fib := []Stub{{Start: 0x7ffff0000000, End: 0x7ffff0001000, Site: 0x401840, Next: 0x401844}}
	for _, tc := range []struct {
		run   string
		stubs []Stub
	}{{"run-static", nil}, {"run-static-ptw", nil}, {"run-static-ptw", fib}} {
		t.Run(fmt.Sprintf("%s stubs=%d", tc.run, len(tc.stubs)), func(t *testing.T) {
			run := filepath.Join(dir, tc.run)
			trace, err := os.ReadFile(filepath.Join(run, "trace.pt"))
			if err != nil {
				t.Fatal(err)
			}
			want := ptsimInsns(t, run)
			var l stubLog
			d := New(ptsimSpace(t, run), Options{Stubs: tc.stubs})
			d.Decode(trace, &l)
			if len(l.errors) > 0 {
				t.Errorf("%d errors, the first: %s", len(l.errors), l.errors[0])
			}
			n := min(len(l.ips), len(want))
			for i := range n {
				if l.ips[i] != want[i] {
					t.Fatalf("instruction %d at 0x%x, want 0x%x", i, l.ips[i], want[i])
				}
			}
			if len(l.ips) != len(want) {
				t.Errorf("%d instructions, want %d", len(l.ips), len(want))
			}
			t.Logf("%d instructions, %d ptwrites", len(l.ips), len(l.ptw))
			checkProbes(t, run, &l, tc.stubs != nil)
		})
	}
}

// TestStubs decodes through probed sites whose stubs no file holds: a
// site patched as the kernel does it (int3 and an out-of-line step in
// [uprobes]), the nop5 optimisation (a call into [uprobes-trampoline]),
// and a trace that resumes inside a ptw stub. The flow goes on as if the
// original instruction ran, without a decode error.
func TestStubs(t *testing.T) {
	const page = 0x7000_0000
	// 1000: nop; 1001: push rbp (the trap site); 1002: nop; 1003: jne 1000;
	// 1005: nop5 (the call site); 100a: ret.
	code := []byte{0x90, 0x55, 0x90, 0x75, 0xfb, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3}
	mem := &blob{base: 0x1000, code: code}
	for _, tc := range []struct {
		name  string
		stubs []Stub
		trace func(e *ptenc.Encoder)
		want  string
		ptw   int
	}{{
		name:  "int3 site, out-of-line step in [uprobes]",
		stubs: []Stub{{Start: page, End: page + 0x1000, Site: 0x1001, Next: 0x1002, Kind: StubTrap}},
		trace: func(e *ptenc.Encoder) {
			start(e, 0x1000)
			e.IPC(ptenc.TIPPGD, 0, 0) // the int3
			e.IP(ptenc.TIPPGE, page+0x40)
			e.IPC(ptenc.TIPPGD, 0, 0) // the single step's trap
			e.IP(ptenc.TIPPGE, 0x1002)
			e.TNT(0, 1)
			e.IPC(ptenc.TIPPGD, 0, 0) // at the ret
		},
		want: "1000 1001 1002 1003 1005 100a",
	}, {
		name:  "nop5 site, a call into [uprobes-trampoline], compressed ret",
		stubs: []Stub{{Start: page, End: page + 0x1000, Site: 0x1005, Next: 0x100a, Kind: StubCall}},
		trace: func(e *ptenc.Encoder) {
			start(e, 0x1002)
			e.TNT(0, 1)
			e.IPC(ptenc.TIPPGD, 0, 0) // the trampoline's syscall
			e.IP(ptenc.TIPPGE, page+0x10)
			e.TNT(1, 1) // its ret, to 100a
			e.IPC(ptenc.TIPPGD, 0, 0)
		},
		want: "1002 1003 1005 100a",
	}, {
		name:  "a shared trampoline page, the ret as a TIP",
		stubs: []Stub{{Start: page, End: page + 0x1000, Kind: StubCall}},
		trace: func(e *ptenc.Encoder) {
			start(e, page+0x10)
			e.IP(ptenc.TIP, 0x100a)
			e.IPC(ptenc.TIPPGD, 0, 0)
		},
		want: "100a",
	}, {
		name:  "synchronised inside a ptw stub, its ptwrite",
		stubs: []Stub{{Start: page, End: page + 0x1000, Site: 0x1001, Next: 0x1002, Kind: StubJump}},
		trace: func(e *ptenc.Encoder) {
			start(e, page+9)
			e.PTW(42, 8, true)
			e.IP(ptenc.FUP, page+9)
			e.TNT(0, 1)
			e.IPC(ptenc.TIPPGD, 0, 0)
		},
		want: "1002 1003 1005 100a",
		ptw:  1,
	}, {
		name: "a ptw stub nobody named: its records leave the flow alone",
		trace: func(e *ptenc.Encoder) {
			start(e, 0x1000)
			e.Probe(7, page, true, 1, 2)
			e.TNT(0, 1)
			e.IPC(ptenc.TIPPGD, 0, 0)
		},
		want: "1000 1001 1002 1003 1005 100a",
		ptw:  3,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := ptenc.New()
			tc.trace(e)
			var l stubLog
			d := New(mem, Options{Stubs: tc.stubs})
			d.Decode(e.Bytes(), &l)
			var got []string
			for _, ip := range l.ips {
				got = append(got, strconv.FormatUint(ip, 16))
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Errorf("flow %s, want %s", g, tc.want)
			}
			if len(l.errors) > 0 || d.Counters().Errors != 0 {
				t.Errorf("errors %q", l.errors)
			}
			if len(l.ptw) != tc.ptw {
				t.Errorf("%d ptwrites, want %d", len(l.ptw), tc.ptw)
			}
		})
	}
}

// checkProbes holds the ptwrites of a run to its probes.txt: at each hit
// the header (the run's probe id, 2 arguments) and rdi, rsi, before the
// instruction INDEX runs: exactly there when the stub names its site
// (exact), else after the last branch the trace showed before it.
func checkProbes(t *testing.T, run string, l *stubLog, exact bool) {
	t.Helper()
	f, err := os.Open(filepath.Join(run, "probes.txt"))
	if os.IsNotExist(err) {
		if len(l.ptw) != 0 {
			t.Errorf("%d ptwrites in a run without probes", len(l.ptw))
		}
		return
	} else if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []uint64
	var at []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) == 0 || strings.HasPrefix(fl[0], "#") {
			continue
		}
		idx, err1 := strconv.Atoi(fl[0])
		rdi, err2 := strconv.ParseUint(fl[2], 0, 64)
		rsi, err3 := strconv.ParseUint(fl[3], 0, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("probes.txt line %q", sc.Text())
		}
		want = append(want, ptenc.Header(0x6c2, 2), rdi, rsi)
		at = append(at, idx, idx, idx)
	}
	if len(want) == 0 || len(l.ptw) != len(want) {
		t.Fatalf("%d ptwrites, want %d", len(l.ptw), len(want))
	}
	for i := range want {
		if l.ptw[i] != want[i] || l.ptwAt[i] > at[i] || exact && l.ptwAt[i] != at[i] || i >= 3 && l.ptwAt[i] < at[i-3] {
			t.Fatalf("ptwrite %d: 0x%x after %d instructions, want 0x%x after %d", i, l.ptw[i], l.ptwAt[i], want[i], at[i])
		}
	}
}
