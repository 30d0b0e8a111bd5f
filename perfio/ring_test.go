package perfio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fakeMmap is memory laid out like a perf mmap: one control page, then the
// data area, with a writer that plays the kernel.
type fakeMmap struct {
	mem  []byte
	page *unix.PerfEventMmapPage
	data []byte
}

const fakePage = 4096

// newFakeMmap lays out a control page and dataSize bytes of data. With
// offsets, data_offset/data_size are filled in as modern kernels do.
func newFakeMmap(dataSize int, offsets bool) *fakeMmap {
	words := make([]uint64, (fakePage+dataSize+7)/8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), fakePage+dataSize)
	f := &fakeMmap{mem: mem, page: (*unix.PerfEventMmapPage)(unsafe.Pointer(&words[0])), data: mem[fakePage:]}
	if offsets {
		f.page.Data_offset, f.page.Data_size = fakePage, uint64(dataSize)
	}
	return f
}

// reset puts head and tail at ring position pos.
func (f *fakeMmap) reset(pos uint64) {
	f.page.Data_head, f.page.Data_tail = pos, pos
}

// write appends b at head, wrapping, and publishes the new head.
func (f *fakeMmap) write(b []byte) {
	head := f.page.Data_head
	for i, c := range b {
		f.data[(head+uint64(i))%uint64(len(f.data))] = c
	}
	atomic.StoreUint64(&f.page.Data_head, head+uint64(len(b)))
}

// makeRecord returns a perf record: header (type, misc, size) then body.
func makeRecord(typ uint32, misc uint16, body []byte) []byte {
	b := make([]byte, headerSize, headerSize+len(body))
	binary.LittleEndian.PutUint32(b, typ)
	binary.LittleEndian.PutUint16(b[4:], misc)
	binary.LittleEndian.PutUint16(b[6:], uint16(headerSize+len(body)))
	return append(b, body...)
}

// seq returns n bytes counting from start, to tell records apart.
func seq(start byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = start + byte(i)
	}
	return b
}

func TestRing(t *testing.T) {
	r16 := makeRecord(recordSample, 1, seq(1, 8))
	r24 := makeRecord(recordLost, 2, seq(50, 16))
	odd := makeRecord(7, 3, seq(100, 5)) // 13 bytes: the next header straddles
	badSize := makeRecord(recordSample, 0, nil)
	binary.LittleEndian.PutUint16(badSize[6:], 4)
	tooBig := makeRecord(recordSample, 0, seq(0, 8))
	binary.LittleEndian.PutUint16(tooBig[6:], 200)
	for _, tc := range []struct {
		name   string
		pos    uint64   // ring position of head and tail before the writes
		write  [][]byte // written in order
		extra  uint64   // head moved beyond the written bytes
		want   [][]byte // records read
		errors uint64
	}{
		{name: "empty"},
		{name: "records", write: [][]byte{r16, r24, r16}, want: [][]byte{r16, r24, r16}},
		{name: "record straddles the end", pos: 48, write: [][]byte{r24, r16}, want: [][]byte{r24, r16}},
		{name: "record ends at the end", pos: 40, write: [][]byte{r24, r16}, want: [][]byte{r24, r16}},
		{name: "header straddles the end", pos: 48, write: [][]byte{odd, r16}, want: [][]byte{odd, r16}},
		{name: "positions beyond 2^32", pos: 1<<33 + 56, write: [][]byte{r24}, want: [][]byte{r24}},
		{name: "size below header", write: [][]byte{r16, badSize, r16}, want: [][]byte{r16}, errors: 1},
		{name: "size beyond head", write: [][]byte{r16, tooBig}, want: [][]byte{r16}, errors: 1},
		{name: "partial header", write: [][]byte{r16, seq(0, 4)}, want: [][]byte{r16}, errors: 1},
		{name: "head more than a ring ahead", write: [][]byte{r16}, extra: 64, errors: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeMmap(64, true)
			f.reset(tc.pos)
			for _, w := range tc.write {
				f.write(w)
			}
			f.page.Data_head += tc.extra
			r, err := NewDataRing(f.mem, fakePage)
			if err != nil {
				t.Fatal(err)
			}
			r.Begin()
			var got [][]byte
			for {
				typ, misc, rec, ok := r.Next()
				if !ok {
					break
				}
				if typ != binary.LittleEndian.Uint32(rec) || misc != binary.LittleEndian.Uint16(rec[4:]) {
					t.Errorf("type %d misc %d do not match header % x", typ, misc, rec[:8])
				}
				got = append(got, bytes.Clone(rec))
			}
			r.End()
			if len(got) != len(tc.want) {
				t.Fatalf("read %d records, want %d", len(got), len(tc.want))
			}
			for i := range got {
				if !bytes.Equal(got[i], tc.want[i]) {
					t.Errorf("record %d: % x, want % x", i, got[i], tc.want[i])
				}
			}
			if r.Errors() != tc.errors {
				t.Errorf("errors %d, want %d", r.Errors(), tc.errors)
			}
			if f.page.Data_tail != f.page.Data_head {
				t.Errorf("tail %d, head %d: batch not released", f.page.Data_tail, f.page.Data_head)
			}
		})
	}
}

// TestRingBatches checks that the producer may not reuse space before End,
// and that the reader continues across batches.
func TestRingBatches(t *testing.T) {
	f := newFakeMmap(64, false) // old kernels: no data_offset/size
	r, err := NewDataRing(f.mem, fakePage)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		rec := makeRecord(recordSample, uint16(i), seq(byte(i), 16))
		f.write(rec)
		r.Begin()
		typ, misc, got, ok := r.Next()
		if !ok || typ != recordSample || misc != uint16(i) || !bytes.Equal(got, rec) {
			t.Fatalf("batch %d: %v %d %d % x", i, ok, typ, misc, got)
		}
		if f.page.Data_tail != uint64(24*i) {
			t.Fatalf("batch %d: tail moved to %d before End", i, f.page.Data_tail)
		}
		if _, _, _, ok := r.Next(); ok {
			t.Fatalf("batch %d: a second record", i)
		}
		r.End()
		if f.page.Data_tail != uint64(24*(i+1)) {
			t.Fatalf("batch %d: tail %d after End", i, f.page.Data_tail)
		}
	}
}

func TestNewRingLayout(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dataSize int
		offset   uint64
		size     uint64
		pageSize int
	}{
		{"data not a power of two", 48, fakePage, 48, fakePage},
		{"data beyond the mapping", 64, fakePage, 128, fakePage},
		{"data offset inside the control page", 64, 8, 64, fakePage},
		{"data offset beyond the mapping", 64, 1 << 40, 64, fakePage},
		{"page too small", 64, 0, 0, 64},
		{"mapping smaller than a page", 0, 0, 0, 8192},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeMmap(tc.dataSize, false)
			f.page.Data_offset, f.page.Data_size = tc.offset, tc.size
			if _, err := NewDataRing(f.mem, tc.pageSize); !errors.Is(err, ErrRingLayout) {
				t.Errorf("err %v, want ErrRingLayout", err)
			}
		})
	}
	words := make([]uint64, 3)
	if _, err := NewRing(make([]byte, 64), (*uint64)(unsafe.Add(unsafe.Pointer(&words[0]), 4)), &words[2]); !errors.Is(err, ErrRingLayout) {
		t.Errorf("misaligned head: err %v, want ErrRingLayout", err)
	}
}

// FuzzRing reads arbitrary ring contents and positions: it must neither
// panic nor loop, and must release everything it was given.
func FuzzRing(f *testing.F) {
	f.Add(makeRecord(recordSample, 0, seq(0, 24)), uint64(0), uint64(32))
	f.Add(append(makeRecord(recordLost, 0, seq(0, 16)), makeRecord(9, 0, seq(0, 40))...), uint64(200), uint64(290))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0xff, 0xff}, uint64(250), uint64(1<<40))
	f.Fuzz(func(t *testing.T, data []byte, tail, head uint64) {
		m := newFakeMmap(256, true)
		copy(m.data, data)
		m.page.Data_tail, m.page.Data_head = tail, head
		r, err := NewDataRing(m.mem, fakePage)
		if err != nil {
			t.Fatal(err)
		}
		r.Begin()
		for n := 0; ; n++ {
			if n > 256/headerSize {
				t.Fatal("more records than fit in the ring")
			}
			_, _, rec, ok := r.Next()
			if !ok {
				break
			}
			if len(rec) < headerSize || int(binary.LittleEndian.Uint16(rec[6:])) != len(rec) {
				t.Fatalf("record of %d bytes with header % x", len(rec), rec[:min(len(rec), 8)])
			}
		}
		r.End()
		if m.page.Data_tail != head {
			t.Fatalf("tail %d, head %d after the batch", m.page.Data_tail, head)
		}
	})
}
