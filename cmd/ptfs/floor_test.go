package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	ptfsfs "ptfs/fs"
)

// The FUSE floor (DESIGN §4, issue 13's fourteenth pass): a minimal go-fuse
// file system, mounted as ptfs mounts, whose one file serves record-shaped
// lines held in memory. What a follower of it costs the server is what any
// go-fuse file system pays on this machine for the same reads; ptfs's CPU
// above it is ptfs's own.

// floorName is the floor's one file.
const floorName = "records"

// floorTick is how often the floor's appender publishes the lines due.
// The follower reads only once a second, so it sees the stream grow as
// ptfs's does; the appender's own wake-ups are no part of a read's cost,
// and on the development VM they cost the idle server about 150 ns of CPU
// a line at a 10 ms tick, about 50 at this one (DESIGN §4).
const floorTick = 100 * time.Millisecond

// floorLine appends line i (from 1) of the floor's file to dst: a line of
// a `ptfs-100k-follow` run's records file with the numbers of line i, so
// that lines have the benchmark's length (113 bytes at six digits).
func floorLine(dst []byte, i int) []byte {
	dst = append(dst, "record "...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, ": event=ptfs_t/e id=0x916 args=["...)
	dst = strconv.AppendInt(dst, int64(i-1), 10)
	dst = append(dst, ", "...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	return append(dst, "] tid=5861 cpu=0 time=45416.277466339 pid=5861 comm=t\n"...)
}

// floorData holds the floor file's lines, all made before the run, so
// that the run neither formats nor touches fresh pages: the appender only
// makes them visible.
type floorData struct {
	data []byte
	ends []int // ends[i]: the end of line i+1 in data
	// size is the visible length, at a line's end.
	size atomic.Int64
}

// newFloorData makes n lines.
func newFloorData(n int) *floorData {
	d := &floorData{
		data: make([]byte, 0, n*len(floorLine(nil, n))),
		ends: make([]int, n),
	}
	for i := range n {
		d.data = floorLine(d.data, i+1)
		d.ends[i] = len(d.data)
	}
	return d
}

// appendLines makes the lines visible at rate lines per second from now,
// published every floorTick.
func (d *floorData) appendLines(rate int) {
	start := time.Now()
	tick := time.NewTicker(floorTick)
	defer tick.Stop()
	for {
		due := min(int(time.Since(start).Seconds()*float64(rate)), len(d.ends))
		if due > 0 {
			d.size.Store(int64(d.ends[due-1]))
		}
		if due == len(d.ends) {
			return
		}
		<-tick.C
	}
}

// floorRoot is the floor's root directory.
type floorRoot struct {
	gofs.Inode
	d *floorData
}

// floorFile is the floor's file; it is its own handle (reads carry their
// offset).
type floorFile struct {
	gofs.Inode
	d *floorData
}

var (
	_ gofs.NodeOnAdder   = (*floorRoot)(nil)
	_ gofs.NodeOpener    = (*floorFile)(nil)
	_ gofs.NodeGetattrer = (*floorFile)(nil)
	_ gofs.FileReader    = (*floorFile)(nil)
)

func (r *floorRoot) OnAdd(ctx context.Context) {
	ch := r.NewPersistentInode(ctx, &floorFile{d: r.d}, gofs.StableAttr{Mode: syscall.S_IFREG})
	r.AddChild(floorName, ch, false)
}

// Open gives direct I/O, as ptfs's records file: each read is a request.
func (f *floorFile) Open(context.Context, uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return f, fuse.FOPEN_DIRECT_IO, 0
}

// Getattr reports the visible size, with no attribute timeout (ptfs's
// growing files).
func (f *floorFile) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	out.Size = uint64(f.d.size.Load())
	return 0
}

// Read returns the visible lines at off that fit dest, cut at the last
// '\n' as ptfs's stream cuts them, written from memory with the reply's
// header in one writev, as ptfs's cheapest reads are.
func (f *floorFile) Read(_ context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	size := f.d.size.Load()
	if off >= size {
		return fuse.ReadResultData(nil), 0
	}
	p := f.d.data[off:min(size, off+int64(len(dest)))]
	if i := bytes.LastIndexByte(p, '\n'); i >= 0 {
		p = p[:i+1]
	}
	return fuse.ReadResultVector([][]byte{p}), 0
}

// floorMain is the floor server, the child of startFloor: it makes lines
// lines, mounts on dir with ptfs's mount options (fs.MountOptions), says "floor:
// serving", starts appending at rate lines/s at a line on its standard
// input, and unmounts on SIGTERM.
func floorMain(dir, lines, rate string) int {
	n, err1 := strconv.Atoi(lines)
	r, err2 := strconv.Atoi(rate)
	if err1 != nil || err2 != nil || n < 1 || r < 1 {
		fmt.Fprintf(os.Stderr, "floor: bad lines %q or rate %q\n", lines, rate)
		return 2
	}
	d := newFloorData(n)
	runtime.GC() // the lines are made: no collection of their making in the run
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	// ptfs's options, under a name of its own: ptfs takes a mount named
	// ptfs:PID for a dead one of its own.
	opts := ptfsfs.MountOptions(ptfsfs.Options{})
	opts.FsName, opts.Name = fmt.Sprintf("ptfsfloor:%d", os.Getpid()), "ptfsfloor"
	server, err := gofs.Mount(dir, &floorRoot{d: d}, &gofs.Options{MountOptions: opts})
	if err != nil {
		fmt.Fprintf(os.Stderr, "floor: mount on %s: %v\n", dir, err)
		return 1
	}
	fmt.Println("floor: serving")
	go func() {
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err == nil {
			d.appendLines(r)
		}
	}()
	<-stop
	if err := server.Unmount(); err != nil {
		fmt.Fprintf(os.Stderr, "floor: unmount %s: %v\n", dir, err)
		return 1
	}
	return 0
}

// startFloor runs the floor server for n lines at rate lines/s in a child
// process (this test binary), as startMount runs ptfs, and waits until it
// serves. start starts the appending. The cleanup stops it.
func startFloor(t testing.TB, n, rate int) (m *mountProc, start func()) {
	t.Helper()
	m = &mountProc{t: t, dir: t.TempDir(), log: &lockedBuffer{}, done: make(chan error, 1)}
	m.cmd = exec.Command(os.Args[0], "-test.run=^$")
	m.cmd.Env = append(os.Environ(), "PTFS_TEST_FLOOR="+m.dir,
		fmt.Sprintf("PTFS_TEST_FLOOR_LINES=%d", n), fmt.Sprintf("PTFS_TEST_FLOOR_RATE=%d", rate))
	in, err := m.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	m.serve("floor server", func() bool { return strings.Contains(m.log.String(), "floor: serving") }, nil)
	return m, func() {
		if _, err := io.WriteString(in, "go\n"); err != nil {
			t.Fatalf("start the floor's appending: %v", err)
		}
	}
}

// benchFloor follows the floor's file as benchPtfs follows records (reads
// of size bytes, a second's sleep at the end) while it grows by b.N lines
// at rate lines/s, and reports the server's CPU as benchPtfs reports the
// mount's.
func benchFloor(b *testing.B, rate, size int) {
	m, start := startFloor(b, b.N, rate)
	f, err := os.Open(m.path(floorName))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	pid := m.cmd.Process.Pid
	cpu0 := taskCPU(b, pid)
	b.ResetTimer()
	start()
	// The appending's end, as the traced program's end for benchPtfs.
	ran := make(chan struct{})
	time.AfterFunc(time.Duration(b.N)*time.Second/time.Duration(rate), func() { close(ran) })
	got, _, reads := countLines(b, f, b.N, ran, time.Second, size, nil)
	b.StopTimer()
	cpu := taskCPU(b, pid) - cpu0
	reportReader(b, cpu, got, reads)
	if got != b.N {
		b.Fatalf("%d lines read of %d", got, b.N)
	}
}

// The floor serves its lines whole, in order, each once, to a reader whose
// buffer cuts lines (1000 bytes) and to one of tail -f's 8 KiB, reading
// while they are appended: a read that cut a line, lost or repeated one
// fails here.
func TestFloorServesLines(t *testing.T) {
	needFUSE(t)
	const n, rate = 30000, 100000
	tests := []struct {
		name string
		size int
	}{
		{"1000", 1000},
		{"tail", tailRead},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, start := startFloor(t, n, rate)
			f, err := os.Open(m.path(floorName))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			start()
			buf := make([]byte, tc.size)
			var want []byte
			next := 1
			for deadline := time.Now().Add(kernelWait); next <= n; {
				if time.Now().After(deadline) {
					t.Fatalf("%d lines read of %d in %v", next-1, n, kernelWait)
				}
				k, err := f.Read(buf)
				if err == io.EOF || k == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if buf[k-1] != '\n' {
					t.Fatalf("a read of %d bytes after line %d ends within a line: %q", k, next-1, buf[max(0, k-40):k])
				}
				for _, l := range bytes.SplitAfter(buf[:k], []byte{'\n'}) {
					if len(l) == 0 {
						continue
					}
					if want = floorLine(want[:0], next); !bytes.Equal(l, want) {
						t.Fatalf("line %d: %q, want %q", next, l, want)
					}
					next++
				}
			}
			if k, err := f.Read(buf); k != 0 || err != io.EOF {
				t.Errorf("a read after the last line: %d bytes, %v; want the end", k, err)
			}
		})
	}
}
