package main

import (
	"bytes"
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
	"ptfs/tracefs"
)

const branchesUsage = `usage: ptfs decode --branches IMAGE... [--tid N] [--cpu N] FILE

Reconstructs the control flow of the raw Intel PT trace FILE and prints a
branch: line per taken control transfer, trace: lines where tracing starts,
stops and resynchronises, gap: lines where the path is unknown (overflow,
decoding error) and manual ptwrite: lines, in execution order (DESIGN §5).
IMAGE says where the traced code was (later ones win where they overlap):
  --raw FILE[:FROM[-TO]]:BASE  bytes of FILE (libipt ptxed's form) at BASE
  --elf FILE[:BIAS]            an ELF file's PT_LOAD segments at BIAS + vaddr
  --pages ADDRFILE:DUMPFILE    a libxdc page dump
  --maps FILE                  /proc/PID/maps snapshots ('#' lines skipped; a
                               later line wins), files read under --root DIR,
                               [vdso] from --vdso FILE
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
	if len(a.raws)+len(a.elfs)+len(a.pages)+len(a.maps) == 0 {
		return a, fmt.Errorf("%w: %w", errNoImage, flow.ErrBadOption)
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
		var vdso images.Source
		if a.vdso != "" {
			e, err := images.OpenELF(a.vdso)
			if err != nil {
				return nil, closeAll, fmt.Errorf("--vdso: %w", err)
			}
			closers = append(closers, e.Close)
			vdso = e
		}
		root := a.root
		p := images.NewProcesses(images.Options{VDSO: vdso, Path: func(name string) string {
			if root == "" {
				return name
			}
			// Under root whatever the name says: a maps file is input,
			// its names must not reach outside the directory given.
			return filepath.Join(root, filepath.Clean("/"+name))
		}})
		closers = append(closers, p.Close)
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

// readMaps reads /proc/PID/maps text, skipping '#' comment lines (ptsim's
// snapshot and dump lines).
func readMaps(path string) ([]images.MapsEntry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--maps: %w", err)
	}
	var keep []byte
	for line := range bytes.Lines(data) {
		if !bytes.HasPrefix(line, []byte("#")) {
			keep = append(keep, line...)
		}
	}
	entries, err := images.ParseMaps(keep)
	if err != nil {
		return nil, fmt.Errorf("--maps %s: %w", path, err)
	}
	return entries, nil
}

// listBranches implements `ptfs decode --branches`.
func listBranches(w io.Writer, args []string) error {
	a, err := parseBranchesArgs(args)
	if err != nil {
		return err
	}
	streams, _, err := input(a.trace)
	if err != nil {
		return err
	}
	if len(streams) != 1 || streams[0].cpu >= 0 {
		return fmt.Errorf("%s: perf.data input is not supported by --branches yet (give the raw AUX bytes): %w", a.trace, flow.ErrBadOption)
	}
	var trace []byte
	streams[0].segments(func(d []byte, _ bool) { trace = d })
	s, closeAll, err := branchImages(&a)
	if err != nil {
		return err
	}
	events := map[uint16]*decode.Event{}
	if a.events != "" {
		if events, err = tracefs.LoadEvents(os.DirFS(a.events)); err != nil {
			return errors.Join(fmt.Errorf("events %s: %w", a.events, err), closeAll())
		}
	}
	b := flow.NewBranches(w, s, s, events)
	b.SetContext(a.tid, a.cpu)
	d := flow.New(s, flow.Options{})
	// Lines carry time= once a TSC conversion (perf.data) sets b.TimeConv
	// and the decoder runs with Options.Time; raw PT has neither.
	b.SetClock(d)
	d.Decode(trace, b)
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
