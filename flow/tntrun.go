package flow

import (
	"math/bits"
	"unsafe"

	"ptfs/x86insn"
)

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

// tntRun is what a run does: its edges, the block it ends at, and what the
// decoder's counters and bounds see of it. It is a cache line (64 bytes,
// from a slab of page-aligned chunks): the fast path looks up a run per
// TNT packet, and a run is more often out of the cache than not.
type tntRun struct {
	// edges are handed to the Handler as they are (Edges). Past their
	// length, within their capacity, are the nrets return addresses the
	// run's calls push, in order (in From; a run has no return).
	edges []Edge
	// end is the block where the run stopped: after its last bit, or
	// before a block it does not go through (a return, an indirect
	// branch, anything but a conditional branch or direct jump or call,
	// more than runJumps blocks without a bit).
	end *block
	// errIP is the last branch instruction of the run.
	errIP uint64
	// next is the start block's next run (block.runs).
	next *tntRun
	// pre is the most instructions the walk counts toward MaxInsns,
	// before the first bit, on top of those counted before the run; post
	// the most after it. steps is the count after the run: on top of
	// those before it when it took no bit (bit), else alone. A run goes
	// through at most 6*(runJumps+2) blocks of maxBlock instructions: 16
	// bits hold the counts.
	insns, pre, post, steps uint16
	used                    uint8 // bits taken
	bit                     bool
	// pat is the bits the run is for (below a stop bit, as in a TNT.8).
	pat   uint8
	nrets uint8
	_     [4]byte
}

// rets returns the return addresses r's calls push, in order.
func (r *tntRun) rets() []Edge {
	n := len(r.edges)
	return r.edges[n : n+int(r.nrets)]
}

// runCache holds the slabs runs and their edges are allocated from; a
// block lists its runs (block.runs), so they are dropped with the block
// cache.
type runCache struct {
	runs  slab[tntRun]
	edges slab[Edge]
	// tmp holds a run's edges and its return addresses while it is
	// worked out.
	tmp [2 * maxRunEdges]Edge
	// recent is a direct-mapped cache over the blocks' lists (runHash),
	// allocated when the fast path first runs (only its kernel takes
	// runs, and reads it without a test): a run costs a load instead of
	// a walk of its block's list.
	recent *[recentRuns]runRef
	// tips is a direct-mapped cache of the blocks at recent IP packets'
	// targets (ipBlock), allocated on the first miss or when the fast
	// path first runs.
	tips *[recentTips]*block
	// pgds are the recent TIP.PGD walks (fast.go), allocated when the
	// fast path first runs.
	pgds *[recentPGDs]pgdWalk
	// tlets are the recent tracelets, allocated when the fast path
	// first runs (the kernel reads it without a test).
	tlets *[recentTlets]tlet
	// tletSeen marks, by set, the last group the kernel did not find
	// (its tletHash): a group is made when it is missed twice in a row
	// in its slot, so that groups that do not come again (a loop's
	// varying bits) cost no exit and fill each.
	tletSeen *[recentTlets / 2]uint64
	// tletRoom holds, by slot, the edges of the slot's tracelet
	// (tlet.e), from tletSlab; tletRoomed counts the edges the rooms
	// took, old ones too (a room only grows). Not cleared with the
	// cache: a drop while a Handler reads a batch leaves them as they
	// are.
	tletRoom   *[recentTlets][]Edge
	tletSlab   slab[Edge]
	tletRoomed int
	// wndKeys, wnds, wndSeen, wndRoom, wndSlab and wndRoomed are the
	// recent packet windows (window.go), their keys apart, as tlets,
	// tletSeen, tletRoom, tletSlab and tletRoomed are the tracelets;
	// wtmp holds a window's edges while it is worked out. The tables
	// may be a closed decoder's that this one has not used (wndUsed:
	// wndCaches), which a drop and Close need not clear: a cold decoder
	// carries them, zero, to the next.
	wndKeys   *[recentWnds / 2]wndKeys
	wnds      *[recentWnds]wnd
	wndSeen   *[recentWnds / 2]uint64
	wndRoom   *[recentWnds][]Edge
	wndUsed   bool
	wndSlab   slab[Edge]
	wndRoomed int
	wtmp      [wndEdges]Edge
}

// runRef is a recent entry: the run r of block b.
type runRef struct {
	b *block
	r *tntRun
}

// recentRuns is the size of runCache.recent (16 bytes an entry).
const recentRuns = 1 << 11

// recentTips is the size of runCache.tips (8 bytes an entry).
const recentTips = 1 << 11

// Slab sizes: the first chunk's and the largest.
const (
	runSlabLo  = 1 << 6
	runSlab    = 1 << 8
	edgeSlabLo = 1 << 8
	edgeSlab   = 1 << 10
)

func (c *runCache) drop() {
	c.runs.drop()
	c.edges.drop()
	if c.recent != nil {
		clear(c.recent[:])
	}
	if c.tips != nil {
		clear(c.tips[:])
	}
	if c.tlets != nil {
		clear(c.tlets[:])
		clear(c.tletSeen[:])
	}
	if c.wndUsed {
		clear(c.wndKeys[:])
		clear(c.wnds[:])
		clear(c.wndSeen[:])
	}
	c.dropWalks()
}

// runHash is the index in runCache.recent of block b's run with pat.
func runHash(b *block, pat uint8) uint64 {
	return (b.ip ^ uint64(pat)<<56) * 0x9e3779b97f4a7c15 >> 53 & (recentRuns - 1)
}

// add keeps a copy of r with edges, and its return addresses after them
// (r.nrets at the end of edges), as a run of b.
func (c *runCache) add(b *block, r *tntRun, edges []Edge) *tntRun {
	kept := c.runs.take(runSlabLo, runSlab)
	// Field by field into the zeroed slab, as block and decodeBlock fill a block: a whole
	// run copied at once is a bulk write barrier while the GC marks.
	kept.end, kept.errIP = r.end, r.errIP
	kept.insns, kept.pre, kept.post, kept.steps = r.insns, r.pre, r.post, r.steps
	kept.used, kept.bit, kept.pat, kept.nrets = r.used, r.bit, r.pat, r.nrets
	kept.edges = c.edges.copy(edges, edgeSlabLo, edgeSlab)[:len(edges)-int(r.nrets)]
	kept.next, b.runs = b.runs, kept
	return kept
}

// tntRun returns the run from block b (ending in a conditional branch or a
// direct jump or call) with the k (1..runBits) bits of pat below its stop
// bit, not in the recent cache (the kernel's lookup): from its block's
// list, or worked out on the first use; the recent cache keeps it.
func (d *Decoder) tntRun(b *block, pat uint8, k uint) *tntRun {
	c := &d.cache.runs
	ref := &c.recent[runHash(b, pat)] // made by runCaches before the kernel ran
	for r := b.runs; r != nil; r = r.next {
		if r.pat == pat {
			*ref = runRef{b, r}
			return r
		}
	}
	start := b
	r := tntRun{pat: pat}
	// The edges from tmp's start (at most maxRunEdges), the return
	// addresses from its middle, by index: no slice is kept across the
	// successor's lookup (a call, around which the compiler spills what
	// is live), and a known successor is taken without it.
	tmp := &c.tmp
	ne, nr := 0, maxRunEdges
	steps, jumps := 0, 0
	rest := uint64(pat) << (64 - k) // the bits to take, the next at the top
	for uint(r.used) < k && jumps <= runJumps {
		n := int(b.n) - 1
		class := b.class
		// A run goes through the direct branches only (a range of
		// classes: CondJump, Jump, Call).
		if n < 0 || class == x86insn.NotBranch || class > x86insn.Call {
			break
		}
		from, target := b.ip+uint64(b.lastOff), b.target
		next, succ := from+uint64(b.lastLen), &b.taken
		// The walk's MaxInsns check before the block.
		if need := uint16(steps + n + 1); r.bit {
			r.post = max(r.post, need)
		} else {
			r.pre = max(r.pre, need)
		}
		if class == x86insn.CondJump {
			r.used++
			r.bit, steps, jumps = true, 0, 0
			if rest>>63 == 1 {
				tmp[ne] = Edge{From: from, To: target, Kind: BrCond}
				ne++
				next = target
			} else {
				succ = &b.fall
			}
			rest <<= 1
		} else {
			steps += n + 1
			jumps++
			kind := BrJump
			if class == x86insn.Call {
				kind = BrCall
				// As pushCall: a call to the next instruction
				// pushes nothing.
				if target != next {
					tmp[nr] = Edge{From: next}
					nr++
				}
			}
			tmp[ne] = Edge{From: from, To: target, Kind: kind}
			ne++
			next = target
		}
		r.insns += uint16(n + 1)
		r.errIP = from
		if b = *succ; b == nil {
			b = d.fixedSucc(succ, next)
		}
	}
	nrets := nr - maxRunEdges
	r.end, r.steps, r.nrets = b, uint16(steps), uint8(nrets)
	d.cache.insns += 2 + ne + nrets
	if nrets > 0 {
		// The return addresses after the edges (copy moves
		// overlapping elements as memmove does).
		copy(tmp[ne:], tmp[maxRunEdges:nr])
	}
	kept := c.add(start, &r, tmp[:ne+nrets])
	*ref = runRef{start, kept}
	return kept
}

// A tracelet is libxdc's other idea: the TNT.8 packets that stand
// together in the trace (up to 8, read as one word) are taken by one
// lookup of the block and those bytes, where each would be a packet read,
// a run's lookup and the run. Of a warm mruby pass's 84 k TNT.8 packets,
// 49 k stand with others (12.8 k groups of 2 to 8, 1,766 distinct keys).
// A tracelet is the runs the bytes take, each run taking its byte's bits
// whole (so nothing is pending between them, and the runs are the ones
// the kernel would take byte by byte), made into one: their edges copied
// into one slice (its slot's room, runCache.tletRoom), their return
// addresses into the tracelet, so that the kernel stores one batch entry,
// reads no run and loads one line (a tracelet is a cache line). What the
// runs' MaxInsns checks see is left out: the kernel takes one only with a
// budget that passes all of them unread (tletBudget).
type tlet struct {
	b *block
	// key is the bytes, the first in the low byte (TNT.8 bytes are not
	// zero: keys of different lengths differ).
	key   uint64
	end   *block
	errIP uint64
	// e is the first of the ne edges (0 without any), in the slot's
	// room, which keeps them: a word the collector neither scans nor
	// write-barriers, as a batch entry (edgeRef).
	e     uintptr
	insns uint32
	ne    uint16
	// nrets is the return addresses pushed, in order, rets (in the
	// line: a warm mruby pass's tracelets push 0 to 2, 99% of them); m
	// the runs (bytes) it takes: those of key from the first on that
	// give a run taking its bits whole, up to tletEdges edges (fewer
	// past tletRoomMax) and tletRets return addresses; 0, none (the
	// kernel reads the bytes one by one).
	nrets, m uint8
	rets     [tletRets]uint64
}

// edges returns t's edges as a batch entry.
func (t *tlet) edges() edgeRef {
	n := int(t.ne)
	return edgeRef{t.e, n, n}
}

// tletRets bounds a tracelet's return addresses.
const tletRets = 2

// tletEdges bounds a tracelet's edges (its slot's room): of a warm mruby
// pass's tracelets 96% have 24 or fewer, 99% 48.
const tletEdges = 48

// tletGrain is what a slot's room grows by: few rooms grow again (mruby's
// rooms take 12.6 k edges the first pass, 22.8 k by the thirtieth, none
// after).
const tletGrain = 4

// tletRoomMax bounds the edges the rooms take, so that a trace whose
// tracelets keep changing ends their growth: past it a tracelet takes
// the runs its slot's room has room for.
const tletRoomMax = 1 << 15

// tletMax is the most bytes a tracelet takes: a word's.
const tletMax = 8

// tletBudget is the least budget at which the kernel takes a tracelet: a
// budget and MaxInsns of 2^17 or more pass every run's checks unread
// (a run taking its bits whole ends at its last bit: the budget after
// each is MaxInsns).
const tletBudget = 1 << 17

// recentTlets is the size of runCache.tlets, a cache of two ways: a set
// is two entries side by side, the last made first (of a warm mruby
// pass's lookups, 90% hit a direct-mapped cache of 2,048, 94% one of
// 4,096; two ways of 2,048 take 23.71 M instructions a pass against
// 24.13 M).
const (
	recentTletsLog = 11
	recentTlets    = 1 << recentTletsLog
)

// Tracelet room slab sizes: the first chunk's and the largest. Each chunk
// twice the last up to half tletRoomMax, so that the rooms' growth after
// the first passes finds room in the last chunk (mruby's: 12.6 k edges
// the first pass, 16.6 k the second, in chunks of 32 k by then): a warm
// decode allocates nothing.
const (
	tletSlabLo = 1 << 8
	tletSlab   = tletRoomMax / 2
)

// tnt8Count is how many of w's bytes, from the low one, are TNT.8 packets
// (even, 4 or more).
func tnt8Count(w uint64) int {
	const lo, six = 0x0101010101010101, 0x3f3f3f3f3f3f3f3f
	// A byte's bit 6 after the sum is set when its top six bits are not
	// all zero; no sum carries into the next byte.
	ge4 := (w>>2&six + six) >> 6
	ok := ^w & ge4 & lo
	return bits.TrailingZeros64(^ok&lo) / 8
}

// tletHash is a hash of block b and key: its top bits are the set in
// runCache.tlets of b's tracelet for key (tletSet), the whole its mark in
// runCache.tletSeen.
func tletHash(b *block, key uint64) uint64 {
	return (b.ip ^ key*0x9e3779b97f4a7c15) * 0x9e3779b97f4a7c15
}

// tletSet is the set of hash h: its entries in runCache.tlets are 2*set
// and 2*set+1.
func tletSet(h uint64) uint64 { return h >> (64 - recentTletsLog + 1) }

// tletFill makes the tracelet the kernel did not find: from block b, the
// TNT.8 bytes at buf[pos:] (2 or more), from the runs each byte's bits
// take, worked out here if new (tntRun). A drop of the block cache while
// it works them out leaves an entry that takes no byte (the kernel goes
// on byte by byte from the block it holds, as after a run's work-out).
// The slot's room is overwritten: the kernel exited and the batch was
// handed over before this (fastLoop), so no batch refers to it.
func (d *Decoder) tletFill(b *block, buf []byte, pos int) {
	w := word(buf, pos)
	m := tnt8Count(w)
	key := w & (^uint64(0) >> ((64 - 8*m) & 63))
	c := &d.cache.runs
	i := 2 * tletSet(tletHash(b, key))
	t := &c.tlets[i] // made by runCaches before the kernel ran
	// The new one first, the first one second with its room (the
	// second's is the new one's).
	c.tlets[i+1] = *t
	c.tletRoom[i], c.tletRoom[i+1] = c.tletRoom[i+1], c.tletRoom[i]
	drops := d.cache.drops
	var runs [tletMax]*tntRun
	*t = tlet{b: b, key: key}
	room := &c.tletRoom[i]
	most := tletEdges
	if c.tletRoomed >= tletRoomMax {
		most = cap(*room)
	}
	ne := 0
	s := b
	for j := range m {
		tb := buf[pos+j]
		nb := uint(tnt8Lens[tb])
		r := d.byteRun(s, tb)
		if d.cache.drops != drops {
			// The runs are gone with the cache: t was cleared.
			*t = tlet{b: b, key: key}
			return
		}
		if r == nil || uint(r.used) != nb || ne+len(r.edges) > most || int(t.nrets)+int(r.nrets) > tletRets {
			break
		}
		runs[j] = r
		t.m++
		ne += len(r.edges)
		for _, ret := range r.rets() {
			t.rets[t.nrets] = ret.From
			t.nrets++
		}
		t.insns += uint32(r.insns)
		t.end, t.errIP = r.end, r.errIP
		s = r.end
	}
	if ne == 0 {
		return
	}
	// Edge by edge: a run has few (copy's memmove call cost more).
	e := roomFor(room, ne, &c.tletSlab, &c.tletRoomed)
	k := 0
	for _, r := range runs[:t.m] {
		for _, x := range r.edges {
			e[k] = x
			k++
		}
	}
	t.e, t.ne = uintptr(unsafe.Pointer(&e[0])), uint16(ne)
}

// roomFor returns a slot's room for ne edges: *room, made larger from slab
// (by tletGrain, counted in roomed) when it is too small; the old room
// stays in its chunk: nothing refers to it past the batch handed over
// before a fill.
func roomFor(room *[]Edge, ne int, slab *slab[Edge], roomed *int) []Edge {
	if n := ne; cap(*room) < n {
		n = (n + tletGrain - 1) / tletGrain * tletGrain
		*room = slab.room(n, tletSlabLo, tletSlab)[:n:n]
		slab.used(n)
		*roomed += n
	}
	return (*room)[:ne]
}

// byteRun returns the run from block b with the bits of the TNT.8 byte tb,
// as the kernel finds it (most are among the recent ones), else from the
// block's list or worked out (tntRun: it may read memory, and so drop the
// block cache); nil when b starts no run (its last instruction is not a
// conditional branch or a direct jump or call).
func (d *Decoder) byteRun(b *block, tb byte) *tntRun {
	if cls := b.class; b.count() == 0 || cls != x86insn.CondJump && cls != x86insn.Jump && cls != x86insn.Call {
		return nil
	}
	nb := uint(tnt8Lens[tb])
	pat := uint8(1<<nb | tnt8Words[tb]>>((64-nb)&63))
	r := b.runs
	if r == nil || r.pat != pat {
		if ref := &d.cache.runs.recent[runHash(b, pat)]; ref.b == b && ref.r.pat == pat {
			r = ref.r
		} else {
			r = d.tntRun(b, pat, nb)
		}
	}
	return r
}
