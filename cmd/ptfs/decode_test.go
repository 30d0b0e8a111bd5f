package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"ptfs/decode"
	"ptfs/decode/ptenc"
	"ptfs/internal/testkit"
)

func runDecodeT(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = runDecode(args, &o, &e)
	return code, o.String(), e.String()
}

// writeEvent writes a tracefs-like events tree with one 2-argument probe.
func writeEvent(t *testing.T, group, name, id string) string {
	return writeEventFormat(t, group, name, id, "\tfield:u64 arg1;\toffset:16;\tsize:8;\tsigned:0;\n"+
		"\tfield:u64 rsi;\toffset:24;\tsize:8;\tsigned:0;\n")
}

// writeEventFormat writes a tracefs-like events tree with one probe whose
// format has the given argument fields (and print fmt line).
func writeEventFormat(t *testing.T, group, name, id, args string) string {
	dir := t.TempDir()
	writeEventTree(t, dir, group, name, id, args)
	return dir
}

// writeEventTree adds event group/name to the events tree at dir.
func writeEventTree(t testing.TB, dir, group, name, id, args string) {
	ev := filepath.Join(dir, group, name)
	if err := os.MkdirAll(ev, 0o755); err != nil {
		t.Fatal(err)
	}
	format := "format:\n" +
		"\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n" +
		"\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n" + args
	if err := os.WriteFile(filepath.Join(ev, "format"), []byte(format), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ev, "id"), []byte(id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestDecodePtsim(t *testing.T) {
	trace := filepath.Join(testkit.Corpus(t), "ptsim", "run-static-ptw", "trace.pt")
	events := writeEvent(t, "ptsim", "fib", "1730") // 0x6c2
	code, out, errs := runDecodeT("--events", events, trace)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	ls := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(ls) != 988 {
		t.Fatalf("%d lines, want 987 records and the summary", len(ls))
	}
	if ls[0] != "record 1: event=ptsim/fib id=0x6c2 args=[15, rsi=4689959]" {
		t.Errorf("first line %q", ls[0])
	}
	if ls[986] != "record 987: event=ptsim/fib id=0x6c2 args=[1, rsi=4689959]" {
		t.Errorf("last record %q", ls[986])
	}
	if ls[987] != "summary: records=987 dropped=0 stray=0 unknown=0 errors=0" {
		t.Errorf("summary %q", ls[987])
	}
	// Without the event table, every word is a manual ptwrite.
	code, out, _ = runDecodeT(trace)
	if code != 0 || !strings.HasSuffix(out, "summary: records=0 dropped=0 stray=2961 unknown=0 errors=0\n") {
		t.Errorf("no events: exit %d, output ends %q", code, out[max(0, len(out)-80):])
	}
}

// auxRec is one PERF_RECORD_AUXTRACE of a synthetic perf.data.
type auxRec struct {
	cpu    uint32
	offset uint64 // in the AUX buffer: a hole after the previous one is lost data
	data   []byte
}

// pipePerfData writes a pipe-mode perf.data with a TIME_CONV (ns = 1e9 +
// tsc) and the AUXTRACE records auxs, and returns its path.
func pipePerfData(t *testing.T, auxs ...auxRec) string {
	var recs []byte
	rec := func(typ uint32, body, extra []byte) {
		recs = binary.LittleEndian.AppendUint32(recs, typ)
		recs = binary.LittleEndian.AppendUint16(recs, 0)
		recs = binary.LittleEndian.AppendUint16(recs, uint16(8+len(body)))
		recs = append(recs, body...)
		recs = append(recs, extra...)
	}
	u64s := func(vs ...uint64) (b []byte) {
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
		return b
	}
	rec(79, u64s(0, 1, 1_000_000_000), nil) // TIME_CONV
	for _, a := range auxs {
		body := u64s(uint64(len(a.data)), a.offset, 0)
		body = binary.LittleEndian.AppendUint32(body, a.cpu)
		body = binary.LittleEndian.AppendUint32(body, 0xffffffff)
		body = binary.LittleEndian.AppendUint32(body, a.cpu)
		body = binary.LittleEndian.AppendUint32(body, 0)
		rec(71, body, a.data)
	}
	pipe := append([]byte("PERFILE2"), u64s(16)...)
	pipe = append(pipe, recs...)
	path := filepath.Join(t.TempDir(), "perf.data")
	if err := os.WriteFile(path, pipe, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A gap in a buffer (a hole in the AUX offsets) splits the packet listing:
// no packet is pieced together across lost data.
func TestDecodePacketsGap(t *testing.T) {
	e := ptenc.New()
	e.PSB()
	e.PSBEnd()
	e.TSC(7)
	seg := e.Bytes()
	path := pipePerfData(t, auxRec{cpu: 0, data: seg}, auxRec{cpu: 0, offset: uint64(len(seg)) + 64, data: seg})
	code, out, errs := runDecodeT("--packets", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	parts := strings.Split(out, "# gap: trace data lost here\n")
	if len(parts) != 2 || parts[0] != parts[1] || !strings.Contains(parts[0], "psb") || !strings.Contains(parts[0], "tsc") {
		t.Errorf("listing:\n%s", out)
	}
}

// TestDecodePerfData decodes a synthetic perf.data with two CPUs' buffers and
// a time conversion: records come out merged by time.
func TestDecodePerfData(t *testing.T) {
	enc := func(tscs ...uint64) []byte {
		e := ptenc.New()
		e.PSB()
		e.PSBEnd()
		for _, tsc := range tscs {
			e.TSC(tsc)
			e.Probe(0x6c2, 0x7ffff0000000, true, tsc, 2)
		}
		return e.Bytes()
	}
	cpu0, cpu1 := enc(10, 30), enc(20, 40)
	path := pipePerfData(t, auxRec{cpu: 0, data: cpu0}, auxRec{cpu: 1, data: cpu1})
	code, out, errs := runDecodeT("--events", writeEvent(t, "g", "e", "1730"), path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := "record 1: event=g/e id=0x6c2 args=[10, rsi=2] tid=-1 cpu=0 time=1.000000010\n" +
		"record 2: event=g/e id=0x6c2 args=[20, rsi=2] tid=-1 cpu=1 time=1.000000020\n" +
		"record 3: event=g/e id=0x6c2 args=[30, rsi=2] tid=-1 cpu=0 time=1.000000030\n" +
		"record 4: event=g/e id=0x6c2 args=[40, rsi=2] tid=-1 cpu=1 time=1.000000040\n" +
		"summary: records=4 dropped=0 stray=0 unknown=0 errors=0\n"
	want = strings.ReplaceAll(want, " tid=-1", "")
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
}

func TestDecodePackets(t *testing.T) {
	dir := filepath.Join(testkit.Corpus(t), "perf")
	code, out, errs := runDecodeT("--packets", "--lastip", filepath.Join(dir, "perf.data.intel_pt-4.14"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	parts := strings.Split(out, "# ")
	if len(parts) != 3 {
		t.Fatalf("%d listings, want 2", len(parts)-1)
	}
	for i, f := range []string{"intel_pt-4.14-idx0-cpu0.ptdump.txt", "intel_pt-4.14-idx3-cpu3.ptdump.txt"} {
		want, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		got := parts[i+1][strings.IndexByte(parts[i+1], '\n')+1:]
		if got != string(want) {
			t.Errorf("buffer %d: listing differs from libipt's %s", i, f)
		}
	}
}

func TestDecodeBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no file", nil, 2, "no FILE"},
		{"unknown option", []string{"--bogus", "x"}, 2, "unknown option"},
		{"missing events dir", []string{"--events"}, 2, "needs a directory"},
		{"missing file", []string{filepath.Join(dir, "nope")}, 1, "no such file"},
		{"text file", []string{write("text", []byte("hello\n"))}, 1, "no PSB"},
		{"directory", []string{dir}, 1, "is a directory"},
		{"standard input twice", []string{"-", "-"}, 2, "more than once"},
		{"truncated perf.data", []string{write("trunc", []byte("PERFILE2\x68\x00\x00"))}, 1, "truncated perf.data"},
		{"perf.data without AUX", []string{write("noaux", append([]byte("PERFILE2"), 16, 0, 0, 0, 0, 0, 0, 0))}, 1, "without AUX"},
		{"bad events dir", []string{"--events", filepath.Join(dir, "nope"), write("ok", bytes.Repeat([]byte{2, 0x82}, 8))}, 1, "load events"},
		{"bad ptdump option", []string{"--packets", "--mtc-freq", "x", write("ok2", bytes.Repeat([]byte{2, 0x82}, 8))}, 2, "mtc-freq"},
	}
	for _, tt := range tests {
		code, _, errs := runDecodeT(tt.args...)
		if code != tt.code || !strings.Contains(errs, tt.msg) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d and %q", tt.name, code, errs, tt.code, tt.msg)
		}
	}
}

// TestDecodeEventTypes: `--events` types each argument as its format file
// says: an 8-byte field with signed:1 (s64) prints -1, not
// 18446744073709551615; 4-byte ones signed or hex by the format.
func TestDecodeEventTypes(t *testing.T) {
	dir := writeEventFormat(t, "g", "e", "1730", "\tfield:s64 a;\toffset:16;\tsize:8;\tsigned:1;\n"+
		"\tfield:u64 b;\toffset:24;\tsize:8;\tsigned:0;\n"+
		"\tfield:s32 c;\toffset:32;\tsize:4;\tsigned:1;\n"+
		"\tfield:u32 d;\toffset:36;\tsize:4;\tsigned:0;\n\n"+
		"print fmt: \"(%lx) a=%Ld b=%Lu c=%d d=0x%x\", REC->__probe_ip, REC->a, REC->b, REC->c, REC->d\n")
	e := ptenc.New()
	e.PSB()
	e.PSBEnd()
	e.Probe(0x6c2, 0x7ffff0000000, true, 1<<64-1, 1<<64-1, 0xffff_fffe, 0x2a)
	path := filepath.Join(t.TempDir(), "trace.pt")
	if err := os.WriteFile(path, e.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runDecodeT("--events", dir, path)
	want := "record 1: event=g/e id=0x6c2 args=[a=-1, b=18446744073709551615, c=-2, d=0x2a]\n" +
		"summary: records=1 dropped=0 stray=0 unknown=0 errors=0\n"
	if code != 0 || out != want {
		t.Errorf("exit %d (%s), output:\n%s\nwant:\n%s", code, errs, out, want)
	}
}

// writeGenEvents writes under dir/events the events of ptenc.Generate's
// probe records (1 to 8 u64 arguments) and returns the events directory.
func writeGenEvents(t testing.TB, dir string) string {
	events := filepath.Join(dir, "events")
	for n := 1; n <= 8; n++ {
		var fields strings.Builder
		for i := 0; i < n; i++ {
			fmt.Fprintf(&fields, "\tfield:u64 arg%d;\toffset:%d;\tsize:8;\tsigned:0;\n", i+1, 16+8*i)
		}
		writeEventTree(t, events, "gen", "n"+strconv.Itoa(n), strconv.Itoa(int(ptenc.GenEventID(n))), fields.String())
	}
	return events
}

// TestDecodeLargeRaw: a raw trace of several pieces (feedSize) decodes the
// same read a piece at a time from a file or a pipe as fed whole from
// memory to an Assembler whose lines AppendRecord formats; a trace whose
// first PSB lies past the first piece gives the same records;
// a large file without a PSB is refused.
func TestDecodeLargeRaw(t *testing.T) {
	dir := t.TempDir()
	events := writeGenEvents(t, dir)
	data := ptenc.Generate(ptenc.PTWHeavy, 3*feedSize+12345, 7)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	trace := write("trace.pt", data)

	// The reference: the whole trace in memory, lines from AppendRecord.
	evs, err := loadEvents(events)
	if err != nil {
		t.Fatal(err)
	}
	ref := &refOutput{}
	a := decode.NewAssembler(evs, ref)
	a.Feed(data)
	a.End()
	c := a.Counters()
	want := string(decode.AppendSummary(ref.buf, &c))
	if c.Records < 10000 || c.Errors != 0 {
		t.Fatalf("reference counters %+v", c)
	}

	code, out, errs := runDecodeT("--events", events, trace)
	if code != 0 || out != want {
		t.Fatalf("file: exit %d %s, %d bytes of output, want %d (the same: %v)", code, errs, len(out), len(want), out == want)
	}
	stdin, err := os.Open(trace)
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	old := os.Stdin
	os.Stdin = stdin
	code, out, errs = runDecodeT("--events", events, "-")
	os.Stdin = old
	if code != 0 || out != want {
		t.Fatalf("stdin: exit %d %s, output the same: %v", code, errs, out == want)
	}
	// A pipe is not mapped: it is read a piece at a time.
	_ = withStdin(t, trace, true, func() error {
		code, out, errs = runDecodeT("--events", events, "-")
		return nil
	})
	if code != 0 || out != want {
		t.Fatalf("pipe: exit %d %s, output the same: %v", code, errs, out == want)
	}

	// PADs before the first PSB: skipped, and counted on stderr.
	late := write("late.pt", append(make([]byte, feedSize+feedSize/2), data...))
	code, out, errs = runDecodeT("--events", events, late)
	if code != 0 || out != want || !strings.Contains(errs, fmt.Sprintf("gap: %d bytes before the first PSB skipped", feedSize+feedSize/2)) {
		t.Fatalf("PSB after the first piece: exit %d %s, output the same: %v", code, errs, out == want)
	}
	code, _, errs = runDecodeT(write("nopsb.pt", make([]byte, 2*feedSize)))
	if code != 1 || !strings.Contains(errs, "no PSB") {
		t.Fatalf("no PSB: exit %d, stderr %q", code, errs)
	}
}

// A mapped input file that shrinks while it is decoded is an error, not a
// crash: the fault on the pages it lost becomes errInputChanged.
func TestDecodeMappedShrinks(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "trace.pt")
	if err := os.WriteFile(trace, ptenc.Generate(ptenc.PTWHeavy, 3*feedSize, 7), 0o644); err != nil {
		t.Fatal(err)
	}
	streams, _, done, err := input(trace, true, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if err := os.Truncate(trace, 0); err != nil {
		t.Fatal(err)
	}
	zeros := 0
	err = guardFaults(func() error {
		for {
			d, _, err := streams[0].next()
			if err != nil {
				return err
			}
			zeros += bytes.Count(d, []byte{0})
		}
	})
	if !errors.Is(err, errInputChanged) {
		t.Fatalf("decoding a mapped file truncated to 0: %v (%d zero bytes read), want %v", err, zeros, errInputChanged)
	}
}

// refOutput formats what an Assembler delivers with AppendRecord.
type refOutput struct {
	buf []byte
	seq uint64
}

func (o *refOutput) Record(r *decode.Record) {
	o.seq++
	o.buf = decode.AppendRecord(o.buf, o.seq, r)
}

func (o *refOutput) Manual(m *decode.Manual) {
	o.buf = decode.AppendManual(o.buf, m.Payload, m.IP, m.HasIP)
}

// Standard input positioned past a regular file's start (a shell that read
// some of it before) is decoded from where it stands, as a pipe would be,
// not mapped from the file's start.
func TestDecodeStdinOffset(t *testing.T) {
	dir := t.TempDir()
	events := writeGenEvents(t, dir)
	skipped := ptenc.Generate(ptenc.PTWHeavy, feedSize/2, 3)
	rest := ptenc.Generate(ptenc.PTWHeavy, 2*feedSize, 7)
	restFile := filepath.Join(dir, "rest.pt")
	both := filepath.Join(dir, "both.pt")
	if err := os.WriteFile(restFile, rest, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(both, append(skipped, rest...), 0o644); err != nil {
		t.Fatal(err)
	}
	code, want, errs := runDecodeT("--events", events, restFile)
	if code != 0 || !strings.Contains(want, "records=") {
		t.Fatalf("reference: exit %d %s", code, errs)
	}
	stdin, err := os.Open(both)
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	if _, err := stdin.Seek(int64(len(skipped)), io.SeekStart); err != nil {
		t.Fatal(err)
	}
	old := os.Stdin
	os.Stdin = stdin
	t.Cleanup(func() { os.Stdin = old })
	code, out, errs := runDecodeT("--events", events, "-")
	if code != 0 || out != want {
		t.Fatalf("stdin at offset %d: exit %d %s, %d bytes of output, want %d (the same: %v)", len(skipped), code, errs, len(out), len(want), out == want)
	}
}
