package fs

import (
	"context"
	"syscall"
	"testing"

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
