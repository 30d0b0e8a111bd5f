package engine

import "ptfs/perfdata"

// Tee returns a TraceSource that runs src and passes everything it traces
// to the sink Start is given and then to also: one PT trace, two consumers
// (ptw records and the live branches of the same per-CPU events). also must
// take data only during each call, as any TraceSink.
func Tee(src TraceSource, also TraceSink) TraceSource { return &teeSource{src, also} }

type teeSource struct {
	TraceSource
	also TraceSink
}

// Start implements TraceSource.
func (t *teeSource) Start(sink TraceSink) error {
	return t.TraceSource.Start(teeSink{sink, t.also})
}

// teeSink passes each call to a, then b.
type teeSink struct{ a, b TraceSink }

func (t teeSink) TimeConv(cpu int, tc perfdata.TimeConv) {
	t.a.TimeConv(cpu, tc)
	t.b.TimeConv(cpu, tc)
}

func (t teeSink) Trace(cpu int, data []byte) {
	t.a.Trace(cpu, data)
	t.b.Trace(cpu, data)
}

func (t teeSink) Loss(cpu int, why LossKind, n uint64) {
	t.a.Loss(cpu, why, n)
	t.b.Loss(cpu, why, n)
}

func (t teeSink) Side(cpu int, ev *SideEvent) {
	t.a.Side(cpu, ev)
	t.b.Side(cpu, ev)
}

func (t teeSink) Round(flush bool) {
	t.a.Round(flush)
	t.b.Round(flush)
}
