package images

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// readByte reads the byte at addr of pid's space.
func readByte(t *testing.T, p *Processes, pid int32, addr uint64) (byte, error) {
	t.Helper()
	s, ok := p.Space(pid)
	if !ok {
		t.Fatalf("no space for pid %d", pid)
	}
	var b [1]byte
	_, err := s.ReadAt(b[:], addr)
	return b[0], err
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestProcessesForkExec(t *testing.T) {
	a := writeFile(t, "a", []byte{0xa0, 0xa1, 0xa2, 0xa3})
	b := writeFile(t, "b", []byte{0xb0, 0xb1, 0xb2, 0xb3})
	vdso := NewBlob([]byte{0xd0, 0xd1})
	p := NewProcesses(Options{VDSO: vdso})
	t.Cleanup(func() { p.Close() })
	mmap := func(pid int32, addr, n, off uint64, name string) {
		t.Helper()
		if err := p.Mmap(pid, addr, n, off, name); err != nil {
			t.Fatalf("Mmap(%d, %s): %v", pid, name, err)
		}
	}
	check := func(pid int32, addr uint64, want byte, wantErr error) {
		t.Helper()
		got, err := readByte(t, p, pid, addr)
		if !errors.Is(err, wantErr) || (err == nil && got != want) {
			t.Errorf("pid %d at 0x%x: 0x%x, %v; want 0x%x, %v", pid, addr, got, err, want, wantErr)
		}
	}

	mmap(1, 0x1000, 4, 0, a)
	mmap(1, 0x2000, 2, 0, "[vdso]")
	p.Fork(1, 2)
	mmap(2, 0x1000, 4, 1, b) // the child's mapping hides a, in the child only
	mmap(1, 0x3000, 2, 2, a) // the parent's new mapping is not the child's
	check(1, 0x1000, 0xa0, nil)
	check(2, 0x1000, 0xb1, nil)
	check(2, 0x2001, 0xd1, nil)
	check(1, 0x3001, 0xa3, nil)
	if s, _ := p.Space(2); s != nil {
		if _, ok := s.Lookup(0x3000); ok {
			t.Error("the parent's mapping after fork shows in the child")
		}
	}

	p.Exec(2)
	check(2, 0x1000, 0, ErrNotMapped)
	check(1, 0x1000, 0xa0, nil)

	// munmap is not reported: an anonymous mapping later over the file
	// hides it.
	mmap(1, 0x1000, 2, 0, "//anon")
	check(1, 0x1000, 0, ErrNoBytes)
	check(1, 0x1002, 0xa2, nil)

	// A fork of an unknown pid starts empty; exit forgets.
	p.Fork(7, 8)
	check(8, 0x1000, 0, ErrNotMapped)
	p.Exit(8)
	if _, ok := p.Space(8); ok {
		t.Error("space kept after Exit")
	}
}

func TestProcessesUnreadable(t *testing.T) {
	dir := t.TempDir()
	p := NewProcesses(Options{Path: func(name string) string { return filepath.Join(dir, name) }})
	t.Cleanup(func() { p.Close() })
	if err := p.Mmap(1, 0x1000, 0x1000, 0, "missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
	// The second mapping of the file does not try again, but counts.
	if err := p.Mmap(1, 0x3000, 0x1000, 0, "missing"); err != nil {
		t.Errorf("second mapping of a missing file: %v", err)
	}
	if p.Unknown() != 2 {
		t.Errorf("Unknown = %d, want 2", p.Unknown())
	}
	if _, err := readByte(t, p, 1, 0x1000); !errors.Is(err, ErrNoBytes) {
		t.Errorf("read of a missing file: %v, want ErrNoBytes", err)
	}
	// A FIFO is refused without blocking.
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Mmap(1, 0x5000, 0x1000, 0, "fifo"); err == nil {
		t.Error("a FIFO was mapped")
	}
	// No vDSO dump: its bytes are unknown.
	if err := p.Mmap(1, 0x7000, 0x1000, 0, "[vdso]"); err != nil {
		t.Error(err)
	}
	if _, err := readByte(t, p, 1, 0x7000); !errors.Is(err, ErrNoBytes) || p.Unknown() != 4 {
		t.Errorf("vDSO without a dump: %v, want ErrNoBytes; Unknown = %d, want 4", err, p.Unknown())
	}
	// A file offset past its end.
	if err := os.WriteFile(filepath.Join(dir, "short"), []byte{1, 2}, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Mmap(1, 0x9000, 0x1000, 0x1000, "short"); !errors.Is(err, ErrBadMapping) {
		t.Errorf("offset past the end: %v, want ErrBadMapping", err)
	}
}

// TestProcessesReread: after Reread, the next mapping of the name reads
// the file again (another file is at the path now) while the spaces that
// mapped the old one keep its bytes; Forget drops the spaces and keeps
// the files, which are not read again.
func TestProcessesReread(t *testing.T) {
	path := writeFile(t, "lib", []byte{0x10, 0x11})
	p := NewProcesses(Options{})
	t.Cleanup(func() { p.Close() })
	if err := p.Mmap(1, 0x1000, 2, 0, path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte{0x20, 0x21}, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Mmap(2, 0x1000, 2, 0, path); err != nil {
		t.Fatal(err)
	}
	if b, err := readByte(t, p, 2, 0x1000); err != nil || b != 0x10 {
		t.Errorf("before Reread: 0x%x, %v; want the file as first read, 0x10", b, err)
	}
	p.Reread(path)
	if err := p.Mmap(3, 0x1000, 2, 0, path); err != nil {
		t.Fatal(err)
	}
	if b, err := readByte(t, p, 3, 0x1000); err != nil || b != 0x20 {
		t.Errorf("after Reread: 0x%x, %v; want the new file, 0x20", b, err)
	}
	if b, err := readByte(t, p, 1, 0x1001); err != nil || b != 0x11 {
		t.Errorf("old space after Reread: 0x%x, %v; want 0x11", b, err)
	}

	p.Forget()
	if _, ok := p.Space(1); ok {
		t.Error("a space kept after Forget")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := p.Mmap(4, 0x1000, 2, 0, path); err != nil {
		t.Fatalf("mapping after Forget read the removed file again: %v", err)
	}
	if b, err := readByte(t, p, 4, 0x1001); err != nil || b != 0x21 {
		t.Errorf("after Forget: 0x%x, %v; want the kept file's 0x21", b, err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
