package engine

import "testing"

// TestCommsCached: Cached answers from the cache alone, and Get asks the
// lookup once per process it has not seen.
func TestCommsCached(t *testing.T) {
	asked := 0
	c := NewComms(func(pid int32) string {
		asked++
		if pid == 5 {
			return "five"
		}
		return ""
	})
	check := func(step string, pid int32, want string, wantOK bool) {
		t.Helper()
		if got, ok := c.Cached(pid); got != want || ok != wantOK {
			t.Errorf("%s: Cached(%d) = %q, %v; want %q, %v", step, pid, got, ok, want, wantOK)
		}
	}
	check("pid 0", 0, "", true)
	check("pid -1", -1, "", true)
	check("not seen", 5, "", false)
	if got := c.Get(5); got != "five" {
		t.Errorf("Get(5) = %q", got)
	}
	check("after Get", 5, "five", true)
	c.Set(6, "six")
	check("set", 6, "six", true)
	check("in the map, not the last", 5, "five", true)
	check("the last again", 5, "five", true)
	c.Get(7) // gone: its absence is remembered
	check("absent", 7, "", true)
	c.Exit(5)
	check("exited", 5, "", false)
	c.Set(5, "renamed")
	check("named again", 5, "renamed", true)
	c.Reset()
	check("reset", 6, "", false)
	if asked != 2 {
		t.Errorf("lookup asked %d times, want 2 (pids 5 and 7)", asked)
	}
}
