package engine

// maxComms bounds the processes a Comms remembers: past it the cache starts
// over (names are looked up again), so that a mount that lives through
// millions of short processes whose exits went unseen stays bounded.
const maxComms = 1 << 16

// Comms caches the name (comm) of each process that hit a probe, so that a
// record costs a map lookup at most, and none for a run of records of one
// process. Set takes the kernel's word (a COMM record: exec or a rename of
// the main thread); a process not seen yet is asked of Lookup once. Exit
// forgets a process, whose pid may come back as another. Not safe for
// concurrent use: each source keeps one under its own lock.
type Comms struct {
	lookup func(pid int32) string
	m      map[int32]string
	// The last pid asked and its name: records come in runs.
	lastPID  int32
	lastComm string
}

// NewComms returns an empty cache that asks lookup for the name of a
// process it has not seen (perfio.ProcComm reads /proc/PID/comm); lookup
// returns "" when it cannot tell, and may be nil.
func NewComms(lookup func(pid int32) string) *Comms {
	return &Comms{lookup: lookup, m: map[int32]string{}}
}

// Get returns the name of process pid, "" when unknown. A pid of 0 or
// below is unknown.
func (c *Comms) Get(pid int32) string {
	if comm, ok := c.Cached(pid); ok {
		return comm
	}
	var comm string
	if c.lookup != nil {
		comm = c.lookup(pid)
	}
	// An unknown name is remembered too: the process is gone, or its
	// name unreadable, and will not become readable by asking at every
	// record.
	c.store(pid, comm)
	c.lastPID, c.lastComm = pid, comm
	return comm
}

// Cached returns the name of process pid and true when the cache holds it
// (or its absence) or pid is 0 or below (unknown), without asking lookup:
// false leaves the caller to decide whether Get may ask (perfio.Classic).
func (c *Comms) Cached(pid int32) (string, bool) {
	if pid <= 0 {
		return "", true
	}
	// The last process asked for first: hits come in runs of one
	// process, and this is asked for each.
	if pid == c.lastPID {
		return c.lastComm, true
	}
	comm, ok := c.m[pid]
	if ok {
		c.lastPID, c.lastComm = pid, comm
	}
	return comm, ok
}

// Set records that process pid is now named comm (the kernel said so).
func (c *Comms) Set(pid int32, comm string) {
	if pid <= 0 {
		return
	}
	c.store(pid, comm)
	if pid == c.lastPID {
		c.lastComm = comm
	}
}

// Exit forgets process pid.
func (c *Comms) Exit(pid int32) {
	delete(c.m, pid)
	if pid == c.lastPID {
		c.lastPID, c.lastComm = 0, ""
	}
}

// Reset forgets every process: names are looked up again (after lost
// COMM or EXIT records).
func (c *Comms) Reset() {
	clear(c.m)
	c.lastPID, c.lastComm = 0, ""
}

// Len returns how many processes the cache holds.
func (c *Comms) Len() int { return len(c.m) }

func (c *Comms) store(pid int32, comm string) {
	if _, ok := c.m[pid]; !ok && len(c.m) >= maxComms {
		clear(c.m)
	}
	c.m[pid] = comm
}
