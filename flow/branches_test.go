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
		{"interrupts in user-only tracing", func(b *Branches) {
			b.Event(&Event{Kind: EvEnabled, IP: 0x1002, HasIP: true})
			b.Insn(&Insn{IP: 0x1002, Len: 2})
			// A signal: tracing stops before 0x1002 and starts at
			// the handler.
			b.Event(&Event{Kind: EvAsyncDisabled, At: 0x1002})
			b.Event(&Event{Kind: EvEnabled, IP: 0x3000, HasIP: true})
			// An interrupt that returned to the instruction it
			// interrupted: no branch.
			b.Event(&Event{Kind: EvAsyncDisabled, At: 0x3000})
			b.Event(&Event{Kind: EvEnabled, IP: 0x3000, HasIP: true, Flags: Resumed})
			// FUP + TIP without an IP, then a gap: the stop's line
			// comes before the gap's.
			b.Event(&Event{Kind: EvInterrupt, At: 0x3000})
			b.Event(&Event{Kind: EvError, Offset: 0x40, Err: ErrBadQuery})
			b.Event(&Event{Kind: EvEnabled, IP: 0x1000, HasIP: true})
			b.Insn(&Insn{IP: 0x1000, Len: 2, Class: x86insn.FarTransfer})
			b.Event(&Event{Kind: EvDisabled})
			b.Event(&Event{Kind: EvOverflow})
			// A fatal signal ends the trace.
			b.Event(&Event{Kind: EvEnabled, IP: 0x1002, HasIP: true})
			b.Event(&Event{Kind: EvAsyncDisabled, At: 0x1002})
			b.Finish()
		}, "trace: start at 0x1002 main+0x12 (/bin/p)\n" +
			"branch: 0x1002 main+0x12 (/bin/p) => 0x3000 _Z1fv+0x0 (/bin/p) async\n" +
			"trace: stop at 0x3000 _Z1fv+0x0 (/bin/p)\n" +
			"trace: resume at 0x3000 _Z1fv+0x0 (/bin/p)\n" +
			"trace: stop at 0x3000 _Z1fv+0x0 (/bin/p)\n" +
			"gap: error offset=0x40 err=trace stream does not match query\n" +
			"trace: start at 0x1000 main+0x10 (/bin/p)\n" +
			"trace: stop after 0x1000 main+0x10 (/bin/p)\n" +
			"gap: overflow\n" +
			"trace: start at 0x1002 main+0x12 (/bin/p)\n" +
			"trace: stop at 0x1002 main+0x12 (/bin/p)\n"},
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
// its addresses' symbols are cached, also with its time.
func TestBranchesNoAlloc(t *testing.T) {
	var out bytes.Buffer
	out.Grow(1 << 20)
	b := NewBranches(&out, nil, syms{0x1000: {"f", "/bin/p", 4}}, nil)
	b.SetContext(1, 2)
	b.SetClock(fixedTime{1 << 40, true})
	b.TimeConv = func(tsc uint64) uint64 { return tsc / 3 }
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
func BenchmarkBranchLines(b *testing.B) { benchBranchLines(b, false) }

// BenchmarkBranchLinesTime measures branch: lines with time=.
func BenchmarkBranchLinesTime(b *testing.B) { benchBranchLines(b, true) }

func benchBranchLines(b *testing.B, timed bool) {
	var out bytes.Buffer
	br := NewBranches(&out, nil, syms{0x401840: {"fib", "/usr/bin/flow-static", 0}, 0x40185a: {"fib", "/usr/bin/flow-static", 0x1a}}, nil)
	br.SetContext(1234, 1)
	if timed {
		br.SetClock(fixedTime{8_061_235_912_410 * 3, true})
		br.TimeConv = func(tsc uint64) uint64 { return tsc / 3 }
	}
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
	e = ptenc.New()
	e.PSB()
	e.TSC(1000)
	e.TMA(0x10, 4)
	e.PSBEnd()
	e.IP(ptenc.TIPPGE, 0x1000)
	e.MTC(0x13)
	e.TNT(0b10, 2)
	e.MTC(0x15)
	e.IP(ptenc.TIP, 0x1008)
	f.Add(e.Bytes(), code)
	f.Fuzz(func(t *testing.T, trace, code []byte) {
		if len(trace) > 1<<14 || len(code) > 1<<12 {
			return
		}
		mem := &blob{base: 0x1000, code: code}
		var out bytes.Buffer
		b := NewBranches(&out, mem, nil, nil)
		d := New(mem, Options{MaxInsns: 1 << 12, Time: &decode.ClockConfig{CPUID15EAX: 1, CPUID15EBX: 2}})
		b.SetClock(d)
		b.TimeConv = func(tsc uint64) uint64 { return tsc }
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

var fuzzLine = regexp.MustCompile(`^(branch: 0x[0-9a-f]+ \[unknown\] \(\[unknown\]\) => 0x[0-9a-f]+ \[unknown\] \(\[unknown\]\) (jcc|jmp|call|ret|ijmp|icall|syscall|far|async)|trace: (start at|resume at|stop at|stop after|end at|sync at) 0x[0-9a-f]+ \[unknown\] \(\[unknown\]\)|gap: (overflow( resume=0x[0-9a-f]+ \[unknown\] \(\[unknown\]\))?|error offset=0x[0-9a-f]+( ip=0x[0-9a-f]+ \[unknown\] \(\[unknown\]\))? err=[a-z ]+)|manual ptwrite: payload=0x[0-9a-f]+( ip=0x[0-9a-f]+)?)( time=[0-9]+\.[0-9]{9})?\n$`)

// fixedTime is a TimeSource at one TSC.
type fixedTime struct {
	tsc uint64
	ok  bool
}

func (f fixedTime) TSC() (uint64, bool) { return f.tsc, f.ok }

// TestBranchesTime checks the ` time=` of lines: printed only with both a
// clock that has a TSC and a conversion (DESIGN §5), after tid= and cpu=.
func TestBranchesTime(t *testing.T) {
	sy := syms{0x1000: {"main", "/bin/p", 0}, 0x2000: {"f", "/bin/p", 0}}
	conv := func(tsc uint64) uint64 { return tsc*10 + 7 }
	for _, tt := range []struct {
		name  string
		clock TimeSource
		conv  func(uint64) uint64
		want  string
	}{
		{"no clock", nil, conv, "branch: 0x1000 main+0x0 (/bin/p) => 0x2000 f+0x0 (/bin/p) call tid=5 cpu=1\n"},
		{"no conversion (raw PT)", fixedTime{100, true}, nil, "branch: 0x1000 main+0x0 (/bin/p) => 0x2000 f+0x0 (/bin/p) call tid=5 cpu=1\n"},
		{"no TSC yet", fixedTime{100, false}, conv, "branch: 0x1000 main+0x0 (/bin/p) => 0x2000 f+0x0 (/bin/p) call tid=5 cpu=1\n"},
		{"time", fixedTime{300_000_000, true}, conv, "branch: 0x1000 main+0x0 (/bin/p) => 0x2000 f+0x0 (/bin/p) call tid=5 cpu=1 time=3.000000007\n"},
		{"sub-second", fixedTime{12, true}, conv, "branch: 0x1000 main+0x0 (/bin/p) => 0x2000 f+0x0 (/bin/p) call tid=5 cpu=1 time=0.000000127\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			b := NewBranches(&out, nil, sy, nil)
			b.SetContext(5, 1)
			b.SetClock(tt.clock)
			b.TimeConv = tt.conv
			b.Branch(0x1000, 0x2000, BrCall)
			if err := b.Flush(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("got  %q\nwant %q", out.String(), tt.want)
			}
		})
	}
}

// TestBranchesTimeTrace decodes a trace with TSC, TMA and MTC packets and
// checks each line's time against the estimate computed by hand.
func TestBranchesTimeTrace(t *testing.T) {
	// 0x1000: je +0; 0x1002: je +0; 0x1004: jmp 0x1000.
	mem := &blob{base: 0x1000, code: []byte{0x74, 0x00, 0x74, 0x00, 0xeb, 0xfa}}
	e := ptenc.New()
	e.PSB()
	e.TSC(1000)
	// TMA: CTC 0x10, FastCounter 4: the TSC was 4 past the CTC's tick,
	// so the MTC base is 996.
	e.TMA(0x10, 4)
	e.PSBEnd()
	e.IP(ptenc.TIPPGE, 0x1000)
	e.TNT(1, 1)
	// CTC 0x13: 3 ticks of 2 TSC each (cpuid 0x15 2/1) past 996: 1002.
	e.MTC(0x13)
	e.TNT(1, 1)
	// CTC 0x15: 2 more ticks: 1006.
	e.MTC(0x15)
	e.TNT(1, 1)
	e.IP(ptenc.TIPPGD, 0x1002)
	cfg := &decode.ClockConfig{CPUID15EAX: 1, CPUID15EBX: 2}
	want := "trace: start at 0x1000 [unknown] ([unknown]) time=1.000000000\n" +
		"branch: 0x1000 [unknown] ([unknown]) => 0x1002 [unknown] ([unknown]) jcc time=1.000000000\n" +
		"branch: 0x1002 [unknown] ([unknown]) => 0x1004 [unknown] ([unknown]) jcc time=1.002000000\n" +
		// A direct jump is decided by no packet: the decoder reads on
		// to the next TNT/TIP (does tracing stop at the jump?), and the
		// MTC before it, so the jump has the time of the next branch.
		"branch: 0x1004 [unknown] ([unknown]) => 0x1000 [unknown] ([unknown]) jmp time=1.006000000\n" +
		"branch: 0x1000 [unknown] ([unknown]) => 0x1002 [unknown] ([unknown]) jcc time=1.006000000\n" +
		"trace: stop at 0x1002 [unknown] ([unknown]) time=1.006000000\n"
	// Without Options.Time the same trace prints the same lines without
	// time: raw PT's ptsim runs are unchanged.
	noTime := regexp.MustCompile(` time=[0-9.]+`).ReplaceAllString(want, "")
	for _, tt := range []struct {
		name string
		opts Options
		want string
	}{
		{"timed", Options{Time: cfg}, want},
		{"untimed", Options{}, noTime},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			b := NewBranches(&out, mem, nil, nil)
			b.TimeConv = func(tsc uint64) uint64 { return tsc * 1_000_000 }
			d := New(mem, tt.opts)
			b.SetClock(d)
			d.Decode(e.Bytes(), b)
			b.Finish()
			if err := b.Flush(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("got\n%s\nwant\n%s", out.String(), tt.want)
			}
		})
	}
}
