package decode

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// decSIMD tells whether putList converts with SSE2 and SSSE3's PSHUFB
// (all but the oldest amd64 CPUs have both).
var decSIMD = cpu.X86.HasSSSE3

// putListSSSE3 is putListGo in SIMD registers (dec_amd64.s): both
// eight-digit groups of a value below 1e16 at once, their leading zeros
// dropped by a shuffle, not by branching on the value's length (the one
// branch on it that remains, at 1e16, is taken by a sixth of the records
// benchmark's arguments), the constants loaded once for all n values.
// b must have room for listRoom(n) bytes, n > 0.
//
//go:noescape
func putListSSSE3(b *byte, vals *uint64, n int) int

// putList writes vals in decimal, separated by ", ", at the start of b,
// which must have room for listRoom(len(vals)) bytes, and returns the
// length. It may write scratch bytes past the length within that room.
func putList(b []byte, vals []uint64) int {
	if decSIMD && len(vals) > 0 && len(b) >= listRoom(len(vals)) {
		return putListSSSE3(unsafe.SliceData(b), unsafe.SliceData(vals), len(vals))
	}
	// Without SSSE3, or without the room: Go's bounds checks say so.
	return putListGo(b, vals)
}
