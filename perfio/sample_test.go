package perfio

import (
	"encoding/binary"
	"errors"
	"testing"

	"ptfs/decode"
)

// makeSample returns a PERF_RECORD_SAMPLE of classicSampleType carrying raw,
// padded as the kernel pads it (u32 size + raw to a multiple of 8).
func makeSample(pid, tid uint32, time uint64, cpu uint32, raw []byte) []byte {
	body := make([]byte, 28, 28+len(raw)+8)
	binary.LittleEndian.PutUint32(body[0:], pid)
	binary.LittleEndian.PutUint32(body[4:], tid)
	binary.LittleEndian.PutUint64(body[8:], time)
	binary.LittleEndian.PutUint32(body[16:], cpu)
	n := len(raw)
	for (4+n)%8 != 0 {
		n++
	}
	binary.LittleEndian.PutUint32(body[24:], uint32(n))
	body = append(body, raw...)
	body = append(body, make([]byte, n-len(raw))...)
	return makeRecord(recordSample, 0, body)
}

// makeRaw returns uprobe raw data of event id: common fields, __probe_ip,
// then the argument bytes.
func makeRaw(id uint16, pid int32, args ...[]byte) []byte {
	raw := make([]byte, rawArgsOff)
	binary.LittleEndian.PutUint16(raw, id)
	binary.LittleEndian.PutUint32(raw[4:], uint32(pid))
	binary.LittleEndian.PutUint64(raw[8:], 0x401136)
	for _, a := range args {
		raw = append(raw, a...)
	}
	return raw
}

func le(size int, v uint64) []byte {
	b := binary.LittleEndian.AppendUint64(nil, v)
	return b[:size]
}

// typedEvent has arguments of every size, packed as tracefs packs them.
var typedEvent = &decode.Event{ID: 2326, Group: "g", Name: "e", Args: []decode.Arg{
	{Type: decode.U64, Offset: 16, Size: 8},
	{Type: decode.S32, Offset: 24, Size: 4},
	{Type: decode.U64, Offset: 28, Size: 8}, // unaligned, as after a u32
	{Type: decode.U32, Offset: 36, Size: 2},
	{Type: decode.X32, Offset: 38, Size: 1},
}}

// stringEvent has a string argument among numbers, for the fuzz target.
var stringEvent = &decode.Event{ID: 2326, Group: "g", Name: "s", Args: []decode.Arg{
	{Type: decode.U64, Offset: 16, Size: 8},
	{Type: decode.String, Offset: 24, Size: 4},
	{Type: decode.S8, Offset: 28, Size: 1},
}}

func TestParseSample(t *testing.T) {
	raw := makeRaw(2326, 77, le(8, 1<<40+5), le(4, 0xfffffffe), le(8, 0x1122334455667788), le(2, 0xbeef), le(1, 0x7f))
	good := makeSample(77, 78, 123456789, 1, raw)
	short := makeSample(77, 78, 1, 1, raw[:30])
	rawSize := func(rec []byte, n uint32) []byte {
		binary.LittleEndian.PutUint32(rec[sampleRawOff:], n)
		return rec
	}
	for _, tc := range []struct {
		name    string
		rec     []byte
		want    decode.Record
		wantErr error
	}{
		{name: "all sizes", rec: good, want: decode.Record{Event: typedEvent, N: 5,
			Args: [8]uint64{1<<40 + 5, 0xfffffffe, 0x1122334455667788, 0xbeef, 0x7f}, TID: 78, CPU: 1, Time: 123456789, PID: 77}},
		{name: "truncated record", rec: good[:sampleMinSize-1], wantErr: ErrMalformed},
		{name: "raw shorter than the common fields", rec: rawSize(makeSample(1, 1, 1, 1, raw), 12), wantErr: ErrMalformed},
		{name: "raw size beyond the record", rec: rawSize(makeSample(1, 1, 1, 1, raw), 4096), wantErr: ErrMalformed},
		{name: "raw too short for the arguments", rec: short, wantErr: ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s sample
			r := decode.Record{N: 8, Args: [8]uint64{9, 9, 9, 9, 9, 9, 9, 9}} // a reused slot
			err := parseSample(tc.rec, &s)
			if err == nil {
				if id := rawEventID(s.raw); id != typedEvent.ID {
					t.Fatalf("event id %d", id)
				}
				err = fillRecord(typedEvent, &s, &r)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if err == nil && r != tc.want {
				t.Errorf("got  %+v\nwant %+v", r, tc.want)
			}
		})
	}
}

// TestFillWords: an event of 8-byte arguments fills a reused slot with
// fillWords as fillRecord does, over a longer record and a shorter one;
// an event with another size or a string has no word offsets.
func TestFillWords(t *testing.T) {
	offs, end := wordOffsets(pairEvent)
	if len(offs) != 2 || end != 32 {
		t.Fatalf("wordOffsets(pairEvent) = %v, %d; want 2 offsets, end 32", offs, end)
	}
	if offs, _ := wordOffsets(typedEvent); offs != nil {
		t.Errorf("wordOffsets of an event of mixed sizes = %v, want nil", offs)
	}
	str := &decode.Event{ID: 3, Args: []decode.Arg{{Type: decode.String, Offset: 16, Size: 8}}}
	if offs, _ := wordOffsets(str); offs != nil {
		t.Errorf("wordOffsets of a string argument = %v, want nil", offs)
	}
	var s sample
	if err := parseSample(pairSample(5, 100, 1, 11, 22), &s); err != nil {
		t.Fatal(err)
	}
	for _, prev := range []decode.Record{{N: 8, Args: [8]uint64{9, 9, 9, 9, 9, 9, 9, 9}}, {N: 1, Args: [8]uint64{9}}, {}} {
		want, got := prev, prev
		if err := fillRecord(pairEvent, &s, &want); err != nil {
			t.Fatal(err)
		}
		fillWords(pairEvent, offs, &s, &got)
		if got != want || got.Args != [8]uint64{11, 22} {
			t.Errorf("over %+v:\n got  %+v\nwant %+v", prev, got, want)
		}
	}
}

// FuzzParseSample parses arbitrary sample records for typedEvent: an error
// or a record, never a panic.
func FuzzParseSample(f *testing.F) {
	f.Add(makeSample(1, 2, 3, 0, makeRaw(2326, 1, make([]byte, 23))))
	f.Add(makeSample(1, 2, 3, 0, makeRaw(2326, 1)))
	f.Add([]byte{})
	f.Add(makeSample(1, 2, 3, 0, makeRaw(2326, 1, make([]byte, 23), []byte{0x1c, 0, 4, 0, 'a', 'b', 'c', 0})))
	f.Fuzz(func(t *testing.T, rec []byte) {
		var s sample
		var r decode.Record
		if parseSample(rec, &s) != nil {
			return
		}
		if len(s.raw) < rawArgsOff {
			t.Fatalf("accepted %d raw bytes", len(s.raw))
		}
		if fillRecord(typedEvent, &s, &r) == nil && r.N != len(typedEvent.Args) {
			t.Fatalf("N %d", r.N)
		}
		if fillRecord(stringEvent, &s, &r) == nil {
			decode.AppendRecord(nil, 1, &r)
		}
	})
}

// String arguments: the __data_loc word locates the bytes in the raw data;
// they are copied into the record's own storage (the ring is reused), a
// faulted read (length 0) stays one, and a location beyond the raw data is
// malformed.
func TestFillRecordStrings(t *testing.T) {
	ev := &decode.Event{ID: 7, Group: "g", Name: "e", Args: []decode.Arg{
		{Name: "s", Type: decode.String, Offset: 16, Size: 4},
		{Name: "n", Type: decode.S8, Offset: 20, Size: 1},
		{Name: "f", Type: decode.UString, Offset: 21, Size: 4},
	}}
	if err := checkEvent(ev); err != nil {
		t.Fatal(err)
	}
	loc := func(off, n int) []byte { return le(4, uint64(n)<<16|uint64(off)) }
	raw := makeRaw(7, 1, loc(25, 6), le(1, 0xfe), loc(31, 0), []byte("a\"b\n\x00"))
	var s sample
	if err := parseSample(makeSample(1, 2, 3, 0, raw), &s); err != nil {
		t.Fatal(err)
	}
	var r decode.Record
	old := []byte("stale bytes of a reused slot")
	r.Data = &old
	if err := fillRecord(ev, &s, &r); err != nil {
		t.Fatal(err)
	}
	want := `record 1: event=g/e id=0x7 args=[s="a\"b\n", n=-2, f=(fault)] tid=2 cpu=0 time=0.000000003 pid=1` + "\n"
	if got := string(decode.AppendRecord(nil, 1, &r)); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	for i := range s.raw {
		s.raw[i] = 'X' // the ring is overwritten
	}
	if got := string(decode.AppendRecord(nil, 1, &r)); got != want {
		t.Errorf("after the ring changed: %q", got)
	}
	bad := makeRaw(7, 1, loc(25, 60), le(1, 0), loc(0, 0), []byte("abc"))
	if err := parseSample(makeSample(1, 2, 3, 0, bad), &s); err != nil {
		t.Fatal(err)
	}
	if err := fillRecord(ev, &s, &r); !errors.Is(err, ErrMalformed) {
		t.Errorf("string beyond the raw data: %v, want ErrMalformed", err)
	}
	if err := checkEvent(&decode.Event{Args: []decode.Arg{{Type: decode.String, Offset: 16, Size: 8}}}); err == nil {
		t.Error("checkEvent took an 8-byte string field")
	}
}
