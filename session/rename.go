package session

import (
	"fmt"
	"syscall"

	"ptfs/decode"
	"ptfs/probes"
	"ptfs/tracefs"
)

// siteTakenError refuses a probe at a site that another probe of the
// target has (one probe a site): it wraps tracefs.ErrExists (EEXIST).
type siteTakenError struct {
	probe string
	off   uint64
}

func (e *siteTakenError) Error() string {
	return fmt.Sprintf("%v: probe %s is at file offset 0x%x already", tracefs.ErrExists, e.probe, e.off)
}

func (e *siteTakenError) Unwrap() error { return tracefs.ErrExists }

// StageProbe is SetProbe for a file made to be renamed over another probe
// (a temp file of `sed -i`, created with O_EXCL): a spec whose site the
// other probe has is not refused but kept as staged, and RenameProbe over
// that probe installs it in its place. Every other error is SetProbe's.
func (t *Target) StageProbe(name, spec string) error {
	return t.setProbe(name, spec, true)
}

// RenameProbe renames probe from to `to` (`mv`), replacing probe `to` if
// it exists (unless noReplace: EEXIST). An installed probe keeps its
// kernel probe, and its records carry the new name; a staged one is
// installed as `to`, replacing that probe's at its own site as a
// rewrite of its file would, and when that fails nothing changes.
func (t *Target) RenameProbe(from, to string, noReplace bool) error {
	if err := checkName(to); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	t.change.Lock()
	defer t.change.Unlock()
	t.mu.Lock()
	p, q, closed := t.probes[from], t.probes[to], t.closed
	t.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case p == nil:
		return fmt.Errorf("probe %s: %w", from, ErrNoProbe)
	case p == q:
		return nil
	case q != nil && noReplace:
		return fmt.Errorf("probe %s: %w", to, syscall.EEXIST)
	}
	if q != nil && p.staged != "" {
		return t.installStaged(p, q)
	}
	if q != nil {
		if err := t.retire(q); err != nil {
			return fmt.Errorf("probe %s: removing the probe renamed over: %w", to, err)
		}
	}
	t.mu.Lock()
	delete(t.probes, from)
	t.probes[to] = p
	p.name = to
	if p.ev != nil {
		p.ev = t.renameEvent(p.ev, to)
		// A ptw return probe's other rets are events of p too.
		for i := range p.rets {
			p.rets[i].ev = t.renameEvent(p.rets[i].ev, to)
		}
	}
	t.mu.Unlock()
	return nil
}

// renameEvent returns a copy of ev named to, which the records of ev's
// id carry from now on, in records and in branches.
func (t *Target) renameEvent(ev *decode.Event, to string) *decode.Event {
	named := *ev
	named.Name = to
	t.s.renameRoute(named.ID, &named)
	t.s.br.setEvent(named.ID, &named)
	return &named
}

// installStaged installs p's staged spec as probe q and drops p: the
// rename of a temp file over q.
func (t *Target) installStaged(p, q *probe) error {
	err := t.follow()
	if err == nil {
		var sp *probes.Spec
		if sp, err = probes.Parse(p.staged); err == nil {
			err = t.place(q, p.staged, sp)
		}
	}
	if err != nil {
		return fmt.Errorf("probe %s: installing the staged spec of %s: %w", q.name, p.name, err)
	}
	// A staged probe has no kernel probe: its file just goes.
	t.mu.Lock()
	delete(t.probes, p.name)
	q.err, q.badSpec = nil, ""
	t.mu.Unlock()
	return nil
}
