package perfdata

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"ptfs/images"
)

// record returns one record of type typ and misc flags with body.
func record(typ uint32, misc uint16, body []byte) []byte {
	var b builder
	b.rec(typ, body, nil)
	binary.LittleEndian.PutUint16(b.recs[4:], misc)
	return b.recs
}

func u32s(vs ...uint32) []byte {
	var out []byte
	for _, v := range vs {
		out = binary.LittleEndian.AppendUint32(out, v)
	}
	return out
}

// pad8 is s NUL-terminated and padded to 8 bytes.
func pad8(s string) []byte {
	b := append([]byte(s), 0)
	for len(b)%8 != 0 {
		b = append(b, 0)
	}
	return b
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestSideBand(t *testing.T) {
	id := bytes.Repeat([]byte{0xab}, 20)
	mmap2ID := cat(u32s(10, 11), u64s(0x400000, 0x1000, 0x2000), []byte{20, 0, 0, 0}, id, u32s(5, 2), pad8("/bin/true"))
	tests := []struct {
		name string
		rec  []byte
		want Event
		err  error
	}{
		{"mmap", record(recMmap, 0, cat(u32s(1, 2), u64s(0x1000, 0x2000, 0x3000), pad8("/lib/x.so"))),
			Event{Kind: Mmap, PID: 1, TID: 2, Addr: 0x1000, Len: 0x2000, PgOff: 0x3000, Name: "/lib/x.so"}, nil},
		{"mmap2 inode", record(recMmap2, 0, cat(u32s(3, 4), u64s(0x1000, 0x2000, 0), u32s(8, 1), u64s(99, 7), u32s(5, 2), pad8("/a"))),
			Event{Kind: Mmap, PID: 3, TID: 4, Addr: 0x1000, Len: 0x2000, Maj: 8, Min: 1, Ino: 99, Prot: 5, Flags: 2, Name: "/a"}, nil},
		{"mmap2 build id", record(recMmap2, miscMmapBuildID, mmap2ID),
			Event{Kind: Mmap, PID: 10, TID: 11, Addr: 0x400000, Len: 0x1000, PgOff: 0x2000, BuildID: id, Prot: 5, Flags: 2, Name: "/bin/true"}, nil},
		{"comm exec", record(recComm, miscCommExec, cat(u32s(5, 5), pad8("true"))),
			Event{Kind: Comm, PID: 5, TID: 5, Name: "true", Exec: true}, nil},
		{"comm", record(recComm, 0, cat(u32s(5, 6), pad8("worker"))),
			Event{Kind: Comm, PID: 5, TID: 6, Name: "worker"}, nil},
		{"fork", record(recFork, 0, cat(u32s(7, 5, 8, 5), u64s(123))),
			Event{Kind: Fork, PID: 7, PPID: 5, TID: 8, PTID: 5}, nil},
		{"exit", record(recExit, 0, cat(u32s(7, 5, 8, 5), u64s(123))),
			Event{Kind: Exit, PID: 7, PPID: 5, TID: 8, PTID: 5}, nil},
		{"itrace start", record(recItraceStart, 0, u32s(9, 10)),
			Event{Kind: ItraceStart, PID: 9, TID: 10}, nil},
		{"switch in", record(recSwitch, 0, nil), Event{Kind: Switch, PID: -1, TID: -1}, nil},
		{"switch out", record(recSwitch, miscSwitchOut, nil), Event{Kind: Switch, Out: true, PID: -1, TID: -1}, nil},
		{"cpu-wide switch in", record(recSwitchCPUWide, 0, u32s(3, 4)), Event{Kind: Switch, PID: -1, TID: -1}, nil},
		{"cpu-wide switch out", record(recSwitchCPUWide, miscSwitchOut, u32s(3, 4)), Event{Kind: Switch, Out: true, PID: 3, TID: 4}, nil},
		{"aux", record(recAux, 0, u64s(0x100, 0x40, AuxTruncated)), Event{Kind: Aux, AuxOffset: 0x100, AuxSize: 0x40, AuxFlags: AuxTruncated}, nil},
		{"lost", record(recLost, 0, u64s(7, 3)), Event{Kind: Lost, Lost: 3}, nil},
		{"short cpu-wide switch out", record(recSwitchCPUWide, miscSwitchOut, u32s(3)), Event{}, ErrCorrupt},
		{"short aux", record(recAux, 0, u64s(1, 2)), Event{}, ErrCorrupt},
		{"short lost", record(recLost, 0, u64s(1)), Event{}, ErrCorrupt},
		{"short mmap", record(recMmap, 0, u32s(1, 2)), Event{}, ErrCorrupt},
		{"short mmap2", record(recMmap2, 0, cat(u32s(3, 4), u64s(0x1000))), Event{}, ErrCorrupt},
		{"short comm", record(recComm, 0, u32s(5)), Event{}, ErrCorrupt},
		{"short fork", record(recFork, 0, u32s(7, 5)), Event{}, ErrCorrupt},
		{"short itrace start", record(recItraceStart, 0, u32s(9)), Event{}, ErrCorrupt},
		{"unterminated name", record(recMmap, 0, cat(u32s(1, 2), u64s(1, 2, 3), []byte("/lib/x.so"))), Event{}, ErrCorrupt},
		{"build id too long", record(recMmap2, miscMmapBuildID, func() []byte { b := bytes.Clone(mmap2ID); b[32] = 21; return b }()), Event{}, ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, ok, err := sideBand(binary.LittleEndian.Uint32(tt.rec), tt.rec, 0)
			if !ok {
				t.Fatal("not taken as side band")
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("err %v, want %v", err, tt.err)
			}
			if err == nil && !reflect.DeepEqual(ev, tt.want) {
				t.Errorf("got %+v, want %+v", ev, tt.want)
			}
		})
	}
	if _, ok, _ := sideBand(recAuxtrace, record(recAuxtrace, 0, make([]byte, 40)), 0); ok {
		t.Error("PERF_RECORD_AUXTRACE taken as side band")
	}
}

// buildIDRecord is a build_id event for name.
func buildIDRecord(id []byte, name string, sized bool) []byte {
	var misc uint16
	bid := make([]byte, 24)
	copy(bid, id)
	if sized {
		misc = miscBuildIDSize
		bid[20] = byte(len(id))
	}
	return record(recBuildID, misc, cat(u32s(1), bid, pad8(name)))
}

func TestBuildIDs(t *testing.T) {
	full := bytes.Repeat([]byte{1}, 20)
	short := []byte{2, 3, 4, 5, 6, 7, 8, 9}
	ids := map[string][]byte{}
	in := cat(buildIDRecord(full, "/bin/a", false), buildIDRecord(short, "/bin/b", true))
	if err := buildIDs(in, 0, ids); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ids["/bin/a"], full) || !bytes.Equal(ids["/bin/b"], short) {
		t.Errorf("ids %x", ids)
	}
	for _, tt := range []struct {
		name string
		in   []byte
		err  error
	}{
		{"short header", in[:5], ErrTruncated},
		{"cut record", in[:40], ErrTruncated},
		{"size too small", func() []byte { b := bytes.Clone(in); b[6] = 16; return b }(), ErrCorrupt},
		{"size byte too big", func() []byte { b := bytes.Clone(in); b[len(in)/2+32] = 30; return b }(), ErrCorrupt},
		{"unterminated name", func() []byte { b := bytes.Clone(in[:len(in)/2]); return append(b[:len(b)-8], "abcdefgh"...) }(), ErrCorrupt},
	} {
		if err := buildIDs(tt.in, 0, map[string][]byte{}); !errors.Is(err, tt.err) {
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.err)
		}
	}
	// A pipe-mode file carries them as records.
	var b builder
	b.recs = append(b.recs, buildIDRecord(full, "/bin/a", false)...)
	f, err := Parse(b.pipe(0))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f.BuildIDs["/bin/a"], full) {
		t.Errorf("pipe build ids %x", f.BuildIDs)
	}
}

// TestCorpusSideBand compares the side band of the corpus recording with
// perf buildid-list's output and checks its mappings.
func TestCorpusSideBand(t *testing.T) {
	dir, f := corpusFile(t)
	list, err := os.ReadFile(filepath.Join(dir, "perf.data.intel_pt-4.14.buildids"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := images.ParseBuildIDs(list)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 || len(f.BuildIDs) != len(want) {
		t.Fatalf("%d build ids, want %d", len(f.BuildIDs), len(want))
	}
	for name, id := range want {
		if !bytes.Equal(f.BuildIDs[name], id) {
			t.Errorf("%s: build id %x, want %x", name, f.BuildIDs[name], id)
		}
	}
	kinds := map[Kind]int{}
	for _, e := range f.Events {
		kinds[e.Kind]++
		if e.Kind == Mmap && (e.Name == "" || e.Len == 0) {
			t.Errorf("mapping %+v", e)
		}
	}
	if kinds[Mmap] == 0 || kinds[Comm] == 0 || kinds[ItraceStart] == 0 {
		t.Errorf("side band kinds %v", kinds)
	}
	// perf traced `echo` as pid 3174.
	for _, b := range f.Buffers {
		if b.PID != 3174 {
			t.Errorf("buffer %d: pid %d, want 3174", b.Idx, b.PID)
		}
	}
}

// FuzzSideBand checks that no record panics the side-band parser and that
// a name it returns lies within the record.
func FuzzSideBand(f *testing.F) {
	f.Add(uint32(recMmap2), record(recMmap2, miscMmapBuildID, cat(u32s(1, 2), u64s(1, 2, 3), make([]byte, 24), u32s(5, 2), pad8("/x"))))
	f.Add(uint32(recComm), record(recComm, miscCommExec, cat(u32s(5, 5), pad8("true"))))
	f.Add(uint32(recBuildID), buildIDRecord([]byte{1, 2}, "/y", true))
	f.Fuzz(func(t *testing.T, typ uint32, rec []byte) {
		if len(rec) < 8 {
			return
		}
		if ev, ok, err := sideBand(typ, rec, 0); ok && err == nil && len(ev.Name) >= len(rec) {
			t.Fatalf("name of %d bytes from a %d-byte record", len(ev.Name), len(rec))
		}
		_ = buildIDs(rec, 0, map[string][]byte{})
	})
}
