package session

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"ptfs/objfile"
	"ptfs/probes"
)

// follow makes the target's binary the file that its path names now, if
// that changed: replaced (renamed over, as compilers and package managers
// do) or rewritten in place (same inode, new size or times). It opens and
// parses the new file, resolves every installed or stale probe's spec
// against it and installs it there, removing the old probe; a probe whose
// spec no longer resolves or installs is removed and marked stale with the
// reason. When the path is gone, the probes stay on the file they are on
// (running processes still execute it) and the state says so. It returns
// an error only when the path names a file that cannot be used; the
// probes then stay where they are. Called holding change.
func (t *Target) follow() error {
	id, err := objfile.StatID(t.path)
	if err != nil {
		state := "path gone: the probes stay on the file they were installed on"
		if !errors.Is(err, fs.ErrNotExist) {
			state = fmt.Sprintf("path unusable (%v): the probes stay on the file they were installed on", err)
		}
		t.setPathState(state)
		return nil
	}
	old := t.bin
	if id == old.ID() {
		t.setPathState("")
		return nil
	}
	nb, err := probes.Open(t.path)
	if err != nil {
		t.setPathState(fmt.Sprintf("the file at the path changed and cannot be used (%v): the probes stay on the old file", err))
		return fmt.Errorf("%s changed: %w", t.path, err)
	}
	inPlace := nb.ID().SameFile(old.ID())
	var todo []*probe
	for _, p := range t.list() {
		if p.ev != nil || p.stale != nil {
			todo = append(todo, p)
		}
	}
	if inPlace {
		// The kernel keeps the instruction it copied when a probe was
		// registered, per inode and offset: the old probes must go before
		// any probe on the new bytes is made.
		for _, p := range todo {
			if p.ev != nil {
				t.unplace(p, errors.New("the file was rewritten in place"))
			}
		}
	}
	t.mu.Lock()
	t.bin, t.syms, t.pathState = nb, nil, ""
	t.mu.Unlock()
	moved, stale := 0, 0
	for _, p := range todo {
		sp := p.sp
		// A refusal of the spec on the old file goes as it installs
		// (installedLocked).
		if err := t.place(p, p.spec, sp); err != nil {
			t.unplace(p, fmt.Errorf("not installed on the new file at %s (%s): %w", t.path, nb.ID(), err))
			stale++
			continue
		}
		moved++
	}
	// Branch tracing filters on the code of the file the path names.
	t.s.br.fileChanged(t)
	if !slices.Contains(t.binaries(), old) {
		if err := old.Close(); err != nil {
			logrus.WithError(err).WithField("target", t.name).Warn("ptfs: closing the replaced binary")
		}
	}
	logrus.WithFields(logrus.Fields{"target": t.name, "file": nb.ID().String(), "in place": inPlace,
		"moved": moved, "stale": stale}).Info("ptfs: target file changed; probes followed it")
	return nil
}

// unplace removes p's installed probe, if any, and marks p stale with why;
// its spec stays, to be installed again when the path changes or the spec
// is written. Called holding change.
func (t *Target) unplace(p *probe, why error) {
	sp := p.sp
	if err := t.retire(p); err != nil {
		logrus.WithError(err).WithField("probe", p.name).Warn("ptfs: removing a stale probe")
	}
	t.mu.Lock()
	p.sp, p.stale = sp, why
	t.mu.Unlock()
}

// binaries returns the target's binary and every other one that an
// installed probe is on. Called holding change.
func (t *Target) binaries() []*probes.Binary {
	bins := []*probes.Binary{t.bin}
	for _, p := range t.list() {
		if p.ev != nil && !slices.Contains(bins, p.bin) {
			bins = append(bins, p.bin)
		}
	}
	return bins
}

func (t *Target) setPathState(s string) {
	t.mu.Lock()
	t.pathState = s
	t.mu.Unlock()
}

// settle is how long a follow waits after the first change it hears of,
// so that the burst of events of one build or copy makes one follow.
const settle = 50 * time.Millisecond

// schedule follows the path soon, in its own goroutine; a follow that is
// scheduled and has not started yet covers later calls.
func (t *Target) schedule(w *watcher) {
	if !t.pending.CompareAndSwap(false, true) {
		return
	}
	w.follows.Add(1)
	go func() {
		defer w.follows.Done()
		select {
		case <-time.After(w.settle):
		case <-w.stop:
			return
		}
		t.pending.Store(false)
		t.change.Lock()
		defer t.change.Unlock()
		t.mu.Lock()
		closed := t.closed
		t.mu.Unlock()
		if closed {
			return
		}
		if err := t.follow(); err != nil {
			logrus.WithError(err).WithField("target", t.name).Warn("ptfs: following the target's path")
		}
	}()
}

// watchMask are the events of a directory that can change what a name in
// it refers to, or the content of the file it names.
const watchMask = unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_CREATE | unix.IN_CLOSE_WRITE |
	unix.IN_ATTRIB | unix.IN_DELETE | unix.IN_ONLYDIR

// watcher follows the paths of a session's targets with inotify on their
// parent directories, one goroutine for the session. A directory stays
// watched until Close.
type watcher struct {
	f       *os.File // the inotify descriptor, read through the poller
	targets func() []*Target
	stop    chan struct{}
	done    chan struct{}
	follows sync.WaitGroup
	settle  time.Duration // a follow's wait after the first change

	mu   sync.Mutex
	dirs map[int32]string // by watch descriptor
}

// newWatcher starts a watcher that looks targets up with targets and
// follows a path settle after the first change it hears of.
func newWatcher(targets func() []*Target, settle time.Duration) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &watcher{
		f:       os.NewFile(uintptr(fd), "inotify"),
		targets: targets,
		settle:  settle,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		dirs:    map[int32]string{},
	}
	go w.run()
	return w, nil
}

// watch watches the directory that holds path.
func (w *watcher) watch(path string) error {
	dir := filepath.Dir(path)
	var wd int
	err := w.control(func(fd int) (err error) {
		wd, err = unix.InotifyAddWatch(fd, dir, watchMask)
		return err
	})
	if err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	w.mu.Lock()
	w.dirs[int32(wd)] = dir
	w.mu.Unlock()
	return nil
}

func (w *watcher) control(f func(fd int) error) error {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// run reads inotify events until Close and schedules a follow of each
// target whose path an event names (every target when the queue
// overflowed).
func (w *watcher) run() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				logrus.WithError(err).Warn("ptfs: inotify read failed; target paths are checked on probe writes only")
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if i := slices.Index(name, 0); i >= 0 {
				name = name[:i]
			}
			w.mu.Lock()
			dir, ok := w.dirs[ev.Wd]
			w.mu.Unlock()
			all := ev.Mask&unix.IN_Q_OVERFLOW != 0
			if !ok && !all {
				continue
			}
			for _, t := range w.targets() {
				if all || filepath.Dir(t.path) == dir && filepath.Base(t.path) == string(name) {
					t.schedule(w)
				}
			}
		}
	}
}

// Close stops the watcher and waits for the follows it scheduled.
func (w *watcher) Close() error {
	close(w.stop)
	err := w.f.Close()
	<-w.done
	w.follows.Wait()
	if err != nil {
		return fmt.Errorf("close inotify: %w", err)
	}
	return nil
}
