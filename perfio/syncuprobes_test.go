package perfio

import (
	"bufio"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"ptfs/decode"
	"ptfs/internal/testkit"
)

// TestSyncUprobesStraddle replays the hit that a replacement at one site
// loses unless SyncUprobes separates the new event's enable from the old
// one's disable. The kernel runs the new event's handler first, here while
// that event is still disabled (nothing recorded); then the old event's,
// whose fetch of +0(%di) waits (testdata/stall.c: the page's first touch
// waits in userfaultfd until the program resolves it, saying "resolving"
// first) while the new event is enabled. SyncUprobes must return only once
// the hit is through, so that the old event, removed after it, records
// it. Without it the hit comes back to a disabled old event and neither
// event records it, and nothing counts it (seen here: one record, of the
// next hit, and no loss). The new event is opened before the hit and only
// enabled during it: opening takes the kernel's event_mutex, which a
// uprobe removal in another process (other test packages make them all
// the time) holds while it waits for the stalled hit, so an open then
// would wait until nothing straddles. A run in which the hit ended before
// the enable all the same (a test thread kept off the CPU) is retried.
func TestSyncUprobesStraddle(t *testing.T) {
	tfs := needKernel(t)
	bin := testkit.BuildC(t, "testdata/stall.c", "-pthread")
	off := testkit.FuncOffset(t, bin, "hot")
	for try := 1; ; try++ {
		if straddle(t, tfs, bin, off, try) {
			return
		}
		if try == 5 {
			testkit.Unavailable(t, "the stalled hit ended before the new event was enabled, %d times", try)
		}
		t.Logf("run %d: the stalled hit ended before the new event was enabled; again", try)
	}
}

// straddle runs one replacement around a waiting hit (the try-th) and
// tells whether the hit still waited when the new event was enabled.
func straddle(t *testing.T, tfs, bin string, off uint64, try int) bool {
	old := probe(t, tfs, bin, off, fmt.Sprint("straddle_old", try), "+0(%di):u64", decode.U64)
	nu := probe(t, tfs, bin, off, fmt.Sprint("straddle_new", try), "%di:u64", decode.U64)
	col := &collector{}
	c, err := NewClassic(ClassicOptions{}, col.sink)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Add(old); err != nil {
		t.Fatal(err)
	}
	// The new event's handler runs from now on, first, and disabled.
	c.mu.Lock()
	nce, err := c.openLocked(nu)
	c.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	prog := exec.Command(bin, "500")
	in, err := prog.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := prog.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := prog.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		prog.Process.Kill()
		prog.Wait()
	}()
	lines := make(chan string, 2)
	go func() {
		defer close(lines)
		for sc := bufio.NewScanner(out); sc.Scan(); {
			lines <- sc.Text()
		}
	}()
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if l := <-lines; l != "fault" {
		t.Fatalf("%s said %q, want fault", bin, l)
	}
	c.mu.Lock()
	err = c.enableLocked(nce)
	c.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lines:
		return false
	default:
	}
	start := time.Now()
	if err := SyncUprobes(); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-lines:
		if l != "resolving" {
			t.Fatalf("%s said %q, want resolving", bin, l)
		}
	default:
		t.Errorf("SyncUprobes returned after %v while a hit was still in its handlers", time.Since(start))
	}
	if err := c.Remove(old.ID); err != nil {
		t.Fatal(err)
	}
	if err := prog.Wait(); err != nil {
		t.Fatal(err)
	}
	// The waiting hit by the old event (its page came back zero), the
	// next one by the new event (and the old one, if it was not gone).
	recs := col.wait(2, 10*time.Second)
	if len(recs) < 2 || recs[0].Event != old || recs[0].Args[0] != 0 || recs[1].Event != nu {
		for _, r := range recs {
			t.Logf("record of %s: %#x", r.Event.Name, r.Args[0])
		}
		t.Errorf("the hit that waited through the replacement was not recorded once by the old event; %+v", c.Stats())
	}
	return true
}
