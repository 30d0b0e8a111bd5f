package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordsChecker checks the lines of a records file as a script would read
// them: every line a whole record line of probe e on nop5's hot(i, i+1),
// or a gap line, record numbers strictly increasing and every jump
// explained by the gap line before it.
type recordsChecker struct {
	mu      sync.Mutex
	seen    int    // record lines
	missed  int    // records the gap lines reported missing
	gaps    int    // gap lines
	spliced int    // lines that are neither: spliced or partial
	jumps   int    // record numbers that no gap line explains
	last    uint64 // the last record number seen, or explained by a gap
	bad     string // the first bad line, for the failure message
}

// line checks one line (without its '\n').
func (c *recordsChecker) line(l []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rest, ok := bytes.CutPrefix(l, []byte("lost: records=")); ok {
		n, ok := bytes.CutSuffix(rest, []byte(" reason=bound"))
		v, err := strconv.ParseUint(string(n), 10, 64)
		if !ok || err != nil {
			c.fail(l, &c.spliced)
			return
		}
		c.gaps++
		c.missed += int(v)
		c.last += v
		return
	}
	n, ok := parseRecord(l)
	if !ok {
		c.fail(l, &c.spliced)
		return
	}
	if n != c.last+1 {
		c.fail(l, &c.jumps)
	}
	c.last = n
	c.seen++
}

func (c *recordsChecker) fail(l []byte, count *int) {
	*count++
	if c.bad == "" {
		c.bad = fmt.Sprintf("%q after record %d", l, c.last)
	}
}

func (c *recordsChecker) counts() (seen, missed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen, c.missed
}

// parseRecord parses `record N: event=ptfs_t/e id=0xID args=[A, B] tid=T
// cpu=C time=S.NNNNNNNNN pid=P[ comm=NAME]` with B = A+1, by hand: a regexp
// would cost the machine more CPU than ptfs spends on the line.
func parseRecord(l []byte) (uint64, bool) {
	p := parser{b: l, ok: true}
	p.lit("record ")
	n := p.num(10)
	p.lit(": event=ptfs_t/e id=0x")
	p.num(16)
	p.lit(" args=[")
	a := p.num(10)
	p.lit(", ")
	b := p.num(10)
	p.lit("] tid=")
	p.num(10)
	p.lit(" cpu=")
	p.num(10)
	p.lit(" time=")
	p.num(10)
	p.lit(".")
	at := len(p.b)
	p.num(10)
	frac := at - len(p.b)
	p.lit(" pid=")
	p.num(10)
	if c, ok := bytes.CutPrefix(p.b, []byte(" comm=")); ok && len(c) > 0 && bytes.IndexByte(c, ' ') < 0 {
		p.b = nil
	}
	return n, p.ok && len(p.b) == 0 && frac == 9 && b == a+1
}

// parser consumes a line; ok turns false at the first mismatch.
type parser struct {
	b  []byte
	ok bool
}

func (p *parser) lit(s string) {
	if !bytes.HasPrefix(p.b, []byte(s)) {
		p.ok = false
		return
	}
	p.b = p.b[len(s):]
}

func (p *parser) num(base int) uint64 {
	i := 0
	for i < len(p.b) && (p.b[i] >= '0' && p.b[i] <= '9' || base == 16 && p.b[i] >= 'a' && p.b[i] <= 'f') {
		i++
	}
	v, err := strconv.ParseUint(string(p.b[:i]), base, 64)
	if err != nil {
		p.ok = false
	}
	p.b = p.b[i:]
	return v
}

// follow runs GNU `tail -n +1 -f path` as a real process and checks its
// lines. The cleanup kills it by its PID.
func follow(t testing.TB, path string) (*recordsChecker, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command("tail", "-n", "+1", "-f", path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start tail: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c := &recordsChecker{}
	go func() {
		r := bufio.NewReaderSize(stdout, 1<<20)
		for {
			l, err := r.ReadSlice('\n')
			if len(l) > 0 && l[len(l)-1] == '\n' {
				c.line(l[:len(l)-1])
			} else if len(l) > 0 || err == bufio.ErrBufferFull {
				c.line(l)
			}
			if err != nil && err != bufio.ErrBufferFull {
				return
			}
		}
	}()
	return c, stderr
}

// streamStatus is what a target's status says about its records.
type streamStatus struct {
	emitted, kernelLost, discarded, unread int
}

func readStreamStatus(t testing.TB, m *mountProc) streamStatus {
	t.Helper()
	st := m.read("t", "status")
	var s streamStatus
	field := func(line, key string) int {
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, key+"="); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("status %s=%q: %v", key, v, err)
				}
				return n
			}
		}
		t.Fatalf("status has no %s= in %q:\n%s", key, line, st)
		return 0
	}
	s.emitted = field(statusValue(st, "summary"), "records")
	s.discarded = field(statusValue(st, "records discarded"), "lines")
	s.unread = field(statusValue(st, "records discarded"), "unread")
	lost, err := strconv.Atoi(strings.Fields(statusValue(st, "lost") + " x")[0])
	if err != nil {
		t.Fatalf("status lost: %v\n%s", err, st)
	}
	s.kernelLost = lost
	return s
}

// BenchmarkStreamLoad is the load test of DESIGN §2's bound: 4 threads of
// nop5 each hit a NOP-site probe b.N times (run it with -benchtime
// 1000000x) at full speed while a real `tail -f records` follows. It
// reports the records emitted into records, lost in the kernel (counted),
// discarded at the bound while tail had not read them (counted, and told
// to tail by gap lines), seen by tail, and spliced or partial lines (must
// be 0); it fails unless every record is seen by tail or reported missing
// to it, in order. With the default bounds tail should miss nothing; with
// a 1 MiB hard bound it falls behind between its polls and gets gap lines.
func BenchmarkStreamLoad(b *testing.B) {
	needKernel(b)
	bin := buildC(b, "nop5", "t", "-no-pie")
	b.Run("default-bounds", func(b *testing.B) { benchStreamLoad(b, bin) })
	b.Run("hard-1MiB", func(b *testing.B) {
		benchStreamLoad(b, bin, "--max-stream=262144", "--max-stream-hard=1048576")
	})
}

func benchStreamLoad(b *testing.B, bin string, flags ...string) {
	m := startMount(b, append(flags, "t="+bin)...)
	m.setProbe("t", "e", "hot %di %si")
	c, tailErr := follow(b, m.path("t", "records"))
	const threads = 4
	hits := threads * b.N
	b.ResetTimer()
	start := time.Now()
	runProg(b, bin, strconv.Itoa(b.N), "0", strconv.Itoa(threads))
	wall := time.Since(start)
	// Wait until tail has seen or been told of every record ptfs emitted,
	// and ptfs has emitted or counted lost every hit; give up when nothing
	// moves for 10 s.
	var st streamStatus
	var seen, missed int
	for last, moved := -1, time.Now(); time.Since(moved) < 10*time.Second; time.Sleep(100 * time.Millisecond) {
		st = readStreamStatus(b, m)
		seen, missed = c.counts()
		if st.emitted+st.kernelLost == hits && seen+missed == st.emitted {
			break
		}
		if now := seen + st.emitted + st.kernelLost; now != last {
			last, moved = now, time.Now()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(hits)/wall.Seconds(), "hits/s")
	b.ReportMetric(float64(st.emitted), "emitted")
	b.ReportMetric(float64(st.kernelLost), "kernel-lost")
	b.ReportMetric(float64(st.unread), "discarded")
	b.ReportMetric(float64(seen), "seen")
	b.ReportMetric(float64(missed), "gap-reported")
	c.mu.Lock()
	defer c.mu.Unlock()
	b.ReportMetric(float64(c.spliced), "spliced")
	switch {
	case c.spliced > 0 || c.jumps > 0:
		b.Errorf("%d spliced or partial lines, %d unexplained jumps; first: %s", c.spliced, c.jumps, c.bad)
	case st.emitted+st.kernelLost != hits:
		b.Errorf("%d records emitted + %d lost in the kernel != %d hits", st.emitted, st.kernelLost, hits)
	case seen+missed != st.emitted:
		b.Errorf("tail saw %d records and was told of %d missing, ptfs emitted %d", seen, missed, st.emitted)
	case missed != st.unread:
		b.Errorf("gap lines reported %d missing, status counts %d discarded unread", missed, st.unread)
	}
	if msg := tailErr.String(); msg != "" {
		b.Errorf("tail: %s", msg)
	}
}

// TestStreamGap runs a real mount with a tiny bound and a reader that
// opens records and only reads after the trace: the gap line it gets and
// the status counter agree, and the lines around it are whole and in
// order.
func TestStreamGap(t *testing.T) {
	needKernel(t)
	bin := buildC(t, "nop5", "t", "-no-pie")
	m := startMount(t, "--max-stream=4096", "--max-stream-hard=8192", "t="+bin)
	m.setProbe("t", "e", "hot %di %si")
	f, err := os.Open(m.path("t", "records"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const hits = 3000 // about 270 KB of records: far past the bounds
	runProg(t, bin, strconv.Itoa(hits))
	var st streamStatus
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if st = readStreamStatus(t, m); st.emitted+st.kernelLost == hits {
			break
		}
	}
	if st.emitted+st.kernelLost != hits || st.kernelLost != 0 {
		t.Fatalf("status after %d hits: %+v", hits, st)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	c := &recordsChecker{}
	for l := range bytes.SplitSeq(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		c.line(l)
	}
	if c.spliced > 0 || c.jumps > 0 {
		t.Fatalf("%d spliced lines, %d unexplained jumps; first: %s", c.spliced, c.jumps, c.bad)
	}
	if c.gaps == 0 || c.seen+c.missed != hits || c.last != hits {
		t.Fatalf("read %d records and %d gap lines reporting %d missing (last %d), want all %d accounted for",
			c.seen, c.gaps, c.missed, c.last, hits)
	}
	t.Logf("read %d records and %d gap lines reporting %d missing", c.seen, c.gaps, c.missed)
	if st := readStreamStatus(t, m); st.unread != c.missed || st.discarded < st.unread {
		t.Errorf("gap lines reported %d missing; status: %+v", c.missed, st)
	}
	if !strings.HasPrefix(statusValue(m.read("t", "status"), "records file"), "size=") {
		t.Errorf("status has no records file line:\n%s", m.read("t", "status"))
	}
}

// TestStreamFlags checks that bad bounds and stream directories are
// refused before anything is mounted.
func TestStreamFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"soft bound too small", []string{"--max-stream=100"}, "--max-stream (100)"},
		{"negative", []string{"--max-stream=-1"}, "--max-stream (-1)"},
		{"hard below soft", []string{"--max-stream=8192", "--max-stream-hard=4096"}, "--max-stream-hard (4096)"},
		{"not a number", []string{"--max-stream-hard=1G"}, "invalid value"},
		{"no such dir", []string{"--stream-dir=/nonexistent/ptfs"}, "no such file"},
		{"not a dir", []string{"--stream-dir=" + file}, "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			mnt := t.TempDir()
			if code := run(append(append([]string{"mount"}, tc.args...), mnt), &out, &errOut); code != 2 || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("mount %v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
			}
		})
	}
}
