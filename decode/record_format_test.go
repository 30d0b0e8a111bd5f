package decode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

func TestAppendRecord(t *testing.T) {
	ev := &Event{ID: 0x6c2, Group: "ptfs_t", Name: "e", Args: []Arg{
		{Name: "a"}, {Type: U32}, {Name: "n", Type: S32}, {Type: X32}, {},
	}}
	ev2 := &Event{ID: 7, Group: "ptfs_u", Name: "f"}
	ev3 := &Event{ID: 0x6c2, Group: "ptfs_t", Name: "g"}
	cases := []struct {
		name string
		r    Record
		want string
	}{
		{"no args, no context", Record{Event: ev, TID: -1, CPU: -1},
			"record 7: event=ptfs_t/e id=0x6c2 args=[]\n"},
		{"every type", Record{Event: ev, N: 5, Args: [8]uint64{1, 0x1_0000_0005, 0xffff_fffe, 0xdead_beef_0000_002a, 1<<64 - 1}, TID: 4711, CPU: 3, Time: 8061_235912410},
			"record 7: event=ptfs_t/e id=0x6c2 args=[a=1, 5, n=-2, 0x2a, 18446744073709551615] tid=4711 cpu=3 time=8061.235912410\n"},
		{"more words than declared args", Record{Event: ev, N: 6, Args: [8]uint64{0, 0, 0, 0, 0, 9}, TID: 0, CPU: 0, Time: 5},
			"record 7: event=ptfs_t/e id=0x6c2 args=[a=0, 0, n=0, 0x0, 0, 9] tid=0 cpu=0 time=0.000000005\n"},
		{"thread unknown (no side band), time known", Record{Event: ev, N: 1, TID: -1, CPU: 2, Time: 5_000000001},
			"record 7: event=ptfs_t/e id=0x6c2 args=[a=0] cpu=2 time=5.000000001\n"},
		{"no time (no TSC conversion) and so no thread", Record{Event: ev, N: 1, TID: -1, CPU: 2},
			"record 7: event=ptfs_t/e id=0x6c2 args=[a=0] cpu=2\n"},
		{"time with whole seconds", Record{Event: ev, N: 1, TID: -1, CPU: -1, Time: 12_000000000},
			"record 7: event=ptfs_t/e id=0x6c2 args=[a=0] time=12.000000000\n"},
		{"process and name", Record{Event: ev, N: 1, TID: 4712, CPU: 1, Time: 5, PID: 4711, Comm: "worker"},
			"record 7: event=ptfs_t/e id=0x6c2 args=[a=0] tid=4712 cpu=1 time=0.000000005 pid=4711 comm=worker\n"},
		{"process known, name not", Record{Event: ev, N: 1, TID: -1, CPU: -1, PID: 1},
			"record 7: event=ptfs_t/e id=0x6c2 args=[a=0] pid=1\n"},
		{"hostile name escaped", Record{Event: ev, N: 1, TID: -1, CPU: -1, PID: 9, Comm: "a b\nc\\d\x7f\xffe=f"},
			"record 7: event=ptfs_t/e id=0x6c2 args=[a=0] pid=9 comm=a\\x20b\\x0ac\\x5cd\\x7f\\xffe=f\n"},
		{"same process renamed", Record{Event: ev, N: 1, TID: -1, CPU: -1, PID: 9, Comm: "b"},
			"record 7: event=ptfs_t/e id=0x6c2 args=[a=0] pid=9 comm=b\n"},
		{"same name, another process", Record{Event: ev, N: 1, TID: -1, CPU: -1, PID: 10, Comm: "b"},
			"record 7: event=ptfs_t/e id=0x6c2 args=[a=0] pid=10 comm=b\n"},
		{"another event", Record{Event: ev2, N: 1, Args: [8]uint64{3}, TID: -1, CPU: -1, PID: 10, Comm: "b"},
			"record 7: event=ptfs_u/f id=0x7 args=[3] pid=10 comm=b\n"},
		{"an event like the first at another address", Record{Event: ev3, N: 1, TID: -1, CPU: -1},
			"record 7: event=ptfs_t/g id=0x6c2 args=[0]\n"},
	}
	// A RecordWriter gives AppendRecord's lines whatever came before:
	// every case after every other (its event and process kept or not).
	var w RecordWriter
	for _, prev := range cases {
		for _, c := range cases {
			if got := string(AppendRecord(nil, 7, &c.r)); got != c.want {
				t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
			}
			w.Append(nil, 7, &prev.r)
			if got := string(w.Append([]byte("x"), 7, &c.r)); got != "x"+c.want {
				t.Errorf("RecordWriter, %s after %s:\n got %q\nwant %q", c.name, prev.name, got, "x"+c.want)
			}
		}
	}
}

// TestRecordWriterRuns: a RecordWriter over a run of records whose
// numbers count up through every carry (9 to 10, 999 to 1000, ...) or
// jump, whose times cross seconds and whose thread changes, gives
// AppendRecord's lines.
func TestRecordWriterRuns(t *testing.T) {
	ev := &Event{ID: 1, Group: "g", Name: "e", Args: []Arg{{Name: "a"}}}
	var w RecordWriter
	seq := uint64(0)
	for i := range 12000 {
		switch {
		case i == 5000:
			seq = 99_998 // a jump, then a carry
		case i == 7000:
			seq = 3 // back: the writer assumes nothing of the numbers
		default:
			seq++
		}
		r := Record{Event: ev, N: 1, Args: [8]uint64{uint64(i)}, TID: int32(i / 7 % 3), CPU: int32(i / 11 % 2),
			Time: uint64(i) * 1_234_567, PID: int32(i / 13 % 2), Comm: "p"}
		if i%17 == 0 {
			r.TID, r.CPU, r.Time = -1, -1, 0
		}
		want := string(AppendRecord(nil, seq, &r))
		if got := string(w.Append(nil, seq, &r)); got != want {
			t.Fatalf("record %d:\n got %q\nwant %q", i, got, want)
		}
	}
}

// TestRecordWriterComm: the writer compares a record's comm with the last
// by pointer and length, so every way a process's name can change behind
// the same pid must still show: a name of another length in the same
// bytes (a prefix), one of the same length elsewhere, the first again,
// and an equal name at another address.
func TestRecordWriterComm(t *testing.T) {
	ev := &Event{ID: 1, Group: "g", Name: "e"}
	full := "target-name"
	same := string([]byte("tarXet-name")) // same length, other bytes
	again := string([]byte(full))         // equal, another address
	var w RecordWriter
	for i, comm := range []string{full, full[:6], full, same, full, again, full[:0], full} {
		r := Record{Event: ev, TID: 3, CPU: 1, Time: 5_000_000_001, PID: 42, Comm: comm}
		want := string(AppendRecord(nil, uint64(i), &r))
		if got := string(w.Append(nil, uint64(i), &r)); got != want {
			t.Errorf("comm %d %q:\n got %q\nwant %q", i, comm, got, want)
		}
	}
}

// RecordWriter writes AppendRecord's bytes for random records of events of
// every kind (unnamed whole u64 ones, which take its own path, named,
// typed, strings, bitfields), events alternating record by record, ids
// that share a cache slot, and an event replaced by another of the same
// id; each line of an all-u64 event is also checked against strconv.
func TestRecordWriterRandom(t *testing.T) {
	plain := func(id uint16, group, name string, n int) *Event {
		return &Event{ID: id, Group: group, Name: name, Args: make([]Arg, n)}
	}
	events := []*Event{
		plain(0x101, "gen", "n1", 1), plain(0x108, "gen", "n8", 8),
		plain(0x141, "other", "same-slot-as-0x101", 3), // 0x141&63 == 0x101&63
		plain(0x101, "gen", "replaced", 2),             // same id, another event
		{ID: 0x6c2, Group: "ptfs_t", Name: "e", Args: []Arg{{Name: "a"}, {Type: U32}, {Name: "n", Type: S32}, {Type: X32}, {}}},
		{ID: 7, Group: "g", Name: "s", Args: []Arg{{Name: "s", Type: String}, {Type: Char}}},
		{ID: 8, Group: "g", Name: "b", Args: []Arg{{Name: "b", Type: U64, Bits: Bitfield{Width: 12, Offset: 40}}}},
		plain(9, "g", "none", 0),
	}
	data := []byte("str\x00\n\"")
	rng := rand.New(rand.NewPCG(1, 2))
	var lines RecordWriter
	buf := []byte("prefix ")
	for i := range 20000 {
		ev := events[rng.IntN(len(events))]
		r := Record{Event: ev, N: rng.IntN(len(ev.Args) + 1), TID: int32(rng.IntN(3)) - 1, CPU: int32(rng.IntN(3)) - 1, Data: &data}
		if rng.IntN(2) == 0 {
			r.Time = rng.Uint64()
		}
		if rng.IntN(4) == 0 {
			r.PID, r.Comm = rng.Int32(), "c d"
		}
		for k := range r.N {
			r.Args[k] = rng.Uint64() >> rng.IntN(64)
		}
		seq := uint64(i) * 7919
		want := AppendRecord(nil, seq, &r)
		n := len(buf)
		buf = lines.Append(buf, seq, &r)
		if got := buf[n:]; string(got) != string(want) {
			t.Fatalf("record %d:\n got %q\nwant %q", i, got, want)
		}
		if len(ev.Args) > 0 && ev.Args[0] == (Arg{}) && r.N > 0 {
			// An all-u64 event's arguments, from strconv.
			args := strconv.FormatUint(r.Args[0], 10)
			for k := 1; k < r.N; k++ {
				args += ", " + strconv.FormatUint(r.Args[k], 10)
			}
			if !strings.Contains(string(want), " args=["+args+"]") {
				t.Fatalf("record %d: %q, want args %s", i, want, args)
			}
		}
		if len(buf) > 1<<16 {
			buf = buf[:7]
		}
	}
	if string(buf[:7]) != "prefix " {
		t.Errorf("the line before was overwritten: %q", buf[:7])
	}
}

// TestAppendRun: runs of records of plain and other events, threads,
// processes (names that escape to four bytes a byte) and extreme values,
// into buffers of random free space: AppendRun writes AppendRecord's lines
// of a prefix of each run, numbered on, never grows its buffer (lines
// formatted in place stay there), stops only at an event that is not
// plain or where the next line's bound does not fit, and a run whose
// lines fit in full goes out whole. endRoom bounds every line's end.
func TestAppendRun(t *testing.T) {
	plainEv := &Event{ID: 0x101, Group: "ptfs_t", Name: "e", Args: make([]Arg, 8)}
	other := &Event{ID: 0x6c2, Group: "ptfs_t", Name: "n", Args: []Arg{{Name: "a"}, {Type: S32}}}
	rng := rand.New(rand.NewPCG(7, 8))
	var w RecordWriter
	seq := uint64(1)
	for round := range 3000 {
		rs := make([]Record, 1+rng.IntN(20))
		for i := range rs {
			ev := plainEv
			if rng.IntN(30) == 0 {
				ev = other
			}
			r := Record{Event: ev, N: rng.IntN(len(ev.Args) + 1), TID: rng.Int32N(3) - 1, CPU: rng.Int32N(3) - 1, Time: rng.Uint64() >> rng.IntN(64)}
			switch rng.IntN(4) {
			case 0:
				r.TID, r.CPU, r.PID, r.Time = math.MaxInt32, math.MaxInt32, math.MaxInt32, math.MaxUint64
				r.Comm = strings.Repeat("\x01", 16)
			case 1:
				r.PID, r.Comm = 4711, "t"
			}
			for k := range r.N {
				r.Args[k] = rng.Uint64() >> rng.IntN(64)
			}
			rs[i] = r
			if end := AppendRecord(nil, 1, &r); len(end)-bytes.LastIndexByte(end, ']') > endRoom(&r) {
				t.Fatalf("record %+v: end %q longer than endRoom %d", r, end[bytes.LastIndexByte(end, ']'):], endRoom(&r))
			}
		}
		buf := make([]byte, 5, 5+rng.IntN(3000))
		copy(buf, "head ")
		at, c := unsafe.SliceData(buf), cap(buf)
		out, k := w.AppendRun(buf, seq, rs)
		if unsafe.SliceData(out) != at || cap(out) != c {
			t.Fatalf("round %d: the buffer grew", round)
		}
		var want []byte
		for i := range rs[:k] {
			want = AppendRecord(want, seq+uint64(i), &rs[i])
		}
		if string(out[5:]) != string(want) || string(out[:5]) != "head " {
			t.Fatalf("round %d: %d lines\n got %q\nwant %q", round, k, out, want)
		}
		if k < len(rs) {
			line := AppendRecord(nil, seq+uint64(k), &rs[k])
			if rs[k].Event == plainEv && c-len(out) >= len("record ")+20+len(": event=ptfs_t/e id=0x101 args=[")+listRoom(rs[k].N)+endRoom(&rs[k])+lineSlack {
				t.Fatalf("round %d: stopped at record %d with %d bytes free for a line of %d", round, k, c-len(out), len(line))
			}
		}
		if big, n := w.AppendRun(make([]byte, 0, 1<<16), seq, rs); n != len(rs) && rs[n].Event == plainEv {
			t.Fatalf("round %d: %d of %d plain lines in a buffer of %d bytes", round, n, len(rs), cap(big))
		}
		seq += uint64(len(rs))
	}
}

func TestAppendManualSummary(t *testing.T) {
	if got := string(AppendManual(nil, 0xabcd, 0x100000, true)); got != "manual ptwrite: payload=0xabcd ip=0x100000\n" {
		t.Errorf("manual with ip: %q", got)
	}
	if got := string(AppendManual(nil, 0, 0, false)); got != "manual ptwrite: payload=0x0\n" {
		t.Errorf("manual without ip: %q", got)
	}
	c := Counters{Records: 1, Dropped: 2, Stray: 3, Unknown: 4, Errors: 5}
	c.Add(&c)
	if got := string(AppendSummary(nil, &c)); got != "summary: records=2 dropped=4 stray=6 unknown=8 errors=10\n" {
		t.Errorf("summary: %q", got)
	}
}

// BenchmarkAppendRecord formats a record without and with its process
// (pid= and comm=): the ratio is what issue 12's fields cost a line; and
// with its process through a RecordWriter, as the record path does.
func BenchmarkAppendRecord(b *testing.B) {
	ev := &Event{ID: 0x6c2, Group: "ptfs_t", Name: "e", Args: []Arg{{Name: "a"}, {Name: "b"}}}
	r := Record{Event: ev, N: 2, Args: [8]uint64{123456, 123457}, TID: 4711, CPU: 1, Time: 8061_235912410}
	bench := func(b *testing.B) {
		buf := make([]byte, 0, 256)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			buf = AppendRecord(buf[:0], uint64(i), &r)
		}
	}
	b.Run("thread", bench)
	r.PID, r.Comm = 4711, "target"
	b.Run("process", bench)
	writer := func(b *testing.B) {
		var w RecordWriter
		buf := make([]byte, 0, 256)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			buf = w.Append(buf[:0], uint64(i), &r)
		}
	}
	b.Run("writer", writer)
	// Unnamed whole u64 arguments (the record path's hot %di %si) and a
	// time that advances.
	r.Event = &Event{ID: 0x6c2, Group: "ptfs_t", Name: "e", Args: make([]Arg, 2)}
	b.Run("writer-plain", func(b *testing.B) {
		var w RecordWriter
		buf := make([]byte, 0, 256)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			r.Args[0], r.Time = uint64(i)*977, 8061_235912410+uint64(i)*10000
			buf = w.Append(buf[:0], uint64(i), &r)
		}
	})
}

// BenchmarkRecordLines formats the lines of BenchmarkDecodeEvents (cmd/ptfs)
// alone: records of eight all-u64 events (1 to 8 arguments) with random
// values of every length, in lines per second, by AppendRecord and by
// RecordWriter (the formatter of ptfs decode and the record path), into
// one large buffer as ptfs decode does.
func BenchmarkRecordLines(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	var events [9]*Event
	for n := 1; n <= 8; n++ {
		events[n] = &Event{ID: 0x100 + uint16(n), Group: "gen", Name: "n" + strconv.Itoa(n), Args: make([]Arg, n)}
	}
	recs := make([]Record, 1024)
	size := 0
	for i := range recs {
		n := 1 + rng.IntN(8)
		recs[i] = Record{Event: events[n], N: n, TID: -1, CPU: -1}
		for k := range n {
			recs[i].Args[k] = rng.Uint64() >> rng.IntN(64)
		}
		size += len(AppendRecord(nil, 1e6, &recs[i]))
	}
	var lines RecordWriter
	for _, c := range []struct {
		name string
		fn   func([]byte, uint64, *Record) []byte
	}{{"AppendRecord", AppendRecord}, {"RecordWriter", lines.Append}} {
		b.Run(c.name, func(b *testing.B) {
			buf := make([]byte, 0, 1<<20+4096)
			b.SetBytes(int64(size / len(recs)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if buf = c.fn(buf, uint64(i), &recs[i&1023]); len(buf) >= 1<<20 {
					buf = buf[:0]
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lines/s")
		})
	}
}

// FuzzAppendDec checks appendDec against strconv on any value, and
// putList (SIMD on amd64) and putListGo on a list of two.
func FuzzAppendDec(f *testing.F) {
	f.Add(uint64(0), uint64(9))
	f.Add(uint64(1e8), uint64(1e16))
	f.Add(uint64(1<<64-1), uint64(99999999_99999999))
	f.Fuzz(func(t *testing.T, v, w uint64) {
		if got, want := string(appendDec([]byte("x"), v)), "x"+strconv.FormatUint(v, 10); got != want {
			t.Fatalf("appendDec(%d) = %q, want %q", v, got, want)
		}
		if got, want := string(appendHex([]byte("x"), v, 0)), "x"+strconv.FormatUint(v, 16); got != want {
			t.Fatalf("appendHex(%#x) = %q, want %q", v, got, want)
		}
		want := strconv.FormatUint(v, 10) + ", " + strconv.FormatUint(w, 10)
		for name, put := range map[string]func([]byte, []uint64) int{"putList": putList, "putListGo": putListGo} {
			b := make([]byte, listRoom(2))
			if got := string(b[:put(b, []uint64{v, w})]); got != want {
				t.Fatalf("%s(%d, %d) = %q, want %q", name, v, w, got, want)
			}
		}
	})
}

// putList (SIMD on amd64) and putListGo write what strconv does for every
// length 1-20, the ends of every eight-digit group, zeros inside groups,
// lists of 1 to 8 values, and nothing past listRoom.
func TestPutList(t *testing.T) {
	vals := []uint64{0, 1<<64 - 1, 1<<63 - 1, 1 << 63}
	for p := uint64(1); ; p *= 10 {
		vals = append(vals, p-1, p, p+1, 2*p-1, 9*p, 9*p+9)
		if p > (1<<64-1)/10 {
			break
		}
	}
	vals = append(vals, 10000_00000001, 1_00000000_00000001, 12345678_00000000, 1_00000001_00000000,
		1844_67440737_09551615, 1000_00000000_00000000, 1000_00000000_00000009, 9999_99999999_99999999/1000)
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		vals = append(vals, rng.Uint64()>>rng.IntN(64))
	}
	const canary = 0xa5
	for n := 1; n <= 8; n++ {
		for i := range vals {
			list := make([]uint64, n)
			var want []string
			for k := range list {
				list[k] = vals[(i+k*(len(vals)/n+1))%len(vals)]
				want = append(want, strconv.FormatUint(list[k], 10))
			}
			for name, put := range map[string]func([]byte, []uint64) int{"putList": putList, "putListGo": putListGo} {
				b := make([]byte, listRoom(n)+8)
				for k := range b {
					b[k] = canary
				}
				l := put(b[:listRoom(n)], list)
				if got := string(b[:l]); got != strings.Join(want, ", ") {
					t.Fatalf("%s(%v) = %q, want %q", name, list, got, strings.Join(want, ", "))
				}
				for k := listRoom(n); k < len(b); k++ {
					if b[k] != canary {
						t.Fatalf("%s(%v) wrote past its room at %d", name, list, k)
					}
				}
			}
		}
	}
	if n := putList(nil, nil); n != 0 {
		t.Fatalf("putList of nothing = %d", n)
	}
}

// RecordWriter counts consecutive line numbers up in place of converting
// them: every carry (9 to 10, 99999 to 100000, ...) and the step past 1e8,
// where it converts again, prints as AppendRecord does.
func TestRecordWriterCounting(t *testing.T) {
	ev := &Event{ID: 1, Group: "g", Name: "e", Args: make([]Arg, 1)}
	r := Record{Event: ev, N: 1, TID: -1, CPU: -1}
	var lines RecordWriter
	check := func(from, to uint64) {
		for seq := from; seq-from <= to-from; seq++ { // to may be the largest uint64
			if got, want := lines.Append(nil, seq, &r), AppendRecord(nil, seq, &r); string(got) != string(want) {
				t.Fatalf("line %d: got %q, want %q", seq, got, want)
			}
		}
	}
	check(0, 200000)
	check(99_999_000, 100_000_100) // through the last eight-digit number
	check(9_999_990, 10_000_010)
	check(7, 7) // not the next number: converted
	check(1<<64-3, 1<<64-2)
}

// digits8 is right for every value of each of its lanes: it splits w into
// two 4-digit lanes, each into two 2-digit ones, with reciprocals that must
// hold for every lane value (lanes cannot spill into each other: their
// products stay below the next lane), so every lane value in each lane, with
// the other lane at its ends and in between, covers them.
func TestDigits8(t *testing.T) {
	for k := uint32(0); k < 10000; k++ {
		for _, w := range []uint32{k, k * 10000, k*10000 + k, k*10000 + 9999 - k, k*10000 + 9999, 9999*10000 + k} {
			want := []byte(fmt.Sprintf("%08d", w))
			for i := range want {
				want[i] -= '0'
			}
			if got := digits8(w); got != binary.LittleEndian.Uint64(want) {
				t.Fatalf("digits8(%d) = %#x, want %v", w, got, want)
			}
		}
	}
}

// BenchmarkAppendDec formats random 64-bit values (19-20 digits mostly,
// the records benchmark's arguments), against strconv.
func BenchmarkAppendDec(b *testing.B) {
	vals := make([]uint64, 1024)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range vals {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		vals[i] = x
	}
	// The decode benchmark's arguments: random lengths, 1 to 20 digits.
	mixed := make([]uint64, len(vals))
	for i, v := range vals {
		mixed[i] = v >> (v % 64)
	}
	buf := make([]byte, 0, 32)
	for _, c := range []struct {
		name string
		vals []uint64
	}{{"", vals}, {"mixed-", mixed}} {
		b.Run(c.name+"ptfs", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				buf = appendDec(buf[:0], c.vals[i&1023])
			}
		})
		b.Run(c.name+"strconv", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				buf = strconv.AppendUint(buf[:0], c.vals[i&1023], 10)
			}
		})
	}
}

func TestAppendDec(t *testing.T) {
	vals := []uint64{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 1<<32 - 1, 1 << 32, 1<<63 - 1, 1 << 63, 1<<64 - 1}
	for p := uint64(1); p < 1e19; p *= 10 {
		vals = append(vals, p-1, p, p+1)
	}
	// Zeros inside and at the ends of the eight-digit groups.
	vals = append(vals, 1e19-1, 1e19, 1e19+1, 1_00000000_00000001, 12345678_00000000, 1_00000001_00000000, 18446744073709551615)
	for i := uint64(0); i < 64; i++ {
		vals = append(vals, 1<<i-1, 1<<i, 1<<i+1)
	}
	// Random values of every length.
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		vals = append(vals, rng.Uint64()>>rng.IntN(64))
	}
	for _, v := range vals {
		if got, want := string(appendDec([]byte("x"), v)), "x"+strconv.FormatUint(v, 10); got != want {
			t.Errorf("appendDec(%d) = %q, want %q", v, got, want)
		}
		if got, want := string(appendHex([]byte("x"), v, 0)), "x"+strconv.FormatUint(v, 16); got != want {
			t.Errorf("appendHex(%#x) = %q, want %q", v, got, want)
		}
	}
	for _, v := range []int32{0, -1, 1, -2147483648, 2147483647} {
		if got, want := string(AppendValue(nil, S32, uint64(uint32(v))|0xdead_0000_0000_0000)), strconv.Itoa(int(v)); got != want {
			t.Errorf("s32 %d = %q", v, got)
		}
	}
}

// Every type prints as the kernel's print format for it does (checked
// against the kernel's own trace output in cmd/ptfs TestTypesKernel), from
// the low bytes of its size; strings and chars escaped.
func TestAppendValueTypes(t *testing.T) {
	cases := []struct {
		t    ArgType
		v    uint64
		want string
	}{
		{U64, 1<<64 - 1, "18446744073709551615"},
		{U32, 0xdead_0000_0005, "5"},
		{U16, 0x1_fffe, "65534"},
		{U8, 0x1fa, "250"},
		{S64, 1<<64 - 1, "-1"},
		{S64, 1 << 63, "-9223372036854775808"},
		{S64, 42, "42"},
		{S32, 0xdead_ffff_fffe, "-2"},
		{S16, 0xfed4, "-300"},
		{S16, 0xffff_7fff, "32767"},
		{S8, 0xfb, "-5"},
		{S8, 0x17f, "127"},
		{X64, 0xdeadbeefcafe1234, "0xdeadbeefcafe1234"},
		{X32, 0xdead_0000_002a, "0x2a"},
		{X16, 0x1_fed4, "0xfed4"},
		{X8, 0xfa, "0xfa"},
		{X8, 0, "0x0"},
		{Char, 'A', "'A'"},
		{Char, '\'', `'\''`},
		{Char, '"', `'"'`},
		{Char, 0, `'\x00'`},
		{Char, 0x1ff, `'\xff'`},
	}
	for _, c := range cases {
		if got := string(AppendValue(nil, c.t, c.v)); got != c.want {
			t.Errorf("%v %#x: got %q, want %q", c.t, c.v, got, c.want)
		}
	}
}

// String arguments print from the record's Data, quoted up to the first
// NUL, with every byte that could break a record line escaped; a faulted
// read (length 0) and a reference outside Data print (fault).
func TestAppendRecordStrings(t *testing.T) {
	ev := &Event{ID: 1, Group: "g", Name: "e", Args: []Arg{
		{Name: "s", Type: String}, {Type: UString}, {Name: "f", Type: String}, {Name: "bad", Type: String}, {Name: "n", Type: S8},
	}}
	data := []byte("a \"q\"\n\\\tb\x1b[31m\xc3\xa9],x\x00\x00rest")
	r := Record{Event: ev, N: 5, TID: -1, CPU: -1, Data: &data,
		Args: [8]uint64{StringRef(0, 20), StringRef(20, 1), StringRef(0, 0), StringRef(10, 30), 0xff}}
	want := `record 1: event=g/e id=0x1 args=[s="a \"q\"\n\\\tb\x1b[31m\xc3\xa9],x", "", f=(fault), bad=(fault), n=-1]` + "\n"
	if got := string(AppendRecord(nil, 1, &r)); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

// A bitfield of a ptw event is cut out of the container word before it is
// formatted; the kernel's own b4@4/32 of 0xcafe1234 is 3.
func TestAppendRecordBitfield(t *testing.T) {
	ev := &Event{ID: 1, Group: "g", Name: "e", Args: []Arg{
		{Name: "a", Type: U32, Bits: Bitfield{Width: 4, Offset: 4}},
		{Name: "b", Type: U64, Bits: Bitfield{Width: 12, Offset: 40}},
		{Name: "c", Type: U64, Bits: Bitfield{Width: 64}},
		{Name: "d", Type: U8, Bits: Bitfield{Width: 1, Offset: 7}},
	}}
	r := Record{Event: ev, N: 4, TID: -1, CPU: -1, Args: [8]uint64{0xcafe1234, 0xdeadbeefcafe1234, 1<<64 - 1, 0x80}}
	want := "record 1: event=g/e id=0x1 args=[a=3, b=3518, c=18446744073709551615, d=1]\n"
	if got := string(AppendRecord(nil, 1, &r)); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if got := (Bitfield{Width: 4, Offset: 2}).Text(U32); got != "b4@2/32" {
		t.Errorf("Text: %q", got)
	}
}

// The type table: every name parses back to its type, and the sizes are
// the kernel's.
func TestArgTypeTable(t *testing.T) {
	sizes := map[string]int{"u8": 1, "s8": 1, "x8": 1, "char": 1, "u16": 2, "s16": 2, "x16": 2,
		"u32": 4, "s32": 4, "x32": 4, "string": 4, "ustring": 4, "u64": 8, "s64": 8, "x64": 8}
	names := ArgTypeNames()
	if len(names) != len(sizes) {
		t.Fatalf("names %q, want the %d of the kernel's uprobe types", names, len(sizes))
	}
	for _, n := range names {
		typ, ok := ParseArgType(n)
		if !ok || typ.String() != n || typ.Size() != sizes[n] {
			t.Errorf("%q: type %v ok=%v size %d, want size %d", n, typ, ok, typ.Size(), sizes[n])
		}
	}
	for _, bad := range []string{"", "u128", "symbol", "b4@2/32", "U8", "string "} {
		if _, ok := ParseArgType(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}
