//go:build race

package capture

// raceDetector is true when the race detector, which slows the reader many
// times over, is on.
const raceDetector = true
