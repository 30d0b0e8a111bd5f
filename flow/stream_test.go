package flow

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"ptfs/decode/ptenc"
	"ptfs/images"
	"ptfs/internal/testkit"
)

// flowHash is a Handler that hashes everything it is told (every
// instruction, branch and event with its offset, IP, error and time), so
// that two decodes compare whole without keeping the flow.
type flowHash struct {
	h                        uint64
	insns, branches, errors_ uint64
	first                    []string // the first events, for a report
}

func (f *flowHash) mix(vs ...uint64) {
	for _, v := range vs {
		f.h = (f.h ^ v) * 0x100000001b3
	}
}

func (f *flowHash) Insn(in *Insn) {
	f.insns++
	f.mix(in.IP, uint64(in.Len), uint64(in.Class))
}

func (f *flowHash) Branch(from, to uint64, k BranchKind) {
	f.branches++
	f.mix(from, to, uint64(k))
}

func (f *flowHash) Event(e *Event) {
	if e.Kind == EvError {
		f.errors_++
	}
	line := fmt.Sprintf("%d %x %x %v %x %x %v %d %d", e.Kind, e.IP, e.At, e.HasIP, e.Offset, e.Payload, e.Err, e.TSC, e.Flags)
	if len(f.first) < 4 {
		f.first = append(f.first, line)
	}
	for _, c := range []byte(line) {
		f.mix(uint64(c))
	}
}

// chunkings are the ways the stream tests cut a trace: every byte alone,
// 7 and 4096 bytes, random sizes (1 to 8 KiB, fixed seed), and whole.
var chunkings = []struct {
	name string
	next func(r *rand.Rand, left int) int
}{
	{"1", func(*rand.Rand, int) int { return 1 }},
	{"7", func(*rand.Rand, int) int { return 7 }},
	{"4096", func(*rand.Rand, int) int { return 4096 }},
	{"random", func(r *rand.Rand, _ int) int { return 1 + r.IntN(8192) }},
	{"whole", func(_ *rand.Rand, left int) int { return left }},
}

// feed writes trace to s in the chunks next cuts, then closes it.
func feed(t testing.TB, s *Stream, trace []byte, next func(*rand.Rand, int) int) {
	t.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	for len(trace) > 0 {
		n := min(next(r, len(trace)), len(trace))
		if w, err := s.Write(trace[:n]); w != n || err != nil {
			t.Fatalf("write %d bytes: %d, %v", n, w, err)
		}
		trace = trace[n:]
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// sameStreamed holds the flow of trace decoded as a Stream, cut every way
// of chunkings, to Decode's of the whole trace; it returns Decode's.
func sameStreamed(t *testing.T, mem Memory, trace []byte, opts Options) *flowHash {
	t.Helper()
	var want flowHash
	d := New(mem, opts)
	d.Decode(trace, &want)
	wantC := d.Counters()
	for _, ck := range chunkings {
		var got flowHash
		d := New(mem, opts)
		s := NewStream(d, &got)
		feed(t, s, trace, ck.next)
		if got.h != want.h || got.insns != want.insns || got.branches != want.branches || d.Counters() != wantC {
			t.Errorf("chunks of %s: %d insns %d branches %d errors (%q...), Decode %d, %d, %d (%q...)", ck.name,
				got.insns, got.branches, got.errors_, got.first, want.insns, want.branches, want.errors_, want.first)
		}
		if c := s.Counters(); c.Bytes != uint64(len(trace)) || c.Gaps != 0 {
			t.Errorf("chunks of %s: counters %+v for %d bytes", ck.name, c, len(trace))
		}
	}
	return &want
}

// TestStreamSameFlow: the benchmark traces (mruby with its page dump, a
// ptsim run with its ELF), whole, truncated and corrupted, and every
// libipt test trace with its image give through a Stream, cut every way,
// the instructions, branches and events (offsets, errors, times) of
// Decode on the whole trace, with and without NoInsns.
func TestStreamSameFlow(t *testing.T) {
	for _, name := range benchNames {
		bt := loadBench(t, name)
		for _, tc := range variants(bt.trace) {
			for _, opts := range []Options{{}, {NoInsns: true}} {
				t.Run(fmt.Sprintf("%s/%s/noinsns=%v", name, tc.name, opts.NoInsns), func(t *testing.T) {
					w := sameStreamed(t, bt.space, tc.trace, opts)
					if w.branches == 0 || (tc.name == "corrupted") != (w.errors_ > 0) {
						t.Fatalf("%d branches, %d errors", w.branches, w.errors_)
					}
				})
			}
		}
	}
	var errs, n uint64
	for _, lt := range libiptTraces(t) {
		t.Run("libipt/"+lt.name, func(t *testing.T) {
			for _, opts := range []Options{{}, {ResyncOnError: true}} {
				errs += sameStreamed(t, lt.mem, lt.trace, opts).errors_
			}
		})
		n++
	}
	if errs == 0 || n < 100 {
		t.Errorf("%d libipt traces, %d errors: the error paths went untested", n, errs)
	}
}

// timedHash is a flowHash that mixes in each branch's time when its
// Handler gets it (a branch line's time=), taking batches as they come.
type timedHash struct {
	flowHash
	d *Decoder
}

func (f *timedHash) Branch(from, to uint64, k BranchKind) {
	f.flowHash.Branch(from, to, k)
	tsc, _ := f.d.TSC()
	f.mix(tsc)
}

func (f *timedHash) Edges(batch [][]Edge) {
	for _, e := range batch {
		for i := range e {
			f.Branch(e[i].From, e[i].To, e[i].Kind)
		}
	}
}

// TestStreamTimed: mruby with timing packets put in (timed: MTCs and CYCs,
// some of more bytes), whole, truncated and corrupted, decoded with a
// clock for a reader of branches (a live mount's case) through a Stream
// cut every way gives the branches with their times and the events of
// the slow path's Decode; the fast path takes the bulk of the bytes where
// the chunks leave it 16 bytes ahead.
func TestStreamTimed(t *testing.T) {
	bt := loadBench(t, "mruby")
	opts := Options{NoInsns: true, Time: &timeConfig}
	for _, tc := range variants(timed(bt.trace, 24, true)) {
		t.Run(tc.name, func(t *testing.T) {
			d := New(bt.space, opts)
			d.fp.off = true
			want := timedHash{d: d}
			d.Decode(tc.trace, &want)
			wantC := d.Counters()
			for _, ck := range chunkings {
				d := New(bt.space, opts)
				got := timedHash{d: d}
				feed(t, NewStream(d, &got), tc.trace, ck.next)
				if got.h != want.h || got.branches != want.branches || d.Counters() != wantC {
					t.Errorf("chunks of %s: %d branches %d errors (%q...), the slow path's Decode %d, %d (%q...)",
						ck.name, got.branches, got.errors_, got.first, want.branches, want.errors_, want.first)
				}
				if ck.name != "1" && ck.name != "7" && d.fp.bytes < uint64(len(tc.trace))/2 {
					t.Errorf("chunks of %s: the fast path took %d of %d bytes", ck.name, d.fp.bytes, len(tc.trace))
				}
			}
			if want.branches == 0 || (tc.name == "corrupted") != (want.errors_ > 0) {
				t.Fatalf("%d branches, %d errors", want.branches, want.errors_)
			}
		})
	}
}

// TestStreamBranchLines: the branch: lines (symbols, gap and trace lines)
// of libxdc's four traces with their page dumps and the corpus's ptsim
// runs with their ELF are the same for every chunking as for Decode.
func TestStreamBranchLines(t *testing.T) {
	corpus := testkit.Corpus(t)
	type run struct {
		name, trace string
		space       *images.Space
	}
	var runs []run
	for _, x := range []struct{ name, trace, addr, dump string }{
		{"foo", "trace", "data.addr", "data.dump"},
		{"mruby", "trace", "data.addr", "data.dump"},
		{"Unzip", "trace", "data.addr", "data.dump"},
		{"icelake_tip", "ptlog", "pagecache.addr", "pagecache.dump"},
	} {
		dir := filepath.Join(corpus, "libxdc", x.name)
		s := images.NewSpace()
		if err := images.MapPageDump(s, filepath.Join(dir, x.addr), filepath.Join(dir, x.dump)); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run{"libxdc/" + x.name, filepath.Join(dir, x.trace), s})
	}
	for _, r := range []string{"run-static", "run-static-ptw"} {
		dir := filepath.Join(corpus, "ptsim", r)
		runs = append(runs, run{"ptsim/" + r, filepath.Join(dir, "trace.pt"), ptsimSpace(t, dir)})
	}
	for _, r := range runs {
		trace, err := os.ReadFile(r.trace)
		if err != nil {
			t.Fatal(err)
		}
		lines := func(decode func(d *Decoder, b *Branches)) string {
			var out bytes.Buffer
			b := NewBranches(&out, r.space, r.space, nil)
			d := New(r.space, Options{})
			decode(d, b)
			b.Finish()
			if err := b.Flush(); err != nil {
				t.Fatal(err)
			}
			return out.String()
		}
		want := lines(func(d *Decoder, b *Branches) { d.Decode(trace, b) })
		if !strings.Contains(want, "branch: ") {
			t.Fatalf("%s: %d bytes of lines", r.name, len(want))
		}
		for _, ck := range chunkings {
			got := lines(func(d *Decoder, b *Branches) { feed(t, NewStream(d, b), trace, ck.next) })
			if got != want {
				i := 0
				for i < min(len(got), len(want)) && got[i] == want[i] {
					i++
				}
				t.Errorf("%s, chunks of %s: lines differ at byte %d: %q, want %q", r.name, ck.name, i,
					got[max(0, i-80):min(len(got), i+80)], want[max(0, i-80):min(len(want), i+80)])
			}
		}
	}
}

// TestStreamGap: a hole reported between chunks gives a gap line at the
// stream offset of the hole, with its cause, drops the packet it cut, and
// decoding goes on at the next PSB; trace before the hole is decoded as
// far as it goes.
func TestStreamGap(t *testing.T) {
	// 1000: nop; 1001: jne 1000; 1003: call 1009; 1008: nop; 1009: ret
	code := []byte{0x90, 0x75, 0xfd, 0xe8, 0x01, 0, 0, 0, 0x90, 0xc3}
	mem := &blob{base: 0x1000, code: code}
	e := ptenc.New()
	start(e, 0x1000)
	e.TNT(0b110, 3)
	before := len(e.Bytes())
	e.IP(ptenc.TIP, 0x1008) // cut by the hole: never decoded
	start(e, 0x1003)
	e.TNT(1, 1)
	e.IPC(ptenc.TIPPGD, 0, 0)
	trace := e.Bytes()
	cause := errors.New("aux truncated")
	for _, at := range []int{before, before + 1} {
		var r recorder
		d := New(mem, Options{})
		s := NewStream(d, &r)
		_, _ = s.Write(trace[:at])
		s.Gap(cause)
		_, _ = s.Write(trace[before+1:])
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("1000 1001 1000 1001 1000 1001 error %x 1001: trace lost: aux truncated 1003 1009 1008 1009 ev1", at)
		if got := strings.Join(r.lines, " "); got != want {
			t.Errorf("hole at %d:\n got %s\nwant %s", at, got, want)
		}
		if c := s.Counters(); c.Gaps != 1 || d.Counters().Errors != 1 {
			t.Errorf("hole at %d: stream %+v, decoder %+v", at, c, d.Counters())
		}
		if _, err := s.Write([]byte{0}); !errors.Is(err, ErrStreamClosed) {
			t.Errorf("write after close: %v", err)
		}
	}
}

// TestStreamLong streams 256 MiB (mruby's trace again and again: each copy
// starts at a PSB) through one Stream in 64 KiB chunks and checks the
// branch and error counts against what one, two and three copies give
// whole, and that the Go heap stays within 4 MiB of what it was after the
// first copies (the window and the warm block cache; never the trace).
func TestStreamLong(t *testing.T) {
	bt := loadBench(t, "mruby")
	const total = 256 << 20
	copies := total / len(bt.trace)
	if testing.Short() {
		copies /= 8
	}
	opts := Options{NoInsns: true}
	whole := func(n int) counter {
		var c counter
		New(bt.space, opts).Decode(bytes.Repeat(bt.trace, n), &c)
		return c
	}
	c1, c2, c3 := whole(1), whole(2), whole(3)
	if c3.branches-c2.branches != c2.branches-c1.branches || c3.errors-c2.errors != c2.errors-c1.errors {
		t.Fatalf("copies do not decode alike: %+v %+v %+v", c1, c2, c3)
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var c counter
	d := New(bt.space, opts)
	s := NewStream(d, &c)
	const chunk = 64 << 10
	var base, peak uint64
	for i := range copies {
		for tr := bt.trace; len(tr) > 0; {
			n := min(chunk, len(tr))
			_, _ = s.Write(tr[:n])
			tr = tr[n:]
		}
		switch {
		case i == 1:
			base = heap()
		case i > 1 && i%32 == 0:
			peak = max(peak, heap())
		}
	}
	_ = s.Close()
	peak = max(peak, heap())
	want := c1.branches + (copies-1)*(c2.branches-c1.branches)
	if c.branches != want || c.errors != c1.errors+(copies-1)*(c2.errors-c1.errors) {
		t.Errorf("%d copies: %d branches, %d errors; want %d, %d", copies, c.branches, c.errors, want, c1.errors+(copies-1)*(c2.errors-c1.errors))
	}
	if s.Counters().Bytes != uint64(copies*len(bt.trace)) {
		t.Errorf("fed %d bytes", s.Counters().Bytes)
	}
	t.Logf("%d MiB streamed: %d branches; heap %d KiB after two copies, peak %d KiB", copies*len(bt.trace)>>20, c.branches, base>>10, peak>>10)
	if peak > base+4<<20 {
		t.Errorf("heap grew from %d to %d bytes over %d bytes of trace", base, peak, copies*len(bt.trace))
	}
	runtime.KeepAlive(d)
}

// BenchmarkStream decodes mruby's trace (branches only, the block cache
// warm) whole with Decode and through a Stream in 64 KiB chunks: the
// Stream's cost is its window copy and one coroutine switch per chunk.
func BenchmarkStream(b *testing.B) {
	bt := loadBench(b, "mruby")
	for _, mode := range []string{"decode", "stream"} {
		b.Run(mode, func(b *testing.B) {
			d := New(bt.space, Options{NoInsns: true})
			var c counter
			d.Decode(bt.trace, &c)
			b.SetBytes(int64(len(bt.trace)))
			b.ResetTimer()
			for b.Loop() {
				if mode == "decode" {
					d.Decode(bt.trace, &c)
					continue
				}
				s := NewStream(d, &c)
				for tr := bt.trace; len(tr) > 0; {
					n := min(64<<10, len(tr))
					_, _ = s.Write(tr[:n])
					tr = tr[n:]
				}
				_ = s.Close()
			}
		})
	}
}
