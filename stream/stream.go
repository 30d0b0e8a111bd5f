// Package stream holds a growing text file of whole lines with bounded
// memory and disk: the content behind ptfs's `records` and `branches`
// files.
package stream

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNegativeOffset is returned by Reader.ReadAt for an offset below zero.
var ErrNegativeOffset = errors.New("negative offset")

// ErrClosed is returned by reads of a closed Stream.
var ErrClosed = errors.New("stream closed")

const (
	// DefaultLimit is the soft bound New uses when given none.
	DefaultLimit = 64 << 20
	// DefaultHardLimit is the hard bound New uses when given none.
	DefaultHardLimit = 1 << 30
	// maxChunk is the largest chunk: the unit of spilling and discarding.
	// Big enough that a FUSE read (up to 1 MiB) rarely spans two, small
	// enough that memory stays a chunk; and 8 KiB under 1 MiB so that a
	// read of a whole spilled chunk, with a FUSE reply's header and the
	// page go-fuse keeps spare, fits a pipe of the default most
	// (/proc/sys/fs/pipe-max-size, 1 MiB): it is spliced (see Span).
	maxChunk = 1<<20 - 8<<10
)

// Options configure a Stream.
type Options struct {
	// Limit is the soft bound in bytes: at most this much is kept for a
	// reader that opens now (DefaultLimit when <= 0).
	Limit int64
	// HardLimit is the most kept in bytes while an open reader has not
	// read it (DefaultHardLimit when <= 0; at least Limit and two chunks
	// plus 64 bytes).
	HardLimit int64
	// Dir holds the unlinked spill file (os.TempDir() when empty).
	Dir string
}

// Stream is an ever-growing text file of whole lines. Its size only grows,
// except by Truncate, which empties it and restarts offsets at 0.
//
// The content kept is a window [start, end) of whole chunks of whole
// lines. The chunk being written is in memory; full chunks go to an
// unlinked spill file (page cache) and reads of them pread it, or lend it
// (ReadSpan), except reads of the last one, which stays in memory until
// the next is full. Reads of the chunks in memory copy, or lend the
// buffer's bytes (ReadSpan). Whole
// chunks are discarded from the front when the window is over the soft
// bound and every open Reader has read them, or when it is over the hard
// bound whatever the readers (counted in Stats.Unread). A Reader whose
// next byte was discarded reads a gap line instead (see Reader). A line
// longer than a chunk can never be kept: it is dropped and counted.
//
// One goroutine may Append while any number read; all methods are safe for
// concurrent use. Reads never wait for data.
type Stream struct {
	soft, hard int64
	chunkSize  int
	dir        string

	mu     sync.Mutex
	gen    uint64  // truncations: a reader of another generation restarts
	start  int64   // window start
	chunks []chunk // full chunks, oldest first, all in the spill file
	cur    []byte  // the chunk being written, at curOff
	curOff int64
	// last holds the bytes of the last of chunks, as well as the spill
	// file (the buffer it was written in, kept until the next chunk is
	// full): a reader a chunk behind reads it without a pread. Only a
	// spilled seal appends to chunks and keeps, so it is last's whenever
	// there is one.
	last []byte
	// memLent counts the spans that hold bytes of a chunk buffer (cur,
	// last, or one the Stream let go of while lent), which is not reused
	// until they are released; spare is a buffer let go of while lent,
	// kept at its last release for the next chunk.
	memLent []memLend
	spare   []byte
	// curLine and lines are line indexes since the last truncation: of
	// cur's first line and of the next line to come.
	curLine, lines uint64
	readers        map[*Reader]struct{}
	file           *os.File // the spill file, made at the first full chunk
	// free are the spill slots to reuse, the first holes of them punched
	// (their disk given back), the rest still holding their blocks and,
	// most likely, their pages in the page cache, the slot freed last at
	// the end: the next spill takes it (see freeSlot).
	free  []int
	holes int
	slots int // spill slots made
	// reserved is how many slots from 0 have their disk allocated ahead
	// (see reserve); noReserve: the file system refused.
	reserved  int
	noReserve bool
	closed    bool
	spillErr  error
	// lent counts the spans of the spill file not yet released (see
	// Span); nil when none were lent since the file was made.
	lent *lent

	size               atomic.Int64
	resets             atomic.Uint64
	discarded, unread  atomic.Uint64
	dropped, spillLost atomic.Uint64
}

// spareSlots is how many free spill slots keep their disk space.
const spareSlots = 2

// chunk is a full chunk in the spill file.
type chunk struct {
	off   int64  // stream offset of its first byte
	n     int    // bytes
	line  uint64 // line index of its first line
	lines uint64 // lines it holds
	slot  int    // spill file slot
}

func (c *chunk) end() int64 { return c.off + int64(c.n) }

// fileOff returns where stream offset off of chunk c is in the spill file.
func (s *Stream) fileOff(c *chunk, off int64) int64 {
	return int64(c.slot)*int64(s.chunkSize) + off - c.off
}

// New returns an empty Stream. It makes no file until the first chunk is
// full.
func New(o Options) *Stream {
	if o.Limit <= 0 {
		o.Limit = DefaultLimit
	}
	if o.HardLimit <= 0 {
		o.HardLimit = DefaultHardLimit
	}
	chunkSize := min(o.Limit, maxChunk)
	// After a forced discard the window keeps at least hard-2*chunkSize
	// bytes: enough lines to cover a gap line (see Reader.makeGap).
	o.HardLimit = max(o.HardLimit, o.Limit, 2*chunkSize+gapMax)
	if o.Dir == "" {
		o.Dir = os.TempDir()
	}
	return &Stream{
		soft:      o.Limit,
		hard:      o.HardLimit,
		chunkSize: int(chunkSize),
		dir:       o.Dir,
		readers:   map[*Reader]struct{}{},
	}
}

// Append adds p, whole lines, at the end. A final line without '\n' gets
// one. Append does not keep p and, once the chunk buffer exists, does not
// allocate; it writes to the spill file only when a chunk fills.
func (s *Stream) Append(p []byte) {
	if len(p) == 0 {
		return
	}
	s.mu.Lock()
	if len(s.cur)+len(p) <= s.chunkSize && p[len(p)-1] == '\n' && cap(s.cur) > 0 {
		// Common case: one or more whole lines that fit the chunk.
		// Counted before the copy: Commit's p may lie in cur's buffer
		// past its end (Tail's bytes, after Truncate emptied cur), and
		// the copy to cur's start then writes over p's first bytes.
		s.lines += uint64(bytes.Count(p, newline))
		s.cur = append(s.cur, p...)
	} else {
		s.appendLines(p)
	}
	s.size.Store(s.curOff + int64(len(s.cur)))
	s.mu.Unlock()
}

var newline = []byte{'\n'}

// Tail returns the free space of the chunk being written, as an empty
// slice with that capacity: the appender may format lines into it, in
// place, and pass them to Commit. Only the one goroutine that appends may
// use it, and it appends nothing else before that Commit (an Append would
// write over them); readers never look past what Commit took.
func (s *Stream) Tail() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		s.cur = make([]byte, 0, s.chunkSize)
	}
	return s.cur[len(s.cur):len(s.cur)]
}

// Commit appends p, whole lines, as Append does; lines is how many, as
// the appender counted them while it wrote them (its count feeds the
// stream's line numbers and loss counts). When p is what Tail returned,
// grown within its capacity, its bytes are in place already: Commit only
// takes them, without a copy and without a pass over them to count the
// lines (unless Truncate emptied the stream since: then they are copied
// to its start, and counted, as Append does).
func (s *Stream) Commit(p []byte, lines int) {
	if len(p) == 0 {
		return
	}
	s.mu.Lock()
	if n := len(s.cur); n < cap(s.cur) && unsafe.SliceData(p) == &s.cur[:n+1][n] && p[len(p)-1] == '\n' {
		s.cur = s.cur[:n+len(p)]
		s.lines += uint64(lines)
		s.size.Store(s.curOff + int64(len(s.cur)))
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.Append(p)
}

// appendLines adds p, the whole lines that fit the chunk at once, else
// line by line, sealing the chunk whenever the next line does not fit.
// Called with mu held.
func (s *Stream) appendLines(p []byte) {
	if s.cur == nil {
		s.cur = make([]byte, 0, s.chunkSize)
	}
	for len(p) > 0 {
		// A batch of lines (the record path's) fills the chunk with one
		// copy.
		if n := bytes.LastIndexByte(p[:min(len(p), s.chunkSize-len(s.cur))], '\n') + 1; n > 0 {
			// Counted before the copy, as in Append: p may overlap
			// where it goes.
			s.lines += uint64(bytes.Count(p[:n], newline))
			s.cur = append(s.cur, p[:n]...)
			p = p[n:]
			continue
		}
		n := bytes.IndexByte(p, '\n') + 1
		nl := n > 0
		if !nl {
			n = len(p)
		}
		line := p[:n]
		p = p[n:]
		size := len(line)
		if !nl {
			size++
		}
		if size > s.chunkSize {
			s.dropped.Add(1)
			continue
		}
		if len(s.cur)+size > s.chunkSize {
			s.seal()
		}
		s.cur = append(s.cur, line...)
		if !nl {
			s.cur = append(s.cur, '\n')
		}
		s.lines++
	}
}

// seal moves the full chunk being written to the spill file and trims the
// window. Called with mu held.
func (s *Stream) seal() {
	c := chunk{off: s.curOff, n: len(s.cur), line: s.curLine, lines: s.lines - s.curLine, slot: -1}
	s.curOff += int64(len(s.cur))
	s.curLine = s.lines
	if err := s.spill(&c); err != nil {
		// The chunk is lost, and with it everything before it: the
		// window stays contiguous. Status shows the error and counts
		// the lines.
		s.spillErr = err
		for len(s.chunks) > 0 {
			s.discard(false)
		}
		s.chunks = append(s.chunks, c)
		s.discard(true)
		s.cur = s.emptied(s.cur)
	} else {
		s.chunks = append(s.chunks, c)
		// The chunk stays in memory as last; the next is written in
		// the buffer last held.
		s.last, s.cur = s.cur, s.emptied(s.last)
	}
	s.trim()
}

// spill writes cur to a free slot of the spill file, making the file
// first if needed. Called with mu held.
func (s *Stream) spill(c *chunk) error {
	if s.closed {
		return ErrClosed
	}
	if s.file == nil {
		f, err := tempFile(s.dir)
		if err != nil {
			return err
		}
		s.file = f
	}
	slot, holes := s.slots, s.holes
	if k := len(s.free); k > 0 {
		slot, s.free = s.free[k-1], s.free[:k-1]
		s.holes = min(s.holes, k-1)
	} else {
		s.slots++
		s.reserve(slot)
	}
	if err := pwrite(s.file, s.cur, int64(slot)*int64(s.chunkSize)); err != nil {
		s.free, s.holes = append(s.free, slot), holes
		return fmt.Errorf("write stream spill file: %w", err)
	}
	c.slot = slot
	return nil
}

// pwrite writes all of p at off in f, as a system call the runtime
// knows of (os.File's WriteAt). Not a raw one (RawSyscall), which would
// spare the wake-up of the runtime's sysmon that an entersyscall makes
// (DESIGN §4, the seventh pass) but keeps the goroutine's P running while
// the kernel holds the write: no stop of the world (a GC's) can complete
// until it returns, so a write that blocks (dirty page throttling, a slow
// or frozen file system under Dir) stops every goroutine of the mount,
// FUSE and the perf reader with it, and a hung one hangs the process for
// good, its probes installed (TestPwriteBlockedStopsNothing).
func pwrite(f *os.File, p []byte, off int64) error {
	_, err := f.WriteAt(p, off)
	return err
}

// reserveSlots is how many slots reserve allocates at a time.
const reserveSlots = 16

// reserve allocates the disk of the slots from slot on, reserveSlots of
// them but no more than the hard bound can use, unless they are. A write
// into blocks already allocated costs the file system far less CPU than
// one that extends the file (ext4 here: 230 against 300 to 2,300 µs a
// MiB), and the appender pays it. The file's size grows with the
// reservation (not KEEP_SIZE: ext4 punches no hole beyond the size, see
// discard); what is read is only what was written. Best effort: where
// fallocate fails, writes allocate as they go. Called with mu held.
func (s *Stream) reserve(slot int) {
	if s.noReserve || slot < s.reserved {
		return
	}
	// The window holds at most hard bytes of whole chunks, and spareSlots
	// more are kept free.
	most := int(s.hard/int64(s.chunkSize)) + spareSlots + 1
	n := min(reserveSlots, most-slot)
	if n <= 0 {
		return
	}
	if err := unix.Fallocate(int(s.file.Fd()), 0,
		int64(slot)*int64(s.chunkSize), int64(n)*int64(s.chunkSize)); err != nil {
		s.noReserve = true
		return
	}
	s.reserved = slot + n
}

// tempFile makes an unlinked file in dir: O_TMPFILE where the file system
// has it, else a named temporary file removed at once.
func tempFile(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil {
		return os.NewFile(uintptr(fd), dir+"/(stream spill)"), nil
	}
	f, err2 := os.CreateTemp(dir, "ptfs-stream-*")
	if err2 != nil {
		return nil, fmt.Errorf("make stream spill file in %s: %w", dir, errors.Join(err, err2))
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("unlink stream spill file: %w", err)
	}
	return f, nil
}

// trim discards whole chunks from the front: while the window with a
// whole chunk being written would be over the hard bound, or over the soft
// bound and every open reader has read the front chunk. Reserving the
// chunk being written keeps the window under the bounds between two
// seals. Called with mu held.
func (s *Stream) trim() {
	for len(s.chunks) > 0 {
		kept := s.curOff - s.start + int64(s.chunkSize)
		switch {
		case kept > s.hard:
			s.discard(false)
		case kept > s.soft && s.readAll(s.chunks[0].end()):
			s.discard(false)
		default:
			return
		}
	}
}

// readAll reports whether every open reader is at or past off. Called
// with mu held.
func (s *Stream) readAll(off int64) bool {
	for r := range s.readers {
		if r.gen == s.gen && r.pos < off {
			return false
		}
	}
	return true
}

// discard drops the front chunk, counting its lines, of those the ones an
// open reader had not read, and, if it could not be spilled, in spillLost.
// Called with mu held.
func (s *Stream) discard(unspilled bool) {
	c := s.chunks[0]
	s.chunks = slices.Delete(s.chunks, 0, 1)
	s.start = c.end()
	s.discarded.Add(c.lines)
	if unspilled {
		s.spillLost.Add(c.lines)
	}
	// The slowest reader in the chunk missed the lines from its own on.
	from := c.line + c.lines
	for r := range s.readers {
		if r.gen != s.gen || r.pos >= c.end() {
			continue
		}
		if r.midLine && !r.owedNL && r.pos >= c.off && c.slot >= 0 {
			// A reader that stopped just before a line's '\n' has read
			// the line: it is owed the '\n', not told it lost the line.
			var nl [1]byte
			if n, _ := s.file.ReadAt(nl[:], s.fileOff(&c, r.pos)); n == 1 && nl[0] == '\n' {
				r.pos++
				r.line++
				r.owedNL = true
			}
		}
		if r.pos < c.end() {
			from = min(from, max(r.line, c.line))
		}
	}
	s.unread.Add(c.line + c.lines - from)
	if c.slot >= 0 {
		// Only now: the loop above reads the chunk.
		if s.lentSlot(c.slot) {
			return // freed by its last span's release
		}
		s.freeSlot(c.slot)
	}
}

// freeSlot makes slot of the spill file free for the next spill, which
// takes the slot freed last. Beyond spareSlots free ones with their
// blocks, the one freed first gives its disk back (punched): a slow reader
// made the file bigger than the window needs. Never the one freed last:
// the steady state frees and reuses a slot a chunk, and a slot written
// again while its pages are in the page cache, dirty, costs the copy
// alone, where a punched one costs fresh pages (on the development VM
// pages the host took back, several times the copy: DESIGN §4, the
// eleventh pass) and ext4 the allocation of its blocks; after a burst of
// discards, a punched slot on top was the next one written at every seal.
// Best effort: where punching fails, the disk comes back when the stream
// is truncated or closed. Called with mu held.
func (s *Stream) freeSlot(slot int) {
	s.free = append(s.free, slot)
	if len(s.free)-s.holes <= spareSlots {
		return
	}
	fd := int(s.file.Fd())
	_ = unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE,
		int64(s.free[s.holes])*int64(s.chunkSize), int64(s.chunkSize))
	s.holes++
	if s.reserved > s.slots {
		// And the slots reserved ahead, which the file no longer grows
		// into soon.
		_ = unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE,
			int64(s.slots)*int64(s.chunkSize), int64(s.reserved-s.slots)*int64(s.chunkSize))
		s.reserved = s.slots
	}
}

// Size returns the file's size: the end of the content.
func (s *Stream) Size() int64 { return s.size.Load() }

// Resets returns how often Truncate emptied the stream. A reader that
// sees the same size but a different Resets knows the content changed.
func (s *Stream) Resets() uint64 { return s.resets.Load() }

// Truncate empties the stream (`: > records`): offsets and line indexes
// restart at 0 and open readers start over from there.
func (s *Stream) Truncate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	s.chunks = s.chunks[:0]
	s.free, s.holes = s.free[:0], 0
	s.slots, s.reserved = 0, 0
	if s.cur != nil {
		s.cur = s.emptied(s.cur)
	}
	s.start, s.curOff, s.curLine, s.lines = 0, 0, 0, 0
	if s.file != nil && s.letGo() {
		// Give the disk back; the next spill starts at slot 0 again.
		// Best effort: the slots are reused either way, and Close
		// releases the file. (A file that spans still read is left
		// to them, and the next spill makes a new one.)
		_ = s.file.Truncate(0)
	}
	s.size.Store(0)
	s.resets.Add(1)
}

// Close releases the spill file. Later appends keep only the chunk being
// written; later reads fail with ErrClosed.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.chunks = nil
	s.last, s.spare = nil, nil
	s.start = s.curOff
	if s.file == nil || !s.letGo() {
		return nil // none, or closed with its last span
	}
	err := s.file.Close()
	s.file = nil
	if err != nil {
		return fmt.Errorf("close stream spill file: %w", err)
	}
	return nil
}

// Stats is a snapshot of a Stream's bounds and counters.
type Stats struct {
	Size      int64  // end of the content: the file size
	Start     int64  // start of the window kept
	Memory    int    // bytes of the chunk being written
	Disk      int64  // bytes of the window in the spill file
	Limit     int64  // soft bound
	HardLimit int64  // hard bound
	Readers   int    // open readers
	Discarded uint64 // lines discarded from the front, in total
	Unread    uint64 // of those, lines an open reader had not read
	SpillLost uint64 // of those, lines lost because the spill file failed
	Dropped   uint64 // lines dropped because each alone was over a chunk
	SpillErr  error  // the last spill file error, if any
}

// Stats returns the current bounds and counters.
func (s *Stream) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Size:      s.curOff + int64(len(s.cur)),
		Start:     s.start,
		Memory:    len(s.cur),
		Limit:     s.soft,
		HardLimit: s.hard,
		Readers:   len(s.readers),
		Discarded: s.discarded.Load(),
		Unread:    s.unread.Load(),
		SpillLost: s.spillLost.Load(),
		Dropped:   s.dropped.Load(),
		SpillErr:  s.spillErr,
	}
	for _, c := range s.chunks {
		st.Disk += int64(c.n)
	}
	return st
}

// AppendStatus appends the stream's lines of a `status` file (DESIGN §5)
// for the file called name.
func (s *Stream) AppendStatus(b []byte, name string) []byte {
	st := s.Stats()
	b = fmt.Appendf(b, "%s file: size=%d window=%d memory=%d disk=%d limit=%d hard-limit=%d readers=%d\n",
		name, st.Size, st.Size-st.Start, st.Memory, st.Disk, st.Limit, st.HardLimit, st.Readers)
	b = fmt.Appendf(b, "%s discarded: lines=%d unread=%d spill-failed=%d over-limit=%d\n",
		name, st.Discarded, st.Unread, st.SpillLost, st.Dropped)
	if st.SpillErr != nil {
		b = fmt.Appendf(b, "%s spill error: %s\n", name, st.SpillErr)
	}
	return b
}
