//go:build race

package testkit

// Race is true when the race detector, which slows the reader many
// times over, is on.
const Race = true
