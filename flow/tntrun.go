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
}

// runCache maps a block (its id) and a pattern of TNT bits (with a stop
// bit above them, as in a TNT.8) to its run: an open-addressing table over
// runs and edges allocated from slabs, dropped with the block cache.
type runCache struct {
	slots []runSlot // a power of two long, at most half full
	n     int
	runs  []tntRun // slab the next runs are taken from
	edges []edge   // slab the next runs' edges are taken from
	tmp   [maxRunEdges]edge
}

type runSlot struct {
	key uint64
	r   *tntRun // nil: empty
}

const (
	minRunSlots = 1 << 10
	runSlab     = 1 << 9
	edgeSlab    = 1 << 12
)

func (c *runCache) drop() {
	clear(c.slots)
	c.n = 0
	c.runs, c.edges = nil, nil
}

func runKey(b *block, pat uint8) uint64 { return b.id<<8 | uint64(pat) }

func (c *runCache) hash(key uint64) uint64 { return key * 0x9e3779b97f4a7c15 >> 32 }

// lookup returns the run of key, or nil.
func (c *runCache) lookup(key uint64) *tntRun {
	if len(c.slots) == 0 {
		return nil
	}
	mask := uint64(len(c.slots) - 1)
	for i := c.hash(key) & mask; ; i = (i + 1) & mask {
		s := &c.slots[i]
		if s.r == nil || s.key == key {
			return s.r
		}
	}
}

// add keeps a copy of r with edges under key (not held yet) and returns it.
func (c *runCache) add(key uint64, r *tntRun, edges []edge) *tntRun {
	if len(c.slots) == 0 {
		c.slots = make([]runSlot, minRunSlots)
	}
	if 2*(c.n+1) > len(c.slots) {
		old := c.slots
		c.slots = make([]runSlot, 2*len(old))
		for i := range old {
			if old[i].r != nil {
				c.put(old[i])
			}
		}
	}
	if len(c.runs) == 0 {
		c.runs = make([]tntRun, runSlab)
	}
	if len(c.edges) < len(edges) {
		c.edges = make([]edge, edgeSlab)
	}
	kept := &c.runs[0]
	c.runs = c.runs[1:]
	*kept = *r
	n := copy(c.edges, edges)
	kept.edges = c.edges[:n:n]
	c.edges = c.edges[n:]
	c.put(runSlot{key, kept})
	c.n++
	return kept
}

func (c *runCache) put(s runSlot) {
	mask := uint64(len(c.slots) - 1)
	i := c.hash(s.key) & mask
	for c.slots[i].r != nil {
		i = (i + 1) & mask
	}
	c.slots[i] = s
}

// tntRun returns the run from block b (ending in a conditional branch or a
// direct jump or call) with the k (1..runBits) bits of pat below its stop
// bit, working it out on the first use.
func (d *Decoder) tntRun(b *block, pat uint8, k uint) *tntRun {
	key := runKey(b, pat)
	if r := d.cache.runs.lookup(key); r != nil {
		return r
	}
	var r tntRun
	edges := d.cache.runs.tmp[:0]
	steps, jumps := 0, 0
walk:
	for uint(r.used) < k {
		n := len(b.insns) - 1
		if n < 0 || jumps > runJumps {
			break
		}
		lst := &b.insns[n]
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
				// As exec: a call to the next instruction pushes
				// nothing.
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
	c := &d.cache
	c.insns += 2 + len(edges)
	return c.runs.add(key, &r, edges)
}
