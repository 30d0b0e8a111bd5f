package fs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"ptfs/internal/testkit"
	"ptfs/stream"
)

// TestReadHandles checks reads at every kind of offset, and that an
// interrupted request (FUSE_INTERRUPT cancels its context) returns EINTR.
func TestReadHandles(t *testing.T) {
	s := stream.New(stream.Options{Limit: 100, Dir: t.TempDir()})
	defer s.Close()
	s.Append([]byte("hello\nworld\n"))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name   string
		handle string
		ctx    context.Context
		off    int64
		size   int
		want   string
		errno  syscall.Errno
	}{
		{"stream line longer than the buffer", "stream", context.Background(), 0, 3, "hel", 0},
		{"stream whole lines only", "stream", context.Background(), 6, 9, "world\n", 0},
		{"stream ends at the last line that fits", "stream", context.Background(), 0, 9, "hello\n", 0},
		{"stream at end", "stream", context.Background(), 12, 100, "", 0},
		{"stream past end", "stream", context.Background(), 60, 100, "", 0},
		{"stream negative", "stream", context.Background(), -1, 100, "", syscall.EINVAL},
		{"stream interrupted", "stream", cancelled, 0, 100, "", syscall.EINTR},
		{"gen start", "gen", context.Background(), 0, 3, "hel", 0},
		{"gen middle", "gen", context.Background(), 2, 2, "ll", 0},
		{"gen at end", "gen", context.Background(), 6, 10, "", 0},
		{"gen negative", "gen", context.Background(), -3, 10, "", syscall.EINVAL},
		{"gen interrupted", "gen", cancelled, 0, 10, "", syscall.EINTR},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dest := make([]byte, tc.size)
			var got []byte
			var errno syscall.Errno
			switch tc.handle {
			case "stream":
				r := s.NewReader()
				defer r.Close()
				res, e := (&streamHandle{s: s, r: r}).Read(tc.ctx, dest, tc.off)
				errno = e
				if res != nil {
					got, _ = res.Bytes(nil)
				}
			case "gen":
				res, e := (&genHandle{data: []byte("hello\n")}).Read(tc.ctx, dest, tc.off)
				errno = e
				if res != nil {
					got, _ = res.Bytes(nil)
				}
			}
			if errno != tc.errno {
				t.Fatalf("errno %v, want %v", errno, tc.errno)
			}
			if string(got) != tc.want {
				t.Errorf("read %q, want %q", got, tc.want)
			}
		})
	}
}

// TestReadSpliced checks reads of the spilled chunks of a records file
// with a buffer of a chunk: the handle lends them (go-fuse splices them
// from the spill file), and what a reader of the mount gets is the
// content, whole, in order.
func TestReadSpliced(t *testing.T) {
	dir := t.TempDir()
	tg, want := spilledTarget(t, dir, 5<<20, 97)
	r := tg.records.NewReader()
	res, errno := (&streamHandle{s: tg.records, r: r}).Read(context.Background(), make([]byte, 1<<20), 0)
	if _, ok := res.(*spanResult); !ok || errno != 0 {
		t.Fatalf("read of a spilled chunk: %T %v, want a span", res, errno)
	}
	res.Done()
	r.Close()

	// No collection from here: the spill file's finalizer would close
	// what a span never released (below).
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	got := readMounted(t, tg, 1<<20, len(want))
	if !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Fatalf("read %d bytes, want %d; first difference at %d: %q", len(got), len(want), i, got[i:min(len(got), i+40)])
	}
	// Every span was released once its reply was written (go-fuse's
	// Done, which may run just after the read returned): closed, the
	// stream keeps no spill file open.
	if err := tg.records.Close(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "spill files closed after Close (a span never released)", func() (string, bool) {
		open := fdsUnder(t, dir)
		return fmt.Sprint(open), len(open) == 0
	})
}

// spilledTarget is a fake target whose records stream (spilling into dir,
// closed at the test's end) holds lines of varied lengths (their padding
// cycling through mod) up to n bytes, most of them spilled; it returns the
// target and the stream's content.
func spilledTarget(t *testing.T, dir string, n, mod int) (*fakeTarget, []byte) {
	tg := newFakeTarget("t", "/bin/true")
	tg.records.Close()
	tg.records = stream.New(stream.Options{Limit: 16 << 20, Dir: dir})
	t.Cleanup(func() { tg.records.Close() })
	var want []byte
	for i := 0; len(want) < n; i++ {
		l := fmt.Appendf(nil, "record %d %s\n", i, strings.Repeat("x", i%mod))
		tg.records.Append(l)
		want = append(want, l...)
	}
	return tg, want
}

// fdsUnder returns this process's descriptors open on files in dir.
func fdsUnder(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var open []string
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, dir+"/") {
			open = append(open, e.Name()+" -> "+l)
		}
	}
	return open
}

// TestReadMemLent checks a read of the chunks still in memory: the handle
// lends their bytes as go-fuse's vectored result (Slices, written with the
// reply's header: no copy, no splice), and Done gives the buffer back, so
// that sealing the next chunks reuses it rather than allocating a chunk
// buffer per read (a lend never released would pin one each time).
func TestReadMemLent(t *testing.T) {
	const limit = 1 << 16 // a chunk
	s := stream.New(stream.Options{Limit: limit, Dir: t.TempDir()})
	defer s.Close()
	r := s.NewReader()
	defer r.Close()
	h := &streamHandle{s: s, r: r}
	line := []byte(strings.Repeat("x", 99) + "\n")
	fill := func() { // two chunks sealed
		for range 2 * limit / len(line) {
			s.Append(line)
		}
	}
	fill()
	dest := make([]byte, 1<<20)
	read := func() {
		res, errno := h.Read(context.Background(), dest, s.Size()-int64(len(line)))
		m, ok := res.(*memResult)
		if !ok || errno != 0 {
			t.Fatalf("read of the chunk being written: %T %v, want a *memResult", res, errno)
		}
		// go-fuse writes a result with Slices from its slices, as they are.
		sl, st := m.Slices()
		if !st.Ok() || len(sl) != 1 || !bytes.Equal(sl[0], line) || m.Size() != len(line) {
			t.Fatalf("Slices %q %v, size %d; want %q", sl, st, m.Size(), line)
		}
		res.Done()
	}
	read()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const rounds = 20
	for range rounds {
		read()
		fill()
	}
	runtime.ReadMemStats(&after)
	got := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d bytes allocated over %d reads and seals", got, rounds)
	if got > rounds*limit/2 {
		t.Error("lent chunk buffers not given back")
	}
}

// tailLine is line i of TestReadTailMounted: a number and a payload that
// depends on it, so that a torn or overwritten line shows.
func tailLine(b []byte, i int) []byte {
	b = fmt.Appendf(b, "%08d ", i)
	for k := range i%97 + 1 {
		b = append(b, byte('a'+(i+k)%26))
	}
	return append(b, '\n')
}

// TestReadTailMounted has readers of the mount follow a records file while
// the appender writes it, `: >` empties it now and then and the stream is
// closed at the end: go-fuse writes the lent bytes of the chunks in memory
// after the read returned, while the appender goes on in the same buffer,
// so every line read must be whole and in order (gap lines count what was
// skipped).
func TestReadTailMounted(t *testing.T) {
	tg := newFakeTarget("t", "/bin/true")
	tg.records.Close()
	tg.records = stream.New(stream.Options{Limit: 1 << 16, HardLimit: 1 << 18, Dir: t.TempDir()})
	mnt := mountFake(t, newFakeTracer(tg))
	path := filepath.Join(mnt, "t", "records")
	// truncs is odd while a truncation is under way.
	var truncs atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		var b []byte
		for i := range 300000 {
			b = tailLine(b[:0], i)
			tg.records.Append(b)
			if i%50000 == 49999 {
				truncs.Add(1)
				if err := os.Truncate(path, 0); err != nil {
					t.Error(err)
				}
				truncs.Add(1)
			}
		}
	}()
	var lines atomic.Int64
	for k := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(path)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			buf := make([]byte, 4<<10<<(3*k)) // 4 KiB, 32 KiB, 256 KiB
			next, off, seen := -1, int64(0), int64(0)
			var lastGap []byte
			for {
				tr := truncs.Load()
				if tr != seen || tr%2 == 1 {
					// Emptied since the last read: start over.
					next, off, seen = -1, 0, tr
				}
				// One pread, as a reader of the file does (os.File's
				// ReadAt would go on to fill buf, ending in a line's
				// part).
				n, err := syscall.Pread(int(f.Fd()), buf, off)
				if err == syscall.EINTR {
					// A signal (the runtime's preemption, more so
					// under -race) interrupted the FUSE request:
					// asked again, as os.File does.
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if truncs.Load() != tr {
					continue // emptied meanwhile
				}
				p := buf[:n]
				for len(p) > 0 {
					i := bytes.IndexByte(p, '\n')
					if i < 0 {
						t.Errorf("read ends inside a line: %.60q", p)
						return
					}
					l := p[:i+1]
					p = p[i+1:]
					var lost int
					if _, err := fmt.Sscanf(string(l), "lost: records=%d reason=bound\n", &lost); err == nil {
						if next >= 0 { // else the count is since the last `: >`
							next += lost
						}
						lastGap = l
						continue
					}
					num, err := strconv.Atoi(string(l[:min(8, len(l))]))
					if want := tailLine(nil, num); err != nil || !bytes.Equal(l, want) {
						t.Errorf("torn or overwritten line: %.60q", l)
						return
					}
					if next >= 0 && num != next {
						t.Errorf("line %d after line %d (last gap %q, at %d)", num, next-1, lastGap, off)
						return
					}
					next = num + 1
					lines.Add(1)
				}
				off += int64(n)
				if n == 0 {
					select {
					case <-done:
						return
					default:
						time.Sleep(100 * time.Microsecond)
					}
				}
			}
		}()
	}
	<-done
	if err := tg.records.Close(); err != nil {
		t.Error(err)
	}
	wg.Wait()
	t.Logf("%d lines read", lines.Load())
	if lines.Load() == 0 {
		t.Error("no line read")
	}
}

// TestReadCopiedVectored checks reads of spilled chunks with a buffer
// smaller than a chunk, as GNU tail's 8 KiB: the handle copies whole lines
// into dest and returns them as go-fuse's vectored result (Slices, one
// writev with the header), not as plain data, which go-fuse would first try
// to splice through a pipe. A reader of the mount gets the content, whole,
// in order.
func TestReadCopiedVectored(t *testing.T) {
	tg, want := spilledTarget(t, t.TempDir(), 3<<20, 89)
	r := tg.records.NewReader()
	dest := make([]byte, 8192)
	res, errno := (&streamHandle{s: tg.records, r: r}).Read(context.Background(), dest, 0)
	sl, ok := res.(interface {
		Slices() ([][]byte, fuse.Status)
	})
	if !ok || errno != 0 {
		t.Fatalf("8 KiB read of a spilled chunk: %T %v, want a vectored result", res, errno)
	}
	v, st := sl.Slices()
	if got := bytes.Join(v, nil); !st.Ok() || len(got) == 0 || len(got) != res.Size() || !bytes.HasPrefix(want, got) || got[len(got)-1] != '\n' {
		t.Fatalf("Slices: %d bytes (size %d, %v), want whole lines of the file's start", len(got), res.Size(), st)
	}
	res.Done()
	r.Close()

	if got := readMounted(t, tg, len(dest), len(want)); !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes in 8 KiB reads, want %d", len(got), len(want))
	}
}

// readMounted mounts a fake tracer of tg and reads its records file to the
// end in reads of size bytes; the file is closed when it returns. Past
// limit bytes it fails: a read that never reports the end (a bug) would
// otherwise loop until the test's timeout, leaving the test process stuck
// on its own mount.
func readMounted(t *testing.T, tg *fakeTarget, size, limit int) []byte {
	t.Helper()
	mnt := mountFake(t, newFakeTracer(tg))
	f, err := os.Open(filepath.Join(mnt, "t", "records"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []byte
	buf := make([]byte, size)
	for {
		n, err := f.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF || n == 0 {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > limit {
			t.Fatalf("read %d bytes of a file of %d and no end yet", len(got), limit)
		}
	}
}

// TestReadCopiedShort checks reads of a spilled chunk with a buffer shorter
// than its first line: the handle copies what fits, down to one byte, and
// returns it rather than the empty read that means the end.
func TestReadCopiedShort(t *testing.T) {
	s := stream.New(stream.Options{Limit: 16 << 20, Dir: t.TempDir()})
	defer s.Close()
	for i := 0; i < 3<<20; i += len("record\n") {
		s.Append([]byte("record\n"))
	}
	tests := []struct {
		size int
		want string
	}{
		{1, "r"},
		{2, "re"},
		{6, "record"},
		{7, "record\n"},
		{10, "record\n"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.size), func(t *testing.T) {
			r := s.NewReader()
			defer r.Close()
			res, errno := (&streamHandle{s: s, r: r}).Read(context.Background(), make([]byte, tc.size), 0)
			if errno != 0 || res == nil {
				t.Fatalf("read: %v %v", res, errno)
			}
			defer res.Done()
			got, st := res.Bytes(nil)
			if !st.Ok() || string(got) != tc.want || res.Size() != len(tc.want) {
				t.Errorf("read %q (size %d, %v), want %q", got, res.Size(), st, tc.want)
			}
		})
	}
}
