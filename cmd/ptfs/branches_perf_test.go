package main

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"ptfs/decode/ptenc"
	"ptfs/images"
	"ptfs/internal/testkit"
)

// TestBranchesPerfCorpus decodes the corpus recording, whose binaries are
// not in the corpus: every mapping of a file is unknown code, named once
// on an image: line and counted, and decoding reports gaps, not failures.
func TestBranchesPerfCorpus(t *testing.T) {
	path := filepath.Join(testkit.Corpus(t), "perf", "perf.data.intel_pt-4.14")
	code, out, errs := runDecodeT("--branches", "--root", t.TempDir(), path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"image: load code image: open binary: stat ",
		"/lib64/libc-2.23.so: no such file or directory\n",
		"perf buffer: idx=0 cpu=0 tid=-1 pid=3174\n",
		"perf buffer: idx=3 cpu=3 tid=-1 pid=3174\n",
		// 9 files and the vDSO (no dump) are unknown.
		"perf summary: buffers=2 lost=0 unknown-mappings=10 image-errors=9\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "\nimage: ") != 8 || !strings.HasPrefix(out, "image: ") {
		t.Errorf("want 9 image: lines:\n%s", out)
	}
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "gap: ") && !strings.Contains(line, "no memory mapped") {
			t.Errorf("gap other than unknown code: %s", line)
		}
	}
	// The one interrupt (FUP + TIP) at the IP a PSB+ synchronised at
	// (taken before the code there is missed, as libipt takes events)
	// stops one thread and starts another: the side band switches tasks
	// in between, so it is a stop and a start, not a branch.
	for _, want := range []string{
		"trace: stop at 0xffffffffb960d300 [unknown] ([unknown]) tid=1760 cpu=3 ",
		"trace: start at 0xffffffffb960d302 [unknown] ([unknown]) tid=3174 cpu=3 ",
		"branch summary: branches=0 insns=0 gaps=10\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Image options are the raw trace's: perf.data refuses them.
	if code, _, errs := runDecodeT("--branches", "--raw", "x:0x1000", path); code != 2 || !strings.Contains(errs, "brings its own images") {
		t.Errorf("--raw with perf.data: exit %d, %q", code, errs)
	}
}

// perfSideBand writes a pipe-mode perf.data in which pid 100 execs and
// maps bin (recorded with build id id: in the MMAP2 if inMmap, else in a
// HEADER_BUILD_ID), and one AUX buffer of trace.
func perfSideBand(t *testing.T, bin string, id, trace []byte, inMmap bool) string {
	var recs []byte
	rec := func(typ uint32, misc uint16, body ...[]byte) {
		b := bytes.Join(body, nil)
		recs = binary.LittleEndian.AppendUint32(recs, typ)
		recs = binary.LittleEndian.AppendUint16(recs, misc)
		recs = binary.LittleEndian.AppendUint16(recs, uint16(8+len(b)))
		recs = append(recs, b...)
	}
	le := binary.LittleEndian
	name := append([]byte(bin), make([]byte, 8-len(bin)%8)...)
	bid := make([]byte, 24)
	copy(bid, id)
	bid[20] = byte(len(id))
	if !inMmap {
		rec(67, 1<<15, le.AppendUint32(nil, 0xffffffff), bid, name)
	} // HEADER_BUILD_ID, sized
	rec(3, 1<<13, le.AppendUint32(le.AppendUint32(nil, 100), 100), []byte("prog\x00\x00\x00\x00")) // COMM exec
	m := le.AppendUint32(le.AppendUint32(nil, 100), 100)
	m = le.AppendUint64(le.AppendUint64(le.AppendUint64(m, 0x555555554000), 0x1000), 0)
	var misc uint16
	if inMmap {
		// build_id_size, 3 reserved bytes, build_id[20]
		m = append(append(m, byte(len(id)), 0, 0, 0), bid[:20]...)
		misc = 1 << 14
	} else {
		m = append(m, make([]byte, 24)...) // maj, min, ino, ino_generation
	}
	m = le.AppendUint32(le.AppendUint32(m, 5), 2)
	rec(10, misc, m, name)                                      // MMAP2
	rec(12, 0, le.AppendUint32(le.AppendUint32(nil, 100), 100)) // ITRACE_START
	a := le.AppendUint64(le.AppendUint64(le.AppendUint64(nil, uint64(len(trace))), 0), 0)
	a = le.AppendUint32(le.AppendUint32(le.AppendUint32(le.AppendUint32(a, 0), 0xffffffff), 0), 0)
	rec(71, 0, a)
	recs = append(recs, trace...)
	data := append([]byte("PERFILE2"), le.AppendUint64(nil, 16)...)
	path := filepath.Join(t.TempDir(), "perf.data")
	if err := os.WriteFile(path, append(data, recs...), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBranchesPerfBuildID maps a binary the test builds through a perf.data
// side band: with its own build id the mapping is known, with another one
// the file is refused, both ids named, and the mapping counted unknown.
func TestBranchesPerfBuildID(t *testing.T) {
	bin := testkit.BuildC(t, "testdata/ptsim-strings.c")
	e, err := images.OpenELF(bin)
	if err != nil {
		t.Fatal(err)
	}
	id := e.File.BuildID()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if len(id) == 0 {
		t.Fatal("gcc built a binary without a build id")
	}
	enc := ptenc.New()
	enc.PSB()
	enc.PSBEnd()
	trace := enc.Bytes()

	for _, inMmap := range []bool{false, true} {
		code, out, errs := runDecodeT("--branches", perfSideBand(t, bin, id, trace, inMmap))
		if code != 0 || strings.Contains(out, "image: ") || !strings.Contains(out, "unknown-mappings=0 image-errors=0\n") || !strings.Contains(out, "pid=100\n") {
			t.Errorf("own build id (in mmap2 %v): exit %d, %s\n%s", inMmap, code, errs, out)
		}

		other := bytes.Clone(id)
		other[0] ^= 0xff
		code, out, errs = runDecodeT("--branches", perfSideBand(t, bin, other, trace, inMmap))
		if code != 0 || !strings.Contains(out, "unknown-mappings=1 image-errors=1\n") {
			t.Errorf("other build id (in mmap2 %v): exit %d, %s\n%s", inMmap, code, errs, out)
		}
		first, _, _ := strings.Cut(out, "\n")
		if !strings.HasPrefix(first, "image: ") || !strings.Contains(first, images.ErrBuildIDMismatch.Error()) ||
			!strings.Contains(first, hex.EncodeToString(id)) || !strings.Contains(first, hex.EncodeToString(other)) {
			t.Errorf("refusal line %q (in mmap2 %v), want the mismatch naming %x and %x", first, inMmap, id, other)
		}
	}
}
