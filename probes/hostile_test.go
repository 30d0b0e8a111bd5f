package probes_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"ptfs/probes"
)

// TestOpenNotRegular: a FIFO, a directory, a device or a socket is refused
// at once with ErrNotRegular, never opened in a way that blocks.
func TestOpenNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tt := range []struct{ path, kind string }{
		{fifo, "FIFO"}, {link, "FIFO"}, {dir, "directory"}, {"/dev/null", "character device"}, {sock, "socket"},
	} {
		done := make(chan error, 1)
		go func() {
			b, err := probes.Open(tt.path)
			if err == nil {
				b.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, probes.ErrNotRegular) || !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "is a "+tt.kind) {
				t.Errorf("Open(%s) = %v, want ErrNotRegular (%s)", tt.path, err, tt.kind)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Open(%s) blocks", tt.path)
		}
	}
}
