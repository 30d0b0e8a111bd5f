package stream

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"ptfs/internal/testkit"
)

// spillMeter counts the CPU of a benchmark's timed sections only
// (testkit.CPUTime, the kernel's on the process's behalf included: a spill
// costs mostly the kernel's copy into the page cache, which wall time on a
// shared machine does not isolate): the set-up between them (punching a
// file, truncating a stream) is not the spill's.
type spillMeter struct {
	b     *testing.B
	cpu   time.Duration
	from  time.Duration
	bytes int64
}

// start and stop read the CPU time inside the timer's: StartTimer and
// StopTimer read the runtime's memory statistics, which stops the world.
func (m *spillMeter) start() { m.b.StartTimer(); m.from = testkit.CPUTime() }
func (m *spillMeter) stop()  { m.cpu += testkit.CPUTime() - m.from; m.b.StopTimer() }

func (m *spillMeter) report() {
	if m.bytes > 0 {
		m.b.ReportMetric(float64(m.cpu.Nanoseconds())/(float64(m.bytes)/(1<<20)), "cpu-ns/MiB")
	}
}

// spillSlots is how many chunks a benchmark of the spill writes before it
// starts over: half a window of the default soft bound, so that a stream
// discards none before then.
const spillSlots = DefaultLimit / maxChunk / 2

// recordBlock returns about 64 KiB of whole record lines (a commit's
// worth, see session's maxEmit) and how many lines.
func recordBlock() ([]byte, int) {
	line := []byte("record 12345: event=ptfs_t/e id=0x6c2 args=[1, 140728356930600] tid=4711 cpu=3 time=8061.235912410\n")
	n := 64 << 10 / len(line)
	return bytes.Repeat(line, n), n
}

// BenchmarkSpill measures the spill's CPU a MiB (cpu-ns/MiB, getrusage;
// ns/op is the wall time of a chunk). "stream" appends a chunk of lines
// through Tail and Commit, as the record path does, and spills it; the
// others write a chunk's bytes, from a buffer in the cache as the
// formatter's output is, into a slot of a spill file made as the stream
// makes it, each way tried for the spill (DESIGN §2, §4): "pwrite" copies
// them into a chunk buffer and writes that (seal's way); "map-slot"
// copies them into a MAP_SHARED mapping of the slot populated at once
// with MADV_POPULATE_WRITE, unmapped after (a chunk formatted in the page
// cache); "map-file" into one mapping of the whole file, its slot
// populated the same way; "direct" copies them into a chunk buffer and
// writes that with O_DIRECT, past the page cache (whose cold pages are
// the cost of a first window: DESIGN §4, the eleventh pass; its slots
// are never in the page cache, so that for it reused and clean differ
// only by clean's fdatasync). "fresh" writes slots reserved (fallocate)
// but never written, as a stream's first window (a benchmark run of the
// mount); "reused" slots written before and still dirty, as a stream's
// steady state at a high rate; "clean" slots written before and written
// back (fdatasync before each pass over them, untimed), as a slower
// stream's steady state (the kernel writes a page back 30 s after it was
// dirtied). Run it with -benchtime 200x or so: clean writes every pass
// over its slots to the disk.
func BenchmarkSpill(b *testing.B) {
	for _, regime := range []spillRegime{fresh, reused, clean} {
		b.Run("stream/"+regime.String(), func(b *testing.B) { benchSpillStream(b, regime) })
		for _, way := range []string{"pwrite", "map-slot", "map-file", "direct"} {
			b.Run(way+"/"+regime.String(), func(b *testing.B) { benchSpillWay(b, way, regime) })
		}
	}
}

// spillRegime is the state of the slots a benchmark of the spill writes.
type spillRegime int

const (
	fresh spillRegime = iota
	reused
	clean
)

func (r spillRegime) String() string { return [...]string{"fresh", "reused", "clean"}[r] }

// restart readies the next pass over the slots, untimed: punch drops the
// pages and blocks of a fresh regime's, sync writes a clean regime's
// back.
func (r spillRegime) restart(b *testing.B, i int, punch func(), sync func() error) {
	if i == 0 || i%spillSlots != 0 {
		return
	}
	switch r {
	case fresh:
		punch()
	case clean:
		if err := sync(); err != nil {
			b.Fatal(err)
		}
	}
}

func benchSpillStream(b *testing.B, regime spillRegime) {
	limit := int64(DefaultLimit)
	if regime != fresh {
		limit = 16 << 20 // discards from the front: its slots are reused
	}
	s := New(Options{Limit: limit, Dir: b.TempDir()})
	defer s.Close()
	block, lines := recordBlock()
	chunk := func() int64 {
		var n int64
		for n < maxChunk {
			if tail := s.Tail(); cap(tail) >= len(block) {
				s.Commit(append(tail, block...), lines)
			} else {
				s.Append(block) // seals the chunk
			}
			n += int64(len(block))
		}
		return n
	}
	if regime != fresh {
		for range 2 * spillSlots {
			chunk()
		}
	}
	m := &spillMeter{b: b}
	b.ResetTimer()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		// Truncate gives the file back: the next slots are fresh.
		regime.restart(b, i, s.Truncate, func() error { return s.file.Sync() })
		m.start()
		m.bytes += chunk()
		m.stop()
	}
	m.report()
	if err := s.Stats().SpillErr; err != nil {
		b.Fatal(err)
	}
}

func benchSpillWay(b *testing.B, way string, regime spillRegime) {
	f, err := tempFile(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	const size = spillSlots * maxChunk
	reserve := func() {
		if err := unix.Fallocate(fd, 0, 0, size); err != nil {
			b.Skip("fallocate:", err)
		}
	}
	reserve()
	if way == "direct" {
		// The same open file, its writes past the page cache from now on.
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		if err == nil {
			_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl|unix.O_DIRECT)
		}
		if err != nil {
			b.Skip("O_DIRECT:", err)
		}
	}
	block, _ := recordBlock()
	src := bytes.Repeat(block, maxChunk/len(block)+1)[:maxChunk]
	buf := make([]byte, maxChunk)
	var whole []byte
	if way == "map-file" {
		if whole, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
			b.Fatal(err)
		}
		defer unix.Munmap(whole)
	}
	write := func(slot int) {
		off := int64(slot) * maxChunk
		switch way {
		case "pwrite", "direct":
			// buf is a large allocation of its own: page-aligned, as
			// O_DIRECT needs (maxChunk and the offsets are 4 KiB
			// multiples).
			copy(buf, src)
			if _, err := unix.Pwrite(fd, buf, off); err != nil {
				b.Fatal(err)
			}
		case "map-slot":
			m, err := unix.Mmap(fd, off, maxChunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				b.Fatal(err)
			}
			populate(b, m)
			copy(m, src)
			if err := unix.Munmap(m); err != nil {
				b.Fatal(err)
			}
		case "map-file":
			m := whole[off : off+maxChunk]
			populate(b, m)
			copy(m, src)
		}
	}
	if regime != fresh {
		for slot := range spillSlots {
			write(slot)
		}
	}
	punch := func() {
		// As Truncate does, then reserve again.
		if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, size); err != nil {
			b.Fatal(err)
		}
		reserve()
	}
	m := &spillMeter{b: b}
	b.ResetTimer()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		regime.restart(b, i, punch, func() error { return unix.Fdatasync(fd) })
		m.start()
		write(i % spillSlots)
		m.stop()
		m.bytes += maxChunk
	}
	m.report()
}

// populate faults m's pages in for writing in one call.
func populate(b *testing.B, m []byte) {
	if err := unix.Madvise(m, unix.MADV_POPULATE_WRITE); err != nil {
		if errors.Is(err, unix.EINVAL) {
			b.Skip("MADV_POPULATE_WRITE (Linux 5.14):", err)
		}
		b.Fatal(err)
	}
}
