// Package capture reads probe data from the kernel through perf mmap rings.
//
// Classic is the record source of classic uprobes: one tracepoint perf
// event per uprobe event and CPU, all events of a CPU writing into one ring,
// samples parsed into decode.Record and merged across CPUs in time order.
// Ring (ring.go) is the generic reader of the perf ring protocol
// (data_head/data_tail), independent of what the records carry.
package capture
