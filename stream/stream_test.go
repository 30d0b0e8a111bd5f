package stream

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// readAll reads r sequentially with buf-sized reads until io.EOF, checking
// that every read ends at a line end unless it filled buf.
func readAll(t testing.TB, r *Reader, off int64, bufLen int) (string, int64) {
	t.Helper()
	var out []byte
	buf := make([]byte, bufLen)
	for {
		n, err := r.ReadAt(buf, off)
		if errors.Is(err, io.EOF) {
			return string(out), off
		}
		if err != nil {
			t.Fatalf("ReadAt(%d): %v", off, err)
		}
		if n == 0 {
			t.Fatalf("ReadAt(%d) returned 0, nil", off)
		}
		if buf[n-1] != '\n' && n != len(buf) {
			t.Fatalf("ReadAt(%d) with %d bytes returned a partial line %q", off, len(buf), buf[:n])
		}
		out = append(out, buf[:n]...)
		off += int64(n)
	}
}

// content reads the window, from its start.
func content(t testing.TB, s *Stream) string {
	t.Helper()
	r := s.NewReader()
	defer r.Close()
	got, _ := readAll(t, r, s.Stats().Start, 3)
	return got
}

func newStream(t testing.TB, limit, hard int64) *Stream {
	s := New(Options{Limit: limit, HardLimit: hard, Dir: t.TempDir()})
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func TestBounds(t *testing.T) {
	tests := []struct {
		name        string
		limit, hard int64
		appends     []string
		want        string
		size        int64
		discarded   uint64
		dropped     uint64
	}{
		{"empty", 10, 0, nil, "", 0, 0, 0},
		{"fits", 10, 0, []string{"ab\n", "cd\n"}, "ab\ncd\n", 6, 0, 0},
		{"exactly a chunk", 6, 0, []string{"ab\n", "cd\n"}, "ab\ncd\n", 6, 0, 0},
		{"next chunk discards the first", 6, 6, []string{"ab\n", "cd\n", "e\n"}, "e\n", 8, 2, 0},
		{"soft bound keeps what fits", 4, 100, []string{"ab\n", "cd\n", "ef\n"}, "ef\n", 9, 2, 0},
		{"multi-line append splits at lines", 8, 8, []string{"aaa\n", "bbb\nccc\n"}, "ccc\n", 12, 2, 0},
		{"window of several chunks", 8, 100, []string{"aaa\nbbb\nccc\nddd\neee\n"}, "eee\n", 20, 4, 0},
		{"line longer than a chunk dropped", 5, 0, []string{"ab\n", "toolong\n", "c\n"}, "ab\nc\n", 5, 0, 1},
		{"long line inside batch", 4, 4, []string{"ab\nxxxxxx\ncd\n"}, "cd\n", 6, 1, 1},
		{"no trailing newline gets one", 10, 0, []string{"abc"}, "abc\n", 4, 0, 0},
		{"empty append", 4, 0, []string{"", "a\n", ""}, "a\n", 2, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStream(t, tc.limit, tc.hard)
			for _, a := range tc.appends {
				s.Append([]byte(a))
			}
			if got := content(t, s); got != tc.want {
				t.Errorf("content = %q, want %q", got, tc.want)
			}
			st := s.Stats()
			if s.Size() != tc.size || st.Size != tc.size {
				t.Errorf("Size = %d (stats %d), want %d", s.Size(), st.Size, tc.size)
			}
			if st.Discarded != tc.discarded || st.Unread != 0 || st.Dropped != tc.dropped {
				t.Errorf("discarded %d unread %d dropped %d, want %d 0 %d", st.Discarded, st.Unread, st.Dropped, tc.discarded, tc.dropped)
			}
			if kept := st.Size - st.Start; kept > s.soft || int64(st.Memory)+st.Disk != kept {
				t.Errorf("kept %d (memory %d disk %d) over the limit %d or not the window", kept, st.Memory, st.Disk, s.soft)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	s := New(Options{})
	if s.soft != DefaultLimit || s.hard != DefaultHardLimit {
		t.Errorf("limits %d %d, want %d %d", s.soft, s.hard, DefaultLimit, DefaultHardLimit)
	}
	if s := New(Options{Limit: 1000, HardLimit: 10}); s.hard != 2*1000+gapMax {
		t.Errorf("hard limit below the soft one: %d, want two chunks and a gap line", s.hard)
	}
	if s := New(Options{Limit: 64 << 20, HardLimit: 10}); s.hard != 64<<20 {
		t.Errorf("hard limit below the soft one: %d, want the soft one", s.hard)
	}
}

// lines returns "prefix i\n" for i in [from, to).
func lines(prefix string, from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, "%s %d\n", prefix, i)
	}
	return b.String()
}

func appendLines(s *Stream, prefix string, from, to int) {
	for i := from; i < to; i++ {
		s.Append(fmt.Appendf(nil, "%s %d\n", prefix, i))
	}
}

// TestReaderHoldsWindow checks that an open reader keeps what it has not
// read, under the hard bound, and that the window shrinks back to the soft
// bound once it has read it or closed.
func TestReaderHoldsWindow(t *testing.T) {
	s := newStream(t, 16, 1<<10)
	slow := s.NewReader()
	appendLines(s, "l", 0, 50) // 50 lines of 4-5 bytes: > 16
	st := s.Stats()
	if st.Discarded != 0 || st.Start != 0 {
		t.Fatalf("discarded %d lines (start %d) that an open reader had not read", st.Discarded, st.Start)
	}
	got, off := readAll(t, slow, 0, 7)
	if got != lines("l", 0, 50) {
		t.Fatalf("slow reader read %q", got)
	}
	if off != s.Size() {
		t.Errorf("file offset %d after reading all, size %d", off, s.Size())
	}
	// Having read it all, the reader lets the next chunk trim the window
	// down to what it has not read.
	appendLines(s, "l", 50, 60)
	if st := s.Stats(); st.Start < off-16 || st.Start > off || st.Unread != 0 || st.Discarded == 0 {
		t.Errorf("after reading: window %d..%d, discarded %d unread %d", st.Start, st.Size, st.Discarded, st.Unread)
	}
	// A second reader that never reads holds the window until it closes.
	idle := s.NewReader()
	appendLines(s, "m", 0, 40)
	if st := s.Stats(); st.Size-st.Start <= 16 {
		t.Errorf("window %d..%d trimmed past an idle reader", st.Start, st.Size)
	}
	idle.Close()
	slow.Close()
	if st := s.Stats(); st.Size-st.Start > 16 || st.Unread != 0 || st.Readers != 0 {
		t.Errorf("after close: window %d..%d, unread %d, readers %d", st.Start, st.Size, st.Unread, st.Readers)
	}
}

// TestDiskReleased checks that discarded chunks give their disk space
// back, so a burst that a slow reader held does not keep the disk.
func TestDiskReleased(t *testing.T) {
	s := newStream(t, 4096, 1<<20)
	r := s.NewReader()
	appendLines(s, strings.Repeat("d", 90), 0, 5000) // ~480 KB held by r
	blocks := func() int64 {
		var st unix.Stat_t
		if err := unix.Fstat(int(s.file.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	if held := blocks(); held < 400<<10 {
		t.Fatalf("spill file holds %d bytes while a reader holds ~480 KB", held)
	}
	r.Close()
	appendLines(s, "d", 0, 100) // fills the next chunk: discards down to the soft bound
	if left := blocks(); left > 3*4096 {
		t.Errorf("spill file still holds %d bytes after the reader left", left)
	}
}

// TestSpillReusesKeptSlot checks which free slot a spill takes after a
// burst of discards (a reader that held the window catching up): one that
// kept its blocks and pages, not one just punched, which costs fresh
// pages and the blocks' allocation at every seal from then on (DESIGN §4,
// the eleventh pass); and that the disk beyond spareSlots is given back.
func TestSpillReusesKeptSlot(t *testing.T) {
	// Full chunks (smaller ones are the soft bound, the window one
	// chunk): the window keeps one full chunk besides the one written.
	s := newStream(t, 2*maxChunk, 64*maxChunk)
	chunk := int64(s.chunkSize)
	r := s.NewReader()
	line := []byte(strings.Repeat("k", 1023) + "\n")
	for s.Stats().Disk < 20*(chunk-chunk%1024) { // held by r
		s.Append(line)
	}
	readAll(t, r, 0, 1<<20)
	r.Close()
	isHole := func(slot int) bool { return slotIsHole(s, slot) }
	if !slices.ContainsFunc(s.free, isHole) {
		// Nothing discarded yet (the next seal trims) or no punching.
		for off := s.curOff; s.curOff == off; {
			s.Append(line)
		}
		if !slices.ContainsFunc(s.free, isHole) {
			t.Skipf("no slot punched among %d free: the file system does not punch holes?", len(s.free))
		}
	}
	for i := range 3 {
		if len(s.free) == 0 {
			t.Fatalf("seal %d: no free slot", i)
		}
		next := s.free[len(s.free)-1]
		hole := isHole(next)
		for off := s.curOff; s.curOff == off; {
			s.Append(line)
		}
		if slot := s.chunks[len(s.chunks)-1].slot; slot != next {
			t.Fatalf("seal %d spilled into slot %d, not %d, the last of free", i, slot, next)
		}
		if hole {
			t.Fatalf("seal %d spilled into slot %d, punched, with %d slots free", i, next, len(s.free))
		}
		kept := 0
		for _, slot := range s.free {
			if !isHole(slot) {
				kept++
			}
		}
		if kept != spareSlots || len(s.free) <= spareSlots {
			t.Errorf("seal %d: %d of %d free slots keep their disk, want %d", i, kept, len(s.free), spareSlots)
		}
	}
}

// slotIsHole reports whether slot of s's spill file holds no data.
func slotIsHole(s *Stream, slot int) bool {
	chunk := int64(s.chunkSize)
	off := int64(slot) * chunk
	data, err := unix.Seek(int(s.file.Fd()), off, unix.SEEK_DATA)
	return errors.Is(err, unix.ENXIO) || (err == nil && data >= off+chunk)
}

// checkFree checks the free list's invariants: the first holes of free
// punched, the rest holding data (where a slot is whole blocks: a punch
// within a block leaves data), at most spareSlots of those; each slot
// once, made, and used by no chunk and no span.
func checkFree(t *testing.T, s *Stream, when string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holes < 0 || s.holes > len(s.free) || len(s.free)-s.holes > spareSlots {
		t.Fatalf("%s: %d holes of %d free slots, at most %d kept", when, s.holes, len(s.free), spareSlots)
	}
	used := map[int]bool{}
	for _, c := range s.chunks {
		used[c.slot] = true
	}
	if s.lent != nil {
		for slot := range s.lent.slots {
			used[slot] = true
		}
	}
	blocks := false
	if s.file != nil {
		var st unix.Stat_t
		if err := unix.Fstat(int(s.file.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		blocks = s.chunkSize%int(st.Blksize) == 0
	}
	for i, slot := range s.free {
		if used[slot] || slot < 0 || slot >= s.slots {
			t.Fatalf("%s: free slot %d used, or not of the %d made (free %v)", when, slot, s.slots, s.free)
		}
		used[slot] = true
		if blocks && slotIsHole(s, slot) != (i < s.holes) {
			t.Fatalf("%s: free slot %d (index %d, %d holes) punched %v", when, slot, i, s.holes, i >= s.holes)
		}
	}
}

// TestFreeSlots checks the free list's bookkeeping (checkFree) through
// what changes it: bursts of discards, a reader that holds the window
// again while the spills take the kept slots and then punched ones, spans
// that hold discarded slots until their release, and Truncate, with and
// without a span lent.
func TestFreeSlots(t *testing.T) {
	s := newStream(t, 1<<12, 1<<22)
	line := []byte(strings.Repeat("f", 99) + "\n")
	seals := func(n int) {
		for range n {
			for off := s.curOff; s.curOff == off; {
				s.Append(line)
			}
		}
	}
	// burst has a reader hold n seals' chunks, then read them and leave:
	// the next seal discards them.
	burst := func(n int) {
		r := s.NewReader()
		seals(n)
		readAll(t, r, 0, 1<<20)
		r.Close()
		seals(1)
	}
	burst(20)
	if !slices.ContainsFunc(s.free, func(slot int) bool { return slotIsHole(s, slot) }) {
		t.Skipf("no slot punched among %d free: the file system does not punch holes?", len(s.free))
	}
	checkFree(t, s, "burst")
	// The slots reserved ahead were punched with the first hole: none is
	// counted reserved, so that the file's next growth reserves again.
	if s.reserved > s.slots {
		t.Errorf("burst: %d slots counted reserved, %d made, the rest punched", s.reserved, s.slots)
	}

	// The spills take the kept slots, then punched ones, not all.
	r := s.NewReader()
	for i := range spareSlots + 3 {
		seals(1)
		checkFree(t, s, fmt.Sprintf("held seal %d", i))
	}
	readAll(t, r, 0, 1<<20)
	r.Close()
	seals(1)
	checkFree(t, s, "second burst")

	// Slots discarded while lent are freed at their release.
	r = s.NewReader()
	seals(10)
	var spans []Span
	buf := make([]byte, 1<<20)
	for off := int64(0); ; {
		n, sp, lent, err := r.ReadSpan(buf, off)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if lent && sp.Mem == nil {
			spans = append(spans, sp)
		} else if lent {
			sp.Release()
		}
		off += int64(n)
	}
	r.Close()
	seals(1)
	if len(spans) < spareSlots+2 || len(s.lent.held) < spareSlots+2 {
		t.Fatalf("%d spans lent, %d slots held, want more than %d", len(spans), len(s.lent.held), spareSlots+1)
	}
	checkFree(t, s, "spans held")
	for i := range spans {
		spans[i].Release()
		checkFree(t, s, fmt.Sprintf("release %d", i))
	}

	burst(10)
	s.Truncate()
	checkFree(t, s, "truncate")
	burst(10)
	checkFree(t, s, "burst after truncate")

	// Truncate with a span lent lets go of the file.
	r = s.NewReader()
	seals(3)
	_, sp, lent, err := r.ReadSpan(buf, s.Stats().Start)
	if err != nil || !lent || sp.Mem != nil {
		t.Fatalf("no span of the file: lent %v, err %v", lent, err)
	}
	r.Close()
	s.Truncate()
	if s.file != nil {
		t.Fatal("the file a span holds was kept")
	}
	checkFree(t, s, "truncate with a span")
	sp.Release()
	burst(10)
	checkFree(t, s, "burst after a span's truncate")
}

// TestHardBound checks the gap line and the counters when the hard bound
// discards what a reader has not read.
func TestHardBound(t *testing.T) {
	tests := []struct {
		name        string
		limit, hard int64
		before      int // lines read before the flood
		flood       int
		bufLen      int
	}{
		{"small chunks", 16, 32, 0, 100, 64},
		{"reader read some first", 16, 48, 5, 200, 64},
		{"one byte reads", 32, 64, 3, 100, 1},
		{"big reads", 64, 256, 0, 1000, 1 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStream(t, tc.limit, tc.hard)
			r := s.NewReader()
			defer r.Close()
			appendLines(s, "x", 0, tc.before)
			_, off := readAll(t, r, 0, tc.bufLen)
			appendLines(s, "x", tc.before, tc.before+tc.flood)
			got, end := readAll(t, r, off, tc.bufLen)
			if end > s.Size() {
				t.Errorf("file offset %d ran past the size %d", end, s.Size())
			}
			seen, missed := 0, uint64(0)
			next := tc.before
			for _, l := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
				if n, ok := gapCount(l); ok {
					missed += n
					next += int(n)
					continue
				}
				if l != fmt.Sprintf("x %d", next) {
					t.Fatalf("line %q, want x %d (after %d seen, %d missed)", l, next, seen, missed)
				}
				seen++
				next++
			}
			st := s.Stats()
			if seen+int(missed) != tc.flood || missed == 0 {
				t.Errorf("seen %d + missed %d != %d appended (gap lines must say)", seen, missed, tc.flood)
			}
			if st.Unread != missed {
				t.Errorf("stats unread %d, the reader missed %d", st.Unread, missed)
			}
			if st.Size-st.Start > s.hard {
				t.Errorf("window %d over the hard bound %d", st.Size-st.Start, s.hard)
			}
		})
	}
}

// TestSeveralReaders checks the discard rules with readers at different
// places: nothing one has not read goes under the hard bound, past it the
// slowest reader's loss is what status counts as unread, and every reader
// sees or is told of every line.
func TestSeveralReaders(t *testing.T) {
	tests := []struct {
		name     string
		progress []int // lines each reader reads before the second batch
		first    int   // lines appended before readers read
		second   int   // lines appended after
		unread   bool  // whether the hard bound must discard unread lines
	}{
		{"all keep up", []int{20, 20, 20}, 20, 20, false},
		{"one behind, under the hard bound", []int{16, 16, 0}, 16, 4, false},
		{"one behind, past the hard bound", []int{16, 16, 0}, 16, 200, true},
		{"staggered, past the hard bound", []int{0, 5, 10, 16}, 16, 300, true},
		{"none read", []int{0, 0}, 100, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStream(t, 64, 1) // 8 lines a chunk, hard bound 192 bytes
			line := func(i int) string { return fmt.Sprintf("l%06d", i) }
			readers := make([]*Reader, len(tc.progress))
			offs := make([]int64, len(tc.progress))
			outs := make([][]byte, len(tc.progress))
			for i := range readers {
				readers[i] = s.NewReader()
				defer readers[i].Close()
			}
			for i := range tc.first {
				s.Append([]byte(line(i) + "\n"))
			}
			for i, n := range tc.progress {
				if n == 0 {
					continue
				}
				buf := make([]byte, 8*n) // n whole lines, in reads that end at chunks
				for offs[i] < int64(len(buf)) {
					k, err := readers[i].ReadAt(buf[offs[i]:], offs[i])
					if err != nil {
						t.Fatalf("reader %d at %d: %v", i, offs[i], err)
					}
					offs[i] += int64(k)
				}
				outs[i] = buf
			}
			for i := tc.first; i < tc.first+tc.second; i++ {
				s.Append([]byte(line(i) + "\n"))
			}
			st := s.Stats()
			if st.Size-st.Start > s.hard {
				t.Errorf("window %d over the hard bound %d", st.Size-st.Start, s.hard)
			}
			if (st.Unread > 0) != tc.unread {
				t.Errorf("unread %d, want some: %v", st.Unread, tc.unread)
			}
			var worst uint64
			for i, r := range readers {
				rest, _ := readAll(t, r, offs[i], 13)
				out := append(outs[i], rest...)
				if err := checkLines(out, nil, line, 0, tc.first+tc.second); err != nil {
					t.Errorf("reader %d: %v", i, err)
				}
				var missed uint64
				for l := range strings.SplitSeq(string(out), "\n") {
					if n, ok := gapCount(l); ok {
						missed += n
					}
				}
				worst = max(worst, missed)
			}
			if st.Unread != worst {
				t.Errorf("status counts %d unread, the slowest reader missed %d", st.Unread, worst)
			}
		})
	}
}

// gapCount parses a gap line.
func gapCount(line string) (uint64, bool) {
	rest, ok := strings.CutPrefix(line, "lost: records=")
	if !ok {
		return 0, false
	}
	n, ok := strings.CutSuffix(rest, " reason=bound")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(n, 10, 64)
	return v, err == nil
}

// TestGapMidLine stops a reader inside a line, discards it, and checks that
// the gap line ends the fragment instead of splicing it to the next line.
func TestGapMidLine(t *testing.T) {
	s := newStream(t, 16, 16)
	r := s.NewReader()
	defer r.Close()
	s.Append([]byte("abcdefgh\n"))
	buf := make([]byte, 3)
	if n, err := r.ReadAt(buf, 0); n != 3 || err != nil || string(buf) != "abc" {
		t.Fatalf("first read %q %v", buf[:n], err)
	}
	appendLines(s, "yy", 0, 40)
	got, _ := readAll(t, r, 3, 5)
	if !strings.HasPrefix(got, "\nlost: records=") {
		t.Fatalf("after a discarded partial line: %q", got)
	}
}

// TestGapNeverAhead checks that a gap line replaces at least its own length
// when the reader stopped just before the end of a discarded chunk.
func TestGapNeverAhead(t *testing.T) {
	s := newStream(t, 8, 8)
	r := s.NewReader()
	defer r.Close()
	s.Append([]byte("a\nb\nc\n"))
	if s.hard != 2*8+gapMax {
		t.Fatalf("hard limit %d", s.hard)
	}
	buf := make([]byte, 4)
	n, _ := r.ReadAt(buf, 0) // "a\nb\n": stops 2 bytes before the chunk end
	appendLines(s, "q", 0, 20)
	got, off := readAll(t, r, int64(n), 64)
	if off > s.Size() {
		t.Fatalf("file offset %d past the size %d after %q", off, s.Size(), got)
	}
	if !strings.HasPrefix(got, "lost: records=") {
		t.Fatalf("no gap line: %q", got)
	}
}

// TestSeek reads at offsets other than where the reader stopped: they are
// stream offsets.
func TestSeek(t *testing.T) {
	s := newStream(t, 32, 32)
	appendLines(s, "s", 0, 100) // "s 0\n".. "s 99\n"
	r := s.NewReader()
	defer r.Close()
	st := s.Stats()
	tests := []struct {
		name string
		off  int64
		want string
	}{
		{"window start", st.Start, "s "},
		{"mid-line", st.Size - 2, "9\n"},
		{"end", st.Size, ""},
		{"past end", st.Size + 10, ""},
		{"discarded", 0, fmt.Sprintf("lost: records=%d reason=bound\n", s.Stats().Discarded)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			buf := make([]byte, 64)
			n, err := r.ReadAt(buf, tc.off)
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(buf[:n]), tc.want) {
				t.Errorf("ReadAt(%d) = %q, want prefix %q", tc.off, buf[:n], tc.want)
			}
		})
	}
	if _, err := r.ReadAt(make([]byte, 4), -1); !errors.Is(err, ErrNegativeOffset) {
		t.Errorf("negative offset: %v", err)
	}
}

// TestReadSizes reads lines of many lengths with every kind of buffer: the
// concatenation is the content and no read ends inside a line that fits.
func TestReadSizes(t *testing.T) {
	s := newStream(t, 4<<20, 0)
	var want strings.Builder
	for i := range 3000 {
		l := fmt.Sprintf("r%d %s\n", i, strings.Repeat("z", i*37%700))
		want.WriteString(l)
		s.Append([]byte(l))
	}
	long := strings.Repeat("L", 300<<10) + "\n" // longer than many buffers
	s.Append([]byte(long))
	want.WriteString(long)
	for _, size := range []int{1, 2, 3, 7, 64, 100, 4096, 65536, 128 << 10, 1 << 20} {
		r := s.NewReader()
		got, _ := readAll(t, r, 0, size)
		r.Close()
		if got != want.String() {
			t.Errorf("buffer %d: read %d bytes, differ from the %d appended", size, len(got), want.Len())
		}
	}
}

func TestTruncate(t *testing.T) {
	s := newStream(t, 16, 64)
	r := s.NewReader()
	defer r.Close()
	appendLines(s, "t", 0, 10)
	_, off := readAll(t, r, 0, 64)
	before := s.Stats().Discarded
	s.Truncate()
	if s.Size() != 0 || s.Resets() != 1 {
		t.Fatalf("after Truncate: size %d resets %d", s.Size(), s.Resets())
	}
	if got := content(t, s); got != "" {
		t.Fatalf("content after Truncate = %q", got)
	}
	s.Append([]byte("after\n"))
	// A reader that continues at its old offset reads past the new end;
	// one that starts over (tail after "file truncated") reads the new
	// content.
	if n, err := r.ReadAt(make([]byte, 64), off); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("read at the old offset %d: %d %v", off, n, err)
	}
	if got, _ := readAll(t, r, 0, 64); got != "after\n" {
		t.Errorf("read from 0 after truncation = %q", got)
	}
	if st := s.Stats(); st.Discarded != before || st.Disk != 0 {
		t.Errorf("truncation counted: %+v", st)
	}
}

// TestSpillFailure makes the spill file impossible: lines are discarded and
// counted, and a reader sees the gap.
func TestSpillFailure(t *testing.T) {
	s := New(Options{Limit: 16, HardLimit: 1 << 10, Dir: "/nonexistent/ptfs"})
	defer s.Close()
	r := s.NewReader()
	defer r.Close()
	appendLines(s, "f", 0, 20)
	st := s.Stats()
	if st.SpillErr == nil || st.SpillLost == 0 || st.SpillLost != st.Discarded {
		t.Fatalf("stats after spill failures: %+v", st)
	}
	got, _ := readAll(t, r, 0, 64)
	if !strings.HasPrefix(got, "lost: records=") {
		t.Errorf("reader after spill failure: %q", got)
	}
}

// TestPwrite checks the spill's raw write: all of the bytes at the
// offset (the file's bytes before it untouched), and the system call's
// error, wrapped as os.File's writes wrap theirs, for a file that cannot
// be written.
func TestPwrite(t *testing.T) {
	path := t.TempDir() + "/spill"
	if err := os.WriteFile(path, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		flag int
		data string
		err  error
		want string
	}{
		{"written", os.O_RDWR, "abcdefgh", nil, "0123abcdefgh"},
		{"read-only", os.O_RDONLY, "XXXXXXXX", unix.EBADF, "0123abcdefgh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.OpenFile(path, tc.flag, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			err = pwrite(f, []byte(tc.data), 4)
			var pe *os.PathError
			if !errors.Is(err, tc.err) || err != nil && (!errors.As(err, &pe) || pe.Path != path) {
				t.Errorf("error %v, want %v of %s", err, tc.err, path)
			}
			if got, _ := os.ReadFile(path); string(got) != tc.want {
				t.Errorf("file %q, want %q", got, tc.want)
			}
		})
	}
	// A device that is always full: the error of the first write.
	f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	if err := pwrite(f, []byte("x"), 0); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("write to /dev/full: %v, want ENOSPC", err)
	}
}

// fullTmpfs mounts a tmpfs of size bytes for the test, unmounted at its
// end; it skips the test where it may not mount.
func fullTmpfs(t *testing.T, size int) string {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// TestPwriteShort checks the raw write on a file system that fills up
// during the write: pwrite writes what fits (a short write), and the next
// one fails with ENOSPC, which pwrite returns after writing the rest
// it could.
func TestPwriteShort(t *testing.T) {
	dir := fullTmpfs(t, 256<<10)
	f, err := os.Create(dir + "/spill")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	err = pwrite(f, p, 4096)
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("1 MiB into a 256 KiB file system: %v, want ENOSPC", err)
	}
	got, err := os.ReadFile(dir + "/spill")
	if err != nil {
		t.Fatal(err)
	}
	// All that fitted, at its offset: the short write's bytes were kept
	// and the loop went on after them.
	if len(got) <= 4096 || !bytes.Equal(got[4096:], p[:len(got)-4096]) || !bytes.Equal(got[:4096], make([]byte, 4096)) {
		t.Errorf("file of %d bytes after the failed write, want the first bytes of p at 4096", len(got))
	}
}

// TestSpillWriteFailure checks the loss accounting when the spill file's
// writes fail (its file system full), not its creation: every line of a
// chunk that could not be written is counted lost with what went before
// it, the error is kept, and a reader reads the gap line, then the lines
// kept after it.
func TestSpillWriteFailure(t *testing.T) {
	dir := fullTmpfs(t, 64<<10)
	s := New(Options{Limit: 4 << 20, HardLimit: 8 << 20, Dir: dir})
	defer s.Close()
	r := s.NewReader()
	defer r.Close()
	const n = 300000 // 5 MB of lines: chunks that do not fit
	appendLines(s, "w", 0, n)
	st := s.Stats()
	if !errors.Is(st.SpillErr, unix.ENOSPC) || st.SpillLost == 0 || st.SpillLost != st.Discarded {
		t.Fatalf("stats after spill write failures: %+v", st)
	}
	got, _ := readAll(t, r, 0, 1<<20)
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if !strings.HasPrefix(lines[0], "lost: records=") {
		t.Fatalf("reader after spill write failures starts %q", lines[0])
	}
	// After the gap: the lines kept, up to the last, in order.
	first, err := strconv.Atoi(strings.TrimPrefix(lines[1], "w "))
	if err != nil {
		t.Fatalf("line after the gap %q", lines[1])
	}
	if uint64(first) != st.SpillLost || len(lines)-1 != n-first || lines[len(lines)-1] != fmt.Sprintf("w %d", n-1) {
		t.Errorf("%d lines from %q to %q after %d lost, want %d lines from w %d to w %d",
			len(lines)-1, lines[1], lines[len(lines)-1], st.SpillLost, n-int(st.SpillLost), st.SpillLost, n-1)
	}
}

// userfaultfd(2)'s ioctls (linux/userfaultfd.h; x/sys has none).
const (
	uffdioAPI        = 0xc018aa3f // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister   = 0xc020aa00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	uffdAPI          = 0xaa
	uffdRegisterMiss = 1 // UFFDIO_REGISTER_MODE_MISSING
	uffdMsgSize      = 32
)

// TestPwriteBlockedStopsNothing checks that a spill write the kernel
// blocks (a slow or frozen file system, dirty page throttling; here a
// page of the chunk whose first touch a userfaultfd holds) stops only its
// own goroutine: a garbage collection, which stops the world, goes on
// meanwhile. A write made outside a system call as the runtime sees it
// (RawSyscall) keeps its P running: the world cannot stop until the write
// returns, and every goroutine of the mount (FUSE, the perf reader) waits
// with it. The fault is released when a child process holding the
// userfaultfd's last copy exits, after two seconds.
func TestPwriteBlockedStopsNothing(t *testing.T) {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		t.Skipf("userfaultfd: %v", errno)
	}
	uffd := os.NewFile(fd, "userfaultfd")
	defer uffd.Close()
	api := [3]uint64{uffdAPI}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&api))); errno != 0 {
		t.Skipf("UFFDIO_API: %v", errno)
	}
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	reg := [4]uint64{uint64(uintptr(unsafe.Pointer(&mem[0]))), uint64(len(mem)), uffdRegisterMiss}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioRegister, uintptr(unsafe.Pointer(&reg))); errno != 0 {
		unix.Munmap(mem)
		t.Skipf("UFFDIO_REGISTER: %v", errno)
	}
	f, err := os.Create(t.TempDir() + "/spill")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	errc := make(chan error, 1)
	go func() { errc <- pwrite(f, mem, 0) }()
	// The write waits in the kernel once the fault is reported.
	var msg [uffdMsgSize]byte
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := unix.Read(int(fd), msg[:]); err == nil {
			break
		} else if !errors.Is(err, unix.EAGAIN) || time.Now().After(deadline) {
			t.Errorf("no fault of the write: %v", err)
			break
		}
		time.Sleep(time.Millisecond)
	}
	child := exec.Command("sleep", "2")
	child.ExtraFiles = []*os.File{uffd}
	startErr := child.Start()
	uffd.Close() // the child's copy is the last: the fault ends with it
	if startErr != nil {
		<-errc
		unix.Munmap(mem)
		t.Fatal(startErr)
	}
	start := time.Now()
	runtime.GC()
	gc := time.Since(start)
	err = <-errc
	child.Wait()
	unix.Munmap(mem)
	if err != nil {
		t.Errorf("write: %v", err)
	}
	t.Logf("GC of %v while the write waited", gc)
	if gc > time.Second {
		t.Errorf("a GC took %v while a spill write waited in the kernel: it waited for the write", gc)
	}
}

func TestClose(t *testing.T) {
	s := New(Options{Limit: 16, Dir: t.TempDir()})
	r := s.NewReader()
	appendLines(s, "c", 0, 20)
	if s.Stats().Disk == 0 {
		t.Fatal("nothing spilled")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadAt(make([]byte, 8), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("read after Close: %v", err)
	}
	appendLines(s, "c", 20, 40) // must not panic; counted
	if st := s.Stats(); st.Disk != 0 || st.SpillLost == 0 {
		t.Errorf("after Close: %+v", st)
	}
}

// TestSteadyStateNoAlloc checks the hot-path promise: appends, including
// those that spill a chunk and discard one, do not allocate.
func TestSteadyStateNoAlloc(t *testing.T) {
	s := newStream(t, 1<<12, 1<<13)
	r := s.NewReader()
	defer r.Close()
	line := []byte("record 1: event=ptfs_t/e id=0x6c2 args=[1, 2] tid=1 cpu=0\n")
	for range 400 { // fill past the hard bound: spills and discards
		s.Append(line)
	}
	if s.Stats().Unread == 0 {
		t.Fatal("setup did not discard")
	}
	allocs := testing.AllocsPerRun(1000, func() { s.Append(line) })
	if allocs != 0 {
		t.Fatalf("Append allocates %.1f times per call in steady state", allocs)
	}
	buf := make([]byte, 4096)
	var off int64
	allocs = testing.AllocsPerRun(100, func() {
		s.Append(line)
		n, _ := r.ReadAt(buf, off)
		off += int64(n)
	})
	if allocs != 0 {
		t.Fatalf("sequential reads allocate %.1f times per call", allocs)
	}
}

// follow reads r sequentially with buf-sized reads until stop is closed
// and a read then finds nothing more. It returns what it read and the
// offsets in it of each '\n' that a read began with right after a read
// that ended inside a line: where a mid-line gap line may start.
func follow(t testing.TB, r *Reader, size int, stop <-chan struct{}) ([]byte, map[int]bool) {
	buf := make([]byte, size)
	var out []byte
	cuts := map[int]bool{}
	var off int64
	for stopped := false; ; {
		n, err := r.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			t.Errorf("read at %d: %v", off, err)
			return out, cuts
		}
		out = collect(out, cuts, buf[:n])
		off += int64(n)
		if n == 0 {
			if stopped {
				return out, cuts
			}
			select {
			case <-stop:
				stopped = true
			default:
			}
		}
	}
}

// collect appends what a read returned to out, noting in cuts a '\n' that
// the read began with right after a read that ended inside a line.
func collect(out []byte, cuts map[int]bool, got []byte) []byte {
	if len(got) > 0 && got[0] == '\n' && len(out) > 0 && out[len(out)-1] != '\n' {
		cuts[len(out)] = true
	}
	return append(out, got...)
}

// checkLines checks what a reader read against line(i) for i in
// [first, total): every line whole and in order, each gap line's count
// covering exactly the lines that are not there. A line ended by a cut
// ('\n' of a mid-line gap line) is a fragment: a prefix of the line it
// was, counted by the gap line that must follow it.
func checkLines(out []byte, cuts map[int]bool, line func(int) string, first, total int) error {
	next, off := first, 0
	fragment := false
	for len(out) > off {
		j := bytes.IndexByte(out[off:], '\n')
		if j < 0 {
			return fmt.Errorf("unterminated last line %q", out[off:])
		}
		l := string(out[off : off+j])
		cut := cuts[off+j]
		off += j + 1
		if next >= total {
			return fmt.Errorf("line %q past the last line appended", l)
		}
		want := line(next)
		if g, ok := gapCount(l); ok {
			next += int(g)
			fragment = false
			continue
		}
		if fragment {
			return fmt.Errorf("%q after a fragment, want a gap line", l)
		}
		if !strings.HasPrefix(want, l) || (len(l) < len(want) && !cut) {
			return fmt.Errorf("line %q at byte %d, want %q, after %q", l, off, want, out[max(0, off-len(l)-200):off-len(l)-1])
		}
		if len(l) < len(want) {
			// Only a cut may end a line early, and a gap line must say
			// that the line was lost.
			fragment = true
			continue
		}
		next++
	}
	if fragment {
		return fmt.Errorf("fragment at the end, without a gap line")
	}
	if next != total {
		return fmt.Errorf("lines seen and reported missing end at %d, want %d", next, total)
	}
	return nil
}

// TestConcurrent runs one appender against several readers (meaningful
// under -race): each reader sees whole lines in order, and its lines plus
// the gap lines' counts make every line appended.
func TestConcurrent(t *testing.T) {
	s := newStream(t, 1<<10, 4<<10)
	const total = 20000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i, size := range []int{1, 7, 100, 4096} {
		r := s.NewReader()
		wg.Go(func() {
			defer r.Close()
			out, cuts := follow(t, r, size, stop)
			name := func(i int) string { return fmt.Sprintf("line %d", i) }
			if err := checkLines(out, cuts, name, 0, total); err != nil {
				t.Errorf("reader %d (%d-byte reads): %v", i, size, err)
			}
		})
	}
	// Half appended, half formatted in place (Tail, Commit), as the
	// record path does, while the readers read.
	for i := 0; i < total; {
		if b := s.Tail(); i%2 == 0 && cap(b) >= 16 {
			k := 0
			for ; k < 5 && i < total && cap(b)-len(b) >= 16; k++ {
				b = fmt.Appendf(b, "line %d\n", i)
				i++
			}
			s.Commit(b, k)
			continue
		}
		s.Append(fmt.Appendf(nil, "line %d\n", i))
		i++
	}
	close(stop)
	wg.Wait()
	if s.Stats().Unread == 0 {
		t.Log("no reader fell behind the hard bound this run")
	}
}

func BenchmarkAppend(b *testing.B) {
	s := New(Options{Limit: 1 << 20, Dir: b.TempDir()})
	defer s.Close()
	line := []byte("record 12345: event=ptfs_t/e id=0x6c2 args=[1, 140728356930600] tid=4711 cpu=3 time=8061.235912410\n")
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		s.Append(line)
	}
}

// BenchmarkFollow appends and reads back as a following reader does.
func BenchmarkFollow(b *testing.B) {
	s := New(Options{Limit: 1 << 20, Dir: b.TempDir()})
	defer s.Close()
	r := s.NewReader()
	defer r.Close()
	line := []byte("record 12345: event=ptfs_t/e id=0x6c2 args=[1, 140728356930600] tid=4711 cpu=3 time=8061.235912410\n")
	buf := make([]byte, 128<<10)
	var off int64
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Append(line)
		if i%1000 == 999 {
			for {
				n, err := r.ReadAt(buf, off)
				if err != nil {
					break
				}
				off += int64(n)
			}
		}
	}
}

// FuzzStream runs random sequences of appends, reads of every size by
// several readers, reader opens and truncations, and checks what every
// reader read: whole lines that were appended, in order, each at most
// once, and gap lines that count exactly the lines it did not see.
func FuzzStream(f *testing.F) {
	f.Add(uint8(8), uint8(16), []byte{4, 0, 0, 5, 0, 7, 1, 9, 5, 1, 0, 3, 2, 60, 5, 3, 6, 0, 0, 1})
	f.Add(uint8(30), uint8(0), []byte{4, 0, 3, 200, 5, 0, 6, 64, 7, 0, 0, 3, 4, 1, 5, 1})
	f.Add(uint8(0), uint8(255), bytes.Repeat([]byte{0, 50, 4, 0, 5, 2, 3, 9}, 40))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, limit, hard uint8, ops []byte) { fuzzStream(t, dir, limit, hard, ops) })
}

// fuzzStream is FuzzStream's body.
func fuzzStream(t *testing.T, dir string, limit, hard uint8, ops []byte) {
	{
		lim := int64(limit%64) + 8
		s := New(Options{Limit: lim, HardLimit: lim + int64(hard), Dir: dir})
		defer s.Close()
		var all []string // lines since the last truncation
		type reader struct {
			r    *Reader
			out  []byte
			cuts map[int]bool
			off  int64
		}
		var readers []*reader
		// A gap line waits for the lines that cover it: a reader
		// whose gap is still waiting must be in that state.
		waiting := func(r *Reader) bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return r.pos < s.start && s.end()-s.start < gapMax
		}
		// Spans lent by ReadSpan, with their bytes when lent, are held
		// across the ops that follow: discards, truncations and the
		// spills after them must not change them.
		type heldSpan struct {
			sp   Span
			want string
		}
		var held []heldSpan
		releaseSpans := func(keep int) {
			for len(held) > keep {
				h := held[0]
				held = held[1:]
				buf := make([]byte, h.sp.N)
				if _, err := h.sp.ReadAt(buf); err != nil || string(buf) != h.want {
					t.Fatalf("span changed while lent: %q (%v), lent as %q", buf, err, h.want)
				}
				h.sp.Release()
			}
		}
		defer releaseSpans(0) // after Close too
		read := func(rd *reader, size int) bool {
			buf := make([]byte, size)
			var n int
			var err error
			if size%2 == 0 {
				var sp Span
				var lent bool
				if n, sp, lent, err = rd.r.ReadSpan(buf, rd.off); lent {
					if _, err := sp.ReadAt(buf); err != nil {
						t.Fatalf("read span: %v", err)
					}
					held = append(held, heldSpan{sp, string(buf[:n])})
				}
			} else {
				n, err = rd.r.ReadAt(buf, rd.off)
			}
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("read: %v", err)
			}
			if n > 0 && buf[n-1] != '\n' && n != size {
				t.Fatalf("read of %d returned a partial line %q", size, buf[:n])
			}
			rd.out = collect(rd.out, rd.cuts, buf[:n])
			rd.off += int64(n)
			return n > 0
		}
		check := func() {
			for i, rd := range readers {
				for read(rd, 13) {
				}
				if rd.off > s.Size() {
					t.Fatalf("reader %d: file offset %d past the size %d", i, rd.off, s.Size())
				}
				total := len(all)
				if waiting(rd.r) {
					s.mu.Lock()
					total = int(rd.r.line) // what it has been told of so far
					s.mu.Unlock()
				}
				if err := checkLines(rd.out, rd.cuts, func(i int) string { return all[i] }, 0, total); err != nil {
					t.Fatalf("reader %d, %d lines: %v\n%q", i, len(all), err, rd.out)
				}
				rd.r.Close()
			}
			readers = nil
		}
		line := func(arg byte) string {
			l := strconv.Itoa(len(all)) + " "
			return l + strings.Repeat("x", int(arg)%int(max(1, lim-int64(len(l)))))
		}
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i], ops[i+1]
			switch op % 8 {
			case 0, 1, 2:
				l := line(arg)
				s.Append([]byte(l + "\n"))
				all = append(all, l)
			case 3: // several lines in one append, or formatted in place
				var b []byte
				if arg%2 == 1 {
					b = s.Tail()
				}
				for range arg % 5 {
					l := line(arg)
					b = append(append(b, l...), '\n')
					all = append(all, l)
				}
				if arg%2 == 1 {
					s.Commit(b, int(arg%5))
				} else {
					s.Append(b)
				}
			case 4:
				readers = append(readers, &reader{r: s.NewReader(), cuts: map[int]bool{}})
			case 5, 6:
				if len(readers) > 0 {
					read(readers[int(arg)%len(readers)], int(arg)%70+1)
				}
			case 7:
				check()
				s.Truncate()
				all = nil
			}
			if st := s.Stats(); st.Size-st.Start > s.hard {
				t.Fatalf("window %d over the hard bound %d", st.Size-st.Start, s.hard)
			}
			releaseSpans(int(arg % 4))
			checkFree(t, s, fmt.Sprintf("op %d", i/2))
		}
		check()
	}
}

// TestSpillReserve checks that the spill file's disk is allocated ahead,
// reserveSlots chunks at a time and never beyond what the hard bound can
// use, and that a truncation reserves again.
func TestSpillReserve(t *testing.T) {
	fileStat := func(s *Stream) (size, disk int64) {
		var st unix.Stat_t
		if err := unix.Fstat(int(s.file.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		return st.Size, st.Blocks * 512
	}
	for _, tc := range []struct {
		hard     int64
		reserved int // slots allocated after the first spill
	}{
		{1 << 20, reserveSlots},
		// hard is raised to 2 chunks and a gap line: 2 slots in the
		// window, spareSlots free, and the chunk being sealed.
		{1, 2 + spareSlots + 1},
	} {
		s := newStream(t, 4096, tc.hard)
		r := s.NewReader() // holds the chunks in the window
		line := strings.Repeat("r", 99) + "\n"
		for s.Stats().Disk == 0 {
			s.Append([]byte(line))
		}
		if s.reserved != tc.reserved {
			t.Errorf("hard %d: %d slots reserved, want %d", tc.hard, s.reserved, tc.reserved)
		}
		if size, disk := fileStat(s); size != int64(tc.reserved)*4096 || disk < size {
			t.Errorf("hard %d: spill file size %d disk %d, want %d of both", tc.hard, size, disk, tc.reserved*4096)
		}
		s.Truncate()
		if s.reserved != 0 {
			t.Errorf("hard %d: %d slots reserved after truncate", tc.hard, s.reserved)
		}
		r.Close()
		r = s.NewReader() // a reader of the new content
		for s.Stats().Disk == 0 {
			s.Append([]byte(line))
		}
		if s.reserved != tc.reserved {
			t.Errorf("hard %d: %d slots reserved after truncate and a spill, want %d", tc.hard, s.reserved, tc.reserved)
		}
		r.Close()
	}
}

// TestLastChunkInMemory checks that the last full chunk is read from
// memory and older ones from the spill file: with the file's copy of
// every chunk overwritten, a reader gets the last chunk's lines as they
// were appended and the older chunks' as the file now has them.
func TestLastChunkInMemory(t *testing.T) {
	s := newStream(t, 1<<12, 1<<20)
	// An open reader keeps the window from 0 under the hard bound.
	r := s.NewReader()
	defer r.Close()
	appendLines(s, "line", 0, 1000)
	st := s.Stats()
	if len(s.chunks) < 2 || st.Start != 0 {
		t.Fatalf("setup: %d chunks, window from %d", len(s.chunks), st.Start)
	}
	want := lines("line", 0, 1000)
	last := s.chunks[len(s.chunks)-1]
	var spoiled []byte // the file's chunks now: one line of x each
	for _, c := range s.chunks {
		x := append(bytes.Repeat([]byte("x"), c.n-1), '\n')
		if _, err := s.file.WriteAt(x, int64(c.slot)*int64(s.chunkSize)); err != nil {
			t.Fatal(err)
		}
		spoiled = append(spoiled, x...)
	}
	got, _ := readAll(t, r, 0, 1<<20)
	if len(got) != len(want) {
		t.Fatalf("read %d bytes, want %d", len(got), len(want))
	}
	if a, b := got[last.off:last.end()], want[last.off:last.end()]; a != b {
		t.Errorf("last full chunk read %q, want %q", a, b)
	}
	if a, b := got[last.end():], want[last.end():]; a != b {
		t.Errorf("chunk being written read %q, want %q", a, b)
	}
	if got[:last.off] != string(spoiled[:last.off]) {
		t.Errorf("older chunks did not come from the spill file: %q", got[:min(len(got), 80)])
	}
}

// TestTailCommit checks lines formatted in place into Tail and committed:
// taken without a copy, or copied to the start where the stream was
// emptied meanwhile.
func TestTailCommit(t *testing.T) {
	s := newStream(t, 1<<12, 1<<20)
	r := s.NewReader()
	defer r.Close()
	b := fmt.Appendf(s.Tail(), "line %d\n", 0)
	at := unsafe.SliceData(b)
	s.Commit(b, 1)
	if unsafe.SliceData(s.cur) != at {
		t.Errorf("Commit copied lines formatted in place")
	}
	if got, _ := readAll(t, r, 0, 1<<20); got != lines("line", 0, 1) {
		t.Errorf("read %q, want %q", got, lines("line", 0, 1))
	}
	// Emptied meanwhile: copied to the start.
	b = s.Tail()
	s.Truncate()
	s.Commit(append(b, "after\n"...), 1)
	if got, _ := readAll(t, r, 0, 1<<20); got != "after\n" {
		t.Errorf("after Truncate read %q, want %q", got, "after\n")
	}
}

// TestCommitAfterTruncate checks the line count of lines formatted in
// place by Tail and committed after Truncate emptied the chunk: Commit
// copies them to the chunk's start, over their own first bytes when the
// tail began before their end, and they must be counted as written (the
// count feeds the gap lines' loss counts).
func TestCommitAfterTruncate(t *testing.T) {
	for _, tc := range []struct {
		name, before, tail string
		lines              int
	}{
		{"overlapping", "a\n", "bcdef\n", 1},
		{"overlapping, two lines", "a\n", "bc\nde\n", 2},
		{"apart", "aaaaaaaaaaaaaaaaaaaaa\n", "bcdef\n", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStream(t, 1<<12, 1<<20)
			r := s.NewReader()
			defer r.Close()
			s.Append([]byte(tc.before))
			b := s.Tail()
			s.Truncate()
			s.Commit(append(b, tc.tail...), tc.lines)
			if got, _ := readAll(t, r, 0, 1<<20); got != tc.tail {
				t.Errorf("read %q, want %q", got, tc.tail)
			}
			if s.lines != uint64(tc.lines) {
				t.Errorf("%d lines counted, want %d", s.lines, tc.lines)
			}
		})
	}
}

// TestTailCommitContent checks that what Tail and Commit wrote reads back
// as the lines, across chunks.
func TestTailCommitContent(t *testing.T) {
	s := newStream(t, 1<<12, 1<<20)
	r := s.NewReader()
	defer r.Close()
	for i := 0; i < 2000; {
		b := s.Tail()
		if cap(b) < 16 {
			s.Append(fmt.Appendf(nil, "line %d\n", i))
			i++
			continue
		}
		k := 0
		for ; i < 2000 && cap(b)-len(b) >= 16; i, k = i+1, k+1 {
			b = fmt.Appendf(b, "line %d\n", i)
		}
		s.Commit(b, k)
	}
	if got, _ := readAll(t, r, 0, 1<<20); got != lines("line", 0, 2000) {
		t.Errorf("read %d bytes, want the %d of the lines", len(got), len(lines("line", 0, 2000)))
	}
	// The lines as Commit was told them, in place, and as Append counted
	// them: the line numbers that the loss counts are taken from.
	if s.lines != 2000 {
		t.Errorf("%d lines counted, want 2000", s.lines)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		b := s.Tail()
		if cap(b) < 16 {
			s.Append([]byte("line x\n"))
			return
		}
		s.Commit(append(b, "line x\n"...), 1)
	})
	if allocs != 0 {
		t.Errorf("Tail and Commit allocate %.1f times a line", allocs)
	}
}

// readSpans reads r from off to the end with ReadSpan and a buffer of bufLen,
// the spans' bytes read at once and each released at once, and returns the
// content and how many reads were spans of the spill file and of memory.
func readSpans(t testing.TB, r *Reader, off int64, bufLen int) (content string, spans, memSpans int) {
	t.Helper()
	var out []byte
	buf := make([]byte, bufLen)
	for {
		n, sp, lent, err := r.ReadSpan(buf, off)
		if errors.Is(err, io.EOF) {
			return string(out), spans, memSpans
		}
		if err != nil {
			t.Fatalf("ReadSpan(%d): %v", off, err)
		}
		if lent {
			if sp.Mem != nil {
				memSpans++
			} else {
				spans++
			}
			if sp.N != n {
				t.Fatalf("span of %d bytes for a read of %d", sp.N, n)
			}
			if _, err := sp.ReadAt(buf); err != nil {
				t.Fatal(err)
			}
			sp.Release()
		}
		out = append(out, buf[:n]...)
		off += int64(n)
	}
}

// TestReadSpan checks that a read of a spilled chunk to its end is lent as
// a span of the spill file, with the content ReadAt gives, and that the
// lines the reader has read are counted as ReadAt counts them: a gap after
// it counts only what it missed.
func TestReadSpan(t *testing.T) {
	s := newStream(t, 1<<12, 1<<20)
	r := s.NewReader()
	defer r.Close()
	r2 := s.NewReader()
	defer r2.Close()
	appendLines(s, "line", 0, 2000)
	// Every chunk but the last full one (in memory) and the one being
	// written.
	wantSpans := len(s.chunks) - 1
	got, spans, memSpans := readSpans(t, r, 0, 1<<20)
	if want := lines("line", 0, 2000); got != want {
		t.Fatalf("read %d bytes, want %d: %q", len(got), len(want), got[:min(len(got), 80)])
	}
	// Those two are lent from memory.
	if spans != wantSpans || spans < 2 || memSpans != 2 {
		t.Errorf("%d reads were spans of the file, want %d; %d of memory, want 2", spans, wantSpans, memSpans)
	}
	// A small buffer gets copies of the file, but for the read that ends
	// a chunk; memory is lent whatever the size.
	if got, spans, memSpans := readSpans(t, r2, 0, 100); got != lines("line", 0, 2000) || spans > wantSpans || memSpans < 2 {
		t.Errorf("small reads: %d spans, %d of memory, content ok %v", spans, memSpans, got == lines("line", 0, 2000))
	}
	if st := s.Stats(); st.Unread != 0 {
		t.Errorf("stats after reads: %+v", st)
	}
}

// TestSpanLent checks that a span's bytes stay while it is lent: its chunk
// discarded by the hard bound and many chunks spilled after it, the stream
// truncated, or closed; and that its release frees the slot, or closes a
// file the stream let go of.
func TestSpanLent(t *testing.T) {
	for _, then := range []string{"discard", "truncate", "close"} {
		t.Run(then, func(t *testing.T) {
			fds := countFDs(t)
			s := New(Options{Limit: 1 << 12, HardLimit: 1 << 16, Dir: t.TempDir()})
			r := s.NewReader()
			appendLines(s, "a", 0, 3000)
			buf := make([]byte, 1<<20)
			n, sp, lent, err := r.ReadSpan(buf, 0)
			if err != nil || !lent {
				t.Fatalf("first read: %d %v lent %v", n, err, lent)
			}
			want := lines("a", 0, 3000)[:n]
			switch then {
			case "discard":
				// Far over the hard bound: the lent chunk is discarded
				// and the slots are reused many times.
				appendLines(s, "b", 0, 30000)
				if s.Stats().Start < int64(n) {
					t.Fatal("the lent chunk was not discarded")
				}
			case "truncate":
				s.Truncate()
				appendLines(s, "b", 0, 5000)
			case "close":
				r.Close()
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			got := make([]byte, n)
			if _, err := sp.ReadAt(got); err != nil || string(got) != want {
				t.Fatalf("span after %s: %q (%v), want %q", then, got[:min(n, 40)], err, want[:min(n, 40)])
			}
			slots := s.slots
			sp.Release()
			sp.Release() // a second release does nothing
			if then == "discard" {
				// Freed: the next spills reuse it, the file does not grow.
				appendLines(s, "c", 0, 30000)
				if s.slots > slots+1 {
					t.Errorf("%d slots after the release, %d before", s.slots, slots)
				}
			}
			r.Close()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if got := countFDs(t); got != fds {
				t.Errorf("%d fds after release and Close, %d before", got, fds)
			}
		})
	}
}

// TestMemSpanLent checks that a span of a chunk still in memory keeps its
// bytes while lent, whatever comes after (the chunk sealed and the next
// two written in other buffers, the stream truncated, or closed), and that
// its buffer, let go of while lent, comes back at its release as the next
// chunk's: no new buffer, whose fresh pages each cost a fault.
func TestMemSpanLent(t *testing.T) {
	for _, tc := range []struct {
		then  string
		spare bool // the buffer comes back at the release
	}{
		{"nothing", false},
		{"seal", true},
		{"truncate", true},
		{"close", false},
	} {
		t.Run(tc.then, func(t *testing.T) {
			s := New(Options{Limit: 1 << 12, HardLimit: 1 << 16, Dir: t.TempDir()})
			defer s.Close()
			r := s.NewReader()
			defer r.Close()
			appendLines(s, "a", 0, 100) // in the chunk being written
			buf := make([]byte, 1<<20)
			n, sp, lent, err := r.ReadSpan(buf, 0)
			if err != nil || !lent || sp.Mem == nil || sp.N != n {
				t.Fatalf("read: %d %v lent %v mem %v N %d", n, err, lent, sp.Mem != nil, sp.N)
			}
			want := string(sp.Mem)
			lentBuf := unsafe.SliceData(s.cur[:1])
			switch tc.then {
			case "seal":
				// Two chunks sealed: the lent buffer would be the second's.
				appendLines(s, "b", 0, 2000)
			case "truncate":
				s.Truncate()
				appendLines(s, "b", 0, 100)
			case "close":
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				appendLines(s, "b", 0, 1000) // later appends keep writing
			}
			if string(sp.Mem) != want {
				t.Fatalf("span after %s: %.40q, lent as %.40q", tc.then, sp.Mem, want)
			}
			sp.Release()
			sp.Release() // a second release does nothing
			if len(s.memLent) != 0 {
				t.Errorf("%d buffers lent after the release", len(s.memLent))
			}
			if got := s.spare != nil && unsafe.SliceData(s.spare[:1]) == lentBuf; got != tc.spare {
				t.Errorf("lent buffer the spare after the release: %v, want %v", got, tc.spare)
			}
			if tc.spare {
				// Lend the chunk being written again and seal two: the
				// spare is the buffer that replaces it.
				spare := unsafe.SliceData(s.spare[:1])
				_, sp, lent, err := r.ReadSpan(buf, s.Size()-1)
				if err != nil || !lent || sp.Mem == nil {
					t.Fatalf("second read: %v lent %v", err, lent)
				}
				appendLines(s, "c", 0, 2000)
				if s.spare != nil || (unsafe.SliceData(s.cur[:1]) != spare && unsafe.SliceData(s.last[:1]) != spare) {
					t.Error("the spare was not taken by the next chunks")
				}
				sp.Release()
			}
		})
	}
}

// countFDs counts this process's open file descriptors.
func countFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestSpanConcurrent lends spans to readers while an appender fills, and
// so discards and truncates, a stream over its hard bound, and releases
// them later from another goroutine, as FUSE does once the reply is
// written: a span's bytes stay what they were when lent (its slot is not
// reused, its file not closed), and every file is closed at the end.
func TestSpanConcurrent(t *testing.T) {
	fds := countFDs(t)
	s := New(Options{Limit: 1 << 12, HardLimit: 1 << 15, Dir: t.TempDir()})
	stop := make(chan struct{})
	var appender sync.WaitGroup
	appender.Add(1)
	go func() {
		defer appender.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			s.Append(fmt.Appendf(nil, "line %d\n", i))
			if i%20000 == 19999 {
				s.Truncate()
			}
		}
	}()
	type lentSpan struct {
		sp   Span
		when []byte // its bytes when lent
	}
	lentCh := make(chan lentSpan, 16)
	var releaser sync.WaitGroup
	releaser.Add(1)
	spans := 0
	go func() {
		defer releaser.Done()
		for l := range lentCh {
			spans++
			time.Sleep(200 * time.Microsecond) // the appender goes on meanwhile
			now := make([]byte, l.sp.N)
			if _, err := l.sp.ReadAt(now); err != nil {
				t.Error(err)
			} else if !bytes.Equal(now, l.when) {
				t.Errorf("a span's bytes changed while lent: %.20q..., lent as %.20q...", now, l.when)
			}
			l.sp.Release()
		}
	}()
	var readers sync.WaitGroup
	for range 3 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			r := s.NewReader()
			defer r.Close()
			buf := make([]byte, 1<<20)
			var off int64
			for end := time.Now().Add(time.Second); time.Now().Before(end); {
				n, sp, lent, err := r.ReadSpan(buf, off)
				if err != nil && !errors.Is(err, io.EOF) {
					t.Error(err)
					return
				}
				if lent {
					when := make([]byte, sp.N)
					if _, err := sp.ReadAt(when); err != nil {
						t.Error(err)
					}
					lentCh <- lentSpan{sp, when}
				}
				off += int64(n)
			}
		}()
	}
	readers.Wait()
	close(lentCh)
	releaser.Wait()
	close(stop)
	appender.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if spans == 0 {
		t.Error("no read was lent")
	}
	t.Logf("%d spans lent", spans)
	if got := countFDs(t); got != fds {
		t.Errorf("%d fds after Close, %d before", got, fds)
	}
}

// stressLine is line i of TestMemSpanStress: its number and a payload
// that depends on it, so that a reader can tell a line from a torn or
// overwritten one.
func stressLine(b []byte, i int) []byte {
	b = fmt.Appendf(b, "%08d ", i)
	for k := range i%41 + 1 {
		b = append(b, byte('a'+(i+k)%26))
	}
	return append(b, '\n')
}

// checkStressLines checks that p is whole lines of stressLine or gap
// lines, numbered on from *next (-1: any) with each gap's count skipped,
// and moves *next past them.
func checkStressLines(p []byte, next *int) error {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			return fmt.Errorf("a read ends inside a line: %.60q", p)
		}
		l := p[:i+1]
		p = p[i+1:]
		if n, ok := gapCount(string(l[:len(l)-1])); ok {
			if *next >= 0 {
				*next += int(n)
			}
			continue
		}
		num, err := strconv.Atoi(string(l[:min(8, len(l))]))
		if err != nil {
			return fmt.Errorf("not a line: %.60q", l)
		}
		if want := stressLine(nil, num); !bytes.Equal(l, want) {
			return fmt.Errorf("line %d torn or overwritten: %.60q, want %.60q", num, l, want)
		}
		if *next >= 0 && num != *next {
			return fmt.Errorf("line %d after line %d", num, *next-1)
		}
		*next = num + 1
	}
	return nil
}

// TestMemSpanStress has readers follow the tail with ReadSpan, holding
// the spans a while (as go-fuse does until its writev is done), while the
// appender writes lines with Append and in place (Tail, Commit), chunks
// are sealed and discarded, the stream is truncated and at last closed:
// every span's bytes must stay what they were when lent until released,
// and be whole lines of what was written, in order; under -race, the
// readers' reads of lent bytes against the appender's writes show any
// overlap. At the end no buffer is still held.
func TestMemSpanStress(t *testing.T) {
	s := New(Options{Limit: 1 << 12, HardLimit: 1 << 14, Dir: t.TempDir()})
	const readers = 4
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the appender
		defer wg.Done()
		var scratch []byte
		for i := 0; i < 200000; i++ {
			if i%3 == 0 {
				// In place; a line that does not fit the tail is
				// formatted elsewhere and appended.
				tail := s.Tail()
				line := stressLine(tail, i)
				if cap(line) != cap(tail) {
					scratch = stressLine(scratch[:0], i)
					line = scratch
				}
				s.Commit(line, 1)
			} else {
				scratch = stressLine(scratch[:0], i)
				s.Append(scratch)
			}
			if i%5000 == 4999 {
				runtime.Gosched()
			}
		}
		close(done)
	}()
	wg.Add(1)
	go func() { // `: > records` now and then
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(3 * time.Millisecond):
				s.Truncate()
			}
		}
	}()
	type held struct {
		sp   Span
		when []byte
	}
	var lentMem, lentFile atomic.Int64
	for k := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.NewReader()
			defer r.Close()
			buf := make([]byte, 64<<k) // 64 B to 512 B: more than a line
			var hold []held
			release := func(h held) {
				now := make([]byte, h.sp.N)
				if _, err := h.sp.ReadAt(now); err != nil {
					t.Error(err)
				} else if !bytes.Equal(now, h.when) {
					t.Errorf("lent bytes changed before their release: %.60q, lent as %.60q", now, h.when)
				}
				h.sp.Release()
			}
			defer func() {
				for _, h := range hold {
					release(h)
				}
			}()
			var off int64
			next, resets := -1, s.Resets()
			for {
				n, sp, lent, err := r.ReadSpan(buf, off)
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil && !errors.Is(err, io.EOF) {
					t.Error(err)
					return
				}
				got := buf[:n]
				if lent {
					got = make([]byte, sp.N)
					if _, err := sp.ReadAt(got); err != nil {
						t.Error(err)
						return
					}
					if sp.Mem != nil {
						lentMem.Add(1)
					} else {
						lentFile.Add(1)
					}
					hold = append(hold, held{sp, got})
				}
				if now := s.Resets(); now != resets {
					// Truncated meanwhile: what was read may start
					// inside a line. Start over, as tail -F does.
					resets, off, next = now, 0, -1
				} else if err := checkStressLines(got, &next); err != nil {
					t.Error(err)
					return
				} else {
					off += int64(n)
				}
				if len(hold) > k+1 {
					release(hold[0])
					hold = slices.Delete(hold, 0, 1)
				}
				if n == 0 {
					select {
					case <-done:
						if len(hold) > 0 {
							continue // read what is left while holding spans
						}
						return
					default:
						runtime.Gosched()
					}
				}
			}
		}()
	}
	// Close while readers still hold spans.
	<-done
	time.Sleep(time.Millisecond)
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	wg.Wait()
	t.Logf("spans lent: %d of memory, %d of the file", lentMem.Load(), lentFile.Load())
	if lentMem.Load() == 0 {
		t.Error("no read of memory was lent")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.memLent) != 0 || s.spare != nil {
		t.Errorf("after Close and every release: %d buffers held, spare %v", len(s.memLent), s.spare != nil)
	}
}

// TestMemSpanLastReleased checks a span of the last full chunk released
// while that chunk is still last: its buffer is still the Stream's, so it
// must not become the spare too (the next seal would take it for the
// chunk being written while it is last: one buffer written as both),
// and that Close lets go of the spare.
func TestMemSpanLastReleased(t *testing.T) {
	s := New(Options{Limit: 1 << 12, HardLimit: 1 << 16, Dir: t.TempDir()})
	defer s.Close()
	r := s.NewReader()
	defer r.Close()
	appendLines(s, "a", 0, 800) // one chunk sealed, kept as last
	if len(s.chunks) != 1 {
		t.Fatalf("%d chunks, want 1", len(s.chunks))
	}
	_, sp, lent, err := r.ReadSpan(make([]byte, 1<<20), 0)
	if err != nil || !lent || sp.Mem == nil || unsafe.SliceData(sp.Mem) != unsafe.SliceData(s.last) {
		t.Fatalf("read of the last chunk: %v lent %v, not a span of its buffer", err, lent)
	}
	sp.Release()
	if s.spare != nil {
		t.Fatal("the last chunk's buffer became the spare at its release")
	}
	appendLines(s, "b", 0, 1000) // sealed again
	if unsafe.SliceData(s.cur[:1]) == unsafe.SliceData(s.last[:1]) {
		t.Fatal("the chunk being written and the last one share a buffer")
	}
	if got, want := content(t, s), lines("a", 0, 800)+lines("b", 0, 1000); !strings.HasSuffix(want, got) || got == "" {
		t.Errorf("content after the seal: %d bytes, not the end of what was appended", len(got))
	}
	// A buffer let go of while lent is the spare at its release, until
	// Close, which keeps only the chunk being written.
	_, sp, lent, err = r.ReadSpan(make([]byte, 1<<20), s.Size()-1)
	if err != nil || !lent || sp.Mem == nil {
		t.Fatalf("read of the chunk being written: %v lent %v", err, lent)
	}
	s.Truncate()
	sp.Release()
	if s.spare == nil {
		t.Fatal("no spare after the release of a buffer let go of")
	}
	if err := s.Close(); err != nil || s.spare != nil {
		t.Errorf("Close: %v; spare kept %v", err, s.spare != nil)
	}
}
