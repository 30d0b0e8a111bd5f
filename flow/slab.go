package flow

// The caches take their blocks, instructions, runs and edges from slabs:
// a miss allocates a slab now and then, not an object each time.

// slabTake returns the next element of *slab, a new slab of size elements
// when it is used up.
func slabTake[T any](slab *[]T, size int) *T {
	if len(*slab) == 0 {
		*slab = make([]T, size)
	}
	e := &(*slab)[0]
	*slab = (*slab)[1:]
	return e
}

// slabCopy returns a copy of src in the next elements of *slab, a new slab
// of size (at least len(src)) elements when too few are left.
func slabCopy[T any](slab *[]T, src []T, size int) []T {
	if len(*slab) < len(src) {
		*slab = make([]T, max(size, len(src)))
	}
	n := copy(*slab, src)
	out := (*slab)[:n:n]
	*slab = (*slab)[n:]
	return out
}
