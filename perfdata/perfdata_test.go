package perfdata

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"ptfs/internal/testkit"
)

// TestCorpus extracts the two AUX buffers of a real recording and compares
// them with the bytes extracted independently.
func TestCorpus(t *testing.T) {
	dir, f := corpusFile(t)
	data, err := os.ReadFile(filepath.Join(dir, "perf.data.intel_pt-4.14"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Pipe || len(f.Buffers) != 2 {
		t.Fatalf("pipe %v, %d buffers, want a file with 2", f.Pipe, len(f.Buffers))
	}
	for i, want := range []struct {
		idx  uint32
		cpu  int32
		file string
	}{{0, 0, "intel_pt-4.14-idx0-cpu0.pt"}, {3, 3, "intel_pt-4.14-idx3-cpu3.pt"}} {
		b := f.Buffers[i]
		if b.Idx != want.idx || b.CPU != want.cpu || b.TID != -1 {
			t.Errorf("buffer %d: idx %d cpu %d tid %d", i, b.Idx, b.CPU, b.TID)
		}
		raw, err := os.ReadFile(filepath.Join(dir, want.file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), raw) {
			t.Errorf("buffer %d: %d bytes differ from %s (%d bytes)", i, len(b.Bytes()), want.file, len(raw))
		}
		var segs [][]byte
		b.Segments(func(d []byte, gap bool) {
			if gap {
				t.Errorf("buffer %d: unexpected gap", i)
			}
			segs = append(segs, d)
		})
		if !bytes.Equal(bytes.Join(segs, nil), raw) {
			t.Errorf("buffer %d: segments differ", i)
		}
	}
	if f.LostAux != 0 || f.LostEvents != 0 || f.AuxtraceErrors != 0 {
		t.Errorf("losses %d %d %d in a clean recording", f.LostAux, f.LostEvents, f.AuxtraceErrors)
	}
	// Intel PT's AUXTRACE_INFO carries the conversion of a 1.2 GHz TSC
	// (mult/2^shift = 0.833 ns per tick).
	if f.Time == nil {
		t.Fatal("no time conversion")
	}
	if d := f.Time.NS(1_200_000_000) - f.Time.NS(0); d < 999_999_000 || d > 1_000_001_000 {
		t.Errorf("1.2e9 ticks = %d ns", d)
	}

	// Every truncation before the end of the data section (the feature
	// sections follow it) is an error, never a panic.
	end := int(binary.LittleEndian.Uint64(data[40:]) + binary.LittleEndian.Uint64(data[48:]))
	for n := 0; n < end; n += 1 + n/64 {
		if _, err := Parse(data[:n]); !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotPerfData) {
			t.Fatalf("truncated to %d bytes: err %v", n, err)
		}
	}
}

// corpusFile parses the corpus recording and returns its directory.
func corpusFile(t *testing.T) (string, *File) {
	t.Helper()
	dir := filepath.Join(testkit.Corpus(t), "perf")
	data, err := os.ReadFile(filepath.Join(dir, "perf.data.intel_pt-4.14"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return dir, f
}

// builder writes synthetic perf.data.
type builder struct {
	recs []byte
}

func (b *builder) rec(typ uint32, body []byte, extra []byte) {
	b.recMisc(typ, 0, body)
	b.recs = append(b.recs, extra...)
}

// recMisc adds a record with misc flags.
func (b *builder) recMisc(typ uint32, misc uint16, body []byte) {
	var h [8]byte
	binary.LittleEndian.PutUint32(h[:], typ)
	binary.LittleEndian.PutUint16(h[4:], misc)
	binary.LittleEndian.PutUint16(h[6:], uint16(8+len(body)))
	b.recs = append(b.recs, h[:]...)
	b.recs = append(b.recs, body...)
}

func u64s(vs ...uint64) []byte {
	var out []byte
	for _, v := range vs {
		out = binary.LittleEndian.AppendUint64(out, v)
	}
	return out
}

func (b *builder) auxtrace(off uint64, idx uint32, tid, cpu int32, data []byte) {
	body := u64s(uint64(len(data)), off, 0)
	body = binary.LittleEndian.AppendUint32(body, idx)
	body = binary.LittleEndian.AppendUint32(body, uint32(tid))
	body = binary.LittleEndian.AppendUint32(body, uint32(cpu))
	body = binary.LittleEndian.AppendUint32(body, 0)
	b.rec(recAuxtrace, body, data)
}

// attrBytes is a perf_event_attr (64 bytes, version 0 size) with the given
// sample type and sample_id_all.
func attrBytes(sampleType uint64) []byte {
	a := make([]byte, 64)
	binary.LittleEndian.PutUint32(a[4:], 64)
	binary.LittleEndian.PutUint64(a[24:], sampleType)
	binary.LittleEndian.PutUint64(a[40:], attrSampleIDAll)
	return a
}

// file lays out a perf.data file with one attribute.
func (b *builder) file(sampleType uint64) []byte {
	attr := append(attrBytes(sampleType), u64s(0, 0)...) // ids section
	const hsize = 104
	out := make([]byte, hsize)
	copy(out, magic)
	binary.LittleEndian.PutUint64(out[8:], hsize)
	binary.LittleEndian.PutUint64(out[16:], uint64(len(attr)))
	binary.LittleEndian.PutUint64(out[24:], hsize)
	binary.LittleEndian.PutUint64(out[32:], uint64(len(attr)))
	binary.LittleEndian.PutUint64(out[40:], hsize+uint64(len(attr)))
	binary.LittleEndian.PutUint64(out[48:], uint64(len(b.recs)))
	out = append(out, attr...)
	return append(out, b.recs...)
}

// pipe lays out pipe-mode perf.data; the attribute comes as a record.
func (b *builder) pipe(sampleType uint64) []byte {
	out := append([]byte(magic), u64s(16)...)
	var hb builder
	hb.rec(recHeaderAttr, append(attrBytes(sampleType), u64s(42)...), nil)
	out = append(out, hb.recs...)
	return append(out, b.recs...)
}

func TestSynthetic(t *testing.T) {
	const st = sampleTID | sampleTime | sampleCPU | sampleIdentifier
	trailer := func(tid, cpu uint32) []byte {
		t := binary.LittleEndian.AppendUint32(nil, 100)
		t = binary.LittleEndian.AppendUint32(t, tid)
		t = append(t, u64s(12345)...)
		t = binary.LittleEndian.AppendUint32(t, cpu)
		t = binary.LittleEndian.AppendUint32(t, 0)
		return append(t, u64s(42)...)
	}
	var b builder
	b.rec(recTimeConv, u64s(10, 1<<10, 5), nil)
	b.auxtrace(0, 1, 7, 1, []byte("aaaa"))
	b.auxtrace(0, 0, 7, 0, []byte("cccccc"))
	b.rec(recAux, append(u64s(4, 4, AuxTruncated), trailer(7, 1)...), nil)
	b.auxtrace(4, 1, 7, 1, []byte("bbbbbbbb")) // loss after its 4th byte
	b.auxtrace(20, 0, 7, 0, []byte("dd"))      // hole in the offsets
	b.rec(recAux, append(u64s(0, 22, AuxCollision), trailer(7, 9)...), nil)
	b.rec(recLost, u64s(1, 3), nil)
	b.rec(recAuxtraceError, make([]byte, 8), nil)
	b.rec(recHeaderTracing, []byte{5, 0, 0, 0, 0, 0, 0, 0}, []byte("xxxxx\x00\x00\x00"))

	type seg struct {
		data string
		gap  bool
	}
	for _, pipe := range []bool{false, true} {
		var data []byte
		if pipe {
			data = b.pipe(st)
		} else {
			// The tracing-data record only has a trailing payload in
			// pipe mode.
			fb := builder{recs: b.recs[:len(b.recs)-24]}
			fb.rec(recHeaderTracing, []byte{5, 0, 0, 0, 0, 0, 0, 0}, nil)
			data = fb.file(st)
		}
		f, err := Parse(data)
		if err != nil {
			t.Fatalf("pipe %v: %v", pipe, err)
		}
		if f.Pipe != pipe || len(f.Buffers) != 2 || f.LostAux != 1 || f.LostEvents != 3 || f.AuxtraceErrors != 1 {
			t.Fatalf("pipe %v: %+v", pipe, f)
		}
		if f.Time == nil || f.Time.NS(1<<10) != 5+1<<10 {
			t.Errorf("pipe %v: time %+v", pipe, f.Time)
		}
		want := [][]seg{
			{{"aaaa", false}, {"bbbb", false}, {"bbbb", true}},
			{{"cccccc", false}, {"dd", true}},
		}
		for i, bf := range f.Buffers {
			var got []seg
			bf.Segments(func(d []byte, gap bool) { got = append(got, seg{string(d), gap}) })
			if len(got) != len(want[i]) {
				t.Fatalf("pipe %v buffer %d: segments %v, want %v", pipe, i, got, want[i])
			}
			for j := range got {
				if got[j] != want[i][j] {
					t.Errorf("pipe %v buffer %d: segments %v, want %v", pipe, i, got, want[i])
				}
			}
		}
		if f.Buffers[0].Idx != 1 || f.Buffers[0].CPU != 1 || f.Buffers[0].TID != -1 {
			t.Errorf("pipe %v: buffer 0 %+v", pipe, f.Buffers[0])
		}
	}
}

// A TIME_CONV without cap_user_time_zero gives no time conversion; with
// it, the conversion.
func TestTimeConvFlags(t *testing.T) {
	for _, zero := range []byte{0, 1} {
		var b builder
		b.rec(recTimeConv, append(u64s(10, 1<<10, 5, 0, 0), zero, 0, 0, 0, 0, 0, 0, 0), nil)
		b.auxtrace(0, 0, 7, 0, []byte("aaaa"))
		f, err := Parse(b.pipe(0))
		if err != nil {
			t.Fatal(err)
		}
		if (f.Time != nil) != (zero == 1) {
			t.Errorf("cap_user_time_zero %d: time conversion %+v", zero, f.Time)
		}
	}
}

func TestPerThreadLoss(t *testing.T) {
	var b builder
	b.auxtrace(0, 0, 55, -1, []byte("xy"))
	tr := binary.LittleEndian.AppendUint32(nil, 1)
	tr = binary.LittleEndian.AppendUint32(tr, 55)
	b.rec(recAux, append(u64s(0, 2, AuxPartial), tr...), nil)
	f, err := Parse(b.file(sampleTID))
	if err != nil {
		t.Fatal(err)
	}
	bf := f.Buffers[0]
	if bf.CPU != -1 || bf.TID != 55 || len(bf.Losses) != 1 || bf.Losses[0] != 2 || f.LostAux != 0 {
		t.Fatalf("buffer %+v, unattributed %d", bf, f.LostAux)
	}
	var calls []bool
	bf.Segments(func(d []byte, gap bool) { calls = append(calls, gap) })
	if len(calls) != 2 || calls[0] || !calls[1] {
		t.Errorf("segments: gaps %v, want data then a trailing loss", calls)
	}
}

func TestErrors(t *testing.T) {
	var good builder
	good.auxtrace(0, 0, 1, 0, []byte("abcd"))
	file := good.file(0)
	mod := func(f func(d []byte) []byte) []byte {
		return f(append([]byte(nil), file...))
	}
	compressed := builder{}
	compressed.rec(recCompressed, make([]byte, 8), nil)
	zeroSize := builder{}
	zeroSize.rec(1, nil, nil)
	binary.LittleEndian.PutUint16(zeroSize.recs[6:], 0)
	tests := []struct {
		name string
		data []byte
		err  error
	}{
		{"empty", nil, ErrTruncated},
		{"bad magic", append([]byte("PERFILE1"), make([]byte, 100)...), ErrNotPerfData},
		{"big endian", append([]byte("2ELIFREP"), make([]byte, 100)...), ErrUnsupported},
		{"header size", mod(func(d []byte) []byte { binary.LittleEndian.PutUint64(d[8:], 1<<40); return d }), ErrCorrupt},
		{"data section beyond end", mod(func(d []byte) []byte { binary.LittleEndian.PutUint64(d[48:], 1<<20); return d }), ErrTruncated},
		{"attr section beyond end", mod(func(d []byte) []byte { binary.LittleEndian.PutUint64(d[24:], 1<<62); return d }), ErrTruncated},
		{"attr size", mod(func(d []byte) []byte { binary.LittleEndian.PutUint64(d[16:], 3); return d }), ErrCorrupt},
		{"payload beyond end", mod(func(d []byte) []byte {
			binary.LittleEndian.PutUint64(d[len(d)-4-40:], 1<<30)
			return d
		}), ErrTruncated},
		{"short auxtrace", mod(func(d []byte) []byte {
			binary.LittleEndian.PutUint16(d[len(d)-4-48+6:], 16)
			return d
		}), ErrCorrupt},
		{"compressed", compressed.file(0), ErrUnsupported},
		{"zero record size", zeroSize.pipe(0), ErrCorrupt},
	}
	for _, tt := range tests {
		if _, err := Parse(tt.data); !errors.Is(err, tt.err) {
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.err)
		}
	}
	if _, err := Parse(file); err != nil {
		t.Errorf("unmodified: %v", err)
	}
}

// FuzzParse checks that no input panics or hangs and that what Parse
// returns is consistent.
func FuzzParse(f *testing.F) {
	var b builder
	b.rec(recTimeConv, u64s(10, 1<<10, 5), nil)
	b.auxtrace(0, 1, 7, 1, []byte("aaaa"))
	b.rec(recAux, append(u64s(0, 4, AuxTruncated), make([]byte, 32)...), nil)
	b.auxtrace(4, 1, 7, 1, []byte("bb"))
	f.Add(b.file(sampleCPU))
	f.Add(b.pipe(sampleCPU | sampleTID))
	f.Fuzz(func(t *testing.T, data []byte) {
		pf, err := Parse(data)
		if err != nil {
			return
		}
		for _, bf := range pf.Buffers {
			n := 0
			bf.Segments(func(d []byte, gap bool) { n += len(d) })
			if n != len(bf.Bytes()) {
				t.Fatalf("segments cover %d of %d bytes", n, len(bf.Bytes()))
			}
		}
	})
}
