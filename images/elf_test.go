package images

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"ptfs/internal/testkit"
	"ptfs/objfile"
)

const libcPath = "/lib/x86_64-linux-gnu/libc.so.6"

// mapELF maps path at bias in s and closes it when the test ends.
func mapELF(t testing.TB, s *Space, path string, bias uint64) *ELF {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		testkit.Unavailable(t, "no %s: %v", path, err)
	}
	e, err := MapELF(s, path, bias)
	if err != nil {
		t.Fatalf("MapELF(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close %s: %v", path, err)
		}
	})
	return e
}

// objdumpBytes returns the instruction bytes that binutils' objdump
// disassembles in [start, stop) of path: an oracle independent of Go's
// ELF reader.
func objdumpBytes(t *testing.T, path string, start, stop uint64) []byte {
	t.Helper()
	if _, err := exec.LookPath("objdump"); err != nil {
		testkit.Unavailable(t, "objdump not found: %v", err)
	}
	out, err := exec.Command("objdump", "-d", "--insn-width=16",
		"--start-address=0x"+strconv.FormatUint(start, 16), "--stop-address=0x"+strconv.FormatUint(stop, 16), path).Output()
	if err != nil {
		t.Fatalf("objdump %s: %v", path, err)
	}
	line := regexp.MustCompile(`^\s*[0-9a-f]+:\t((?:[0-9a-f]{2} )+)`)
	var b []byte
	for l := range strings.SplitSeq(string(out), "\n") {
		if m := line.FindStringSubmatch(l); m != nil {
			h, err := hex.DecodeString(strings.ReplaceAll(m[1], " ", ""))
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, h...)
		}
	}
	return b
}

// TestMapELF maps a PIE executable, a shared library and a non-PIE
// executable at a bias and compares the code of their functions with the
// file's bytes at the functions' offsets and with objdump's disassembly.
func TestMapELF(t *testing.T) {
	files := []struct {
		name, path string
		bias       uint64
	}{
		{"pie /bin/true", "/bin/true", 0x555555554000},
		{"libc", libcPath, 0x7ffff7d80000},
		{"nopie", testkit.BuildC(t, "../testdata/target.c", "-fno-PIE", "-no-pie"), 0},
		{"pie", testkit.BuildC(t, "../testdata/target.c", "-fPIE", "-pie"), 0x7f0000000000},
	}
	for _, f := range files {
		t.Run(f.name, func(t *testing.T) {
			s := NewSpace()
			e := mapELF(t, s, f.path, f.bias)
			raw, err := os.ReadFile(f.path)
			if err != nil {
				t.Fatal(err)
			}
			for _, seg := range e.File.Segments() {
				if seg.Filesz == 0 {
					continue
				}
				m, ok := s.Lookup(f.bias + seg.Vaddr + seg.Filesz - 1)
				if !ok || m.Name != f.path {
					t.Errorf("segment %+v: last byte not mapped to %s: %+v", seg, f.path, m)
				}
			}
			syms := e.File.Functions()
			if len(syms) == 0 {
				// /bin/true is stripped of .symtab but has a .dynsym
				// without functions: check its executable segment.
				for _, seg := range e.File.Segments() {
					if seg.Exec() {
						syms = append(syms, objfile.Symbol{Name: "exec", Addr: seg.Vaddr, Offset: seg.Off})
					}
				}
			}
			step := max(1, len(syms)/200)
			buf := make([]byte, 16)
			for i := 0; i < len(syms); i += step {
				sym := syms[i]
				n, err := s.ReadAt(buf, f.bias+sym.Addr)
				if err != nil || n == 0 {
					t.Fatalf("%s at 0x%x: %d bytes, %v", sym.Name, f.bias+sym.Addr, n, err)
				}
				if want := raw[sym.Offset:min(sym.Offset+uint64(n), uint64(len(raw)))]; !bytes.Equal(buf[:n], want) {
					t.Fatalf("%s: read % x, file has % x", sym.Name, buf[:n], want)
				}
			}
			// objdump on the first and a middle function.
			for _, sym := range []objfile.Symbol{syms[0], syms[len(syms)/2]} {
				want := objdumpBytes(t, f.path, sym.Addr, sym.Addr+32)
				if len(want) == 0 {
					t.Fatalf("objdump shows no code at %s 0x%x", sym.Name, sym.Addr)
				}
				got := make([]byte, len(want))
				if n, err := s.ReadAt(got, f.bias+sym.Addr); err != nil || !bytes.Equal(got[:n], want) {
					t.Errorf("%s: read % x (%v), objdump shows % x", sym.Name, got[:n], err, want)
				}
			}
		})
	}
}

func TestSymbolize(t *testing.T) {
	s := NewSpace()
	const bias = 0x7ffff7d80000
	e := mapELF(t, s, libcPath, bias)
	for _, name := range []string{"malloc", "qsort", "__libc_start_main", "write"} {
		sym, err := e.File.Lookup(name)
		if err != nil {
			t.Fatalf("libc: %v", err)
		}
		off := min(uint64(3), max(sym.Size, 1)-1)
		got, gotOff, dso, ok := s.Symbolize(bias + sym.Addr + off)
		// Aliases share an address: any name of the function will do.
		alias, _, _ := e.File.SymbolAt(sym.Addr + off)
		if !ok || got != alias.Name || gotOff != off || dso != libcPath {
			t.Errorf("Symbolize(%s+0x%x) = %q+0x%x %q %v, want %q+0x%x %q", name, off, got, gotOff, dso, ok, alias.Name, off, libcPath)
		}
	}
	if _, _, dso, ok := s.Symbolize(0x1000); ok || dso != "" {
		t.Errorf("unmapped address symbolized: %q %v", dso, ok)
	}
}

func TestBuildIDCheck(t *testing.T) {
	e, err := OpenELF(libcPath)
	if err != nil {
		testkit.Unavailable(t, "libc: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	id := e.File.BuildID()
	if len(id) == 0 {
		t.Fatal("libc has no build id")
	}
	if err := CheckBuildID(e, id); err != nil {
		t.Errorf("own build id refused: %v", err)
	}
	other := bytes.Clone(id)
	other[0] ^= 0xff
	err = CheckBuildID(e, other)
	if !errors.Is(err, ErrBuildIDMismatch) || !strings.Contains(err.Error(), hex.EncodeToString(id)) || !strings.Contains(err.Error(), hex.EncodeToString(other)) {
		t.Errorf("other build id: %v, want ErrBuildIDMismatch naming both ids", err)
	}

	// Processes refuse the file by the recorded ids, and count the mapping.
	p := NewProcesses(Options{BuildIDs: map[string][]byte{libcPath: other}})
	t.Cleanup(func() { p.Close() })
	if err := p.Mmap(1, 0x7f0000000000, 0x1000, 0, libcPath); !errors.Is(err, ErrBuildIDMismatch) {
		t.Errorf("Mmap of another build: %v, want ErrBuildIDMismatch", err)
	}
	if p.Unknown() != 1 {
		t.Errorf("Unknown = %d, want 1", p.Unknown())
	}
	s, _ := p.Space(1)
	if _, err := s.ReadAt(make([]byte, 4), 0x7f0000000000); !errors.Is(err, ErrNoBytes) {
		t.Errorf("read of a refused file: %v, want ErrNoBytes", err)
	}
}
