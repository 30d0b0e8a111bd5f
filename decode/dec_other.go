//go:build !amd64

package decode

// putList writes vals in decimal, separated by ", ", at the start of b,
// which must have room for listRoom(len(vals)) bytes, and returns the
// length. It may write scratch bytes past the length within that room.
func putList(b []byte, vals []uint64) int { return putListGo(b, vals) }
