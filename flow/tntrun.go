package flow

import "ptfs/x86insn"

// A TNT run is libxdc's idea: what a block and the next few TNT bits do is
// the same every time, so it is worked out once and kept. From a block
// ending in a conditional branch or a direct jump or call, with up to
// runBits pending bits, the flow goes through conditional branches (a bit
// each) and direct jumps and calls; the run keeps the taken branches (the
// edges, with the return addresses the calls push) and where it ends.

// runBits is the most TNT bits a run takes: a TNT.8's.
const runBits = 6

// runJumps bounds the blocks a run goes through without taking a bit, so
// that a jump to itself ends in the walk's MaxInsns error.
const runJumps = 16

// maxRunEdges bounds a run's edges: a conditional branch per bit, and up
// to runJumps+1 jumps or calls before each.
const maxRunEdges = runBits * (runJumps + 2)

// edge is a taken branch of a run.
type edge struct {
	from, to uint64
	// ret is the return address a call pushes (push).
	ret  uint64
	kind BranchKind
	push bool
}

// tntRun is what a run does: its edges, the block it ends at, and what the
// decoder's counters and bounds see of it.
type tntRun struct {
	edges []edge
	// end is the block at endIP, where the run stopped: after its last
	// bit, or before a block it does not go through (a return, an
	// indirect branch, anything but a conditional branch or direct jump
	// or call, more than runJumps blocks without a bit).
	end   *block
	endIP uint64
	// errIP is the last branch instruction of the run.
	errIP uint64
	insns uint64
	// pre is the most instructions the walk counts toward MaxInsns,
	// before the first bit, on top of those counted before the run; post
	// the most after it. steps is the count after the run: on top of
	// those before it when it took no bit (bit), else alone.
	pre, post, steps int
	used             uint8 // bits taken
	bit              bool
	// pat is the bits the run is for (below a stop bit, as in a TNT.8);
	// next is the start block's next run (block.runs).
	pat  uint8
	next *tntRun
}

// runCache holds the slabs runs and their edges are allocated from; a
// block lists its runs (block.runs), so they are dropped with the block
// cache.
type runCache struct {
	runs  slab[tntRun]
	edges slab[edge]
	tmp   [maxRunEdges]edge
	// recent is a direct-mapped cache over the blocks' lists (runHash),
	// allocated on the first run: a run that is not its block's first
	// (patterns alternating in a loop) costs a load instead of a walk
	// of the list.
	recent []runRef
}

// runRef is a recent entry: the run r of block b.
type runRef struct {
	b *block
	r *tntRun
}

// recentRuns is the size of runCache.recent (16 bytes an entry).
const recentRuns = 1 << 11

// Slab sizes: the first chunk's and the largest.
const (
	runSlabLo  = 1 << 6
	runSlab    = 1 << 9
	edgeSlabLo = 1 << 9
	edgeSlab   = 1 << 12
)

func (c *runCache) drop() {
	c.runs.drop()
	c.edges.drop()
	clear(c.recent)
}

// runHash is the index in runCache.recent of block b's run with pat.
func runHash(b *block, pat uint8) uint64 {
	return (b.ip ^ uint64(pat)<<56) * 0x9e3779b97f4a7c15 >> 53 & (recentRuns - 1)
}

// add keeps a copy of r with edges as a run of b.
func (c *runCache) add(b *block, r *tntRun, edges []edge) *tntRun {
	kept := c.runs.take(runSlabLo, runSlab)
	*kept = *r
	kept.edges = c.edges.copy(edges, edgeSlabLo, edgeSlab)
	kept.next, b.runs = b.runs, kept
	return kept
}

// tntRun returns the run from block b (ending in a conditional branch or a
// direct jump or call) with the k (1..runBits) bits of pat below its stop
// bit, working it out on the first use.
func (d *Decoder) tntRun(b *block, pat uint8, k uint) *tntRun {
	// The last one found in the list first: a loop's pattern is found
	// at once; then the recent cache, then the list.
	if r := b.runs; r != nil && r.pat == pat {
		return r
	}
	c := &d.cache.runs
	ref := (*runRef)(nil)
	if c.recent != nil {
		ref = &c.recent[runHash(b, pat)]
		if ref.b == b && ref.r.pat == pat {
			return ref.r
		}
	}
	for p := &b.runs; *p != nil; p = &(*p).next {
		if r := *p; r.pat == pat {
			*p, r.next, b.runs = r.next, b.runs, r
			if ref != nil {
				*ref = runRef{b, r}
			}
			return r
		}
	}
	start := b
	r := tntRun{pat: pat}
	edges := d.cache.runs.tmp[:0]
	steps, jumps := 0, 0
walk:
	for uint(r.used) < k {
		n := b.count() - 1
		if n < 0 || jumps > runJumps {
			break
		}
		lst := b.last()
		next, succ := lst.ip+uint64(lst.len), &b.taken
		switch lst.class {
		case x86insn.CondJump, x86insn.Jump, x86insn.Call:
		default:
			break walk
		}
		// The walk's MaxInsns check before the block.
		if need := steps + n + 1; r.bit {
			r.post = max(r.post, need)
		} else {
			r.pre = max(r.pre, need)
		}
		if lst.class == x86insn.CondJump {
			r.used++
			r.bit, steps, jumps = true, 0, 0
			if pat>>(k-uint(r.used))&1 == 1 {
				edges = append(edges, edge{from: lst.ip, to: lst.target, kind: BrCond})
				next = lst.target
			} else {
				succ = &b.fall
			}
		} else {
			steps += n + 1
			jumps++
			e := edge{from: lst.ip, to: lst.target, kind: BrJump}
			if lst.class == x86insn.Call {
				// As pushCall: a call to the next instruction
				// pushes nothing.
				e.kind, e.ret, e.push = BrCall, next, lst.target != next
			}
			edges = append(edges, e)
			next = lst.target
		}
		r.insns += uint64(n + 1)
		r.errIP = lst.ip
		b = d.fixedSucc(succ, next)
		r.endIP = next
	}
	r.end, r.steps = b, steps
	d.cache.insns += 2 + len(edges)
	if c.recent == nil {
		c.recent = make([]runRef, recentRuns)
	}
	return c.add(start, &r, edges)
}
