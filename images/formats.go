package images

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"ptfs/internal/errno"
)

// PageSize is the size of a page of a libxdc page dump.
const PageSize = 4096

var (
	// ErrSyntax reports a malformed spec, maps line, page dump or build-id
	// list (EINVAL).
	ErrSyntax = errno.New("malformed input", syscall.EINVAL)
	// ErrBuildIDMismatch reports a file whose build id is not the one the
	// trace recorded: it is another build than the one that ran (ENOEXEC).
	ErrBuildIDMismatch = errno.New("build id mismatch", syscall.ENOEXEC)
)

// RawSpec is a raw code image to map: the bytes [From, To) of the file
// Path (To 0: to its end) at address Base.
type RawSpec struct {
	Path     string
	From, To uint64
	Base     uint64
}

// ParseRawSpec parses libipt ptxed's --raw argument: FILE:BASE,
// FILE:FROM:BASE or FILE:FROM-TO:BASE, with FROM and TO file offsets (TO
// exclusive) and numbers in C notation (0x hex, 0 octal, decimal). FILE
// may hold colons: the numbers are taken from the right.
func ParseRawSpec(spec string) (RawSpec, error) {
	rest, base, ok := cutLast(spec)
	if !ok {
		return RawSpec{}, fmt.Errorf("%w: raw image %q: want FILE[:FROM[-TO]]:BASE", ErrSyntax, spec)
	}
	var r RawSpec
	var err error
	if r.Base, err = parseNum(base); err != nil {
		return RawSpec{}, fmt.Errorf("%w: raw image %q: base: %w", ErrSyntax, spec, err)
	}
	r.Path = rest
	if file, rng, ok := cutLast(rest); ok {
		from, to, isRange := strings.Cut(rng, "-")
		if f, err := parseNum(from); err == nil {
			r.Path, r.From = file, f
			if isRange {
				if r.To, err = parseNum(to); err != nil {
					return RawSpec{}, fmt.Errorf("%w: raw image %q: range end: %w", ErrSyntax, spec, err)
				}
				if r.To <= r.From {
					return RawSpec{}, fmt.Errorf("%w: raw image %q: empty range 0x%x-0x%x", ErrSyntax, spec, r.From, r.To)
				}
			}
		}
	}
	if r.Path == "" {
		return RawSpec{}, fmt.Errorf("%w: raw image %q: no file", ErrSyntax, spec)
	}
	return r, nil
}

// cutLast splits s at its last colon.
func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// parseNum parses a number in C notation, refusing Go's underscores.
func parseNum(s string) (uint64, error) {
	if strings.Contains(s, "_") {
		return 0, fmt.Errorf("bad number %q", s)
	}
	v, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		return 0, fmt.Errorf("bad number %q", s)
	}
	return v, nil
}

// Map reads the file and maps its range at Base.
func (r RawSpec) Map(s *Space) error {
	b, err := LoadBlob(r.Path)
	if err != nil {
		return err
	}
	size := uint64(len(b.Bytes()))
	to := r.To
	if to == 0 {
		to = size
	}
	if r.From >= to || to > size {
		return fmt.Errorf("%w: raw image %s: range 0x%x-0x%x is not in its %d bytes", ErrBadMapping, r.Path, r.From, to, size)
	}
	return s.Map(r.Base, to-r.From, b, r.From, r.Path)
}

// ParsePageDump checks a libxdc page dump, a list of little-endian u64 page
// addresses and the pages, PageSize bytes each in the same order, and
// returns the addresses.
func ParsePageDump(addrs, dump []byte) ([]uint64, error) {
	if len(addrs)%8 != 0 {
		return nil, fmt.Errorf("%w: address list of %d bytes is not a list of u64", ErrSyntax, len(addrs))
	}
	n := len(addrs) / 8
	if uint64(len(dump)) != uint64(n)*PageSize {
		return nil, fmt.Errorf("%w: %d page addresses but %d bytes of pages (want %d)", ErrSyntax, n, len(dump), uint64(n)*PageSize)
	}
	pages := make([]uint64, n)
	for i := range pages {
		pages[i] = binary.LittleEndian.Uint64(addrs[8*i:])
		if pages[i] > ^uint64(0)-PageSize {
			return nil, fmt.Errorf("%w: page %d at 0x%x ends past the address space", ErrSyntax, i, pages[i])
		}
	}
	return pages, nil
}

// MapsEntry is one line of /proc/PID/maps: [Start, End) maps file Path
// (or a pseudo name such as "[vdso]", or "" for anonymous memory) from
// offset Off with permissions Perms ("r-xp").
type MapsEntry struct {
	Start, End, Off uint64
	Perms           string
	Path            string
}

// ParseMaps parses the text of /proc/PID/maps: "START-END PERMS OFFSET
// MAJ:MIN INODE [PATH]" a line, numbers in hex, the path the rest of the
// line after its padding. Empty lines are skipped.
func ParseMaps(data []byte) ([]MapsEntry, error) {
	var out []MapsEntry
	for n := 1; len(data) > 0; n++ {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		e, err := parseMapsLine(string(line))
		if err != nil {
			return nil, fmt.Errorf("%w: maps line %d: %w", ErrSyntax, n, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// ParseMapsSnapshots parses maps text with '#' comment lines between the
// snapshots (ptsim's maps.txt, `ptfs decode --branches --maps`): the
// comments are skipped, the rest is ParseMaps's.
func ParseMapsSnapshots(data []byte) ([]MapsEntry, error) {
	var keep []byte
	for line := range bytes.Lines(data) {
		if !bytes.HasPrefix(line, []byte("#")) {
			keep = append(keep, line...)
		}
	}
	return ParseMaps(keep)
}

// parseMapsLine parses one line of ParseMaps.
func parseMapsLine(line string) (MapsEntry, error) {
	var e MapsEntry
	f := make([]string, 0, 5)
	rest := line
	for len(f) < 5 {
		rest = strings.TrimLeft(rest, " ")
		word, after, _ := strings.Cut(rest, " ")
		if word == "" {
			return e, fmt.Errorf("%q: want START-END PERMS OFFSET DEV INODE [PATH]", line)
		}
		f = append(f, word)
		rest = after
	}
	e.Path = strings.TrimLeft(rest, " ")
	start, end, ok := strings.Cut(f[0], "-")
	var err1, err2, err3 error
	e.Start, err1 = strconv.ParseUint(start, 16, 64)
	e.End, err2 = strconv.ParseUint(end, 16, 64)
	e.Off, err3 = strconv.ParseUint(f[2], 16, 64)
	if !ok || err1 != nil || err2 != nil || err3 != nil || e.End <= e.Start {
		return e, fmt.Errorf("%q: bad range or offset", line)
	}
	if len(f[1]) != 4 {
		return e, fmt.Errorf("%q: bad permissions %q", line, f[1])
	}
	e.Perms = f[1]
	return e, nil
}

// ParseBuildIDs parses a build-id list, "HEXID PATH" a line (perf
// buildid-list's output), into the ids by path.
func ParseBuildIDs(data []byte) (map[string][]byte, error) {
	ids := map[string][]byte{}
	for n, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		h, path, ok := strings.Cut(line, " ")
		id, err := hex.DecodeString(h)
		if !ok || err != nil || len(id) == 0 || path == "" {
			return nil, fmt.Errorf("%w: build-id line %d %q: want HEXID PATH", ErrSyntax, n+1, line)
		}
		ids[path] = id
	}
	return ids, nil
}

// CheckBuildID refuses an ELF file whose build id is not want, with both
// ids in the message. A file without a build id is refused too: nothing
// says it is the build that ran.
func CheckBuildID(e *ELF, want []byte) error {
	got := e.File.BuildID()
	if !bytes.Equal(got, want) {
		have := "none"
		if got != nil {
			have = hex.EncodeToString(got)
		}
		return fmt.Errorf("%w: %s has build id %s, the trace recorded %x", ErrBuildIDMismatch, e.File.Path(), have, want)
	}
	return nil
}
