package live

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"ptfs/decode"
	"ptfs/decode/ptenc"
	"ptfs/engine"
	"ptfs/engine/enginetest"
	"ptfs/flow"
	"ptfs/images"
	"ptfs/internal/testkit"
	"ptfs/objfile"
	"ptfs/perfdata"
	"ptfs/stream"
)

// ptsimRun loads a ptsim run of the corpus; its binary is beside the runs.
func ptsimRun(t testing.TB, name string) (*enginetest.Ptsim, string) {
	t.Helper()
	root := filepath.Join(testkit.Corpus(t), "ptsim")
	run, err := enginetest.LoadPtsim(filepath.Join(root, name), root)
	if err != nil {
		t.Fatal(err)
	}
	return run, filepath.Join(root, "flow-static")
}

// offline decodes the run whole, as `ptfs decode --branches` does: the
// reference of the live path.
func offline(t testing.TB, run *enginetest.Ptsim, events map[uint16]*decode.Event, tid, cpu int32) string {
	t.Helper()
	vdso, err := images.LoadBlob(run.VDSO)
	if err != nil {
		t.Fatal(err)
	}
	p := images.NewProcesses(images.Options{VDSO: vdso})
	t.Cleanup(func() { p.Close() })
	p.Exec(1)
	if err := p.MapMaps(1, run.Maps); err != nil {
		t.Fatal(err)
	}
	s, _ := p.Space(1)
	var out bytes.Buffer
	b := flow.NewBranches(&out, s, s, events)
	b.SetContext(tid, cpu)
	flow.New(s, flow.Options{}).Decode(run.Trace, b)
	b.Finish()
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// own keeps the lines a target of bin gets: its branch and trace lines,
// every other kind.
func own(text, bin string) (kept string, dropped int) {
	var b strings.Builder
	for l := range strings.SplitSeq(strings.TrimSuffix(text, "\n"), "\n") {
		if (strings.HasPrefix(l, "branch: ") || strings.HasPrefix(l, "trace: ")) && !strings.Contains(l, " ("+bin+")") {
			dropped++
			continue
		}
		b.WriteString(l + "\n")
	}
	return b.String(), dropped
}

// streamText reads all of s.
func streamText(t testing.TB, s *stream.Stream) string {
	t.Helper()
	r := s.NewReader()
	defer r.Close()
	return string(testkit.ReadStream(t, r))
}

// newStage returns a stage with the run's vDSO and no /proc maps.
func newStage(t testing.TB, run *enginetest.Ptsim) *Stage {
	t.Helper()
	vdso, err := images.LoadBlob(run.VDSO)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{VDSO: vdso, Maps: func(int32) ([]images.MapsEntry, error) { return nil, nil }})
	t.Cleanup(func() { s.Close() })
	return s
}

// play replays batches into s to their end.
func play(t testing.TB, s engine.TraceSink, batches []enginetest.Batch) {
	t.Helper()
	r, err := enginetest.NewReplay(batches...)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(s); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
}

// TestStagePtsim replays ptsim's recording of a real program into the stage
// as the kernel would pass it (side band, then the trace in chunks cut
// anywhere, a reader pass after each) and holds the target's branches to
// the offline decoder on the whole trace, byte for byte: the lines of its
// own code with tid= and cpu=, whatever the chunk size (the flow goes on
// across chunks cut anywhere).
func TestStagePtsim(t *testing.T) {
	run, bin := ptsimRun(t, "run-static")
	want, dropped := own(offline(t, run, nil, 42, 3), bin)
	if !strings.HasPrefix(want, "trace: start at 0x4016d0 _start+0x0 ("+bin+") tid=42 cpu=3\n") {
		t.Fatalf("offline reference starts %q", want[:min(len(want), 200)])
	}
	for _, chunk := range []int{1 << 20, 4096, 1000, 17, 1} {
		s := newStage(t, run)
		out := stream.New(stream.Options{})
		if err := s.Attach("t", []string{bin}, out); err != nil {
			t.Fatal(err)
		}
		play(t, s, run.Batches(3, 7, 42, chunk))
		if got := streamText(t, out); got != want {
			t.Fatalf("chunk %d: %s", chunk, firstDiff(got, want))
		}
		st := s.Stats()
		if st.Outside != uint64(dropped) || st.DecodeErrors != 0 || st.Bytes != uint64(len(run.Trace)) {
			t.Errorf("chunk %d: stats %+v, want %d outside", chunk, st, dropped)
		}
	}
}

// fibEvent is the probe of run-static-ptw (id 0x6c2, at fib), as target t
// of a mount names it.
func fibEvent(target string) map[uint16]*decode.Event {
	return map[uint16]*decode.Event{0x6c2: {ID: 0x6c2, Group: "ptfs_" + target, Name: "fib", Args: []decode.Arg{{}, {Name: "rsi"}}}}
}

// TestStagePtsimPTW replays the run with simulated ptw probe hits: the
// records come among the branches, in execution order, exactly where the
// offline decoder prints them, numbered in the target's stream; a second
// target attached for other code gets the gap and manual lines only, and
// none of t's lines or records.
func TestStagePtsimPTW(t *testing.T) {
	run, bin := ptsimRun(t, "run-static-ptw")
	events := fibEvent("t")
	want, _ := own(offline(t, run, events, 42, 0), bin)
	if n := strings.Count(want, "record "); n != 987 {
		t.Fatalf("offline reference has %d records, want 987", n)
	}
	s := newStage(t, run)
	s.SetEvents(events)
	out, other := stream.New(stream.Options{}), stream.New(stream.Options{})
	if err := s.Attach("t", []string{bin}, out); err != nil {
		t.Fatal(err)
	}
	if err := s.Attach("u", []string{"/usr/bin/other"}, other); err != nil {
		t.Fatal(err)
	}
	if err := s.Attach("t", nil, other); !errors.Is(err, ErrAttached) {
		t.Errorf("second attach of t: %v", err)
	}
	play(t, s, run.Batches(0, 7, 42, 333))
	if got := streamText(t, out); got != want {
		t.Fatalf("t's branches differ from the offline decoder's:\n%s", firstDiff(got, want))
	}
	if got := streamText(t, other); got != "" {
		t.Errorf("u got %q", got[:min(len(got), 300)])
	}
	if err := s.Detach("u"); err != nil {
		t.Fatal(err)
	}
	if err := s.Detach("u"); !errors.Is(err, ErrNotAttached) {
		t.Errorf("second detach: %v", err)
	}
}

// firstDiff describes the first line where got and want differ.
func firstDiff(got, want string) string {
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range min(len(gl), len(wl)) {
		if gl[i] != wl[i] {
			return fmt.Sprintf("line %d: got  %q\nwant %q", i, gl[i], wl[i])
		}
	}
	return fmt.Sprintf("%d lines, want %d", len(gl), len(wl))
}

// TestStageLosses replays the run with the kernel's losses in the middle
// (a truncated AUX record, a hole in the AUX offsets, lost side band): each
// hole gives every target a gap line naming its cause where it happened and
// decoding resumes at the next PSB with a sync line; lost side band gives a
// gap line and leaves the thread unknown (no tid=) until the next switch;
// the lines around are the offline decoder's, and status counts each loss
// by cause.
func TestStageLosses(t *testing.T) {
	run, bin := ptsimRun(t, "run-static")
	want, _ := own(offline(t, run, nil, 42, 3), bin)
	wantLines := strings.Split(strings.TrimSuffix(want, "\n"), "\n")
	s := newStage(t, run)
	out, other := stream.New(stream.Options{}), stream.New(stream.Options{})
	if err := s.Attach("t", []string{bin}, out); err != nil {
		t.Fatal(err)
	}
	if err := s.Attach("u", []string{"/usr/bin/other"}, other); err != nil {
		t.Fatal(err)
	}
	b := run.Batches(3, 7, 42, 1500)
	// Losses after the 3rd and 6th chunks (bytes 4500 and 9000), lost
	// side band after the 4th.
	var batches []enginetest.Batch
	for i, x := range b {
		batches = append(batches, x)
		switch i {
		case 3:
			batches = append(batches, enginetest.Batch{3: {enginetest.Loss(engine.LossTruncated, 1)}})
		case 4:
			batches = append(batches, enginetest.Batch{3: {enginetest.Loss(engine.LossSideBand, 5)}})
		case 6:
			batches = append(batches, enginetest.Batch{3: {enginetest.Loss(engine.LossHole, 1)}})
		}
	}
	play(t, s, batches)
	got := strings.Split(strings.TrimSuffix(streamText(t, out), "\n"), "\n")
	var gaps []string
	for i, l := range got {
		if !strings.HasPrefix(l, "gap: ") {
			continue
		}
		gaps = append(gaps, l)
		// The path is unknown until a sync (another gap line may come
		// first).
		j := i + 1
		for j < len(got) && strings.HasPrefix(got[j], "gap: ") {
			j++
		}
		if strings.Contains(l, "err=trace lost: ") && (j >= len(got) || !strings.HasPrefix(got[j], "trace: sync at ")) {
			t.Errorf("after %q: %q, want a sync line", l, got[min(j, len(got)-1)])
		}
	}
	wantGaps := []string{"gap: error offset=0x1194 ip=0x401585 main+0x95 (" + bin + ") err=trace lost: aux truncated tid=42 cpu=3",
		"gap: error offset=0x2328 err=side band lost: 5 records cpu=3",
		"gap: error offset=0x2328 ip=0x40158a main+0x9a (" + bin + ") err=trace lost: aux hole cpu=3"}
	if strings.Join(gaps, "\n") != strings.Join(wantGaps, "\n") {
		t.Errorf("gap lines\n%s\nwant\n%s", strings.Join(gaps, "\n"), strings.Join(wantGaps, "\n"))
	}
	// Before the first hole the lines are the offline decoder's; after
	// the last resync too, without tid= (no switch told the thread since
	// the side band was lost).
	first := slices.IndexFunc(got, func(l string) bool { return strings.HasPrefix(l, "gap: ") })
	if first < 100 || !slices.Equal(got[:first-1], wantLines[:first-1]) {
		t.Errorf("the %d lines before the first hole differ from the offline decoder's", first)
	}
	last := len(got) - 1
	for !strings.HasPrefix(got[last], "trace: sync at ") {
		last--
	}
	tail := len(got) - last - 1
	wantTail := strings.ReplaceAll(strings.Join(wantLines[len(wantLines)-tail:], "\n"), " tid=42", "")
	if tail < 100 || strings.Join(got[last+1:], "\n") != wantTail {
		t.Errorf("the %d lines after the last resync differ from the offline decoder's:\n%s", tail,
			firstDiff(strings.Join(got[last+1:], "\n"), wantTail))
	}
	for l := range strings.SplitSeq(strings.TrimSuffix(streamText(t, other), "\n"), "\n") {
		if !strings.HasPrefix(l, "gap: ") {
			t.Errorf("the other target got %q, want gap lines only", l)
		}
	}
	st := s.Stats()
	if st.Losses[engine.LossTruncated] != 1 || st.Losses[engine.LossHole] != 1 || st.Losses[engine.LossSideBand] != 5 || st.DecodeErrors != 2 {
		t.Errorf("losses %v, stats %+v", st.Losses, st)
	}
	t.Logf("%d lines, %d offline; stats %+v", len(got), len(wantLines), st)
}

// TestOwnVDSO reads ptfs's own vDSO with its symbols.
func TestOwnVDSO(t *testing.T) {
	e, err := OwnVDSO()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	found := false
	for _, f := range e.File.Functions() {
		found = found || strings.Contains(f.Name, "clock_gettime")
	}
	if !found || len(e.Bytes()) < 4096 {
		t.Errorf("vDSO of %d bytes without clock_gettime", len(e.Bytes()))
	}
}

// copyFile copies src to dst (a new inode) and returns dst's identity.
func copyFile(t *testing.T, src, dst string) objfile.FileID {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
	id, err := objfile.StatID(dst)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// identify gives the run's mappings of bin the device and inode of id, as
// MMAP2 records carry them.
func identify(batches []enginetest.Batch, bin string, id objfile.FileID) {
	for _, b := range batches {
		for _, steps := range b {
			for i := range steps {
				if ev := &steps[i].Side; steps[i].Kind == enginetest.StepSide && ev.Filename == bin {
					ev.Maj, ev.Min, ev.Ino = unix.Major(id.Dev), unix.Minor(id.Dev), id.Ino
				}
			}
		}
	}
}

// TestStageReplaced: a binary replaced on disk after the process mapped it
// (MMAP2's inode is not the path's any more) is unknown code, counted, and
// its trace gives gap lines, never lines decoded from the new file's bytes;
// a path that names another file than the one read for an earlier mapping
// is read again for the new one.
func TestStageReplaced(t *testing.T) {
	run, orig := ptsimRun(t, "run-static")
	dir := t.TempDir()
	bin := filepath.Join(dir, "flow-static")
	id := copyFile(t, orig, bin)
	moved, err := enginetest.LoadPtsim(filepath.Join(filepath.Dir(orig), "run-static"), dir)
	if err != nil {
		t.Fatal(err)
	}

	// The file the process mapped: decoded exactly.
	want, _ := own(offline(t, moved, nil, 42, 0), bin)
	s := newStage(t, run)
	out := stream.New(stream.Options{})
	if err := s.Attach("t", []string{bin}, out); err != nil {
		t.Fatal(err)
	}
	batches := moved.Batches(0, 7, 42, 4096)
	identify(batches, bin, id)
	play(t, s, batches)
	if got := streamText(t, out); got != want {
		t.Fatalf("the mapped file itself: %s", firstDiff(got, want))
	}
	if st := s.Stats(); st.Replaced != 0 || st.UnknownCode != 0 {
		t.Errorf("stats %+v", st)
	}

	// Replaced after the mapping: unknown code, not the new bytes.
	s = newStage(t, run)
	out = stream.New(stream.Options{})
	if err := s.Attach("t", []string{bin}, out); err != nil {
		t.Fatal(err)
	}
	copyFile(t, orig, bin)
	play(t, s, batches)
	got := streamText(t, out)
	if strings.Contains(got, "branch: ") || !strings.Contains(got, "gap: error ") {
		t.Errorf("replaced file: got\n%s", got[:min(len(got), 500)])
	}
	maps := 0
	for _, m := range moved.Maps {
		if m.Path == bin {
			maps++
		}
	}
	if st := s.Stats(); st.Replaced != uint64(maps) || st.UnknownCode < st.Replaced || st.DecodeErrors == 0 {
		t.Errorf("stats %+v, want %d replaced mappings", st, maps)
	}

	// Process 7 maps file A, then the path is replaced with B (fib's
	// first byte changed) and process 8 maps B: B is read, and 7 keeps A.
	s = newStage(t, run)
	mmap := func(pid int32, fid objfile.FileID) {
		s.Side(0, &engine.SideEvent{Kind: engine.SideMmap2, PID: pid, TID: pid, Addr: 0x401000, Len: 0x78000, PgOff: 0x1000,
			Filename: bin, Maj: unix.Major(fid.Dev), Min: unix.Minor(fid.Dev), Ino: fid.Ino})
	}
	mmap(7, copyFile(t, orig, bin))
	s.Round(true) // the side band applies when the trace before it passed
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	const at = 0x1840 // fib's first byte, file offset
	old := b[at]
	b[at] ^= 0xff
	if err := os.WriteFile(bin+".b", b, 0o755); err != nil {
		t.Fatal(err)
	}
	mmap(8, copyFile(t, bin+".b", bin))
	s.Round(true)
	for pid, want := range map[int32]byte{7: old, 8: b[at]} {
		sp, _ := s.procs.Space(pid)
		var c [1]byte
		if n, err := sp.ReadAt(c[:], 0x401840); n != 1 || c[0] != want {
			t.Errorf("process %d: code at fib %#x (%d, %v), want %#x", pid, c[0], n, err, want)
		}
	}
	if st := s.Stats(); st.Replaced != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestStageExec: an exec (COMM with the exec flag) gives the process a new
// address space: the old program's code is not read for the new one's;
// the MMAP2s that follow build it.
func TestStageExec(t *testing.T) {
	run, bin := ptsimRun(t, "run-static")
	s := newStage(t, run)
	play(t, s, run.Batches(0, 7, 7, 1<<20)[:1])
	code := func() bool {
		sp, _ := s.procs.Space(7)
		var c [1]byte
		n, _ := sp.ReadAt(c[:], 0x401840)
		return n == 1
	}
	if !code() {
		t.Fatal("no code at fib after the mappings")
	}
	s.Side(0, &engine.SideEvent{Kind: engine.SideComm, PID: 7, TID: 7, Comm: "other", Exec: true})
	s.Round(true)
	if code() {
		t.Error("the old program's code is still mapped after the exec")
	}
	s.Side(0, &engine.SideEvent{Kind: engine.SideComm, PID: 7, TID: 7, Comm: "renamed"})
	s.Side(0, &engine.SideEvent{Kind: engine.SideMmap2, PID: 7, TID: 7, Addr: 0x401000, Len: 0x78000, PgOff: 0x1000, Filename: bin})
	s.Round(true)
	if !code() {
		t.Error("no code after the new program's mapping")
	}
}

// FuzzStage feeds the stage a trace it was not made for, cut and broken
// where the input says, over the ptsim run's images: no panic, no hang,
// every line whole, and what it counts adds up.
func FuzzStage(f *testing.F) {
	run, bin := ptsimRun(f, "run-static")
	f.Add(run.Trace[:2000], uint16(100), uint8(3))
	f.Add(run.Trace[4097:6000], uint16(7), uint8(0))
	f.Add([]byte{2, 0x82, 2, 0x82}, uint16(1), uint8(1))
	f.Fuzz(func(t *testing.T, trace []byte, chunk uint16, losses uint8) {
		s := newStage(t, run)
		out := stream.New(stream.Options{})
		defer out.Close()
		if err := s.Attach("t", []string{bin}, out); err != nil {
			t.Fatal(err)
		}
		// A replay batch per chunk: bounded so that an exec stays short.
		trace = trace[:min(len(trace), 16<<10)]
		b := run.Batches(0, 7, 42, 1<<20)[:1]
		step := max(int(chunk), len(trace)/256) + 1
		for i := 0; i < len(trace); i += step {
			steps := []enginetest.Step{enginetest.Trace(trace[i:min(i+step, len(trace))])}
			if losses > 0 && i/step%int(losses+1) == 1 {
				steps = append(steps, enginetest.Loss(engine.LossKind(i%int(engine.NumLossKinds+1)), 1))
			}
			b = append(b, enginetest.Batch{0: steps})
		}
		play(t, s, b)
		text := streamText(t, out)
		if text != "" && !strings.HasSuffix(text, "\n") {
			t.Fatalf("a cut line: %q", text[max(0, len(text)-100):])
		}
		if st := s.Stats(); st.Bytes != uint64(len(trace)) || st.Lines != uint64(strings.Count(text, "\n")) {
			t.Fatalf("stats %+v for %d bytes, %d lines", st, len(trace), strings.Count(text, "\n"))
		}
	})
}

// TestStageOverflow: an OVF packet in the trace (the CPU's internal buffer
// overflowed) gives one `gap: overflow` line where it is, and decoding
// goes on after it exactly as the offline decoder does.
func TestStageOverflow(t *testing.T) {
	run, bin := ptsimRun(t, "run-static")
	const at = 8193 // a PSB begins here
	if !bytes.HasPrefix(run.Trace[at:], []byte{2, 0x82, 2, 0x82}) {
		t.Fatalf("no PSB at %d", at)
	}
	ovf := *run
	ovf.Trace = append(append(append([]byte(nil), run.Trace[:at]...), 0x02, 0xf3), run.Trace[at:]...)
	want, _ := own(offline(t, &ovf, nil, 42, 0), bin)
	s := newStage(t, run)
	out := stream.New(stream.Options{})
	if err := s.Attach("t", []string{bin}, out); err != nil {
		t.Fatal(err)
	}
	play(t, s, ovf.Batches(0, 7, 42, 1000))
	got := streamText(t, out)
	if got != want {
		t.Fatalf("%s", firstDiff(got, want))
	}
	if n := strings.Count(got, "gap: overflow"); n != 1 {
		t.Errorf("%d overflow lines, want 1", n)
	}
	whole, _ := own(offline(t, run, nil, 42, 0), bin)
	tail := got[strings.LastIndex(got, "gap: overflow"):]
	tail = tail[strings.IndexByte(tail, '\n')+1:]
	if !strings.HasSuffix(whole, tail[strings.IndexByte(tail, '\n')+1:]) {
		t.Errorf("the lines after the overflow differ from the trace's without it")
	}
}

// TestStageSideBandByTime: a switch arrives before the trace that covers
// it (the kernel writes side band before the AUX data): with the CPU's TSC
// conversion it applies when the trace's time passes it, so the lines
// before carry the old thread and those after the new one.
func TestStageSideBandByTime(t *testing.T) {
	run, bin := ptsimRun(t, "run-static")
	var e ptenc.Encoder
	e.PSB()
	e.PSBEnd()
	e.TSC(1000)
	e.IP(ptenc.TIPPGE, 0x4016d0) // _start; its call goes to __libc_start_main
	e.TSC(3000)
	e.IP(ptenc.TIPPGD, 0x402aa0)
	e.TSC(5000)
	e.IP(ptenc.TIPPGE, 0x4016d0)
	e.TSC(6000)
	e.IP(ptenc.TIPPGD, 0x402aa0)
	s := newStage(t, run)
	out := stream.New(stream.Options{})
	if err := s.Attach("t", []string{bin}, out); err != nil {
		t.Fatal(err)
	}
	b := run.Batches(0, 7, 41, 1<<20)[:1]
	b = append(b, enginetest.Batch{0: {
		enginetest.TimeConv(perfdata.TimeConv{Mult: 1}),
		enginetest.Side(engine.SideEvent{Kind: engine.SideSwitchIn, Time: 4000, PID: 7, TID: 42}),
		enginetest.Trace(e.Bytes()),
	}})
	play(t, s, b)
	want := "trace: start at 0x4016d0 _start+0x0 (" + bin + ") tid=41 cpu=0 time=0.000001000\n" +
		"trace: stop at 0x402aa0 __libc_start_main_impl+0x0 (" + bin + ") tid=41 cpu=0 time=0.000003000\n" +
		"trace: start at 0x4016d0 _start+0x0 (" + bin + ") tid=42 cpu=0 time=0.000005000\n" +
		"trace: stop at 0x402aa0 __libc_start_main_impl+0x0 (" + bin + ") tid=42 cpu=0 time=0.000006000\n"
	if got := streamText(t, out); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}

	// Without a TSC conversion (no time in the trace, as under
	// kvm-clock) the side band applies as it arrives, and lines carry
	// no time.
	s = newStage(t, run)
	out = stream.New(stream.Options{})
	if err := s.Attach("t", []string{bin}, out); err != nil {
		t.Fatal(err)
	}
	b[1][0] = b[1][0][1:]
	play(t, s, b)
	got := streamText(t, out)
	if strings.Count(got, " tid=42 cpu=0\n") != 4 {
		t.Errorf("without time:\n%s\nwant 4 lines of the thread that arrived last, without time=", got)
	}
}

// TestStageRuns: a flush ends a run (the events restart with a PSB+); the
// next run decodes in the same process, with no ITRACE_START of its own,
// exactly as the first.
func TestStageRuns(t *testing.T) {
	run, bin := ptsimRun(t, "run-static")
	want, _ := own(offline(t, run, nil, 42, 0), bin)
	s := newStage(t, run)
	out := stream.New(stream.Options{})
	if err := s.Attach("t", []string{bin}, out); err != nil {
		t.Fatal(err)
	}
	b := run.Batches(0, 7, 42, 5000)
	b = append(b, enginetest.Batch{0: {enginetest.Loss(engine.LossFlush, 1)}})
	b = append(b, run.Batches(0, 7, 42, 3000)[1:]...)
	play(t, s, b)
	if got := streamText(t, out); got != want+want {
		t.Fatalf("%s", firstDiff(got, want+want))
	}
}
