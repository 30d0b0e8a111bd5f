// Package decode turns Intel Processor Trace bytes into packets, probe
// records and text. It is pure: no syscalls, no I/O beyond the byte slices it
// is given, so it can be fuzzed and tested without a kernel.
package decode
