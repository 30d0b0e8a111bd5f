// Package bind joins a tracing engine to the FUSE adapter (DESIGN §4).
//
// An engine's methods name its own target type (session.Session returns
// *session.Target), so that the engine need not import fs; Go cannot use
// a []*session.Target as a []fs.Target, so Tracer converts. bind imports
// fs but no engine: the engine comes as a type parameter, which lets the
// engine's own tests mount it too.
package bind

import "ptfs/fs"

// Engine is a tracing engine whose targets are of type T: fs.Tracer with
// T in place of fs.Target.
type Engine[T fs.Target] interface {
	fs.Reporter
	// Targets returns the targets present at mount time.
	Targets() []T
	// AddTarget starts tracing the binary at path as target name.
	AddTarget(name, path string) (T, error)
	// RemoveTarget stops tracing name and removes its probes.
	RemoveTarget(name string) error
}

// Tracer returns e as the fs.Tracer of a mount.
func Tracer[T fs.Target](e Engine[T]) fs.Tracer {
	return tracer[T]{e}
}

// tracer is Engine[T] with fs.Target in its signatures; Status and
// RemoveTarget pass through.
type tracer[T fs.Target] struct {
	Engine[T]
}

// Targets returns the engine's targets as fs.Targets.
func (t tracer[T]) Targets() []fs.Target {
	ts := t.Engine.Targets()
	out := make([]fs.Target, len(ts))
	for i, x := range ts {
		out[i] = x
	}
	return out
}

// AddTarget adds a target. On error the result is a nil fs.Target, not
// one holding the engine's nil pointer.
func (t tracer[T]) AddTarget(name, path string) (fs.Target, error) {
	x, err := t.Engine.AddTarget(name, path)
	if err != nil {
		return nil, err
	}
	return x, nil
}
