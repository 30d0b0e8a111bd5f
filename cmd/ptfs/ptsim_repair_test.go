package main

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"ptfs/images"
	"ptfs/x86insn"
)

// Where ptrace's single step loses its trap after a CPUID (testdata/sstep.c:
// a hypervisor that emulates CPUID), ptsim-trace records the CPUID and then
// the instruction after the next one: insns.bin lacks the one in between,
// and ptsim-encode refuses the recording. repairStepLost restores it.

// ptsimImage is a ptsim recording's executable memory over time, read from
// maps.txt as ptsim-encode reads it: file-backed mappings from their files
// on disk, the others from their dumps in mem/ once dumped.
type ptsimImage struct {
	snaps []ptsimSnap
}

// ptsimSnap is one maps.txt snapshot: it applies from instruction index on.
type ptsimSnap struct {
	index   uint64
	regions []ptsimRegion // executable, sorted by start
}

// ptsimRegion is an executable mapping; data holds the file's bytes (off
// is the mapping's offset in it) or the dump's (off 0).
type ptsimRegion struct {
	start, end, off uint64
	data            []byte
}

// readPtsimImage reads dir's maps.txt snapshots, their files and dumps.
func readPtsimImage(dir string) (*ptsimImage, error) {
	text, err := os.ReadFile(filepath.Join(dir, "maps.txt"))
	if err != nil {
		return nil, fmt.Errorf("read recording: %w", err)
	}
	snaps, err := images.ParseMapsSnapshots(text)
	if err != nil {
		return nil, fmt.Errorf("maps.txt: %w", err)
	}
	if len(snaps) == 0 || snaps[0].Index != 0 {
		return nil, errors.New("maps.txt: no snapshot at instruction 0")
	}
	files := map[string][]byte{}
	load := func(path string) ([]byte, error) {
		if b, ok := files[path]; ok {
			return b, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("code of the recording: %w", err)
		}
		files[path] = b
		return b, nil
	}
	// As ptsim-encode: a mapping without a file is code once a dump of its
	// range has been named, by the end of its snapshot.
	dumps := map[[2]uint64]string{}
	im := &ptsimImage{snaps: make([]ptsimSnap, len(snaps))}
	for i, snap := range snaps {
		for _, d := range snap.Dumps {
			dumps[[2]uint64{d.Start, d.End}] = d.File
		}
		s := &im.snaps[i]
		s.index = snap.Index
		for _, m := range snap.Maps {
			if m.Perms[2] != 'x' {
				continue
			}
			r := ptsimRegion{start: m.Start, end: m.End, off: m.Off}
			path := m.Path
			if !strings.HasPrefix(path, "/") || strings.HasSuffix(path, " (deleted)") {
				d, ok := dumps[[2]uint64{m.Start, m.End}]
				if !ok {
					continue
				}
				path, r.off = filepath.Join(dir, d), 0
			}
			if r.data, err = load(path); err != nil {
				return nil, err
			}
			s.regions = append(s.regions, r)
		}
		slices.SortFunc(s.regions, func(a, b ptsimRegion) int { return cmp.Compare(a.start, b.start) })
	}
	return im, nil
}

// read fills buf with the code at ip, across adjacent mappings, and returns
// how many bytes it found (fewer where memory ends). Bytes of a mapping
// beyond its file's end read as 0, as ptsim-encode reads them.
func (s *ptsimSnap) read(ip uint64, buf []byte) int {
	n := 0
	for n < len(buf) {
		i := sort.Search(len(s.regions), func(i int) bool { return s.regions[i].end > ip })
		if i == len(s.regions) || ip < s.regions[i].start {
			break
		}
		r := &s.regions[i]
		for ; n < len(buf) && ip < r.end; ip, n = ip+1, n+1 {
			buf[n] = 0
			if o := r.off + ip - r.start; o < uint64(len(r.data)) {
				buf[n] = r.data[o]
			}
		}
	}
	return n
}

// repairStepLost restores, in the ptsim recording in dir, each instruction
// that ptsim-trace missed right after a CPUID, and returns how many it
// restored. For each instruction a that is a CPUID (0f a2) whose next
// address b (the next instruction's, or the IP a signal interrupted before
// it) is not a+2, it inserts a+2 into insns.bin, but only if the code at
// a+2, in the maps snapshot in force at a, is not a control transfer and is
// exactly b-(a+2) bytes long, and is not one of probes (a probe site's
// registers at a+2 were not recorded). This is sound: CPUID falls through,
// so a+2 executes right after it, and b proves that exactly one
// instruction, a+2's, ran between. Any other such gap refuses the whole
// recording (an error, nothing written): the restored instruction is never
// guessed. The instruction indexes after each insertion move up in
// syscalls.txt, probes.txt and maps.txt's snapshots; the dumps' file names
// (mem/INDEX-START.bin) keep theirs, as labels that maps.txt names them by.
func repairStepLost(dir string, probes []uint64) (int, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "insns.bin"))
	if err != nil {
		return 0, fmt.Errorf("read recording: %w", err)
	}
	if len(raw)%8 != 0 {
		return 0, fmt.Errorf("insns.bin: %d bytes, not whole addresses", len(raw))
	}
	im, err := readPtsimImage(dir)
	if err != nil {
		return 0, err
	}
	// An asynchronous signal before instruction INDEX makes its IP the
	// one after instruction INDEX-1, as ptsim-encode reads it.
	interrupted := map[uint64]uint64{}
	sys, err := os.ReadFile(filepath.Join(dir, "syscalls.txt"))
	if err != nil {
		return 0, fmt.Errorf("read recording: %w", err)
	}
	for l := range strings.Lines(string(sys)) {
		f := strings.Fields(l)
		if len(f) < 4 || f[1] != "signal" {
			continue
		}
		idx, err1 := strconv.ParseUint(f[0], 10, 64)
		ip, err2 := strconv.ParseUint(strings.TrimPrefix(f[2], "0x"), 16, 64)
		if err := errors.Join(err1, err2); err != nil {
			return 0, fmt.Errorf("syscalls.txt %q: %w", strings.TrimSpace(l), err)
		}
		interrupted[idx] = ip
	}

	n := len(raw) / 8
	insn := func(i int) uint64 { return binary.LittleEndian.Uint64(raw[8*i:]) }
	var at []uint64 // the indexes that restored instructions go before, ascending
	var buf [x86insn.MaxLen]byte
	snap := 0
	for i := range n {
		for snap+1 < len(im.snaps) && im.snaps[snap+1].index <= uint64(i) {
			snap++
		}
		s := &im.snaps[snap]
		a := insn(i)
		if got := s.read(a, buf[:2]); got == 0 {
			return 0, fmt.Errorf("insn %d: no code at %#x", i, a)
		} else if got < 2 || buf[0] != 0x0f || buf[1] != 0xa2 {
			continue
		}
		b, ok := interrupted[uint64(i+1)]
		if !ok && i+1 < n {
			b, ok = insn(i+1), true
		}
		if !ok || b == a+2 {
			continue
		}
		// The code at a+2 is the snapshot's at a: CPUID changes no mapping.
		next := a + 2
		in, err := x86insn.Step(buf[:s.read(next, buf[:])], next)
		switch {
		case err != nil:
			err = fmt.Errorf("the instruction at %#x: %w", next, err)
		case in.Class != x86insn.NotBranch:
			err = fmt.Errorf("the instruction at %#x is a %v", next, in.Class)
		case uint64(in.Len) != b-next:
			err = fmt.Errorf("the instruction at %#x is %d bytes, not %d", next, in.Len, int64(b-next))
		case slices.Contains(probes, next):
			err = fmt.Errorf("%#x is a probe site, whose registers were not recorded", next)
		}
		if err != nil {
			return 0, fmt.Errorf("insn %d: cpuid at %#x, then %#x: not restored: %w", i, a, b, err)
		}
		at = append(at, uint64(i+1))
	}
	if len(at) == 0 {
		return 0, nil
	}

	// shift is an index's number once the instructions are in place.
	shift := func(x uint64) uint64 {
		return x + uint64(sort.Search(len(at), func(k int) bool { return at[k] > x }))
	}
	fixed := make([]byte, 0, len(raw)+8*len(at))
	prev := 0
	for _, p := range at {
		fixed = append(fixed, raw[8*prev:8*p]...)
		fixed = binary.LittleEndian.AppendUint64(fixed, insn(int(p)-1)+2)
		prev = int(p)
	}
	fixed = append(fixed, raw[8*prev:]...)
	if err := os.WriteFile(filepath.Join(dir, "insns.bin"), fixed, 0o644); err != nil {
		return 0, fmt.Errorf("repair recording: %w", err)
	}
	for _, f := range []struct{ name, head string }{{"syscalls.txt", ""}, {"probes.txt", ""}, {"maps.txt", "# snapshot "}} {
		if err := renumber(filepath.Join(dir, f.name), f.head, shift); err != nil {
			return 0, err
		}
	}
	return len(at), nil
}

// renumber rewrites the instruction indexes in the file at path with shift:
// the first field of each line that begins with head (and, with no head,
// is not a '#' comment); the other lines stay as they are.
func renumber(path, head string, shift func(uint64) uint64) error {
	text, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("repair recording: %w", err)
	}
	var out bytes.Buffer
	out.Grow(len(text) + len(text)/8)
	for l := range strings.Lines(string(text)) {
		rest, ok := strings.CutPrefix(l, head)
		if !ok || (head == "" && (strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "")) {
			out.WriteString(l)
			continue
		}
		num, tail, _ := strings.Cut(rest, " ")
		idx, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			return fmt.Errorf("repair %s %q: %w", filepath.Base(path), strings.TrimSpace(l), err)
		}
		out.WriteString(head)
		out.WriteString(strconv.FormatUint(shift(idx), 10))
		out.WriteByte(' ')
		out.WriteString(tail)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		return fmt.Errorf("repair recording: %w", err)
	}
	return nil
}

// ptsimEncodeOpts turns ptsim-run's options into the ptsim-encode
// arguments ptsim-run gives (its encoder's options first, then its -ptw
// ones), and the probe addresses the tracer recorded registers at.
func ptsimEncodeOpts(opts []string) (enc []string, probes []uint64, err error) {
	var ptw []string
	for i := 0; i < len(opts); i++ {
		switch o := opts[i]; o {
		case "--ret-flush-on-disable":
			enc = append(enc, "-ret-flush-on-disable")
		case "--no-validate":
		case "--probe", "--ptw", "--psb-period", "--max":
			if i+1 == len(opts) {
				return nil, nil, fmt.Errorf("ptsim-run option %s: no value", o)
			}
			i++
			v := opts[i]
			switch o {
			case "--psb-period":
				enc = append(enc, "-psb-period", v)
			case "--ptw", "--probe":
				if o == "--ptw" {
					ptw = append(ptw, "-ptw", v)
				}
				// ptsim-trace reads a probe address with strtoull(s, 0, 0).
				addr, _, _ := strings.Cut(v, ":")
				p, err := strconv.ParseUint(addr, 0, 64)
				if err != nil {
					return nil, nil, fmt.Errorf("ptsim-run option %s %s: %w", o, v, err)
				}
				probes = append(probes, p)
			}
		default:
			return nil, nil, fmt.Errorf("ptsim-run option %s: unknown", o)
		}
	}
	return append(enc, ptw...), probes, nil
}
