package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"ptfs/decode"
	"ptfs/flow"
	"ptfs/images"
	"ptfs/perfdata"
	"ptfs/perfflow"
)

const branchesUsage = `usage: ptfs decode --branches IMAGE... [--tid N] [--cpu N] FILE
       ptfs decode --branches [--root DIR] [--vdso FILE] FILE.perf.data

Reconstructs the control flow of the raw Intel PT trace FILE and prints a
branch: line per taken control transfer, trace: lines where tracing starts,
stops and resynchronises, gap: lines where the path is unknown (overflow,
decoding error) and manual ptwrite: lines, in execution order (DESIGN §5).
IMAGE says where the traced code was (later ones win where they overlap):
  --raw FILE[:FROM[-TO]]:BASE  bytes of FILE (libipt ptxed's form) at BASE
  --elf FILE[:BIAS]            an ELF file's PT_LOAD segments at BIAS + vaddr
  --pages ADDRFILE:DUMPFILE    a libxdc page dump
  --maps FILE                  /proc/PID/maps text or ptsim's snapshots of it
                               (a later line wins), files read under --root
                               DIR, [vdso] from --vdso FILE
perf.data brings its own images: the files its side band maps, read under
--root DIR, refused (an image: line) if their build id is not the recorded
one; each AUX buffer is decoded in the memory of its process.
--events DIR is a tracefs events directory (or a copy) giving the probe
events whose records the ptwrites carry: probe records are printed where
they ran, between the branch: lines; without it every ptwrite is a manual
one. --tid and --cpu add the thread and CPU to every line. The last lines
are the counts:
  branch summary: branches=B insns=I gaps=G
  summary: records=R dropped=D stray=S unknown=U errors=E
`

// errNoImage: --branches without any code image.
var errNoImage = errors.New("no code image (--raw, --elf, --pages or --maps)")

// branchesArgs are the options of `ptfs decode --branches`.
type branchesArgs struct {
	raws, elfs, pages, maps []string
	root, vdso, events      string
	tid, cpu                int32
	trace                   string
}

func parseBranchesArgs(args []string) (branchesArgs, error) {
	a := branchesArgs{tid: -1, cpu: -1}
	for i := 0; i < len(args); i++ {
		opt := args[i]
		val, hasVal := "", false
		if k, v, ok := strings.Cut(opt, "="); ok && strings.HasPrefix(opt, "--") {
			opt, val, hasVal = k, v, true
		}
		takes := map[string]bool{"--raw": true, "--elf": true, "--pages": true, "--maps": true, "--root": true, "--vdso": true, "--events": true, "--tid": true, "--cpu": true}[opt]
		if takes && !hasVal {
			if i+1 >= len(args) {
				return a, fmt.Errorf("%s needs a value: %w", opt, flow.ErrBadOption)
			}
			i++
			val = args[i]
		}
		switch opt {
		case "--raw":
			a.raws = append(a.raws, val)
		case "--elf":
			a.elfs = append(a.elfs, val)
		case "--pages":
			a.pages = append(a.pages, val)
		case "--maps":
			a.maps = append(a.maps, val)
		case "--root":
			a.root = val
		case "--vdso":
			a.vdso = val
		case "--events":
			a.events = val
		case "--tid", "--cpu":
			n, err := strconv.ParseInt(val, 10, 32)
			if err != nil || n < 0 {
				return a, fmt.Errorf("%s %q: want a number >= 0: %w", opt, val, flow.ErrBadOption)
			}
			if opt == "--tid" {
				a.tid = int32(n)
			} else {
				a.cpu = int32(n)
			}
		default:
			if strings.HasPrefix(opt, "-") && opt != "-" {
				return a, fmt.Errorf("unknown option %q: %w", opt, flow.ErrBadOption)
			}
			if a.trace != "" {
				return a, fmt.Errorf("more than one trace file (%q, %q): %w", a.trace, opt, flow.ErrBadOption)
			}
			a.trace = opt
		}
	}
	if a.trace == "" {
		return a, fmt.Errorf("no trace FILE: %w", flow.ErrBadOption)
	}
	return a, nil
}

// branchImages builds the address space the options describe; close
// releases the files it holds.
func branchImages(a *branchesArgs) (s *images.Space, closeAll func() error, err error) {
	var closers []func() error
	closeAll = func() error {
		var errs []error
		for _, c := range closers {
			errs = append(errs, c())
		}
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, closeAll())
		}
	}()
	s = images.NewSpace()
	if len(a.maps) > 0 {
		p, closeP, err := branchProcesses(a, nil)
		if err != nil {
			return nil, closeAll, err
		}
		closers = append(closers, closeP)
		const pid = 1
		p.Exec(pid)
		for _, m := range a.maps {
			entries, err := readMaps(m)
			if err != nil {
				return nil, closeAll, err
			}
			if err := p.MapMaps(pid, entries); err != nil {
				return nil, closeAll, fmt.Errorf("--maps %s: %w", m, err)
			}
		}
		s, _ = p.Space(pid)
	}
	for _, r := range a.raws {
		spec, err := images.ParseRawSpec(r)
		if err != nil {
			return nil, closeAll, fmt.Errorf("--raw: %w", err)
		}
		if err := spec.Map(s); err != nil {
			return nil, closeAll, fmt.Errorf("--raw %s: %w", r, err)
		}
	}
	for _, e := range a.elfs {
		path, bias := e, uint64(0)
		if i := strings.LastIndexByte(e, ':'); i >= 0 {
			if v, err := strconv.ParseUint(e[i+1:], 0, 64); err == nil {
				path, bias = e[:i], v
			}
		}
		f, err := images.MapELF(s, path, bias)
		if err != nil {
			return nil, closeAll, fmt.Errorf("--elf: %w", err)
		}
		closers = append(closers, f.Close)
	}
	for _, pg := range a.pages {
		addrs, dump, ok := strings.Cut(pg, ":")
		if !ok || addrs == "" || dump == "" {
			return nil, closeAll, fmt.Errorf("--pages %q: want ADDRFILE:DUMPFILE: %w", pg, flow.ErrBadOption)
		}
		if err := images.MapPageDump(s, addrs, dump); err != nil {
			return nil, closeAll, fmt.Errorf("--pages: %w", err)
		}
	}
	return s, closeAll, nil
}

// branchProcesses returns the processes whose files are read under
// --root, the vDSO from --vdso, refusing a file whose build id differs
// from buildIDs'.
func branchProcesses(a *branchesArgs, buildIDs map[string][]byte) (*images.Processes, func() error, error) {
	var vdso images.Source
	var closeVDSO func() error
	if a.vdso != "" {
		e, err := images.OpenELF(a.vdso)
		if err != nil {
			return nil, nil, fmt.Errorf("--vdso: %w", err)
		}
		vdso, closeVDSO = e, e.Close
	}
	root := a.root
	p := images.NewProcesses(images.Options{VDSO: vdso, BuildIDs: buildIDs, Path: func(name string) string {
		if root == "" {
			return name
		}
		// Under root whatever the name says: a maps file or perf.data is
		// input, its names must not reach outside the directory given.
		return filepath.Join(root, filepath.Clean("/"+name))
	}})
	return p, func() error {
		err := p.Close()
		if closeVDSO != nil {
			err = errors.Join(err, closeVDSO())
		}
		return err
	}, nil
}

// readMaps reads the lines of every snapshot of a --maps file (ptsim's
// maps.txt, or plain /proc/PID/maps text), in order: a later one wins.
func readMaps(path string) ([]images.MapsEntry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--maps: %w", err)
	}
	snaps, err := images.ParseMapsSnapshots(data)
	if err != nil {
		return nil, fmt.Errorf("--maps %s: %w", path, err)
	}
	return images.AllMaps(snaps), nil
}

// listBranches implements `ptfs decode --branches`. A raw trace is read
// and decoded as a stream (flow.Stream), in pieces: memory does not grow
// with the trace.
func listBranches(w, notes io.Writer, args []string) error {
	a, err := parseBranchesArgs(args)
	if err != nil {
		return err
	}
	in, err := openInput(a.trace)
	if err != nil {
		return err
	}
	defer in.close()
	if isPerfData(in.head) {
		data, err := in.perfData(maxPerfRead)
		if err != nil {
			return err
		}
		return perfBranches(w, &a, data)
	}
	next, err := in.pieces(false, notes)
	if err != nil {
		return err
	}
	if len(a.raws)+len(a.elfs)+len(a.pages)+len(a.maps) == 0 {
		return fmt.Errorf("%w: %w", errNoImage, flow.ErrBadOption)
	}
	s, closeAll, err := branchImages(&a)
	if err != nil {
		return err
	}
	events, err := loadEvents(a.events)
	if err != nil {
		return errors.Join(err, closeAll())
	}
	b := flow.NewBranches(w, s, s, events)
	b.SetContext(a.tid, a.cpu)
	d := flow.New(s, flow.Options{})
	// Lines carry time= once a TSC conversion (perf.data) sets b.TimeConv
	// and the decoder runs with Options.Time; raw PT has neither.
	b.SetClock(d)
	err = feedStream(next, flow.NewStream(d, b))
	d.Close() // feedStream closed the Stream
	if err != nil {
		return errors.Join(err, closeAll())
	}
	b.Finish()
	c, bc, rc := d.Counters(), b.Counters(), b.RecordCounters()
	rc.Errors += c.Errors
	if err := b.Flush(); err != nil {
		return errors.Join(fmt.Errorf("write output: %w", err), closeAll())
	}
	line := fmt.Appendf(nil, "branch summary: branches=%d insns=%d gaps=%d\n", bc.Branches, c.Insns, bc.Gaps)
	if _, err := w.Write(decode.AppendSummary(line, &rc)); err != nil {
		return errors.Join(fmt.Errorf("write output: %w", err), closeAll())
	}
	return closeAll()
}

// openTrace opens the trace file name ("-": standard input); done closes
// it.
func openTrace(name string) (f *os.File, done func(), err error) {
	if name == "-" {
		return os.Stdin, func() {}, nil
	}
	if f, err = os.Open(name); err != nil {
		return nil, nil, fmt.Errorf("read trace: %w", err)
	}
	return f, func() { _ = f.Close() }, nil
}

// feedStream writes a raw trace's pieces (traceFile.pieces, which has no
// gaps) to s and closes it.
func feedStream(next func() ([]byte, bool, error), s *flow.Stream) error {
	for {
		d, _, err := next()
		if err == io.EOF {
			return s.Close()
		}
		if err != nil {
			_ = s.Close()
			return err
		}
		_, _ = s.Write(d)
	}
}

// perfBranches implements `ptfs decode --branches` on perf.data: the
// side band builds each process's memory from the binaries on disk (under
// --root), refusing one whose build id is not the recorded one, and each
// AUX buffer is decoded in the space of the process its ITRACE_START names
// (DESIGN §5). Code whose file is missing or refused is unknown: its
// mappings are counted, its errors printed as image: lines.
func perfBranches(w io.Writer, a *branchesArgs, data []byte) error {
	if len(a.raws)+len(a.elfs)+len(a.pages)+len(a.maps) > 0 {
		return fmt.Errorf("%s: perf.data brings its own images (its side band, with --root and --vdso): %w", a.trace, flow.ErrBadOption)
	}
	f, err := perfdata.Parse(data)
	if err != nil {
		return fmt.Errorf("%s: %w", a.trace, err)
	}
	if len(f.Buffers) == 0 {
		return fmt.Errorf("%s: perf.data without AUX area trace (record with -e intel_pt//): %w", a.trace, errNoTrace)
	}
	events, err := loadEvents(a.events)
	if err != nil {
		return err
	}
	// An MMAP2 may carry its file's build id (perf record
	// --buildid-mmap) where the header has none.
	for _, e := range f.Events {
		if _, ok := f.BuildIDs[e.Name]; !ok && e.Kind == perfdata.Mmap && len(e.BuildID) > 0 {
			f.BuildIDs[e.Name] = e.BuildID
		}
	}
	p, closeP, err := branchProcesses(a, f.BuildIDs)
	if err != nil {
		return err
	}
	// A first pass over the whole side band names the files whose code
	// stays unknown, once; each buffer then applies it again from its
	// start, over time (the files are read once).
	imageErrs := sideBand(p, f.Events)
	unknown := p.Unknown()
	for _, e := range imageErrs {
		if _, err := fmt.Fprintf(w, "image: %v\n", e); err != nil {
			return errors.Join(fmt.Errorf("write output: %w", err), closeP())
		}
	}
	var conv func(tsc uint64) uint64
	if f.Time != nil {
		conv = f.Time.NS
	}
	var bc flow.BranchCounters
	var c flow.Counters
	var rc decode.Counters
	var pc perfflow.Counters
	for _, buf := range f.Buffers {
		if _, err := fmt.Fprintf(w, "perf buffer: idx=%d cpu=%d tid=%d pid=%d\n", buf.Idx, buf.CPU, buf.TID, buf.PID); err != nil {
			return errors.Join(fmt.Errorf("write output: %w", err), closeP())
		}
		p.Forget()
		d := perfflow.New(perfflow.Config{Processes: p, Timeline: f.Timeline(buf), CPU: buf.CPU, TimeConv: conv},
			func(mem flow.Memory, sym flow.Symbolizer) *flow.Branches {
				return flow.NewBranches(w, mem, sym, events)
			})
		if err := d.DecodeBuffer(buf, f.AuxRecords(buf)); err != nil {
			return errors.Join(err, closeP())
		}
		b := d.Branches()
		if err := b.Flush(); err != nil {
			return errors.Join(fmt.Errorf("write output: %w", err), closeP())
		}
		dc, bcc, rcc, pcc := d.Flow().Counters(), b.Counters(), b.RecordCounters(), d.Counters()
		bc.Branches, bc.Gaps, c.Insns, c.Errors = bc.Branches+bcc.Branches, bc.Gaps+bcc.Gaps, c.Insns+dc.Insns, c.Errors+dc.Errors
		rc.Add(&rcc)
		pc.Add(&pcc)
	}
	rc.Errors += c.Errors
	lost := pc.Truncated + pc.Collision + pc.Partial + pc.Holes
	line := fmt.Appendf(nil, "perf summary: buffers=%d lost=%d unknown-mappings=%d image-errors=%d\n",
		len(f.Buffers), lost+f.LostAux+f.LostEvents+f.AuxtraceErrors, unknown, len(imageErrs))
	line = fmt.Appendf(line, "perf losses: aux-truncated=%d aux-collision=%d aux-partial=%d aux-hole=%d side-band-lost=%d switches=%d\n",
		pc.Truncated, pc.Collision, pc.Partial, pc.Holes, pc.SideBandLost, pc.Switches)
	line = fmt.Appendf(line, "branch summary: branches=%d insns=%d gaps=%d\n", bc.Branches, c.Insns, bc.Gaps)
	if _, err := w.Write(decode.AppendSummary(line, &rc)); err != nil {
		return errors.Join(fmt.Errorf("write output: %w", err), closeP())
	}
	return closeP()
}

// sideBand applies the side band to p in file order and returns the
// errors of the mappings whose bytes stay unknown.
func sideBand(p *images.Processes, evs []perfdata.Event) []error {
	var errs []error
	for i := range evs {
		if err := perfflow.ApplyProcess(p, &evs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
