// Package decode turns Intel Processor Trace bytes into packets, probe
// records and text. It is pure: no syscalls, no I/O beyond the byte slices
// and the fs.FS (of tracefs event descriptions) it is given, so it can be
// fuzzed and tested without a kernel.
package decode
