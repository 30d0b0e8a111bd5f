package fs

import (
	"bytes"
	"errors"
	"strings"
	"syscall"
	"testing"
)

// writeOp is one write on a probe handle.
type writeOp struct {
	off  int64
	data string
}

func TestProbeWrite(t *testing.T) {
	tests := []struct {
		name     string
		appendTo bool
		ops      []writeOp
		wantSpec string // what SetProbe got last
		wantErr  syscall.Errno
	}{
		{"one write", false, []writeOp{{0, "0x10 %di\n"}}, "0x10 %di", 0},
		{"crlf trimmed", false, []writeOp{{0, "0x10\r\n"}}, "0x10", 0},
		{"two writes", false, []writeOp{{0, "0x1"}, {3, "0 %si\n"}}, "0x10 %si", 0},
		{"a partial line waits", false, []writeOp{{0, "0x10 %di"}}, "", 0},
		{"a bad partial line waits", false, []writeOp{{0, "zzz"}}, "", 0},
		{"overwrite in place", false, []writeOp{{0, "0x10 %di\n"}, {3, "2"}}, "0x12 %di", 0},
		{"append ignores offset", true, []writeOp{{500, "0x1"}, {7, "0\n"}}, "0x10", 0},
		{"hole refused", false, []writeOp{{4, "0x10"}}, "", syscall.EINVAL},
		{"negative offset", false, []writeOp{{-1, "0x10"}}, "", syscall.EINVAL},
		{"too long", false, []writeOp{{0, "0x1 " + strings.Repeat("a", maxSpec)}}, "", syscall.EFBIG},
		{"bad spec", false, []writeOp{{0, "zzz\n"}}, "zzz", syscall.EINVAL},
		{"refused site", false, []writeOp{{0, "0xdead\n"}}, "0xdead", syscall.EOPNOTSUPP},
		{"multi-line is the engine's to refuse", false, []writeOp{{0, "0x1\n0x2\n"}}, "0x1\n0x2", syscall.EINVAL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ft := newFakeTarget("t", "/bin/true")
			if err := ft.CreateProbe("p"); err != nil {
				t.Fatal(err)
			}
			h := &probeHandle{probe: &probeNode{probes: ft, perms: ownerPerms, name: "p"}, appendMode: tc.appendTo}
			var errno syscall.Errno
			for _, op := range tc.ops {
				var n uint32
				n, errno = h.Write(ownerCtx, []byte(op.data), op.off)
				if errno == 0 && n != uint32(len(op.data)) {
					t.Fatalf("Write returned %d, want %d", n, len(op.data))
				}
			}
			if errno != tc.wantErr {
				t.Errorf("last Write errno %v, want %v", errno, tc.wantErr)
			}
			want := ""
			if tc.wantSpec != "" {
				want = "p=" + tc.wantSpec
			}
			if got := ft.lastSet(); got != want {
				t.Errorf("SetProbe got %q, want %q", got, want)
			}
		})
	}
}

// FuzzProbeWrite writes arbitrary bytes at arbitrary offsets into a probe
// file, as any process may: the handle must answer with an errno, never
// panic, and pass SetProbe exactly the text written so far.
func FuzzProbeWrite(f *testing.F) {
	f.Add(int64(0), []byte("0x10 %di\n"), int64(3), []byte("2"), false)
	f.Add(int64(9), []byte("x"), int64(-5), []byte(""), true)
	f.Fuzz(func(t *testing.T, off1 int64, d1 []byte, off2 int64, d2 []byte, appendMode bool) {
		ft := newFakeTarget("t", "/bin/true")
		if err := ft.CreateProbe("p"); err != nil {
			t.Fatal(err)
		}
		h := &probeHandle{probe: &probeNode{probes: ft, perms: ownerPerms, name: "p"}, appendMode: appendMode}
		var model []byte
		for _, op := range []struct {
			off  int64
			data []byte
		}{{off1, d1}, {off2, d2}} {
			before := ft.lastSet()
			n, errno := h.Write(ownerCtx, op.data, op.off)
			off := op.off
			if appendMode {
				off = int64(len(model))
			}
			valid := off >= 0 && off <= int64(len(model)) && off+int64(len(op.data)) <= maxSpec
			if !valid {
				if errno == 0 || ft.lastSet() != before {
					t.Fatalf("invalid write at %d accepted (errno %v)", off, errno)
				}
				continue
			}
			if end := off + int64(len(op.data)); end > int64(len(model)) {
				model = append(model, make([]byte, end-int64(len(model)))...)
			}
			copy(model[off:], op.data)
			want := before
			if bytes.HasSuffix(model, []byte("\n")) {
				// A complete line is installed at once; a partial one waits.
				want = "p=" + strings.TrimRight(string(model), "\r\n")
			}
			if got := ft.lastSet(); got != want {
				t.Fatalf("SetProbe got %q, want %q", got, want)
			}
			if errno == 0 && n != uint32(len(op.data)) {
				t.Fatalf("Write returned %d of %d", n, len(op.data))
			}
			if errno != 0 && !errors.Is(errno, syscall.EINVAL) && !errors.Is(errno, syscall.EOPNOTSUPP) {
				t.Fatalf("unexpected errno %v", errno)
			}
		}
		// Close installs what no newline completed, and nothing twice.
		before := ft.lastSet()
		h.Flush(ownerCtx)
		if len(model) > 0 && !bytes.HasSuffix(model, []byte("\n")) {
			if got, want := ft.lastSet(), "p="+strings.TrimRight(string(model), "\r\n"); got != want {
				t.Fatalf("after Flush SetProbe got %q, want %q", got, want)
			}
		} else if len(model) > 0 && ft.lastSet() != before {
			t.Fatalf("Flush installed %q again", ft.lastSet())
		}
	})
}
