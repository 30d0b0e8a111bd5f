package decode

import "math/bits"

// ipCompression is the last-IP decompression rule of one IPBytes value of
// TIP/TIP.PGE/TIP.PGD/FUP (SDM, "IP Compression"). It is the only copy of
// the rule: the packet decoder (both loops), the assembler's fast path and
// ptdump's last-ip column all apply it, and the fast loop's per-opcode masks
// are built from it.
type ipCompression struct {
	// size is the number of payload bytes; -1 for the reserved values.
	size int8
	// keep is the last-IP bits the packet keeps. A suppressed IP keeps them
	// all: the packet leaves the last IP as it was.
	keep uint64
	// sext is all ones when the payload is sign-extended from bit 47.
	sext uint64
}

// ipCompressions is indexed by the IPBytes field (IPC*). The reserved
// values 5 and 7 are no IP packet at all: the decoder rejects them.
var ipCompressions = [8]ipCompression{
	IPCSuppressed: {size: 0, keep: ^uint64(0)},
	IPCUpdate16:   {size: 2, keep: ^uint64(0xffff)},
	IPCUpdate32:   {size: 4, keep: ^uint64(0xffffffff)},
	IPCSext48:     {size: 6, sext: ^uint64(0)},
	IPCUpdate48:   {size: 6, keep: ^uint64(0xffffffffffff)},
	5:             {size: -1},
	IPCFull:       {size: 8},
	7:             {size: -1},
}

// apply returns the IP of a packet with this compression and payload (the
// IP bytes as they appear in the packet) after last. Branch-free, by masks:
// the compression varies from packet to packet and a switch on it
// mispredicts.
func (c *ipCompression) apply(last, payload uint64) uint64 {
	v := payload | last&c.keep
	return v&^c.sext | uint64(int64(v<<16)>>16)&c.sext
}

// unknownDigits is how many of an IP's 16 hex digits the packet alone does
// not give (they come from the last IP): ptdump prints them as '?'.
func (c *ipCompression) unknownDigits() int {
	return bits.OnesCount64(c.keep) / 4
}
