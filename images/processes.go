package images

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Options configure Processes.
type Options struct {
	// VDSO is the dump mapped where a process maps "[vdso]" (OpenELF of
	// the dump gives its symbols too); nil leaves the vDSO's bytes unknown.
	VDSO Source
	// Path turns a file name of the side band into the path to read
	// (a sysroot, a recording's directory); nil reads the name itself.
	Path func(name string) string
	// BuildIDs are the build ids the trace recorded, by file name: a file
	// whose build id differs is refused (ErrBuildIDMismatch).
	BuildIDs map[string][]byte
}

// Processes is the memory of several processes: one Space per pid, built
// from the side band. Exec replaces a pid's space, fork copies it, and
// mmap adds to it; munmap is not reported, so a later mapping wins. Files
// are read once and shared by every space that maps them. Processes is
// not safe for concurrent use.
type Processes struct {
	opts   Options
	spaces map[int32]*Space
	files  map[string]fileSource
	old    []fileSource // files read again (Reread), still mapped
	// unknown counts mappings whose bytes are not known because their
	// file could not be read or matched.
	unknown uint64
}

// fileSource is a file read for mappings, or why it could not be.
type fileSource struct {
	src Source
	err error
}

// NewProcesses returns an empty set of processes.
func NewProcesses(opts Options) *Processes {
	return &Processes{opts: opts, spaces: map[int32]*Space{}, files: map[string]fileSource{}}
}

// Space returns the address space of pid.
func (p *Processes) Space(pid int32) (*Space, bool) {
	s, ok := p.spaces[pid]
	return s, ok
}

// space returns the address space of pid, made empty if there is none.
func (p *Processes) space(pid int32) *Space {
	s, ok := p.spaces[pid]
	if !ok {
		s = NewSpace()
		p.spaces[pid] = s
	}
	return s
}

// Exec gives pid a new, empty address space.
func (p *Processes) Exec(pid int32) { p.spaces[pid] = NewSpace() }

// Fork gives child a copy of parent's address space (empty if parent is
// unknown), sharing the mappings until either changes.
func (p *Processes) Fork(parent, child int32) {
	if s, ok := p.spaces[parent]; ok {
		p.spaces[child] = s.Clone()
		return
	}
	p.spaces[child] = NewSpace()
}

// Exit forgets pid's address space.
func (p *Processes) Exit(pid int32) { delete(p.spaces, pid) }

// Unknown returns how many mappings were placed without bytes because
// their file could not be read or was another build, or they are the vDSO
// and there is no dump of it: the code there cannot be decoded.
func (p *Processes) Unknown() uint64 { return p.unknown }

// Mmap maps n bytes of the file name from offset off at addr in pid's
// space (a PERF_RECORD_MMAP2, or a line of /proc/PID/maps). "[vdso]" maps
// the vDSO dump; other bracketed names and anonymous memory ("", "//anon")
// are memory of unknown bytes. A file that cannot be read is mapped with
// unknown bytes too, so that it still hides what was mapped there before,
// and its error is returned (the first time only: the file is read once).
func (p *Processes) Mmap(pid int32, addr, n, off uint64, name string) error {
	s := p.space(pid)
	if name == "[vdso]" && p.opts.VDSO != nil {
		// The dump holds the vDSO from its start, whatever the offset.
		return s.Map(addr, n, p.opts.VDSO, 0, name)
	}
	if name == "[vdso]" {
		// Without a dump the vDSO's code is lost to decoding.
		p.unknown++
	}
	if name == "" || name == "//anon" || strings.HasPrefix(name, "[") {
		return s.Map(addr, n, nil, 0, name)
	}
	fs, seen := p.files[name]
	if !seen {
		fs.src, fs.err = p.open(name)
		p.files[name] = fs
	}
	if fs.err != nil {
		p.unknown++
		err := s.Map(addr, n, nil, 0, name)
		if seen {
			return err
		}
		return errors.Join(fs.err, err)
	}
	if off > uint64(len(fs.src.Bytes())) {
		p.unknown++
		return errors.Join(fmt.Errorf("%w: %s: offset 0x%x past its end", ErrBadMapping, name, off), s.Map(addr, n, nil, 0, name))
	}
	return s.Map(addr, n, fs.src, off, name)
}

// open reads the file name: as an ELF file if it is one (for its symbols
// and build id), else as raw bytes.
func (p *Processes) open(name string) (Source, error) {
	path := name
	if p.opts.Path != nil {
		path = p.opts.Path(name)
	}
	e, err := OpenELF(path)
	want, check := p.opts.BuildIDs[name]
	if err != nil {
		if check {
			return nil, err
		}
		b, rawErr := LoadBlob(path)
		if rawErr != nil {
			return nil, rawErr
		}
		return b, nil
	}
	if check {
		if err := CheckBuildID(e, want); err != nil {
			return nil, errors.Join(err, e.Close())
		}
	}
	return e, nil
}

// MapMaps applies a /proc/PID/maps snapshot to pid's space (Mmap for each
// entry) and returns the errors of the entries that could not be mapped.
func (p *Processes) MapMaps(pid int32, entries []MapsEntry) error {
	var errs []error
	for _, e := range entries {
		if err := p.Mmap(pid, e.Start, e.End-e.Start, e.Off, e.Path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Reread makes the next mapping of name read the file again: another file
// is at that path now (a live side band saw a mapping of another inode).
// Spaces that mapped the old one keep its bytes; Close releases it.
func (p *Processes) Reread(name string) {
	if fs, ok := p.files[name]; ok {
		p.old = append(p.old, fs)
		delete(p.files, name)
	}
}

// Close releases the files read.
func (p *Processes) Close() error {
	var errs []error
	for _, fs := range append(p.old, slices.Collect(maps.Values(p.files))...) {
		if e, ok := fs.src.(*ELF); ok {
			errs = append(errs, e.Close())
		}
	}
	p.files, p.old = map[string]fileSource{}, nil
	return errors.Join(errs...)
}

// Forget drops every address space and keeps the files read: the side
// band applied again from its start (one CPU's trace after another's, each
// following the processes over time) reads no file twice.
func (p *Processes) Forget() { clear(p.spaces) }
