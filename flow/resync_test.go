package flow

import (
	"fmt"
	"strings"
	"testing"

	"ptfs/decode/ptenc"
)

// TestResyncLookahead: an error while an event is read in part is
// reported, as libipt's event decoder does, at the offset of the packet
// that completes the event (its lookahead: the TIP after a FUP, PSBEND),
// and ResyncOnError goes on with the event: the interrupt's target, the
// status's IP.
func TestResyncLookahead(t *testing.T) {
	// 1000: jmp 2000 (no code there); 1005: nop; 1006: nop. The trace
	// ends with an asynchronous disable before 1006.
	mem := &blob{base: 0x1000, code: []byte{0xe9, 0xfb, 0x0f, 0, 0, 0x90, 0x90}}
	for _, tc := range []struct {
		name  string
		trace func(e *ptenc.Encoder) (look int)
		want  string
	}{{
		name: "FUP + TIP",
		trace: func(e *ptenc.Encoder) int {
			e.IP(ptenc.FUP, 0x3000)
			look := e.Len()
			e.IP(ptenc.TIP, 0x1005)
			return look
		},
		want: fmt.Sprintf("ev%d 1005 ev%d", EvInterrupt, EvAsyncDisabled),
	}, {
		name: "PSB+",
		trace: func(e *ptenc.Encoder) int {
			e.PSB()
			e.IP(ptenc.FUP, 0x1005)
			e.ModeExec(true, false)
			look := e.Len()
			e.PSBEnd()
			return look
		},
		want: fmt.Sprintf("1005 ev%d", EvAsyncDisabled),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := ptenc.New()
			start(e, 0x1000)
			look := tc.trace(e)
			// Tracing stops before 1006.
			e.IP(ptenc.FUP, 0x1006)
			e.IPC(ptenc.TIPPGD, 0, 0)
			for _, resync := range []bool{false, true} {
				var r recorder
				New(mem, Options{ResyncOnError: resync}).Decode(e.Bytes(), &r)
				if len(r.lines) < 2 || r.lines[0] != "1000" || !strings.HasPrefix(r.lines[1], fmt.Sprintf("error %x 2000: ", look)) {
					t.Fatalf("resync %v: %q, want 1000 and the error at 0x%x", resync, r.lines, look)
				}
				got := strings.Join(r.lines[2:], " ")
				if !resync && got != "" {
					t.Errorf("without resync: %q after the error", got)
				}
				if resync && got != tc.want {
					t.Errorf("resync: %q after the error, want %q", got, tc.want)
				}
			}
		})
	}
}
