package flow

import (
	"math/bits"
	"unsafe"

	"ptfs/decode"
	"ptfs/x86insn"
)

// A packet window is the tracelet generalised across TIPs: where the
// kernel has nothing pending at block b, the next 16 trace bytes (two
// words, the key) hold packets the flow takes the same way every time:
// TNT.8, TIP (with an IP) and PAD, those that fit whole in the 16 bytes.
// What the flow does from b through them is a function of b, the bytes,
// the last IP's bits the first TIP keeps and, for the MaxInsns checks,
// the budget: its edges (one batch entry), the return addresses it pushes,
// the block and last IP it ends at, its counts. A window is worked out once
// (wndFill) and replayed by the kernel with one lookup where it would read,
// dispatch and take each packet, its runs, steps and lookups (a warm mruby
// pass takes about 25 k windows of 9 to 11 bytes on average).

// wndKey is a kept window's key: its block, the 16 bytes at its start and
// the last IP's bits its first TIP keeps (lastTag).
type wndKey struct {
	b      *block
	w0, w1 uint64
	last   uint64
}

// wndKeys is a set's two keys, the last made first: one cache line (the
// table is page-aligned), which is all a miss reads.
type wndKeys [2]wndKey

// wnd is a packet window kept (runCache.wnds, by the slot of its key):
// what the kernel replays, one cache line.
type wnd struct {
	end   *block
	errIP uint64
	// lastOut is the last IP after the window when it takes a TIP
	// (wndTIP), else zero.
	lastOut uint64
	// e is the first of the ne edges, in the slot's room (as tlet.e).
	e uintptr
	// sinceRef is the TRIG count after the window: alone when it takes
	// a TNT bit (wndBit), else added to the count before it.
	insns, sinceRef uint32
	ne              uint16
	// m is the bytes the window takes (its packets, from its start); 0:
	// none, the kernel reads them one by one.
	m, nrets uint8
	flags    uint8
	_        [3]byte
	rets     [wndRets]uint64
}

// wnd.flags.
const (
	wndBit = 1 << iota // it takes a TNT bit: sinceRef restarts
	wndTIP             // it takes a TIP: lastOut is the last IP
)

// lastTag is the key's part for the last IP's bits mask keeps (a TIP's
// compression keeps the bits from sh up): those bits shifted down, sh in
// the top byte (64, none, for a window whose first TIP keeps none or that
// takes no TIP).
func lastTag(mask, last uint64) uint64 {
	sh := uint64(bits.TrailingZeros64(mask))
	return last&mask>>(sh&63)&(1<<56-1) | sh<<56
}

// lastMatch tells whether last has the bits tag keeps.
func lastMatch(tag, last uint64) bool { return last>>(tag>>56) == tag&(1<<56-1) }

// edges returns w's edges as a batch entry.
func (w *wnd) edges() edgeRef {
	n := int(w.ne)
	return edgeRef{w.e, n, n}
}

// wndWarm is the trace a decoder's fast path takes before its kernel
// looks windows up, over a closed decoder's memory too: a window pays for
// its fill and its cache lines (its edges are a copy of its runs' and
// branches') when it comes back many times, which a decoder that takes one
// trace once does not see (a cold mruby pass, 713 KB, ran at 0.8-0.9 times
// the speed with windows from its first byte, for 9% fewer instructions,
// and at 0.79-0.94 with their tables and rooms handed on by Close, no fresh
// memory: its lookups and fills miss the caches; DESIGN §7's fifteenth pass
// and cold windows).
const wndWarm = 1 << 20

// wndLen is a window's bytes: two words.
const wndLen = 16

// wndRets bounds the return addresses a window pushes.
const wndRets = 2

// wndEdges bounds a window's edges (its slot's room).
const wndEdges = 48

// wndJumps bounds the direct jumps and calls a window goes through without
// a bit or a TIP taken: with maxBlock instructions a block, the counts
// between the budget's resets stay far below tletBudget, so that a window
// is taken only with a budget that passes every MaxInsns check unread.
const wndJumps = runJumps

// wndRoomMax bounds the edges the windows' rooms take (as tletRoomMax):
// past it a window takes the packets its slot's room has room for. 128 k
// edges (3 MiB): warm mruby's rooms in 16,384 windows reach 122 k by its
// fortieth pass (64 k cut its windows short: DESIGN §7's sixteenth pass).
const wndRoomMax = 1 << 17

// recentWnds is the size of runCache.wnds, a cache of two ways (as
// tlets): a set's keys are runCache.wndKeys[set], its windows wnds[2*set]
// and wnds[2*set+1]. 16,384 (1.94 MiB of tables): warm mruby keeps 7 k
// windows, which a table of 4,096 thrashed (DESIGN §7's sixteenth and
// seventeenth passes).
const (
	recentWndsLog = 14
	recentWnds    = 1 << recentWndsLog
)

// wndHash is a hash of block b and the key w0, w1: its top bits are the
// set in runCache.wnds (wndSet), the whole its mark in runCache.wndSeen.
func wndHash(b *block, w0, w1 uint64) uint64 {
	return (b.ip ^ w0*0x9e3779b97f4a7c15 ^ w1*0xc2b2ae3d27d4eb4f) * 0x9e3779b97f4a7c15
}

// wndSet is the set of hash h: its entries in runCache.wnds are 2*set and
// 2*set+1.
func wndSet(h uint64) uint64 { return h >> (64 - recentWndsLog + 1) }

// wndMark is a window's fill's state: what the window keeps if it ends
// after the last packet it took whole (at done, with the flow at end).
type wndMark struct {
	end              *block
	pos, done        int
	errIP, last      uint64
	insns, sinceRef  uint32
	ne, nrets        int
	lastMask, lastIn uint64
	// bit: a TNT bit taken (sinceRef restarted); tipped: a TIP read
	// (lastMask and lastIn are the first's; a window kept after one
	// took it, and its last IP is last).
	bit, tipped bool
}

// wndFill makes the window the kernel did not find: from block b, with
// nothing pending, the packets at buf[pos:pos+16] and the last IP last,
// worked out as the kernel takes them, step by step. It stops before what
// is not plain (a compressed return, which pops the stack; an indirect
// branch with bits pending; a conditional branch with a TIP pending; a
// block that is no branch; more than wndJumps blocks without a bit or a
// TIP; the bounds) and keeps the window up to the last packet taken whole;
// a drop of the block cache while it looks blocks up keeps an entry that
// takes nothing. The slot's room is overwritten: the kernel exited and
// the batch went before this (fastLoop), so no batch refers to it.
func (d *Decoder) wndFill(b *block, buf []byte, pos int, last uint64) {
	w0, w1 := word(buf, pos), word(buf, pos+8)
	rc := &d.cache.runs
	set := wndSet(wndHash(b, w0, w1))
	i := 2 * set
	ks, t := &rc.wndKeys[set], &rc.wnds[i] // made by runCaches before the kernel ran
	// The new one first, the first one second with its room; until it
	// is worked out, it takes nothing (for any last IP).
	ks[1], rc.wnds[i+1] = ks[0], *t
	rc.wndRoom[i], rc.wndRoom[i+1] = rc.wndRoom[i+1], rc.wndRoom[i]
	ks[0], *t = wndKey{b, w0, w1, lastTag(0, 0)}, wnd{}
	if d.fp.noWnd {
		return
	}
	room := &rc.wndRoom[i]
	most := wndEdges
	if rc.wndRoomed >= wndRoomMax {
		most = cap(*room)
	}
	drops := d.cache.drops
	tmp := &rc.wtmp
	var (
		rets [wndRets]uint64
		mk   wndMark // before the TIP pending
		cur  = wndMark{end: b, pos: pos, done: pos, last: last}
		tip  bool // a TIP pending, at cur.last
		open bool // a TIP read and not yet taken (mk: before it)
		jmps int
	)
	lim := pos + wndLen
	s := b
	for {
		if !tip {
			p := cur.pos
			if p >= lim {
				break
			}
			c := buf[p]
			op := onOps[c]
			if op == opPad {
				cur.pos++
				continue
			}
			if op == opTNT8 {
				// The byte's bits through the run they take, whole
				// (a run stopped before a return or an indirect
				// branch ends the window before the byte).
				r := d.byteRun(s, c)
				if d.cache.drops != drops {
					// The runs are gone with the cache: the set
					// was cleared.
					ks[0], *t = wndKey{b, w0, w1, lastTag(0, 0)}, wnd{}
					return
				}
				if r == nil || uint(r.used) != uint(tnt8Lens[c]) || cur.ne+len(r.edges) > most || cur.nrets+int(r.nrets) > wndRets {
					break
				}
				// Edge by edge: a run has few (copy's memmove
				// call cost more).
				for _, x := range r.edges {
					tmp[cur.ne] = x
					cur.ne++
				}
				for _, ret := range r.rets() {
					rets[cur.nrets] = ret.From
					cur.nrets++
				}
				cur.insns += uint32(r.insns)
				cur.errIP, cur.sinceRef, cur.bit = r.errIP, 0, true
				// Taken whole: the window may end here (PADs
				// after it are the next one's).
				s, cur.pos, cur.done, cur.end = r.end, p+1, p+1, r.end
				continue
			}
			if op != opTIP {
				break
			}
			n := 1 + decode.IPSize(c)
			if p+n > lim {
				break
			}
			// The IP's bytes are within the window; the word
			// holding them may end past the trace.
			var x uint64
			if q := len(buf) - 8; p+1 <= q {
				x = word(buf, p+1)
			} else {
				x = word(buf, q) >> (8 * (p + 1 - q))
			}
			ip := decode.ApplyIP(c, x, cur.last)
			mk, open = cur, true
			if !cur.tipped {
				// The first TIP: the bits it keeps of the last IP
				// are the window's input.
				mask := decode.ApplyIP(c, 0, ^uint64(0)) ^ decode.ApplyIP(c, 0, 0)
				cur.lastMask, cur.lastIn, cur.tipped = mask, cur.last&mask, true
			}
			cur.last, cur.pos, tip = ip, p+n, true
			continue
		}
		n := s.count() - 1
		if n < 0 {
			break
		}
		from := s.ip + uint64(s.lastOff)
		next := from + uint64(s.lastLen)
		var to uint64
		var p **block
		var kind BranchKind
		switch s.class {
		case x86insn.Jump, x86insn.Call:
			// Taken on the way to the branch that takes the TIP,
			// counted for a TRIG.
			if jmps++; jmps > wndJumps {
				goto done
			}
			cur.sinceRef++
			to, p, kind = s.target, &s.taken, BrJump
			if s.class == x86insn.Call {
				kind = BrCall
				if to != next {
					if cur.nrets == wndRets {
						goto done
					}
					rets[cur.nrets] = next
					cur.nrets++
				}
			}
		case x86insn.Ret:
			to, tip, kind, jmps = cur.last, false, BrReturn, 0
		case x86insn.IndirectJump, x86insn.IndirectCall:
			to, tip, kind, jmps = cur.last, false, BrIndirectJump, 0
			if s.class == x86insn.IndirectCall {
				kind = BrIndirectCall
				if cur.nrets == wndRets {
					goto done
				}
				rets[cur.nrets] = next
				cur.nrets++
			}
		default:
			goto done
		}
		if cur.ne == most {
			goto done
		}
		tmp[cur.ne] = Edge{from, to, kind}
		cur.ne++
		cur.insns += uint32(n + 1)
		cur.errIP = from
		if p != nil {
			s = d.fixedSucc(p, to)
		} else {
			s = d.ipBlock(to)
		}
		if d.cache.drops != drops {
			// The blocks are gone with the cache: the set was
			// cleared.
			ks[0], *t = wndKey{b, w0, w1, lastTag(0, 0)}, wnd{}
			return
		}
		if !tip {
			// The TIP taken: the window may end here.
			cur.done, cur.end, open = cur.pos, s, false
		}
	}
done:
	fin := &cur
	if open {
		fin = &mk
	}
	if fin.done <= pos {
		return
	}
	t.end, t.errIP, t.insns, t.sinceRef = fin.end, fin.errIP, fin.insns, fin.sinceRef
	ks[0].last = lastTag(fin.lastMask, fin.lastIn)
	if fin.tipped {
		t.lastOut, t.flags = fin.last, wndTIP
	}
	if fin.bit {
		t.flags |= wndBit
	}
	t.nrets = uint8(fin.nrets)
	copy(t.rets[:], rets[:fin.nrets])
	t.m = uint8(fin.done - pos)
	ne := fin.ne
	if ne == 0 {
		return
	}
	e := roomFor(room, ne, &rc.wndSlab, &rc.wndRoomed)
	for i := range e {
		e[i] = tmp[i]
	}
	t.e, t.ne = uintptr(unsafe.Pointer(&e[0])), uint16(ne)
}
