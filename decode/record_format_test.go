package decode

import (
	"strconv"
	"testing"
)

func TestAppendRecord(t *testing.T) {
	ev := &Event{ID: 0x6c2, Group: "ptfs_t", Name: "e", Args: []Arg{
		{Name: "a"}, {Type: U32}, {Name: "n", Type: S32}, {Type: X32}, {},
	}}
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
	}
	for _, c := range cases {
		if got := string(AppendRecord(nil, 7, &c.r)); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
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
// (pid= and comm=): the ratio is what issue 12's fields cost a line.
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
}

func TestAppendDec(t *testing.T) {
	vals := []uint64{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 1<<32 - 1, 1 << 32, 1<<63 - 1, 1 << 63, 1<<64 - 1}
	for p := uint64(1); p < 1e19; p *= 10 {
		vals = append(vals, p-1, p, p+1)
	}
	vals = append(vals, 1e19-1, 1e19, 1e19+1)
	for i := uint64(0); i < 64; i++ {
		vals = append(vals, 1<<i-1, 1<<i, 1<<i+1)
	}
	for _, v := range vals {
		if got, want := string(appendDec([]byte("x"), v)), "x"+strconv.FormatUint(v, 10); got != want {
			t.Errorf("appendDec(%d) = %q, want %q", v, got, want)
		}
	}
	for _, v := range []int32{0, -1, 1, -2147483648, 2147483647} {
		if got, want := string(AppendValue(nil, S32, uint64(uint32(v))|0xdead_0000_0000_0000)), strconv.Itoa(int(v)); got != want {
			t.Errorf("s32 %d = %q", v, got)
		}
	}
}
