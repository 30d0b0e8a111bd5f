package capture

import (
	"encoding/binary"
	"errors"
	"strings"
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
			Args: [8]uint64{1<<40 + 5, 0xfffffffe, 0x1122334455667788, 0xbeef, 0x7f}, TID: 78, CPU: 1, Time: 123456789}},
		{name: "truncated record", rec: good[:sampleMinSize-1], wantErr: ErrMalformed},
		{name: "raw shorter than the common fields", rec: rawSize(makeSample(1, 1, 1, 1, raw), 12), wantErr: ErrMalformed},
		{name: "raw size beyond the record", rec: rawSize(makeSample(1, 1, 1, 1, raw), 4096), wantErr: ErrMalformed},
		{name: "raw too short for the arguments", rec: short, wantErr: ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s sample
			r := decode.Record{Args: [8]uint64{9, 9, 9, 9, 9, 9, 9, 9}} // a reused slot
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

// realFormat is the format file of `p:g/e PATH:OFF %di %si +0(%si):u32
// \0x42 b=%di:s32 c=%si:x32` on kernel 6.18.
const realFormat = `name: e
ID: 2326
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:unsigned char common_preempt_count;	offset:3;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:unsigned long __probe_ip;	offset:8;	size:8;	signed:0;
	field:u64 arg1;	offset:16;	size:8;	signed:0;
	field:u64 arg2;	offset:24;	size:8;	signed:0;
	field:u32 arg3;	offset:32;	size:4;	signed:0;
	field:u64 arg4;	offset:36;	size:8;	signed:0;
	field:s32 b;	offset:44;	size:4;	signed:1;
	field:u32 c;	offset:48;	size:4;	signed:0;

print fmt: "(%lx) arg1=0x%Lx arg2=0x%Lx arg3=%u arg4=0x%Lx b=%d c=0x%x", REC->__probe_ip, REC->arg1, REC->arg2, REC->arg3, REC->arg4, REC->b, REC->c
`

func TestApplyFormat(t *testing.T) {
	types := []decode.ArgType{decode.U64, decode.U64, decode.U32, decode.U64, decode.S32, decode.X32}
	newEvent := func(types ...decode.ArgType) *decode.Event {
		ev := &decode.Event{Group: "g", Name: "e"}
		for _, typ := range types {
			ev.Args = append(ev.Args, decode.Arg{Type: typ})
		}
		return ev
	}
	for _, tc := range []struct {
		name    string
		format  string
		types   []decode.ArgType
		want    [][2]int // offset, size per argument
		wantErr error
	}{
		{name: "kernel 6.18", format: realFormat, types: types,
			want: [][2]int{{16, 8}, {24, 8}, {32, 4}, {36, 8}, {44, 4}, {48, 4}}},
		{name: "no arguments", format: strings.Split(realFormat, "\tfield:u64 arg1")[0], want: [][2]int{}},
		{name: "too few arguments", format: realFormat, types: types[:5], wantErr: ErrFormat},
		{name: "type size mismatch", format: realFormat, types: []decode.ArgType{decode.U32, decode.U64, decode.U32, decode.U64, decode.S32, decode.X32}, wantErr: ErrFormat},
		{name: "no id", format: strings.Replace(realFormat, "ID: 2326", "", 1), types: types, wantErr: ErrFormat},
		{name: "bad id", format: strings.Replace(realFormat, "ID: 2326", "ID: 70000", 1), types: types, wantErr: ErrFormat},
		{name: "not a uprobe", format: strings.Replace(realFormat, "__probe_ip", "__probe_func", 1), types: types, wantErr: ErrFormat},
		{name: "probe ip misplaced", format: strings.Replace(realFormat, "offset:8;	size:8", "offset:12;	size:8", 1), types: types, wantErr: ErrFormat},
		{name: "bad offset", format: strings.Replace(realFormat, "offset:24;", "offset:x;", 1), types: types, wantErr: ErrFormat},
		{name: "no size", format: strings.Replace(realFormat, "size:4;	signed:1;\n\n", "signed:1;\n\n", 1), types: types, wantErr: ErrFormat},
		{name: "nameless field", format: strings.Replace(realFormat, "field:u64 arg2;", "field:;", 1), types: types, wantErr: ErrFormat},
		{name: "short field line", format: strings.Replace(realFormat, "field:u64 arg2;	offset:24;	size:8;	signed:0;", "field:u64 arg2", 1), types: types, wantErr: ErrFormat},
		{name: "offset into the header", format: strings.Replace(realFormat, "offset:16;", "offset:4;", 1), types: types, wantErr: ErrBadEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := newEvent(tc.types...)
			err := ApplyFormat(ev, []byte(tc.format))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if ev.ID != 2326 {
				t.Errorf("id %d", ev.ID)
			}
			for i, a := range ev.Args {
				if got := [2]int{a.Offset, a.Size}; got != tc.want[i] {
					t.Errorf("argument %d at %v, want %v", i, got, tc.want[i])
				}
			}
		})
	}
}

func TestCheckEvent(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []decode.Arg
		ok   bool
	}{
		{"none", nil, true},
		{"eight", make9Args()[:8], true},
		{"nine", make9Args(), false},
		{"size 3", []decode.Arg{{Offset: 16, Size: 3}}, false},
		{"size 0", []decode.Arg{{Offset: 16}}, false},
		{"offset in the header", []decode.Arg{{Offset: 8, Size: 8}}, false},
		{"offset huge", []decode.Arg{{Offset: 1 << 30, Size: 8}}, false},
	} {
		err := checkEvent(&decode.Event{Args: tc.args})
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBadEvent)) {
			t.Errorf("%s: err %v", tc.name, err)
		}
	}
}

func make9Args() []decode.Arg {
	args := make([]decode.Arg, 9)
	for i := range args {
		args[i] = decode.Arg{Offset: 16 + 8*i, Size: 8}
	}
	return args
}

// FuzzApplyFormat feeds arbitrary format files: an error or a layout that
// checkEvent accepts, never a panic.
func FuzzApplyFormat(f *testing.F) {
	f.Add(realFormat, 6)
	f.Add("ID: 1\nfield:unsigned long __probe_ip; offset:8; size:8;\nfield:u32 a; offset:16; size:4;\n", 1)
	f.Add("ID: 1\nfield:x __probe_ip; offset:99999999999; size:-1;\n", 0)
	f.Fuzz(func(t *testing.T, format string, nargs int) {
		ev := &decode.Event{Args: make([]decode.Arg, nargs&15)}
		if err := ApplyFormat(ev, []byte(format)); err == nil {
			if err := checkEvent(ev); err != nil {
				t.Fatalf("accepted a layout checkEvent refuses: %v", err)
			}
		}
	})
}

// FuzzParseSample parses arbitrary sample records for typedEvent: an error
// or a record, never a panic.
func FuzzParseSample(f *testing.F) {
	f.Add(makeSample(1, 2, 3, 0, makeRaw(2326, 1, make([]byte, 23))))
	f.Add(makeSample(1, 2, 3, 0, makeRaw(2326, 1)))
	f.Add([]byte{})
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
	})
}
