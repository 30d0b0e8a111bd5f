package objfile

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"

	"ptfs/internal/testkit"
)

// readelfBuildID is the build id that binutils' readelf -n reads from path,
// "" for none: the reference BuildID is checked against.
func readelfBuildID(t *testing.T, path string) string {
	t.Helper()
	if _, err := exec.LookPath("readelf"); err != nil {
		testkit.Unavailable(t, "readelf not found: %v", err)
	}
	out, err := exec.Command("readelf", "-n", path).CombinedOutput()
	if err != nil {
		t.Fatalf("readelf -n %s: %v\n%s", path, err, out)
	}
	if m := regexp.MustCompile(`Build ID: ([0-9a-f]+)`).FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return ""
}

func TestBuildID(t *testing.T) {
	files := map[string]string{
		"true":     "/bin/true",
		"libc":     libcPath,
		"sites":    buildC(t, "sites", "-Wl,--build-id=sha1"),
		"md5":      buildC(t, "sites", "-Wl,--build-id=md5"),
		"none":     buildC(t, "sites", "-Wl,--build-id=none"),
		"stripped": buildC(t, "sites", "-Wl,--build-id=sha1", "-s"),
	}
	for name, path := range files {
		t.Run(name, func(t *testing.T) {
			if _, err := os.Stat(path); err != nil {
				testkit.Unavailable(t, "no %s: %v", path, err)
			}
			want := readelfBuildID(t, path)
			got := hex.EncodeToString(openFile(t, path).BuildID())
			if got != want {
				t.Errorf("BuildID = %q, readelf says %q", got, want)
			}
			if name != "none" && want == "" {
				t.Errorf("readelf finds no build id in %s", path)
			}
		})
	}
}

// note builds one ELF note.
func note(name string, typ uint32, desc []byte) []byte {
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, uint32(len(name)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(desc)))
	b = binary.LittleEndian.AppendUint32(b, typ)
	b = append(b, name...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	b = append(b, desc...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func TestNoteBuildID(t *testing.T) {
	id := []byte{1, 2, 3, 4, 5}
	abi := note("GNU\x00", 1, []byte{0, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0})
	tests := []struct {
		name string
		data []byte
		want []byte
	}{
		{"alone", note("GNU\x00", ntGNUBuildID, id), id},
		{"after ABI tag", append(bytes.Clone(abi), note("GNU\x00", ntGNUBuildID, id)...), id},
		{"other owner", note("Go\x00\x00", ntGNUBuildID, id), nil},
		{"other type", note("GNU\x00", 4, id), nil},
		{"empty id", note("GNU\x00", ntGNUBuildID, nil), nil},
		{"truncated desc", note("GNU\x00", ntGNUBuildID, id)[:18], nil},
		{"truncated header", []byte{4, 0, 0, 0, 5}, nil},
		{"huge namesz", []byte{0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 3, 0, 0, 0, 'G'}, nil},
		{"huge descsz", []byte{4, 0, 0, 0, 0xfc, 0xff, 0xff, 0xff, 3, 0, 0, 0, 'G', 'N', 'U', 0}, nil},
		{"empty", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NoteBuildID(tt.data); !bytes.Equal(got, tt.want) {
				t.Errorf("NoteBuildID = %x, want %x", got, tt.want)
			}
		})
	}
}

// FuzzNoteBuildID: notes come from files a user names; a build id found
// must be a part of the input.
func FuzzNoteBuildID(f *testing.F) {
	f.Add(note("GNU\x00", ntGNUBuildID, []byte{1, 2, 3}))
	f.Add(append(note("GNU\x00", 1, make([]byte, 16)), note("GNU\x00", ntGNUBuildID, make([]byte, 20))...))
	f.Fuzz(func(t *testing.T, data []byte) {
		if id := NoteBuildID(data); id != nil && !bytes.Contains(data, id) {
			t.Fatalf("build id %x is not in the input", id)
		}
	})
}

func TestContents(t *testing.T) {
	f := openLibc(t)
	got, err := f.Contents()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(libcPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("Contents differ from the file (%d vs %d bytes)", len(got), len(want))
	}
	read, err := ReadRegular(libcPath)
	if err != nil || !bytes.Equal(read, want) {
		t.Errorf("ReadRegular: %d bytes, %v", len(read), err)
	}
}

func TestReadRegularRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, dir, "/dev/zero"} {
		if _, err := ReadRegular(p); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadRegular(%s) = %v, want ErrNotRegular", p, err)
		}
	}
	if _, err := ReadRegular(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
	if _, err := readAll(bytes.NewReader(nil), MaxContent+1, "big"); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized: %v, want ErrTooLarge", err)
	}
}
