// Package flow reconstructs the control flow of an Intel PT trace: it walks
// the traced code's instructions (x86insn) from IP to IP, taking the
// direction of conditional branches from TNT bits, the targets of indirect
// branches from TIPs, and events (enable, disable, interrupts, overflow,
// mode changes, PTWRITE) from the packets decode's PacketDecoder returns. It
// follows libipt's instruction flow decoder, which its tests hold it to
// (ptfs decode --insns prints what libipt's ptxed prints). It is pure: no
// syscalls; the code comes from a Memory.
package flow
