package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"ptfs/decode/ptenc"
	"ptfs/internal/testkit"
	"ptfs/perfio"
)

// BenchmarkOverhead runs a tight loop of b.N probe hits (hot %di %si, a
// 5-byte NOP site, the cheapest for the kernel)
// twice in one run: with the probe installed through ptfs and read through
// `records`, and with the same probe installed by a hand-written tracefs
// line and read with perf_event_open directly (the reference). It reports
// the traced program's hits per second, the reader's CPU time per record and
// the records lost; compare the two sub-benchmarks.
func BenchmarkOverhead(b *testing.B) {
	needKernel(b)
	bin := buildC(b, "nop5", "t", "-no-pie")
	off := testkit.FuncOffset(b, bin, "hot")
	b.Run("reference", func(b *testing.B) { benchReference(b, bin, off) })
	b.Run("ptfs", func(b *testing.B) { benchPtfs(b, bin, 0, 0) })
	// The goal of DESIGN: no loss at 100,000 hits per second.
	b.Run("ptfs-100k", func(b *testing.B) { benchPtfs(b, bin, 100000, 0) })
	// As a user gets it: the mount's default window, and a reader that
	// follows the stream while the program runs (`tail -f`), so that the
	// window's spill slots are freed and reused, their pages still in the
	// page cache, as at a mount's steady state. The runs above keep the
	// whole run in their window: every chunk spills into fresh pages of
	// the page cache (DESIGN §4, the eleventh pass). The follower reads
	// 8 KiB at a time, as GNU tail 9.1 does (strace: read(fd, buf, 8192));
	// the records file is direct I/O, so each read is one FUSE request.
	b.Run("ptfs-100k-follow", func(b *testing.B) { benchPtfs(b, bin, 100000, tailRead) })
	// The floor of those reads (floor_test.go): a minimal go-fuse file
	// system whose file of the same lines, in memory, grows as fast, with
	// the same follower. The mount's CPU above it is ptfs's own.
	b.Run("fuse-floor-100k-follow", func(b *testing.B) { benchFloor(b, 100000, tailRead) })
	// The same with reads of 1 MiB, as the earlier passes measured it.
	b.Run("ptfs-100k-follow-1m", func(b *testing.B) { benchPtfs(b, bin, 100000, 1<<20) })
	b.Run("fuse-floor-100k-follow-1m", func(b *testing.B) { benchFloor(b, 100000, 1<<20) })
}

// tailRead is the read size of GNU tail -f (coreutils 9.1's BUFSIZ).
const tailRead = 8192

// probedMount starts a mount with args (target t among them), puts the
// benchmarks' probe on t's hot and opens its records file, closed at the
// benchmark's end.
func probedMount(b *testing.B, args ...string) (*mountProc, *os.File) {
	m := startMount(b, args...)
	m.setProbe("t", "e", "hot %di %si")
	f, err := os.Open(m.path("t", "records"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return m, f
}

// timeProg runs bin with n iterations (at rate hits/s, 0: at full speed)
// and returns its wall time.
func timeProg(b *testing.B, bin string, n, rate int) time.Duration {
	return startProg(b, bin, n, rate).wait(b)
}

// prog is a traced program started by startProg: ran is closed at its
// end, after which wall and err are its wall time and Wait's error.
type prog struct {
	ran  chan struct{}
	wall time.Duration
	err  error
	out  bytes.Buffer
}

// startProg starts bin as timeProg runs it, without waiting: the caller
// reads the mount meanwhile. The benchmark's cleanup waits for its end, so
// that no way out leaves it running.
func startProg(b *testing.B, bin string, n, rate int) *prog {
	p := &prog{ran: make(chan struct{})}
	cmd := exec.Command(bin, strconv.Itoa(n), strconv.Itoa(rate))
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		p.wall = time.Since(start)
		close(p.ran)
	}()
	b.Cleanup(func() { <-p.ran })
	return p
}

// wait waits for p's end and returns its wall time; p's failure fails b.
func (p *prog) wait(b *testing.B) time.Duration {
	<-p.ran
	if p.err != nil {
		b.Fatalf("traced program: %v\n%s", p.err, p.out.Bytes())
	}
	return p.wall
}

// benchPtfs runs the program at rate hits/s through a mount. With follow
// (the follower's read size), the mount has its default window and the
// records file is read while the program runs; with 0 the window holds the
// whole run and is read after it, 1 MiB at a time.
func benchPtfs(b *testing.B, bin string, rate, follow int) {
	args := []string{"t=" + bin}
	if follow == 0 {
		// A records file big enough for the whole run: no rotation.
		args = append(args, "--max-stream=2000000000", "--max-stream-hard=2000000000")
	}
	if dir := os.Getenv("PTFS_BENCH_CPUPROFILE"); dir != "" {
		// A profile of the mount process per run, for `go tool pprof`;
		// the time tells apart the runs of -count and of the b.N probe.
		args = append(args, fmt.Sprintf("--cpuprofile=%s/ptfs-%d-%d-%d.pprof", dir, rate, b.N, time.Now().UnixNano()))
	}
	m, f := probedMount(b, args...)
	pid := m.cmd.Process.Pid
	cpu0, flt0 := taskCPU(b, pid), minorFaults(b, pid)
	b.ResetTimer()
	p := startProg(b, bin, b.N, rate)
	if follow == 0 {
		p.wait(b)
	}
	// The follower reads what came at each end of the file and sleeps
	// there a second, as GNU tail -f polls a FUSE file; the reader after
	// the run polls every 5 ms.
	poll, size := 5*time.Millisecond, 1<<20
	if follow != 0 {
		poll, size = time.Second, follow
	}
	// Ask for the loss count only once the stream stalls: status costs
	// ptfs CPU that the benchmark should not charge.
	lostCount := func() int {
		n, _ := strconv.Atoi(strings.Fields(statusValue(m.read("t", "status"), "lost") + " x")[0])
		return n
	}
	got, lost, reads := countLines(b, f, b.N, p.ran, poll, size, lostCount)
	wall := p.wait(b)
	b.StopTimer()
	cpu, flt := taskCPU(b, pid)-cpu0, minorFaults(b, pid)-flt0
	b.ReportMetric(float64(b.N)/wall.Seconds(), "hits/s")
	reportReader(b, cpu, got, reads)
	b.ReportMetric(float64(b.N-got), "missing")
	b.ReportMetric(float64(lost), "lost")
	// A first touch of a fresh page costs 11-15 µs on the development VM
	// (DESIGN §4, the seventh pass): the faults explain much of a run's CPU.
	b.ReportMetric(float64(flt), "mount-minflt")
	if got+lost != b.N {
		b.Fatalf("%d records + %d counted lost != %d hits", got, lost, b.N)
	}
}

// BenchmarkIdle measures the mount's fixed costs, those that scale with
// time rather than records (DESIGN §4, issue 13's tenth pass): its CPU
// per second with the probe installed and no hit, first with no
// reader, then with a reader polling the records file as countLines does
// (a read, then 5 ms of sleep after an empty one), and from the two the
// CPU of one empty FUSE read. b.N is the seconds of each phase.
func BenchmarkIdle(b *testing.B) {
	needKernel(b)
	bin := buildC(b, "nop5", "t", "-no-pie")
	m, f := probedMount(b, "t="+bin)
	pid := m.cmd.Process.Pid
	span := time.Duration(b.N) * time.Second
	b.ResetTimer()
	cpu0 := taskCPU(b, pid)
	time.Sleep(span)
	idle := taskCPU(b, pid) - cpu0
	buf := make([]byte, 1<<20)
	reads := 0
	cpu0 = taskCPU(b, pid)
	for end := time.Now().Add(span); time.Now().Before(end); reads++ {
		if k, err := f.Read(buf); k != 0 || (err != nil && err != io.EOF) {
			b.Fatalf("read of an idle records file: %d bytes, %v", k, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	poll := taskCPU(b, pid) - cpu0
	b.StopTimer()
	b.ReportMetric(float64(idle)/span.Seconds()/1e3, "idle-cpu-us/s")
	b.ReportMetric(float64(poll)/span.Seconds()/1e3, "poll-cpu-us/s")
	b.ReportMetric(float64(reads)/span.Seconds(), "reads/s")
	b.ReportMetric(float64(poll-idle)/float64(max(reads, 1))/1e3, "cpu-us/empty-read")
}

// countLines reads the records file f as it grows until the lines read and
// the records counted lost add up to n, or 30 s have passed since ran
// was closed (the traced program's end), in reads of size bytes. At the end
// of the file it sleeps poll before it reads again, and every 100 ms of
// such sleeps asks lostCount (if not nil) for the records lost so far. It
// returns the lines, the lost records and its reads of f.
func countLines(b *testing.B, f *os.File, n int, ran <-chan struct{}, poll time.Duration, size int, lostCount func() int) (got, lost, reads int) {
	buf := make([]byte, size)
	var deadline time.Time
	idle := 0
	for got+lost < n {
		if deadline.IsZero() {
			select {
			case <-ran:
				deadline = time.Now().Add(30 * time.Second)
			default:
			}
		} else if time.Now().After(deadline) {
			break
		}
		k, err := f.Read(buf)
		reads++
		got += bytes.Count(buf[:k], []byte{'\n'})
		if err == io.EOF || k == 0 {
			if idle++; lostCount != nil && idle%max(1, int(100*time.Millisecond/poll)) == 0 {
				lost = lostCount()
			}
			time.Sleep(poll)
		} else if err != nil {
			b.Fatal(err)
		} else {
			idle = 0
		}
	}
	return got, lost, reads
}

// reportReader reports a server's CPU (ns) per line of the got that a
// reader read in reads, and per read: with direct I/O, a read is one FUSE
// request.
func reportReader(b *testing.B, cpu int64, got, reads int) {
	b.ReportMetric(float64(cpu)/float64(max(got, 1)), "reader-cpu-ns/record")
	b.ReportMetric(float64(cpu)/float64(max(reads, 1)), "reader-cpu-ns/request")
	b.ReportMetric(float64(got)/float64(max(reads, 1)), "records/request")
}

// taskCPU returns the CPU time in ns that all threads of pid have used.
func taskCPU(b testing.TB, pid int) int64 {
	dirs, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(dirs) == 0 {
		b.Fatalf("schedstat of %d: %v", pid, err)
	}
	var sum int64
	for _, d := range dirs {
		data, err := os.ReadFile(d)
		if err != nil {
			continue // the thread ended
		}
		v, _ := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
		sum += v
	}
	return sum
}

// minorFaults returns the minor page faults of process pid (all its threads:
// field 10 of /proc/PID/stat).
func minorFaults(b testing.TB, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("stat of %d: %v", pid, err)
	}
	// The command name in parentheses may hold spaces: count after it.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	n, err := strconv.ParseInt(f[7], 10, 64)
	if err != nil {
		b.Fatalf("minflt of %d: %q: %v", pid, data, err)
	}
	return n
}

// benchReference installs the probe with a hand-written tracefs line and
// counts its samples from per-CPU perf rings.
func benchReference(b *testing.B, bin string, off uint64) {
	tfs := tracefsDir(b)
	group := fmt.Sprintf("ptfsbenchref%d", os.Getpid())
	line := fmt.Sprintf("p:%s/ref %s:0x%x %%di %%si", group, bin, off)
	if out, err := shell(fmt.Sprintf("echo %s >> %s/uprobe_events", shellQuote(line), tfs)); err != nil {
		b.Fatalf("%s: %v %s", line, err, out)
	}
	b.Cleanup(func() { removeLine(b, line) })
	idText, err := os.ReadFile(filepath.Join(tfs, "events", group, "ref", "id"))
	if err != nil {
		b.Fatal(err)
	}
	id, _ := strconv.ParseUint(strings.TrimSpace(string(idText)), 10, 64)
	const pages = 256
	page := os.Getpagesize()
	type ring struct {
		fd  int
		mem []byte
		r   *perfio.Ring
	}
	var rings []ring
	defer func() {
		for _, r := range rings {
			unix.Munmap(r.mem)
			unix.Close(r.fd)
		}
	}()
	for cpu := 0; cpu < numCPU(b); cpu++ {
		attr := unix.PerfEventAttr{
			Type:        unix.PERF_TYPE_TRACEPOINT,
			Config:      id,
			Sample:      1,
			Sample_type: unix.PERF_SAMPLE_TID | unix.PERF_SAMPLE_TIME | unix.PERF_SAMPLE_CPU | unix.PERF_SAMPLE_RAW,
			// Wake a poller at a quarter full, as ptfs does; this
			// reader polls on a timer, so wake-ups only cost.
			Bits:   unix.PerfBitWatermark,
			Wakeup: pages * uint32(page) / 4,
		}
		attr.Size = uint32(unsafe.Sizeof(attr))
		fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if err != nil {
			b.Fatalf("perf_event_open cpu %d: %v", cpu, err)
		}
		mem, err := unix.Mmap(fd, 0, (1+pages)*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			unix.Close(fd)
			b.Fatal(err)
		}
		r, err := perfio.NewDataRing(mem, page)
		if err != nil {
			b.Fatal(err)
		}
		rings = append(rings, ring{fd, mem, r})
	}
	var ru0, ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	done := make(chan [2]int)
	go func() {
		samples, lost := 0, 0
		deadline := time.Now().Add(30 * time.Second)
		for samples+lost < b.N && time.Now().Before(deadline) {
			for _, r := range rings {
				r.r.Begin()
				for {
					typ, _, rec, ok := r.r.Next()
					if !ok {
						break
					}
					switch typ {
					case unix.PERF_RECORD_SAMPLE:
						samples++
					case unix.PERF_RECORD_LOST:
						lost += int(*(*uint64)(unsafe.Pointer(&rec[16])))
					}
				}
				r.r.End()
			}
			time.Sleep(5 * time.Millisecond)
		}
		done <- [2]int{samples, lost}
	}()
	wall := timeProg(b, bin, b.N, 0)
	got := <-done
	b.StopTimer()
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	cpu := (ru1.Utime.Nano() + ru1.Stime.Nano()) - (ru0.Utime.Nano() + ru0.Stime.Nano())
	b.ReportMetric(float64(b.N)/wall.Seconds(), "hits/s")
	b.ReportMetric(float64(cpu)/float64(max(got[0], 1)), "reader-cpu-ns/record")
	b.ReportMetric(float64(b.N-got[0]), "missing")
	b.ReportMetric(float64(got[1]), "lost")
}

func numCPU(b *testing.B) int {
	data, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		b.Fatal(err)
	}
	s := strings.TrimSpace(string(data))
	if i := strings.LastIndexAny(s, "-,"); i >= 0 {
		s = s[i+1:]
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		b.Fatalf("cpu/possible %q", data)
	}
	return n + 1
}

// BenchmarkDecodeEvents runs `ptfs decode --events DIR` end to end (the
// file read, packets, records, lines written to /dev/null) on the records
// benchmark's 64 MiB stream of ptwrite probe records with random 64-bit
// arguments, and libipt's packet decoder alone (decode's harness: no
// output, the file in memory) on the same bytes, in turn in each
// iteration. It reports the CPU time of each (this process's threads, the
// harness's: wall time on a shared machine measures the neighbours) and
// ptfs's speed over libipt's.
func BenchmarkDecodeEvents(b *testing.B) {
	if _, err := os.Stat("/usr/include/intel-pt.h"); err != nil {
		testkit.Unavailable(b, "libipt header /usr/include/intel-pt.h missing: apt-get install libipt-dev")
	}
	dir := b.TempDir()
	trace := filepath.Join(dir, "trace.pt")
	if err := os.WriteFile(trace, ptenc.Generate(ptenc.PTWHeavy, 64<<20, int64(ptenc.PTWHeavy)+1), 0o644); err != nil {
		b.Fatal(err)
	}
	events := writeGenEvents(b, dir)
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer null.Close()
	ask, pid := testkit.HarnessPID(b, testkit.BuildC(b, filepath.Join("..", "..", "decode", "testdata", "ptpkt.c"), "-lipt"), "bench", trace)
	ask("go") // reads the file into the harness's memory
	var ptfsCPU, libiptCPU int64
	self := os.Getpid()
	b.SetBytes(64 << 20)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cpu0 := taskCPU(b, self)
		var stderr bytes.Buffer
		if code := runDecode([]string{"--events", events, trace}, null, &stderr); code != 0 {
			b.Fatalf("ptfs decode: exit %d: %s", code, stderr.String())
		}
		ptfsCPU += taskCPU(b, self) - cpu0
		cpu0 = taskCPU(b, pid)
		if n, err := strconv.Atoi(ask("go")); err != nil || n == 0 {
			b.Fatalf("libipt harness: %d packets, %v", n, err)
		}
		libiptCPU += taskCPU(b, pid) - cpu0
	}
	b.StopTimer()
	b.ReportMetric(float64(ptfsCPU)/1e9/float64(b.N), "ptfs-cpu-s/op")
	b.ReportMetric(float64(libiptCPU)/1e9/float64(b.N), "libipt-cpu-s/op")
	b.ReportMetric(float64(libiptCPU)/float64(ptfsCPU), "x-libipt")
}
