package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"ptfs/decode"
	"ptfs/engine"
	"ptfs/flow"
	"ptfs/perfdata"
	"ptfs/tracefs"
)

const decodeUsage = `usage: ptfs decode [--events DIR] FILE...
       ptfs decode --packets [PTDUMP-OPTIONS] FILE...
       ptfs decode --insns --raw FILE:BASE [PTXED-OPTIONS] [--pt] FILE
       ptfs decode --branches IMAGE... [--events DIR] FILE

FILE is raw Intel PT bytes or a perf.data file (file or pipe format; its
PERF_RECORD_AUXTRACE data, per buffer); - (once) is standard input. A raw
trace is decoded as it is read, from its first PSB (the bytes before it are
skipped and counted on stderr); perf.data through a pipe is held in memory,
at most 1 GiB. Prints
probe records and manual ptwrites (records of several CPUs merged by time
when the trace has it), then the summary line. DIR is a tracefs events directory (or a copy) giving the
probe events; without it every ptwrite is a manual one.
--packets prints libipt ptdump's packet listing instead; it takes ptdump's
options (--lastip, --no-pad, --time, --mtc-freq N, ...).
--insns reconstructs the control flow and prints libipt ptxed's listing
(instruction addresses and [event] lines); it takes ptxed's options: --raw
FILE[:START[-END]]:BASE (the code; more than one may be given), --pt FILE,
--cpu F/M|none|auto, --no-inst, --quiet, --check, --event:ip, --event:iflags,
--resync-on-error, --event:time, --event:tick (libipt's time estimate with
--mtc-freq, --nom-freq, --cpuid-0x15.eax/ebx, --insn:/--block:keep-tcal-on-ovf),
--stat, --stat:insn, --stat:blocks, --insn-decoder, --block-decoder,
--block:show-blocks, --block:end-on-call, --block:end-on-jump (ptxed's filter
options are accepted; --offset, --time, --att and --raw-insn are refused).
--branches prints the control flow as branch: lines with probe records in
execution order; IMAGE is --raw FILE[:FROM[-TO]]:BASE, --elf FILE[:BIAS],
--pages ADDRFILE:DUMPFILE or --maps FILE [--root DIR] [--vdso FILE]
(ptfs decode --branches --help says more).
`

// errNoTrace: the input holds no Intel PT data.
var errNoTrace = errors.New("no Intel PT data")

// runDecode implements `ptfs decode`; it returns the exit status.
func runDecode(args []string, stdout, stderr io.Writer) int {
	var (
		eventsDir string
		packets   bool
		ptArgs    []string
		files     []string
	)
	for i, a := range args {
		if a == "--insns" {
			return runInsns(append(args[:i:i], args[i+1:]...), stdout, stderr)
		}
		if a == "--branches" {
			return runBranches(append(args[:i:i], args[i+1:]...), stdout, stderr)
		}
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			files = append(files, args[i+1:]...)
			i = len(args)
		case a == "-h" || a == "--help":
			fmt.Fprint(stdout, decodeUsage)
			return 0
		case a == "--events":
			if i+1 >= len(args) {
				fmt.Fprintf(stderr, "ptfs decode: --events needs a directory\n%s", decodeUsage)
				return 2
			}
			i++
			eventsDir = args[i]
		case strings.HasPrefix(a, "--events="):
			eventsDir = strings.TrimPrefix(a, "--events=")
		case a == "--packets":
			packets = true
		case strings.HasPrefix(a, "--"):
			// ptdump's options, checked by ParsePtdumpArgs.
			ptArgs = append(ptArgs, a)
			if decode.PtdumpOptionTakesValue(a) && i+1 < len(args) {
				i++
				ptArgs = append(ptArgs, args[i])
			}
		case strings.HasPrefix(a, "-") && a != "-":
			fmt.Fprintf(stderr, "ptfs decode: unknown option %q\n%s", a, decodeUsage)
			return 2
		default:
			files = append(files, a)
		}
	}
	if len(files) == 0 {
		fmt.Fprintf(stderr, "ptfs decode: no FILE\n%s", decodeUsage)
		return 2
	}
	if i := slices.Index(files, "-"); i >= 0 && slices.Contains(files[i+1:], "-") {
		// Two streams over one standard input would read each other's
		// pieces (a pipe) or the same bytes twice (a mapped file).
		fmt.Fprintf(stderr, "ptfs decode: standard input (-) given more than once\n%s", decodeUsage)
		return 2
	}
	out := bufio.NewWriterSize(stdout, 64<<10)
	var err error
	if !packets && len(ptArgs) > 0 {
		fmt.Fprintf(stderr, "ptfs decode: unknown option %q (ptdump options go with --packets)\n%s", ptArgs[0], decodeUsage)
		return 2
	}
	if packets {
		if eventsDir != "" {
			fmt.Fprintln(stderr, "ptfs decode: --events has no effect with --packets")
		}
		err = guardFaults(func() error { return listPackets(out, stderr, files, ptArgs) })
	} else {
		err = guardFaults(func() error { return decodeRecords(out, stderr, files, eventsDir) })
	}
	if ferr := out.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("write output: %w", ferr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ptfs decode: %v\n", err)
		if errors.Is(err, decode.ErrBadOption) {
			return 2
		}
		return 1
	}
	return 0
}

// runInsns runs `ptfs decode --insns`; args are ptxed's.
func runInsns(args []string, stdout, stderr io.Writer) int {
	return runListing(listInsns, decodeUsage, args, stdout, stderr)
}

// runBranches runs `ptfs decode --branches`.
func runBranches(args []string, stdout, stderr io.Writer) int {
	for _, a := range args {
		if a == "-h" || a == "--help" {
			fmt.Fprint(stdout, branchesUsage)
			return 0
		}
	}
	return runListing(listBranches, branchesUsage, args, stdout, stderr)
}

// runListing runs a listing of `ptfs decode` and returns the exit status:
// 2 and the usage for bad options.
func runListing(list func(w, notes io.Writer, args []string) error, usage string, args []string, stdout, stderr io.Writer) int {
	out := bufio.NewWriterSize(stdout, 64<<10)
	err := guardFaults(func() error { return list(out, stderr, args) })
	if ferr := out.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("write output: %w", ferr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ptfs decode: %v\n", err)
		if errors.Is(err, flow.ErrBadOption) {
			fmt.Fprint(stderr, usage)
			return 2
		}
		return 1
	}
	return 0
}

// stream is one PT byte stream of an input file: a raw file, or one AUX
// buffer of a perf.data file.
type stream struct {
	name     string
	cpu, tid int32
	pid      int32 // 0: unknown
	// next returns the stream's next piece of trace, at most feedSize
	// bytes, valid until the next call; gap is set where data was lost
	// before it. It returns io.EOF after the last piece.
	next func() (data []byte, gap bool, err error)
	time *perfdata.TimeConv
}

// isPerfData tells perf.data (either byte order) from a raw trace.
func isPerfData(data []byte) bool {
	return bytes.HasPrefix(data, []byte("PERFILE2")) || bytes.HasPrefix(data, []byte("2ELIFREP"))
}

// input opens a file ("-": standard input) as its streams; lost is the loss
// perf.data reports that no stream accounts for. A raw trace is one stream
// from its first PSB (skip: the bytes before it are not handed out; the
// Assembler decodes from the first byte it is given), in pieces
// (traceFile.pieces); perf.data is held whole (traceFile.perfData). done
// closes the file and unmaps it.
func input(name string, skip bool, notes io.Writer) (streams []stream, lost uint64, done func(), err error) {
	t, err := openInput(name)
	if err != nil {
		return nil, 0, nil, err
	}
	streams, lost, err = openStreams(t, skip, notes)
	if err != nil {
		t.close()
		return nil, 0, nil, err
	}
	return streams, lost, t.close, nil
}

// mapFile maps f when it is a regular file larger than feedSize, so that
// the decoder reads the page cache in place, without read(2)'s copy into
// a buffer (about a tenth of ptfs decode's CPU); nil when it cannot be (a
// pipe, a small file, mmap refused): the file is read instead. The mapping
// is private and writable, so that nothing written to it could reach the
// file. A file that shrinks while mapped faults on the pages it lost:
// guardFaults turns that into an error. Standard input positioned past
// the file's start (what a shell read before) is read from there, not
// mapped.
func mapFile(f *os.File) []byte {
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() <= feedSize || int64(int(st.Size())) != st.Size() {
		return nil
	}
	if off, err := f.Seek(0, io.SeekCurrent); err != nil || off != 0 {
		return nil
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		return nil
	}
	_ = unix.Madvise(mem, unix.MADV_SEQUENTIAL) // a read-ahead hint: nothing depends on it
	return mem
}

// errInputChanged: a mapped input file shrank while it was decoded.
var errInputChanged = errors.New("input file shrank while it was read")

// guardFaults runs fn, a decoding of mapped input files, with a memory
// fault turned into errInputChanged in place of a crash: a file that
// shrinks while mapped faults on the pages it lost.
func guardFaults(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			// Faults at an address; nil dereferences and other panics
			// are bugs and go on.
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				panic(r)
			}
			err = fmt.Errorf("read trace: %w", errInputChanged)
		}
	}()
	return fn()
}

// openStreams makes the streams of the input t.
func openStreams(t *traceFile, skip bool, notes io.Writer) ([]stream, uint64, error) {
	if !isPerfData(t.head) {
		next, err := t.pieces(skip, notes)
		if err != nil {
			return nil, 0, err
		}
		return []stream{{name: t.name, cpu: -1, tid: -1, next: next}}, 0, nil
	}
	data, err := t.perfData(maxPerfRead)
	if err != nil {
		return nil, 0, err
	}
	pf, err := perfdata.Parse(data)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", t.name, err)
	}
	if len(pf.Buffers) == 0 {
		return nil, 0, fmt.Errorf("%s: perf.data without AUX area trace (record with -e intel_pt//): %w", t.name, errNoTrace)
	}
	var streams []stream
	for _, b := range pf.Buffers {
		// A per-thread buffer's process is its thread's; a per-CPU
		// buffer's first ITRACE_START names only its first process.
		pid := int32(0)
		if b.TID >= 0 && b.PID > 0 {
			pid = b.PID
		}
		var (
			segs [][]byte
			gaps []bool
		)
		b.Segments(func(d []byte, gap bool) { segs, gaps = append(segs, d), append(gaps, gap) })
		streams = append(streams, stream{
			name: fmt.Sprintf("%s idx %d cpu %d tid %d", t.name, b.Idx, b.CPU, b.TID),
			cpu:  b.CPU, tid: b.TID, pid: pid,
			next: memPieces(segs, gaps),
			time: pf.Time,
		})
	}
	return streams, pf.LostAux + pf.LostEvents + pf.AuxtraceErrors, nil
}

// memPieces returns a stream's next function over segments in memory,
// gaps[i] set when data was lost before segs[i].
func memPieces(segs [][]byte, gaps []bool) func() ([]byte, bool, error) {
	return func() ([]byte, bool, error) {
		if len(segs) == 0 {
			return nil, false, io.EOF
		}
		gap := gaps[0]
		gaps[0] = false
		n := min(len(segs[0]), feedSize)
		d := segs[0][:n]
		if segs[0] = segs[0][n:]; len(segs[0]) == 0 {
			segs, gaps = segs[1:], gaps[1:]
		}
		return d, gap, nil
	}
}

// listPackets prints the ptdump listing of every stream; with more than one,
// each listing is preceded by a `# NAME` line. Each listing is streamed
// (decode.PtdumpWriter): memory does not grow with the trace.
func listPackets(w, notes io.Writer, files []string, ptArgs []string) error {
	opts, err := decode.ParsePtdumpArgs(ptArgs)
	if err != nil {
		return err
	}
	if opts.NoSync {
		notes = nil // the bytes before the first PSB are listed
	}
	var all []stream
	for _, name := range files {
		s, _, done, err := input(name, false, notes)
		if err != nil {
			return err
		}
		defer done()
		all = append(all, s...)
	}
	for _, s := range all {
		if len(all) > 1 {
			fmt.Fprintf(w, "# %s\n", s.name)
		}
		// A gap (lost data) starts a new listing, so no packet is
		// pieced together across it.
		var pw *decode.PtdumpWriter
		for {
			d, gap, err := s.next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			if gap && pw != nil {
				if err := pw.Close(); err != nil {
					return err
				}
				fmt.Fprintln(w, "# gap: trace data lost here")
				pw = nil
			}
			if pw == nil {
				if pw, err = decode.NewPtdumpWriter(w, opts); err != nil {
					return err
				}
			}
			if _, err := pw.Write(d); err != nil {
				return err
			}
		}
		if pw != nil {
			if err := pw.Close(); err != nil {
				return err
			}
		}
	}
	return nil
}

// entry is one output line waiting for the merge.
type entry struct {
	rec    decode.Record
	man    decode.Manual
	manual bool
}

// cursor decodes one stream a piece at a time into its queue of the merge,
// so that the merge holds the entries of at most feedSize bytes of trace per
// stream, not of the whole trace (the Assembler completes a packet cut
// between two pieces).
type cursor struct {
	a    *decode.Assembler
	m    *engine.Merger[entry]
	q    int // the cursor's queue in m
	next func() ([]byte, bool, error)
	done bool
	err  error // the read error that ended the stream
}

// feedSize is the most trace a cursor (or decode --branches) decodes at
// once.
const feedSize = 1 << 20

func (c *cursor) Record(r *decode.Record) {
	// Slots are reused: set all of the entry.
	*c.m.Push(c.q, r.Time) = entry{rec: *r}
}

func (c *cursor) Manual(m *decode.Manual) {
	*c.m.Push(c.q, m.Time) = entry{man: *m, manual: true}
}

// fill decodes pieces until the stream has an entry in its queue or
// ends.
func (c *cursor) fill() {
	for !c.done && c.m.QueueLen(c.q) == 0 {
		c.step()
	}
}

// step decodes the next piece of the stream, or ends it.
func (c *cursor) step() {
	d, gap, err := c.next()
	if err != nil {
		if err != io.EOF {
			c.err = err
		}
		c.a.End()
		c.done = true
		return
	}
	if gap {
		c.a.Gap()
	}
	c.a.Feed(d)
}

// printer writes the output lines, numbering the records. Lines are
// formatted into its own buffer and written in large writes, not copied
// line by line into a bufio.Writer.
type printer struct {
	w     io.Writer
	buf   []byte
	lines decode.RecordWriter
	seq   uint64
	err   error // the first write error; later lines are not written
}

// printBuf is the size of the printer's writes: large enough that the
// writes cost little, small enough to stay in the CPU's cache beside the
// trace being decoded (1 MiB cost about a tenth more CPU).
const printBuf = 128 << 10

func (p *printer) Record(r *decode.Record) {
	p.seq++
	if p.buf = p.lines.Append(p.buf, p.seq, r); len(p.buf) >= printBuf {
		p.flush()
	}
}

func (p *printer) Manual(m *decode.Manual) {
	if p.buf = decode.AppendManual(p.buf, m.Payload, m.IP, m.HasIP); len(p.buf) >= printBuf {
		p.flush()
	}
}

// flush writes the buffered lines.
func (p *printer) flush() {
	if p.err == nil && len(p.buf) > 0 {
		if _, err := p.w.Write(p.buf); err != nil {
			p.err = fmt.Errorf("write output: %w", err)
		}
	}
	p.buf = p.buf[:0]
}

// loadEvents loads the probe events of the --events directory dir (none
// without it).
func loadEvents(dir string) (map[uint16]*decode.Event, error) {
	if dir == "" {
		return map[uint16]*decode.Event{}, nil
	}
	events, err := tracefs.LoadEvents(os.DirFS(dir))
	if err != nil {
		return nil, fmt.Errorf("events %s: %w", dir, err)
	}
	return events, nil
}

// decodeRecords prints the records of the files' streams, merged by time,
// and the summary; notes gets what was skipped.
func decodeRecords(w, notes io.Writer, files []string, eventsDir string) error {
	events, err := loadEvents(eventsDir)
	if err != nil {
		return err
	}
	var (
		total   decode.Counters
		cursors []*cursor
		// Release's bound is not used: the merge pops.
		merge = engine.NewMerger[entry](0, 0)
	)
	var all []stream
	for _, name := range files {
		streams, lost, done, err := input(name, true, notes)
		if err != nil {
			return err
		}
		defer done()
		// Losses perf.data reports without saying where (ring LOST,
		// AUXTRACE_ERROR, AUX truncation of an unknown buffer).
		total.Errors += lost
		all = append(all, streams...)
	}
	pr := &printer{w: w, buf: make([]byte, 0, printBuf+4096)}
	for _, s := range all {
		c := &cursor{m: &merge, q: merge.AddQueue()}
		var out decode.Output = c
		if len(all) == 1 {
			// One stream is in time order already: its lines go out as
			// they are decoded, without the copies into and out of the
			// merge.
			out = pr
		}
		c.a = decode.NewAssembler(events, out)
		c.a.SetCPU(s.cpu)
		c.a.SetTID(s.tid)
		c.a.SetPID(s.pid)
		if s.time != nil {
			c.a.SetTimeConv(s.time.NS)
		}
		c.next = s.next
		cursors = append(cursors, c)
	}
	if len(cursors) == 1 {
		c := cursors[0]
		for !c.done && pr.err == nil {
			c.step()
		}
	} else {
		// Each stream is in time order; the merge takes the earliest
		// entry of all streams (ties and unknown times: the earlier
		// stream first) while every stream that has not ended holds one:
		// only the one popped from can run out.
		for _, c := range cursors {
			c.fill()
		}
		for pr.err == nil {
			e, q, ok := merge.Pop()
			if !ok {
				break
			}
			if e.manual {
				pr.Manual(&e.man)
			} else {
				pr.Record(&e.rec)
			}
			cursors[q].fill()
		}
	}
	if pr.flush(); pr.err != nil {
		return pr.err
	}
	for _, c := range cursors {
		if c.err != nil {
			return c.err
		}
		cs := c.a.Counters()
		total.Add(&cs)
	}
	if _, err := w.Write(decode.AppendSummary(nil, &total)); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}
