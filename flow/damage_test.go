package flow

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"ptfs/decode"
	"ptfs/images"
	"ptfs/internal/testkit"
)

// branchLines decodes trace over mem and returns the lines Branches
// prints, the decoder's counters and Branches'.
func branchLines(mem *images.Space, trace []byte, opts Options) ([]string, Counters, BranchCounters) {
	var out bytes.Buffer
	b := NewBranches(&out, mem, mem, nil)
	d := New(mem, opts)
	d.Decode(trace, b)
	b.Finish()
	if err := b.Flush(); err != nil {
		panic(err) // a bytes.Buffer does not fail
	}
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"), d.Counters(), b.Counters()
}

// tracePackets returns the packets of trace from its first PSB on, up to
// the first error.
func tracePackets(t *testing.T, trace []byte) []decode.Packet {
	t.Helper()
	d := decode.NewPacketDecoder(trace)
	if err := d.SyncForward(); err != nil {
		t.Fatal(err)
	}
	var pkts []decode.Packet
	for {
		var p decode.Packet
		if err := d.Next(&p); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("packet at 0x%x: %v", d.Pos(), err)
			}
			return pkts
		}
		pkts = append(pkts, p)
	}
}

// TestDamagedTrace damages a real trace (ptsim's static run: ground truth
// from single-stepping) in one known place and holds the branch lines to
// the clean run's: the same lines up to the damage, one gap line at the
// damaged offset, and after the next PSB (a `trace: sync at` its FUP's IP)
// the same lines as the clean run to the end. A trace cut in mid-packet
// ends with the clean run's lines up to the cut and a gap line.
func TestDamagedTrace(t *testing.T) {
	run := filepath.Join(testkit.Corpus(t), "ptsim", "run-static")
	clean, err := os.ReadFile(filepath.Join(run, "trace.pt"))
	if err != nil {
		t.Fatal(err)
	}
	mem := ptsimSpace(t, run)
	want, wc, _ := branchLines(mem, clean, Options{})
	if wc.Errors != 0 {
		t.Fatalf("clean run: %d errors", wc.Errors)
	}
	// The damage: the first TNT between the second and the third PSB,
	// its byte and the next made an unknown extended opcode (02 ff).
	pkts := tracePackets(t, clean)
	var psbs []int
	for i, p := range pkts {
		if p.Kind == decode.PSB {
			psbs = append(psbs, i)
		}
	}
	if len(psbs) < 3 {
		t.Fatalf("%d PSBs, want 3 or more", len(psbs))
	}
	at := -1
	for i := psbs[1] + 1; i < psbs[2] && at < 0; i++ {
		if pkts[i].Kind == decode.TNT8 && pkts[i-1].Kind != decode.PSBEnd {
			at = i
		}
	}
	if at < 0 {
		t.Fatal("no TNT between the second and the third PSB")
	}
	off := pkts[at].Offset
	// The FUP of the next PSB+ is where decoding resynchronises.
	var syncIP uint64
	for _, p := range pkts[psbs[2]:] {
		if p.Kind == decode.FUP {
			syncIP = p.IP
			break
		}
	}
	corrupt := bytes.Clone(clean)
	corrupt[off], corrupt[off+1] = 0x02, 0xff
	for _, tc := range []struct {
		name  string
		trace []byte
		err   string
		after bool // lines after the gap
	}{
		{"corrupt", corrupt, "unknown opcode", true},
		{"truncated", clean[:pkts[psbs[2]].Offset+3], "end of stream", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, c, bc := branchLines(mem, tc.trace, Options{})
			if c.Errors != 1 || bc.Gaps != 1 {
				t.Fatalf("%d errors, %d gaps, want 1 each", c.Errors, bc.Gaps)
			}
			gap := -1
			for i, l := range got {
				if strings.HasPrefix(l, "gap: ") {
					gap = i
				}
			}
			// Up to the damage: the clean run's lines.
			for i := range gap {
				if got[i] != want[i] {
					t.Fatalf("line %d before the damage: %q, clean %q", i, got[i], want[i])
				}
			}
			wantOff := off
			if !tc.after {
				wantOff = pkts[psbs[2]].Offset
			}
			if l := got[gap]; !strings.HasPrefix(l, fmt.Sprintf("gap: error offset=0x%x ", wantOff)) || !strings.HasSuffix(l, "err="+tc.err) {
				t.Errorf("gap line %q, want offset 0x%x and %q", l, wantOff, tc.err)
			}
			rest := got[gap+1:]
			if !tc.after {
				if len(rest) != 0 {
					t.Errorf("lines after the cut: %q", rest)
				}
				t.Logf("%d of %d lines before the cut at 0x%x", gap, len(want), len(tc.trace))
				return
			}
			// After the next PSB: the clean run's lines to the end.
			if len(rest) == 0 || !strings.HasPrefix(rest[0], fmt.Sprintf("trace: sync at 0x%x ", syncIP)) {
				t.Fatalf("after the gap %q, want the sync at the next PSB's 0x%x", rest[:min(1, len(rest))], syncIP)
			}
			rest = rest[1:]
			if len(rest) > len(want) || len(rest) < 1000 {
				t.Fatalf("%d lines after the sync, clean run %d", len(rest), len(want))
			}
			tail := want[len(want)-len(rest):]
			for i := range rest {
				if rest[i] != tail[i] {
					t.Fatalf("line %d after the sync: %q, clean %q", i, rest[i], tail[i])
				}
			}
			t.Logf("damage at 0x%x: %d lines equal before, %d after the PSB at 0x%x, %d lost, of %d",
				off, gap, len(rest), pkts[psbs[2]].Offset, len(want)-gap-len(rest), len(want))
		})
	}
}

// realImages are the fuzz target's code: ptsim's static run (its binary
// and vDSO) and mruby's page dump from libxdc's kAFL trace, with seeds
// from their traces.
func realImages(f *testing.F) (spaces [2]*images.Space, seeds [][]byte) {
	corpus := testkit.Corpus(f)
	run := filepath.Join(corpus, "ptsim", "run-static")
	spaces[0] = ptsimSpace(f, run)
	mruby := filepath.Join(corpus, "libxdc", "mruby")
	spaces[1] = images.NewSpace()
	if err := images.MapPageDump(spaces[1], filepath.Join(mruby, "data.addr"), filepath.Join(mruby, "data.dump")); err != nil {
		f.Fatal(err)
	}
	for _, p := range []string{filepath.Join(run, "trace.pt"), filepath.Join(corpus, "ptsim", "run-static-ptw", "trace.pt"), filepath.Join(mruby, "trace")} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		// A PSB period or so: small inputs keep the fuzzer fast.
		seeds = append(seeds, b[:min(len(b), 1<<12)])
	}
	return spaces, seeds
}

// FuzzRealImages decodes random and mutated traces over real code (the
// ptsim static binary with its vDSO, mruby's page dump): no panic, no hang
// (each decode ends within 3 s), memory bounded by the code and the block
// cache whatever the trace, every error a gap line, every line of a
// format of DESIGN §5.
func FuzzRealImages(f *testing.F) {
	spaces, seeds := realImages(f)
	for i, s := range seeds {
		img := uint8(0)
		if i == 2 {
			img = 1
		}
		f.Add(s, img)
		f.Add(s, img|2) // with ResyncOnError
	}
	f.Fuzz(func(t *testing.T, trace []byte, img uint8) {
		if len(trace) > 1<<13 {
			return
		}
		mem := spaces[img&1]
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var lines lineChecker
		b := NewBranches(&lines, mem, mem, nil)
		d := New(mem, Options{MaxInsns: 1 << 10, ResyncOnError: img&2 != 0})
		testkit.Bounded(t, 3*time.Second, fmt.Sprintf("decode of %d bytes", len(trace)), func() {
			d.Decode(trace, b)
			b.Finish()
		})
		if err := b.Flush(); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		// The block cache holds at most 2^20 instructions (24 MiB); the
		// lines are written out as they come.
		if n := after.TotalAlloc - before.TotalAlloc; n > 64<<20+uint64(len(trace))<<10 {
			t.Fatalf("%d bytes allocated decoding %d bytes of trace", n, len(trace))
		}
		c, bc := d.Counters(), b.Counters()
		if bc.Gaps < c.Errors {
			t.Fatalf("%d errors, %d gap lines", c.Errors, bc.Gaps)
		}
		if lines.bad != "" {
			t.Fatalf("line %q", lines.bad)
		}
	})
}

// lineChecker keeps the first line written to it that is of none of the
// formats Branches prints (DESIGN §5); Branches writes whole lines.
type lineChecker struct{ bad string }

func (c *lineChecker) Write(p []byte) (int, error) {
	for l := range bytes.Lines(p) {
		known := false
		for _, pre := range []string{"branch: ", "trace: ", "gap: ", "manual ptwrite: ", "record "} {
			known = known || bytes.HasPrefix(l, []byte(pre))
		}
		if (!known || !bytes.HasSuffix(l, []byte("\n"))) && c.bad == "" {
			c.bad = string(l)
		}
	}
	return len(p), nil
}
