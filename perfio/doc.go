// Package perfio is ptfs's kernel I/O for probe data: perf_event_open and
// the intel_pt attributes, the perf ring protocol, AUX rings and side band,
// classic tracepoint samples, the CPU lists, and the one reader loop
// (poller) that sleeps on the rings until data or a request arrives.
//
// Classic is the record source of classic uprobes: one tracepoint perf
// event per uprobe event and CPU, all events of a CPU writing into one ring,
// samples parsed into decode.Record and merged across CPUs by the engine's
// Merger.
//
// PT is the engine.TraceSource of the kernel in ptw mode: one intel_pt event
// per CPU whose AUX ring it passes on in place to an engine.TraceSink, with
// the side band and the losses of its data ring.
//
// Ring (ring.go) is the generic reader of the perf ring protocol
// (data_head/data_tail), independent of what the records carry.
package perfio
