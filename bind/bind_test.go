package bind

import (
	"errors"
	"slices"
	"syscall"
	"testing"

	"ptfs/fs"
)

// target is a fs.Target that only knows its name; the adapter calls no
// other method.
type target struct {
	fs.Target
	name string
}

func (t *target) Name() string { return t.name }

// engine is an Engine[*target] that records the removals.
type engine struct {
	targets []*target
	removed []string
}

func (e *engine) Status() []byte     { return []byte("mode: test\n") }
func (e *engine) Targets() []*target { return e.targets }

func (e *engine) AddTarget(name, path string) (*target, error) {
	if path == "" {
		return nil, syscall.ENOENT
	}
	t := &target{name: name}
	e.targets = append(e.targets, t)
	return t, nil
}

func (e *engine) RemoveTarget(name string) error {
	e.removed = append(e.removed, name)
	return nil
}

func TestTracer(t *testing.T) {
	e := &engine{targets: []*target{{name: "a"}, {name: "b"}}}
	tr := Tracer[*target](e)
	if got := string(tr.Status()); got != "mode: test\n" {
		t.Errorf("Status = %q", got)
	}
	var names []string
	for _, x := range tr.Targets() {
		names = append(names, x.Name())
	}
	if !slices.Equal(names, []string{"a", "b"}) {
		t.Errorf("Targets = %q, want [a b] in the engine's order", names)
	}
	got, err := tr.AddTarget("c", "/bin/c")
	if err != nil || got == nil || got.Name() != "c" {
		t.Fatalf("AddTarget(c) = %v, %v; want target c", got, err)
	}
	// A failed add must give a nil interface: the root would otherwise
	// build a directory around the engine's nil pointer.
	got, err = tr.AddTarget("d", "")
	if !errors.Is(err, syscall.ENOENT) || got != nil {
		t.Errorf("AddTarget(d) = %#v, %v; want nil, ENOENT", got, err)
	}
	if err := tr.RemoveTarget("a"); err != nil || !slices.Equal(e.removed, []string{"a"}) {
		t.Errorf("RemoveTarget(a) = %v, removed %q", err, e.removed)
	}
}
