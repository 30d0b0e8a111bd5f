package stream

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
)

// content reads the whole current content through ReadAt in small chunks,
// as a FUSE reader would.
func content(t *testing.T, s *Stream) string {
	t.Helper()
	var out []byte
	buf := make([]byte, 3)
	for off := int64(0); ; {
		n, err := s.ReadAt(buf, off)
		out = append(out, buf[:n]...)
		off += int64(n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("ReadAt(%d): %v", off, err)
		}
		if n == 0 {
			t.Fatalf("ReadAt(%d) returned 0, nil", off)
		}
	}
	return string(out)
}

func TestAppendBound(t *testing.T) {
	tests := []struct {
		name      string
		limit     int
		appends   []string
		want      string
		rotations uint64
		dropped   uint64
	}{
		{"empty", 10, nil, "", 0, 0},
		{"fits", 10, []string{"ab\n", "cd\n"}, "ab\ncd\n", 0, 0},
		{"exactly limit", 6, []string{"ab\n", "cd\n"}, "ab\ncd\n", 0, 0},
		{"one over rotates", 6, []string{"ab\n", "cd\n", "e\n"}, "e\n", 1, 0},
		{"rotates twice", 4, []string{"ab\n", "cd\n", "ef\n"}, "ef\n", 2, 0},
		{"multi-line append rotates per line", 8, []string{"aaa\n", "bbb\nccc\n"}, "ccc\n", 1, 0},
		{"multi-line append keeps what fits", 12, []string{"aaa\n", "bbb\nccc\nddd\n"}, "ddd\n", 1, 0},
		{"line longer than limit dropped", 5, []string{"ab\n", "toolong\n", "c\n"}, "ab\nc\n", 0, 1},
		{"long line inside batch", 4, []string{"ab\nxxxxxx\ncd\n"}, "cd\n", 1, 1},
		{"no trailing newline", 10, []string{"abc"}, "abc", 0, 0},
		{"empty append", 4, []string{"", "a\n", ""}, "a\n", 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := New(tc.limit)
			for _, a := range tc.appends {
				s.Append([]byte(a))
			}
			if got := content(t, s); got != tc.want {
				t.Errorf("content = %q, want %q", got, tc.want)
			}
			if got := s.Size(); got != int64(len(tc.want)) {
				t.Errorf("Size = %d, want %d", got, len(tc.want))
			}
			if got := s.Rotations(); got != tc.rotations {
				t.Errorf("Rotations = %d, want %d", got, tc.rotations)
			}
			if got := s.Resets(); got != tc.rotations {
				t.Errorf("Resets = %d, want %d", got, tc.rotations)
			}
			if got := s.DroppedLines(); got != tc.dropped {
				t.Errorf("DroppedLines = %d, want %d", got, tc.dropped)
			}
			if m := s.memory(); m > s.memoryBound() {
				t.Errorf("memory %d exceeds the bound %d of limit %d", m, s.memoryBound(), tc.limit)
			}
		})
	}
}

func TestReadAt(t *testing.T) {
	s := New(100)
	s.Append([]byte("hello\nworld\n"))
	tests := []struct {
		name    string
		off     int64
		bufLen  int
		want    string
		wantErr error
	}{
		{"start", 0, 5, "hello", nil},
		{"middle", 6, 100, "world\n", nil},
		{"last byte", 11, 4, "\n", nil},
		{"at end", 12, 4, "", io.EOF},
		{"past end", 50, 4, "", io.EOF},
		{"negative", -1, 4, "", ErrNegativeOffset},
		{"empty buffer", 0, 0, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := make([]byte, tc.bufLen)
			n, err := s.ReadAt(p, tc.off)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if got := string(p[:n]); got != tc.want {
				t.Errorf("read %q, want %q", got, tc.want)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	s := New(100)
	s.Append([]byte("one\ntwo\n"))
	s.Truncate()
	if s.Size() != 0 || s.Resets() != 1 || s.Rotations() != 0 {
		t.Fatalf("after Truncate: size %d resets %d rotations %d, want 0 1 0",
			s.Size(), s.Resets(), s.Rotations())
	}
	if n, err := s.ReadAt(make([]byte, 4), 0); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("ReadAt after Truncate = %d, %v; want 0, EOF", n, err)
	}
	s.Append([]byte("three\n"))
	if got := content(t, s); got != "three\n" {
		t.Fatalf("content after Truncate+Append = %q", got)
	}
}

func TestDefaultLimit(t *testing.T) {
	for _, l := range []int{0, -5} {
		if got := New(l).Limit(); got != DefaultLimit {
			t.Errorf("New(%d).Limit() = %d, want %d", l, got, DefaultLimit)
		}
	}
}

// TestSteadyStateNoAlloc checks the hot-path promise: once the buffer has
// grown to the limit, appends and rotations do not allocate.
func TestSteadyStateNoAlloc(t *testing.T) {
	s := New(1 << 12)
	line := []byte("record 1: event=ptfs_t/e id=0x6c2 args=[1, 2] tid=1 cpu=0\n")
	for range 200 { // fill to the limit and rotate at least once
		s.Append(line)
	}
	if s.Rotations() == 0 {
		t.Fatal("setup did not rotate")
	}
	allocs := testing.AllocsPerRun(1000, func() { s.Append(line) })
	if allocs != 0 {
		t.Fatalf("Append allocates %.1f times per call in steady state", allocs)
	}
}

// TestConcurrent runs one appender against several readers (meaningful
// under -race) and checks every read sees whole lines of the expected form.
func TestConcurrent(t *testing.T) {
	s := New(1 << 10)
	const lines = 5000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 3; r++ {
		wg.Go(func() {
			buf := make([]byte, 256)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = s.Size()
				_ = s.Resets()
				n, err := s.ReadAt(buf, 0)
				if err != nil && !errors.Is(err, io.EOF) {
					t.Errorf("ReadAt: %v", err)
					return
				}
				// A read from offset 0 begins at a line start.
				if n > 0 && !strings.HasPrefix(string(buf[:n]), "line ") {
					t.Errorf("read from 0 starts mid-line: %q", buf[:n])
					return
				}
			}
		})
	}
	for i := range lines {
		s.Append(fmt.Appendf(nil, "line %d\n", i))
		if i%1000 == 500 {
			s.Truncate()
		}
	}
	close(stop)
	wg.Wait()
	if s.Rotations() == 0 {
		t.Errorf("expected rotations with limit 1 KiB and %d lines", lines)
	}
	got := content(t, s)
	if !strings.HasSuffix(got, fmt.Sprintf("line %d\n", lines-1)) {
		t.Errorf("content does not end with the last line: %q", got[max(0, len(got)-40):])
	}
	if !bytes.HasPrefix([]byte(got), []byte("line ")) {
		t.Errorf("content does not start with a line: %q", got[:min(40, len(got))])
	}
}

func BenchmarkAppend(b *testing.B) {
	s := New(1 << 20)
	line := []byte("record 12345: event=ptfs_t/e id=0x6c2 args=[1, 140728356930600] tid=4711 cpu=3 time=8061.235912410\n")
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		s.Append(line)
	}
}

// FuzzAppend feeds arbitrary text, split into appends at 0xff bytes, and
// compares with a line-at-a-time model of the documented bound.
func FuzzAppend(f *testing.F) {
	f.Add(uint8(8), []byte("ab\ncd\nef\n"))
	f.Add(uint8(4), []byte("ab\n\xfftoolong\n\xffc\n"))
	f.Add(uint8(1), []byte("\n\n\xff\n"))
	f.Fuzz(func(t *testing.T, limit uint8, data []byte) {
		s := New(int(limit) + 1)
		var model []byte
		var rotations, dropped uint64
		for _, chunk := range bytes.Split(data, []byte{0xff}) {
			s.Append(chunk)
			for rest := chunk; len(rest) > 0; {
				n := bytes.IndexByte(rest, '\n') + 1
				if n == 0 {
					n = len(rest)
				}
				line := rest[:n]
				rest = rest[n:]
				switch {
				case len(line) > s.Limit():
					dropped++
				case len(model)+len(line) > s.Limit():
					model = append(model[:0], line...)
					rotations++
				default:
					model = append(model, line...)
				}
			}
		}
		if got := content(t, s); got != string(model) {
			t.Fatalf("content %q, want %q", got, model)
		}
		if s.Size() > int64(s.Limit()) || s.memory() > s.memoryBound() {
			t.Fatalf("size %d memory %d over limit %d", s.Size(), s.memory(), s.Limit())
		}
		if s.Rotations() != rotations || s.DroppedLines() != dropped {
			t.Fatalf("rotations %d dropped %d, want %d %d", s.Rotations(), s.DroppedLines(), rotations, dropped)
		}
	})
}

// memory returns the bytes the stream holds allocated.
func (s *Stream) memory() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m := 0
	for _, c := range s.chunks {
		m += cap(c)
	}
	for _, c := range s.free {
		m += cap(c)
	}
	return m
}

// memoryBound is the most memory a stream may hold: its limit rounded up
// to whole chunks.
func (s *Stream) memoryBound() int {
	return (s.limit + s.chunk - 1) / s.chunk * s.chunk
}

// TestChunks reads across chunk boundaries and through a rotation of a
// stream bigger than one chunk, against the same lines kept in one slice.
func TestChunks(t *testing.T) {
	s := New(3*maxChunk + 100)
	var want []byte
	for i := 0; len(want) < 2*maxChunk+maxChunk/2; i++ {
		line := fmt.Appendf(nil, "record %d: %s\n", i, bytes.Repeat([]byte{'x'}, i%97))
		s.Append(line)
		want = append(want, line...)
	}
	if s.Size() != int64(len(want)) {
		t.Fatalf("size %d, want %d", s.Size(), len(want))
	}
	buf := make([]byte, 128<<10)
	for _, off := range []int{0, maxChunk - 10, maxChunk, 2*maxChunk - 1, len(want) - 5} {
		n, err := s.ReadAt(buf, int64(off))
		if err != nil {
			t.Fatalf("ReadAt(%d): %v", off, err)
		}
		if end := min(off+len(buf), len(want)); !bytes.Equal(buf[:n], want[off:end]) {
			t.Fatalf("ReadAt(%d): %d bytes differ from the content", off, n)
		}
	}
	// Past the limit the stream starts over and reuses its chunks: a
	// second round allocates nothing more.
	for s.Rotations() == 0 {
		s.Append(want[:maxChunk/4])
	}
	before := s.memory()
	for s.Rotations() == 1 {
		s.Append(want[:maxChunk/4])
	}
	if s.memory() != before || s.memory() > s.memoryBound() {
		t.Errorf("memory %d after the second rotation, %d after the first, bound %d", s.memory(), before, s.memoryBound())
	}
}
