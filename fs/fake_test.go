package fs

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"

	"ptfs/stream"
)

// fakeTracer is an in-memory engine for the FUSE tests. It checks specs
// with a toy grammar (an offset "0x…" followed by words) so that tests can
// see what the file system passed and what it did with the answer.
type fakeTracer struct {
	mu      sync.Mutex
	targets map[string]*fakeTarget
	// added and removed record AddTarget and RemoveTarget calls.
	added   []string
	removed []string
	// stall, when set, makes AddTarget and RemoveTarget send the name on
	// entered and wait until stall is closed before doing anything, as a
	// slow binary or probe removal would.
	stall, entered chan string
}

// stallCalls makes the next AddTarget and RemoveTarget calls block until
// the returned function is called (safe to call more than once).
func (tr *fakeTracer) stallCalls() (entered <-chan string, release func()) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.stall, tr.entered = make(chan string), make(chan string, 16)
	stall, once := tr.stall, sync.Once{}
	return tr.entered, func() { once.Do(func() { close(stall) }) }
}

// wait blocks while calls are stalled.
func (tr *fakeTracer) wait(name string) {
	tr.mu.Lock()
	stall, entered := tr.stall, tr.entered
	tr.mu.Unlock()
	if stall != nil {
		entered <- name
		<-stall
	}
}

func newFakeTracer(targets ...*fakeTarget) *fakeTracer {
	tr := &fakeTracer{targets: make(map[string]*fakeTarget)}
	for _, t := range targets {
		tr.targets[t.name] = t
	}
	return tr
}

func (tr *fakeTracer) Status() []byte {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return fmt.Appendf(nil, "mode: classic\ntargets: %d\n", len(tr.targets))
}

func (tr *fakeTracer) Targets() []Target {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []Target
	for _, t := range tr.targets {
		out = append(out, t)
	}
	return out
}

func (tr *fakeTracer) AddTarget(name, path string) (Target, error) {
	tr.wait(name)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.added = append(tr.added, name+"="+path)
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("add target %s: path %q: %w", name, path, syscall.ENOENT)
	}
	t := newFakeTarget(name, path)
	tr.targets[name] = t
	return t, nil
}

func (tr *fakeTracer) RemoveTarget(name string) error {
	tr.wait(name)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.removed = append(tr.removed, name)
	if tr.targets[name] == nil {
		return fmt.Errorf("remove target %s: %w", name, syscall.ENOENT)
	}
	delete(tr.targets, name)
	return nil
}

func (tr *fakeTracer) calls() (added, removed []string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.added), slices.Clone(tr.removed)
}

// The fakes implement each small interface the nodes use; the tests of a
// single node use a fakeTarget as that interface alone.
var (
	_ Tracer         = (*fakeTracer)(nil)
	_ Exe            = (*fakeTarget)(nil)
	_ Reporter       = (*fakeTarget)(nil)
	_ SymbolTable    = (*fakeTarget)(nil)
	_ ProbeSet       = (*fakeTarget)(nil)
	_ Recorder       = (*fakeTarget)(nil)
	_ Brancher       = (*fakeTarget)(nil)
	_ BranchesCloser = (*fakeTarget)(nil)
	_ Target         = (*fakeTarget)(nil)
)

type fakeProbe struct {
	spec    string // the working spec, "" if none
	refused string // the last refused spec and why, "" if none
}

type fakeTarget struct {
	name, path string
	records    *stream.Stream
	// branches is nil when the fake has no PT.
	branches *stream.Stream

	mu         sync.Mutex
	probes     map[string]*fakeProbe
	setCalls   []string
	stageCalls int
	brOpen     int
	brClosed   int
	symbolsOK  bool
}

func newFakeTarget(name, path string) *fakeTarget {
	return &fakeTarget{
		name: name, path: path,
		records:   stream.New(stream.Options{Limit: 1 << 20}),
		probes:    make(map[string]*fakeProbe),
		symbolsOK: true,
	}
}

func (t *fakeTarget) Name() string { return t.name }
func (t *fakeTarget) Path() string { return t.path }

func (t *fakeTarget) Status() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fmt.Appendf(nil, "target: %s\nprobes: %d\nsummary: records=%d\n",
		t.name, len(t.probes), t.records.Size())
}

func (t *fakeTarget) Symbols() ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.symbolsOK {
		return nil, fmt.Errorf("read symbols of %s: %w", t.path, syscall.ENOEXEC)
	}
	return []byte("0x1040 32 main\n0x1060 16 f(int)\n"), nil
}

func (t *fakeTarget) Probes() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var names []string
	for n := range t.probes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (t *fakeTarget) ProbeText(name string) ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.probes[name]
	if p == nil {
		return nil, false
	}
	var b []byte
	if p.spec != "" {
		b = fmt.Appendf(b, "%s\n# installed\n", p.spec)
	}
	if p.refused != "" {
		b = fmt.Appendf(b, "# refused: %s\n", p.refused)
	}
	return b, true
}

func (t *fakeTarget) CreateProbe(name string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if strings.HasPrefix(name, ".") {
		return fmt.Errorf("create probe %q: hidden names are not probes: %w", name, syscall.EINVAL)
	}
	if t.probes[name] == nil {
		t.probes[name] = &fakeProbe{}
	}
	return nil
}

func (t *fakeTarget) SetProbe(name, spec string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.setCalls = append(t.setCalls, name+"="+spec)
	p := t.probes[name]
	if p == nil {
		return fmt.Errorf("set probe %s: %w", name, syscall.ENOENT)
	}
	f := strings.Fields(spec)
	switch {
	case len(f) == 0 || strings.Contains(spec, "\n"):
		p.refused = fmt.Sprintf("%q: want one line: OFFSET ARGS", spec)
		return fmt.Errorf("set probe %s: %w", name, syscall.EINVAL)
	case f[0] == "0xdead":
		p.refused = fmt.Sprintf("%q: site is an int3", spec)
		return fmt.Errorf("set probe %s: %w", name, syscall.EOPNOTSUPP)
	case !strings.HasPrefix(f[0], "0x"):
		p.refused = fmt.Sprintf("%q: offset must start with 0x", spec)
		return fmt.Errorf("set probe %s: %w", name, syscall.EINVAL)
	}
	p.spec, p.refused = spec, ""
	return nil
}

func (t *fakeTarget) StageProbe(name, spec string) error {
	t.mu.Lock()
	t.stageCalls++
	t.mu.Unlock()
	return t.SetProbe(name, spec)
}

func (t *fakeTarget) RenameProbe(from, to string, noReplace bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.probes[from]
	switch {
	case p == nil:
		return fmt.Errorf("rename probe %s: %w", from, syscall.ENOENT)
	case noReplace && t.probes[to] != nil:
		return fmt.Errorf("rename probe %s: %w", to, syscall.EEXIST)
	}
	delete(t.probes, from)
	t.probes[to] = p
	return nil
}

func (t *fakeTarget) RemoveProbe(name string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.probes[name] == nil {
		return fmt.Errorf("remove probe %s: %w", name, syscall.ENOENT)
	}
	delete(t.probes, name)
	return nil
}

func (t *fakeTarget) Records() *stream.Stream { return t.records }

func (t *fakeTarget) Branches() (*stream.Stream, error) {
	if t.branches == nil {
		return nil, fmt.Errorf("branches of %s: no intel_pt: %w", t.name, syscall.EOPNOTSUPP)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.brOpen++
	return t.branches, nil
}

func (t *fakeTarget) CloseBranches() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.brClosed++
}

func (t *fakeTarget) probe(name string) fakeProbe {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.probes[name]; p != nil {
		return *p
	}
	return fakeProbe{}
}

func (t *fakeTarget) lastSet() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.setCalls) == 0 {
		return ""
	}
	return t.setCalls[len(t.setCalls)-1]
}

func (t *fakeTarget) branchCounts() (opened, closed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.brOpen, t.brClosed
}
