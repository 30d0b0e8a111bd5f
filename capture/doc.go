// Package capture reads probe data from the kernel through perf mmap rings.
//
// Classic is the record source of classic uprobes: one tracepoint perf
// event per uprobe event and CPU, all events of a CPU writing into one ring,
// samples parsed into decode.Record and merged across CPUs in time order.
//
// In ptw mode two halves meet at the TraceSource/TraceSink interfaces
// (trace.go): PT is the kernel side, one intel_pt event per CPU whose AUX
// ring it passes on in place, with the side band and the losses of its data
// ring; PTW is the record engine, one decode.Assembler per CPU, thread ids
// from the side band, records merged across CPUs in time order. Tests put
// capturetest.Replay where PT would be.
//
// Ring (ring.go) is the generic reader of the perf ring protocol
// (data_head/data_tail), independent of what the records carry.
package capture
