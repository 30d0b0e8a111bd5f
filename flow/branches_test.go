package flow

import (
	"bytes"
	"errors"
	"regexp"
	"testing"

	"ptfs/decode"
	"ptfs/decode/ptenc"
	"ptfs/x86insn"
)

// syms names addresses from a table.
type syms map[uint64]struct {
	name, dso string
	off       uint64
}

func (s syms) Symbolize(addr uint64) (string, uint64, string, bool) {
	e, ok := s[addr]
	if !ok {
		return "", 0, "", false
	}
	return e.name, e.off, e.dso, e.name != ""
}

// TestBranchesLines checks every line format of DESIGN §5 that Branches
// prints, from a sequence of handler calls.
func TestBranchesLines(t *testing.T) {
	// 0x1000: syscall; 0x2000: int3 (a far transfer that is not one).
	mem := &blob{base: 0x1000, code: append([]byte{0x0f, 0x05}, make([]byte, 0x1000)...)}
	mem.code[0x1000] = 0xcc
	sy := syms{
		0x1000: {"main", "/bin/p", 0x10},
		0x1002: {"main", "/bin/p", 0x12},
		0x3000: {"_Z1fv", "/bin/p", 0},
		0x4000: {"", "[vdso]", 0},
	}
	events := map[uint16]*decode.Event{7: {ID: 7, Group: "g", Name: "e", Args: []decode.Arg{{Name: "a"}}}}
	for _, tt := range []struct {
		name string
		run  func(b *Branches)
		want string
	}{
		{"kinds", func(b *Branches) {
			for k := BrCond; k <= BrInterrupt; k++ {
				b.Branch(0x1002, 0x3000, k)
			}
		}, "branch: 0x1002 main+0x12 (/bin/p) => 0x3000 _Z1fv+0x0 (/bin/p) jcc\n" +
			"branch: 0x1002 main+0x12 (/bin/p) => 0x3000 _Z1fv+0x0 (/bin/p) jmp\n" +
			"branch: 0x1002 main+0x12 (/bin/p) => 0x3000 _Z1fv+0x0 (/bin/p) call\n" +
			"branch: 0x1002 main+0x12 (/bin/p) => 0x3000 _Z1fv+0x0 (/bin/p) ret\n" +
			"branch: 0x1002 main+0x12 (/bin/p) => 0x3000 _Z1fv+0x0 (/bin/p) ijmp\n" +
			"branch: 0x1002 main+0x12 (/bin/p) => 0x3000 _Z1fv+0x0 (/bin/p) icall\n" +
			"branch: 0x1002 main+0x12 (/bin/p) => 0x3000 _Z1fv+0x0 (/bin/p) far\n" +
			"branch: 0x1002 main+0x12 (/bin/p) => 0x3000 _Z1fv+0x0 (/bin/p) async\n"},
		{"far kinds and unknown symbols", func(b *Branches) {
			b.Branch(0x1000, 0x4000, BrFar)
			b.Branch(0x2000, 0x5000, BrFar)
		}, "branch: 0x1000 main+0x10 (/bin/p) => 0x4000 [unknown] ([vdso]) syscall\n" +
			"branch: 0x2000 [unknown] ([unknown]) => 0x5000 [unknown] ([unknown]) far\n"},
		{"syscall across a stop, context", func(b *Branches) {
			b.SetContext(42, 3)
			b.Event(&Event{Kind: EvEnabled, IP: 0x1000, HasIP: true})
			b.Insn(&Insn{IP: 0x1000, Len: 2, Class: x86insn.FarTransfer})
			b.Event(&Event{Kind: EvDisabled})
			b.Event(&Event{Kind: EvEnabled, IP: 0x1002, HasIP: true})
			b.Insn(&Insn{IP: 0x1002, Len: 2, Class: x86insn.NotBranch})
			b.Event(&Event{Kind: EvEnd, IP: 0x1004, HasIP: true})
		}, "trace: start at 0x1000 main+0x10 (/bin/p) tid=42 cpu=3\n" +
			"branch: 0x1000 main+0x10 (/bin/p) => 0x1002 main+0x12 (/bin/p) syscall tid=42 cpu=3\n" +
			"trace: end at 0x1004 [unknown] ([unknown]) tid=42 cpu=3\n"},
		{"stops, gaps, sync", func(b *Branches) {
			b.Event(&Event{Kind: EvEnabled, IP: 0x3000, HasIP: true, Flags: Resumed})
			b.Insn(&Insn{IP: 0x3000, Len: 1, Class: x86insn.Ret})
			b.Event(&Event{Kind: EvDisabled})
			b.Event(&Event{Kind: EvEnabled, IP: 0x3000, HasIP: true})
			b.Event(&Event{Kind: EvDisabled, IP: 0x4000, HasIP: true})
			b.Event(&Event{Kind: EvAsyncDisabled, At: 0x1002})
			b.Event(&Event{Kind: EvError, Offset: 0x40, IP: 0x3000, HasIP: true, Err: ErrBadQuery})
			b.Insn(&Insn{IP: 0x3000, Len: 1})
			b.Event(&Event{Kind: EvOverflow, IP: 0x1000, HasIP: true})
			b.Event(&Event{Kind: EvOverflow})
			b.Insn(&Insn{IP: 0x1000, Len: 2, Class: x86insn.FarTransfer})
			b.Event(&Event{Kind: EvDisabled})
			b.Finish()
		}, "trace: resume at 0x3000 _Z1fv+0x0 (/bin/p)\n" +
			"trace: stop after 0x3000 _Z1fv+0x0 (/bin/p)\n" +
			"trace: start at 0x3000 _Z1fv+0x0 (/bin/p)\n" +
			"trace: stop at 0x4000 [unknown] ([vdso])\n" +
			"trace: stop at 0x1002 main+0x12 (/bin/p)\n" +
			"gap: error offset=0x40 ip=0x3000 _Z1fv+0x0 (/bin/p) err=trace stream does not match query\n" +
			"trace: sync at 0x3000 _Z1fv+0x0 (/bin/p)\n" +
			"gap: overflow resume=0x1000 main+0x10 (/bin/p)\n" +
			"gap: overflow\n" +
			"trace: sync at 0x1000 main+0x10 (/bin/p)\n" +
			"trace: stop after 0x1000 main+0x10 (/bin/p)\n"},
		{"records and manual ptwrites", func(b *Branches) {
			b.Event(&Event{Kind: EvPTWrite, Payload: 7<<48 | 1<<40 | decode.HeaderMagic, Aux: 8, IP: 0x1000, HasIP: true})
			b.Event(&Event{Kind: EvPTWrite, Payload: 5, Aux: 8, IP: 0x1000, HasIP: true})
			b.Event(&Event{Kind: EvPTWrite, Payload: 9, Aux: 4})
			// A record cut by a gap is dropped, not printed.
			b.Event(&Event{Kind: EvPTWrite, Payload: 7<<48 | 1<<40 | decode.HeaderMagic, Aux: 8, IP: 0x1000, HasIP: true})
			b.Event(&Event{Kind: EvOverflow})
		}, "record 1: event=g/e id=0x7 args=[a=5]\n" +
			"manual ptwrite: payload=0x9\n" +
			"gap: overflow\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			b := NewBranches(&out, mem, sy, events)
			tt.run(b)
			if err := b.Flush(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("got\n%s\nwant\n%s", out.String(), tt.want)
			}
		})
	}
}

// errWriter fails every write.
type errWriter struct{}

func (errWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// TestBranchesWriteError checks that a failed write is returned by Flush.
func TestBranchesWriteError(t *testing.T) {
	b := NewBranches(errWriter{}, nil, nil, nil)
	b.Branch(1, 2, BrJump)
	if err := b.Flush(); err == nil || err.Error() != "disk full" {
		t.Errorf("Flush: %v", err)
	}
}

// TestBranchesNoAlloc checks that a branch line costs no allocation once
// its addresses' symbols are cached.
func TestBranchesNoAlloc(t *testing.T) {
	var out bytes.Buffer
	out.Grow(1 << 20)
	b := NewBranches(&out, nil, syms{0x1000: {"f", "/bin/p", 4}}, nil)
	b.SetContext(1, 2)
	b.Branch(0x1000, 0x1000, BrCall)
	in := Insn{IP: 0x1000, Len: 1, Class: x86insn.CondJump}
	if n := testing.AllocsPerRun(1000, func() {
		b.Insn(&in)
		b.Branch(0x1000, 0x1000, BrCond)
		b.Branch(0x1000, 0x1000, BrReturn)
	}); n != 0 {
		t.Errorf("%v allocations per branch line", n)
	}
}

// BenchmarkBranchLines measures formatting branch: lines (symbols cached).
func BenchmarkBranchLines(b *testing.B) {
	var out bytes.Buffer
	br := NewBranches(&out, nil, syms{0x401840: {"fib", "/usr/bin/flow-static", 0}, 0x40185a: {"fib", "/usr/bin/flow-static", 0x1a}}, nil)
	br.SetContext(1234, 1)
	b.ReportAllocs()
	for b.Loop() {
		br.Branch(0x40185a, 0x401840, BrCall)
		if out.Len() > 1<<20 {
			out.Reset()
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}

// FuzzBranches: the lines of random and mutated traces are all of the
// formats of DESIGN §5, and every decoding error has its gap line.
func FuzzBranches(f *testing.F) {
	code := []byte{0x90, 0x75, 0xfd, 0xe8, 0x01, 0, 0, 0, 0x0f, 0x05, 0xc3, 0xff, 0xe0, 0x0f, 0xae, 0xe0}
	e := ptenc.New()
	start(e, 0x1000)
	e.TNT(0b1011, 4)
	e.IP(ptenc.TIP, 0x1008)
	e.IP(ptenc.TIPPGD, 0)
	e.IP(ptenc.TIPPGE, 0x100a)
	f.Add(e.Bytes(), code)
	f.Fuzz(func(t *testing.T, trace, code []byte) {
		if len(trace) > 1<<14 || len(code) > 1<<12 {
			return
		}
		mem := &blob{base: 0x1000, code: code}
		var out bytes.Buffer
		b := NewBranches(&out, mem, nil, nil)
		d := New(mem, Options{MaxInsns: 1 << 12})
		d.Decode(trace, b)
		b.Finish()
		if err := b.Flush(); err != nil {
			t.Fatal(err)
		}
		if c := d.Counters(); b.Counters().Gaps < c.Errors {
			t.Fatalf("%d errors, %d gap lines", c.Errors, b.Counters().Gaps)
		}
		for l := range bytes.Lines(out.Bytes()) {
			if !bytes.HasSuffix(l, []byte("\n")) || !fuzzLine.Match(l) {
				t.Fatalf("line %q", l)
			}
		}
	})
}

var fuzzLine = regexp.MustCompile(`^(branch: 0x[0-9a-f]+ \[unknown\] \(\[unknown\]\) => 0x[0-9a-f]+ \[unknown\] \(\[unknown\]\) (jcc|jmp|call|ret|ijmp|icall|syscall|far|async)|trace: (start at|resume at|stop at|stop after|end at|sync at) 0x[0-9a-f]+ \[unknown\] \(\[unknown\]\)|gap: (overflow( resume=0x[0-9a-f]+ \[unknown\] \(\[unknown\]\))?|error offset=0x[0-9a-f]+( ip=0x[0-9a-f]+ \[unknown\] \(\[unknown\]\))? err=[a-z ]+)|manual ptwrite: payload=0x[0-9a-f]+( ip=0x[0-9a-f]+)?)\n$`)
