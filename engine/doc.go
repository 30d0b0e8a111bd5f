// Package engine is the pure record engine: what becomes of probe data once
// the kernel handed it over. It makes no system calls, so all of it runs in
// tests without a kernel.
//
// Merger (merge.go) is the one merge by time of ptfs: per-queue FIFOs whose
// heads it takes in time order, held back to a watermark for live sources
// (perfio.Classic, PTW) or popped as they come for offline ones (`ptfs
// decode`).
//
// In ptw mode the kernel side and the engine meet at the TraceSource and
// TraceSink interfaces (trace.go): the kernel side (perfio.PT) passes each
// CPU's PT bytes, losses and side band; PTW assembles each CPU's probe
// records with a decode.Assembler, attributes them to threads from per-CPU
// timelines built from the side band, and passes them to a Sink merged
// across CPUs. Tests put enginetest.Replay where perfio.PT would be.
package engine
