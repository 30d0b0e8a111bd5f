package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"ptfs/bind"
	"ptfs/cred"
	"ptfs/fs"
	"ptfs/perfio"
	"ptfs/session"
	"ptfs/tracefs"
)

// mountSynopsis is the first line of the mount usage.
const mountSynopsis = "usage: ptfs mount [flags] MOUNTPOINT [NAME=]BINARY..."

// runMount implements `ptfs mount`: it serves the mount until it is
// unmounted or the process gets SIGINT/SIGTERM, then removes every probe.
func runMount(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("mount", flag.ContinueOnError)
	fl.SetOutput(stderr)
	mode := fl.String("mode", "auto", "engine: auto, classic or ptw")
	var so session.Options
	fl.Int64Var(&so.Stream.Limit, "max-stream", session.DefaultStreamLimit,
		"soft bound of each records file in bytes: what is kept for a reader that opens now")
	fl.Int64Var(&so.Stream.HardLimit, "max-stream-hard", session.DefaultStreamHardLimit,
		"hard bound of each records file in bytes, kept on disk while an open reader has not read it; past it the reader gets a gap line")
	fl.StringVar(&so.Stream.Dir, "stream-dir", os.TempDir(), "directory of the unlinked files that hold the records beyond memory")
	// 4 MiB a CPU: measured here, the 1 MiB rings lost 3-4% of the hits
	// of a tight loop on a NOP site (~700,000 hits/s) and these none.
	ringPages := fl.Int("ring-pages", 1024, "classic mode: per-CPU perf ring size in pages (a power of 2)")
	var pt perfio.PTOptions
	fl.IntVar(&pt.AuxPages, "aux-pages", 0, "ptw mode: per-CPU Intel PT AUX ring size in pages (a power of 2, at least 8 KiB; 0: 4 MiB, or 128 KiB when the locked-memory limit would refuse that, as perf chooses)")
	fl.IntVar(&pt.DataPages, "data-pages", 0, "ptw mode: per-CPU side-band ring size in pages (a power of 2; 0: 64 pages, or 256 KiB under the locked-memory limit)")
	fl.IntVar(&pt.AuxWatermark, "aux-watermark", 0, "ptw mode: bytes of trace after which the kernel publishes it (0: 64 KiB, or half the AUX ring if less)")
	fl.DurationVar(&pt.FlushInterval, "pt-flush", perfio.DefaultFlushInterval,
		"ptw mode: publish the trace of a CPU that published nothing for this long by stopping its tracing for a moment (counted as flush losses); negative: never")
	allowOther := fl.Bool("allow-other", false, "let other users list the mount and read status and symbols (DESIGN §2)")
	readers := fl.String("readers", "", "group `GROUP` (name or gid) whose members may read records, branches and probes; implies --allow-other")
	verbose := fl.Bool("v", false, "debug logging")
	fuseDebug := fl.Bool("fuse-debug", false, "log every FUSE request")
	cpuProfile := fl.String("cpuprofile", "", "write a CPU profile (pprof) of the mount to `FILE` until it ends: for benchmarks")
	fl.Usage = flagUsage(fl, mountSynopsis)
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if *verbose {
		logrus.SetLevel(logrus.DebugLevel)
	}
	if fl.NArg() < 1 {
		fmt.Fprintln(stderr, mountSynopsis)
		return 2
	}
	m, err := session.ParseMode(*mode)
	if err != nil {
		fmt.Fprintln(stderr, "ptfs:", err)
		return 2
	}
	// A bound of a few lines would make gap lines wait for the lines that
	// cover them (DESIGN §2).
	if so.Stream.Limit < minStream || so.Stream.HardLimit < so.Stream.Limit {
		fmt.Fprintf(stderr, "ptfs: want %d <= --max-stream (%d) <= --max-stream-hard (%d)\n",
			minStream, so.Stream.Limit, so.Stream.HardLimit)
		return 2
	}
	if err := checkStreamDir(so.Stream.Dir); err != nil {
		fmt.Fprintln(stderr, "ptfs:", err)
		return 2
	}
	// The mounting user owns the mount; the kernel has checked that it
	// may mount, and tracing is its power (DESIGN §2, "Who may do what").
	fo := fs.Options{
		AllowOther: *allowOther,
		Debug:      *fuseDebug,
		UID:        uint32(os.Getuid()),
		GID:        uint32(os.Getgid()),
		MayTrace:   cred.MayTrace,
	}
	if *readers != "" {
		gid, err := cred.Group(*readers)
		if err != nil {
			fmt.Fprintf(stderr, "ptfs: --readers: %v\n", err)
			return 2
		}
		fo.GID, fo.GroupReads, fo.AllowOther = gid, true, true
	}
	so.Mode, so.RingPages, so.PT = m, *ringPages, pt
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "ptfs:", err)
			return 1
		}
		defer stop()
	}
	if err := mount(fl.Arg(0), fl.Args()[1:], so, fo); err != nil {
		fmt.Fprintln(stderr, "ptfs:", err)
		return 1
	}
	return 0
}

// startCPUProfile profiles this process into a new file at path (created
// with O_EXCL: the mount runs as root and the path is the user's) until
// the returned function runs.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile %s: %w", path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			logrus.WithError(err).Warn("ptfs: writing the CPU profile")
		}
	}, nil
}

// minStream is the smallest bound of a records file.
const minStream = 4096

// checkStreamDir makes sure that the spill files of the streams can be
// made in dir: a directory, given by the user of a root program.
func checkStreamDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("--stream-dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("--stream-dir %s: %w", dir, syscall.ENOTDIR)
	}
	return nil
}

// targetArg splits a [NAME=]BINARY argument; the name defaults to the
// binary's base name.
func targetArg(a string) (name, path string) {
	if i := strings.IndexByte(a, '='); i > 0 && !strings.Contains(a[:i], "/") {
		return a[:i], a[i+1:]
	}
	return filepath.Base(a), a
}

// errInterrupted is a mount stopped by a signal before it was mounted.
var errInterrupted = errors.New("interrupted")

func mount(dir string, targets []string, so session.Options, opts fs.Options) error {
	// Signals are caught from the start, so a SIGTERM right after
	// "mounted" still unmounts and removes the probes; one that comes
	// while the session is set up stops before the mount.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sig)
	clearDeadMounts()
	if err := refuseLiveMount(dir); err != nil {
		return err
	}
	s, err := session.New(so)
	if err != nil {
		return err
	}
	for _, a := range targets {
		name, path := targetArg(a)
		if _, err := s.AddTarget(name, path); err != nil {
			return errors.Join(err, s.Close())
		}
	}
	select {
	case got := <-sig:
		return errors.Join(fmt.Errorf("%v before the mount: %w", got, errInterrupted), s.Close())
	default:
	}
	server, release, err := mountOwn(dir, bind.Tracer[*session.Target](s), opts)
	if err != nil {
		return errors.Join(err, s.Close())
	}
	defer release()
	logrus.WithFields(logrus.Fields{"dir": dir, "mode": s.Mode()}).Info("ptfs: mounted")

	done := make(chan struct{})
	go func() {
		server.Wait()
		close(done)
	}()
	select {
	case <-done: // unmounted from outside (umount)
	case got := <-sig:
		logrus.WithField("signal", got).Debug("ptfs: unmounting")
		if err := server.Unmount(); err != nil {
			// Busy: a reader holds a file open (tail -f) and would keep a
			// detached mount served for as long as it likes. Detach, remove
			// the probes and return: when this process exits, the kernel
			// ends the connection and the readers get errors.
			logrus.WithError(err).Debug("ptfs: unmount busy, detaching")
			if derr := unix.Unmount(dir, unix.MNT_DETACH); derr != nil {
				err = fmt.Errorf("unmount %s: %w", dir, errors.Join(err, derr))
				return errors.Join(err, s.Close())
			}
			return s.Close()
		}
		<-done
	}
	return s.Close()
}

// own records the FUSE mounts this process made and still serves, by
// device (MAJ:MIN in mountinfo). A mount whose source names this process's
// PID but is not recorded was made by a dead process that had the PID
// before (PIDs are reused): the PID alone cannot tell the two apart, and a
// process can serve several mounts (tests in one binary), so the record is
// per mount. tracefs keeps its probe groups the same way (DESIGN §1).
var own struct {
	sync.Mutex
	devs map[string]bool
}

// mountOwn mounts t on dir (fs.Mount) and records the mount as this
// process's until release, which the caller calls once the server is done.
func mountOwn(dir string, t fs.Tracer, opts fs.Options) (server *fuse.Server, release func(), err error) {
	server, err = fs.Mount(dir, t, opts)
	if err != nil {
		return nil, nil, err
	}
	// The mount just made is the top one at dir; its root is served by
	// this process, so the stat cannot wait on anybody else.
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		err = fmt.Errorf("device of the ptfs mount on %s: %w", dir, err)
		if uerr := server.Unmount(); uerr != nil {
			return nil, nil, errors.Join(err, uerr)
		}
		server.Wait()
		return nil, nil, err
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	own.Lock()
	if own.devs == nil {
		own.devs = map[string]bool{}
	}
	own.devs[dev] = true
	own.Unlock()
	return server, func() {
		own.Lock()
		delete(own.devs, dev)
		own.Unlock()
	}, nil
}

// ownerLive tells whether the server of m may still live: a mount of this
// process's PID only if this process made it (mountOwn), another only while
// tracefs.OwnerAlive says its PID's owner lives.
func ownerLive(m ptfsMount) bool {
	if m.pid == os.Getpid() {
		own.Lock()
		defer own.Unlock()
		return own.devs[m.dev]
	}
	return m.pid > 0 && tracefs.OwnerAlive(m.pid)
}

// clearDeadMounts detaches every FUSE mount of ptfs whose server is gone
// (SIGKILL), wherever it is: its mount point answers ENOTCONN, refuses a new
// mount there and breaks tools that walk the tree. A mount whose owner lives
// (ownerLive) is never touched, not even stat'ed: a busy server could block
// the stat.
func clearDeadMounts() {
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		logrus.WithError(err).Warn("ptfs: looking for dead mounts")
		return
	}
	for _, m := range ptfsMounts(info) {
		if ownerLive(m) {
			continue
		}
		// statfs always reaches the server; stat may be answered from
		// attributes the kernel still caches for permission checks.
		var st unix.Statfs_t
		if err := unix.Statfs(m.dir, &st); !errors.Is(err, unix.ENOTCONN) {
			continue
		}
		log := logrus.WithFields(logrus.Fields{"dir": m.dir, "pid": m.pid})
		if err := unix.Unmount(m.dir, unix.MNT_DETACH); err != nil {
			log.WithError(err).Warn("ptfs: detaching the dead mount of a killed ptfs")
			continue
		}
		log.Info("ptfs: detached the dead mount of a killed ptfs")
	}
}

// refuseLiveMount refuses a mount point that a live ptfs serves: the new
// mount would hide it, and its probes would keep running unseen. It reads
// mountinfo only: a live owner's mount is never touched.
func refuseLiveMount(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("mount point %s: %w", dir, err)
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("looking for ptfs mounts at %s: %w", dir, err)
	}
	for _, m := range ptfsMounts(info) {
		if m.dir == abs && ownerLive(m) {
			return fmt.Errorf("%s is the mount point of a running ptfs (pid %d): unmount it first (umount %s): %w", abs, m.pid, abs, syscall.EBUSY)
		}
	}
	return nil
}

// ptfsMount is a FUSE mount of ptfs in mountinfo: its mount point, the
// PID its source names (0: none) and its device (MAJ:MIN).
type ptfsMount struct {
	dir string
	pid int
	dev string
}

// ptfsMounts returns the ptfs mounts of a /proc/PID/mountinfo text: the
// fields are "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] -
// FSTYPE SOURCE SUPEROPTIONS", with spaces, tabs, newlines and backslashes
// in names escaped as octal (\040).
func ptfsMounts(info []byte) []ptfsMount {
	var out []ptfsMount
	for line := range strings.Lines(string(info)) {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		sep := slices.Index(f[6:], "-") + 6 // after the optional fields
		if sep < 6 || sep+2 >= len(f) || f[sep+1] != "fuse.ptfs" {
			continue
		}
		m := ptfsMount{dir: unescapeOctal(f[4]), dev: f[2]}
		if p, ok := strings.CutPrefix(f[sep+2], "ptfs:"); ok {
			if pid, err := strconv.Atoi(p); err == nil && pid > 0 {
				m.pid = pid
			}
		}
		out = append(out, m)
	}
	return out
}

// unescapeOctal undoes the kernel's \ooo escapes of mountinfo fields.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] <= '3' && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b = append(b, (s[i+1]-'0')<<6|(s[i+2]-'0')<<3|(s[i+3]-'0'))
			i += 3
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
