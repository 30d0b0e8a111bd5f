package images

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"iter"
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
// line after its padding. Empty lines are skipped; a line may end in
// "\r\n".
func ParseMaps(data []byte) ([]MapsEntry, error) {
	var out []MapsEntry
	for n, line := range mapsLines(data) {
		e, err := parseMapsLine(line)
		if err != nil {
			return nil, fmt.Errorf("%w: maps line %d: %w", ErrSyntax, n, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// MapsSnapshot is one snapshot of a maps file (ptsim's maps.txt): the
// mappings in force from instruction Index on, and the dumps named while
// it was the last snapshot.
type MapsSnapshot struct {
	// Index is the first instruction the snapshot applies to.
	Index uint64
	// Maps are its /proc/PID/maps lines, in order.
	Maps []MapsEntry
	// Dumps are its "# dump" lines, in order.
	Dumps []MapsDump
}

// MapsDump is a "# dump START-END FILE" line: FILE, a name relative to the
// maps file's directory, holds the bytes of [Start, End).
type MapsDump struct {
	Start, End uint64
	File       string
}

// ParseMapsSnapshots parses a maps file of snapshots (ptsim's maps.txt,
// `ptfs decode --branches --maps`): a "# snapshot INDEX [REASON]" line
// starts a snapshot (INDEX decimal, not below the one before); ParseMaps's
// lines and "# dump START-END FILE" lines (START-END as in maps) belong to
// the last one. Mappings before any header are a snapshot at index 0, so
// plain /proc/PID/maps text is one snapshot; a dump before any snapshot is
// refused. Other '#' lines are comments. Empty lines are skipped; a line
// may end in "\r\n". Empty text has no snapshots.
func ParseMapsSnapshots(data []byte) ([]MapsSnapshot, error) {
	var snaps []MapsSnapshot
	for n, line := range mapsLines(data) {
		var err error
		if snaps, err = addSnapshotLine(snaps, line); err != nil {
			return nil, fmt.Errorf("%w: maps line %d: %w", ErrSyntax, n, err)
		}
	}
	return snaps, nil
}

// AllMaps returns the maps lines of every snapshot, in order: mapped one
// after the other (a later line wins where they overlap), the memory that
// any of them showed.
func AllMaps(snaps []MapsSnapshot) []MapsEntry {
	var out []MapsEntry
	for _, s := range snaps {
		out = append(out, s.Maps...)
	}
	return out
}

// addSnapshotLine adds one line of ParseMapsSnapshots to snaps.
func addSnapshotLine(snaps []MapsSnapshot, line string) ([]MapsSnapshot, error) {
	comment, isComment := strings.CutPrefix(line, "#")
	if !isComment {
		e, err := parseMapsLine(line)
		if err != nil {
			return snaps, err
		}
		if len(snaps) == 0 {
			// Plain /proc/PID/maps text: what it shows holds from the start.
			snaps = append(snaps, MapsSnapshot{})
		}
		s := &snaps[len(snaps)-1]
		s.Maps = append(s.Maps, e)
		return snaps, nil
	}
	word, rest, _ := strings.Cut(strings.TrimLeft(comment, " "), " ")
	rest = strings.TrimLeft(rest, " ")
	switch word {
	case "snapshot":
		num, _, _ := strings.Cut(rest, " ")
		idx, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			return snaps, fmt.Errorf("%q: want # snapshot INDEX [REASON]", line)
		}
		if k := len(snaps); k > 0 && idx < snaps[k-1].Index {
			return snaps, fmt.Errorf("%q: index below the previous snapshot's %d", line, snaps[k-1].Index)
		}
		return append(snaps, MapsSnapshot{Index: idx}), nil
	case "dump":
		rng, file, _ := strings.Cut(rest, " ")
		file = strings.TrimSpace(file)
		start, end, err := parseRange(rng)
		if err != nil || file == "" {
			return snaps, fmt.Errorf("%q: want # dump START-END FILE", line)
		}
		if len(snaps) == 0 {
			return snaps, fmt.Errorf("%q: a dump before any snapshot", line)
		}
		s := &snaps[len(snaps)-1]
		s.Dumps = append(s.Dumps, MapsDump{Start: start, End: end, File: file})
	}
	return snaps, nil
}

// mapsLines yields the lines of maps text that are not blank, without
// their "\n" or "\r\n", with their numbers from 1.
func mapsLines(data []byte) iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		n := 0
		for line := range bytes.Lines(data) {
			n++
			line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
			if len(bytes.TrimSpace(line)) > 0 && !yield(n, string(line)) {
				return
			}
		}
	}
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
	var err1, err2 error
	e.Start, e.End, err1 = parseRange(f[0])
	e.Off, err2 = strconv.ParseUint(f[2], 16, 64)
	if err1 != nil || err2 != nil {
		return e, fmt.Errorf("%q: bad range or offset", line)
	}
	if len(f[1]) != 4 {
		return e, fmt.Errorf("%q: bad permissions %q", line, f[1])
	}
	e.Perms = f[1]
	return e, nil
}

// parseRange parses a maps range: START-END in hex, START below END.
func parseRange(s string) (start, end uint64, err error) {
	a, b, ok := strings.Cut(s, "-")
	start, err1 := strconv.ParseUint(a, 16, 64)
	end, err2 := strconv.ParseUint(b, 16, 64)
	if !ok || err1 != nil || err2 != nil || end <= start {
		return 0, 0, fmt.Errorf("bad range %q", s)
	}
	return start, end, nil
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
