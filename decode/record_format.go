package decode

import (
	"math/bits"
	"slices"
	"strconv"
)

// Arg describes one argument of a probe event.
type Arg struct {
	// Name is the name the spec gave, or "" when it gave none; unnamed
	// arguments print as bare values.
	Name string
	Type ArgType
	// Bits, when its Width is set, is a bitfield that the formatter cuts
	// out of the value first: ptw payloads carry the whole container,
	// where a classic sample holds what the kernel already cut out.
	Bits Bitfield
	// Offset and Size locate the argument in a classic tracepoint sample's
	// raw data, as the event's format file gives them. Unused in ptw mode.
	Offset, Size int
}

// Event describes one probe event: its tracefs id and name and its arguments.
type Event struct {
	ID    uint16
	Group string
	Name  string
	Args  []Arg
	// Filter limits the records of the event to some processes (the
	// spec's %pid and %comm); the zero value takes every record.
	Filter Filter
}

// Filter selects records by process. A zero field matches everything.
type Filter struct {
	// PID is the process id (tgid) to keep; 0 keeps every process.
	PID int32
	// Comm is the process name to keep, as the kernel keeps it (at most
	// 15 bytes); "" keeps every name.
	Comm string
}

// Active tells whether f drops anything.
func (f *Filter) Active() bool { return f.PID != 0 || f.Comm != "" }

// Match tells whether a record of process pid named comm passes f. A
// record whose process or name is unknown (0, "") fails a filter on it:
// keeping it would show a record the filter may exclude.
func (f *Filter) Match(pid int32, comm string) bool {
	return (f.PID == 0 || f.PID == pid) && (f.Comm == "" || f.Comm == comm)
}

// Record is one assembled probe hit.
type Record struct {
	Event *Event
	// N is the number of valid words in Args.
	N    int
	Args [8]uint64
	// Data holds the bytes of string arguments (classic mode): such an
	// argument's word is StringRef's. The storage is the record's own and
	// is reused with it; a pointer, so that records stay comparable.
	Data *[]byte
	// Context of the hit; negative TID or CPU and zero Time mean unknown.
	TID  int32
	CPU  int32
	Time uint64 // nanoseconds
	// PID is the process (tgid) of the hit and Comm its name; 0 and ""
	// mean unknown (pid 0 is the idle task, which runs no user code).
	// Comm is a cached string: setting it copies no bytes.
	PID  int32
	Comm string
}

// Counters are the summary counters of DESIGN §5.
type Counters struct {
	Records uint64 // records printed
	Dropped uint64 // argument words lost mid-record
	Stray   uint64 // payloads outside a record, or headers of unknown events
	Unknown uint64 // words that match no argument slot
	Errors  uint64 // decoder errors and lost trace
}

// Add adds o to c.
func (c *Counters) Add(o *Counters) {
	c.Records += o.Records
	c.Dropped += o.Dropped
	c.Stray += o.Stray
	c.Unknown += o.Unknown
	c.Errors += o.Errors
}

// AppendRecord appends the text line of record number seq (counted from 1),
// with its trailing newline, in the format of DESIGN §5:
//
//	record N: event=GRP/EVENT id=0xID args=[A, name=B] tid=T cpu=C time=SEC.NSEC pid=P comm=NAME
//
// Only known context is printed: no tid= for a negative TID (ptw mode: the
// side band did not say which thread ran), no cpu= for a negative CPU, no
// time= for Time 0 (no TSC conversion), no pid= for PID 0, no comm= for an
// empty Comm: never a guessed value. pid= and comm= come last so that the
// older fields keep their places; comm is last because a process names
// itself (AppendComm escapes what could split the line or the field).
func AppendRecord(dst []byte, seq uint64, r *Record) []byte {
	dst = append(dst, "record "...)
	dst = appendDec(dst, seq)
	dst = append(dst, ": "...)
	dst = appendEventHead(dst, r.Event)
	dst = appendArgs(dst, r)
	dst = appendThread(dst, r.TID, r.CPU)
	if r.Time != 0 {
		dst = append(dst, " time="...)
		dst = AppendTime(dst, r.Time)
	}
	dst = appendProcess(dst, r.PID, r.Comm)
	return append(dst, '\n')
}

// RecordWriter appends the lines of AppendRecord, byte for byte, keeping
// the text of what repeats from line to line: the record number (the
// next one is the last one's text counted up), the event (name and id),
// the thread (tid= and cpu=), the time's seconds and the process (pid=
// and comm=). Records come in runs of one event, thread and process, whose
// fields then cost a copy. The zero value is ready to use. Like a Record,
// it points to the Event, which must not change (no source changes one
// once it is added).
type RecordWriter struct {
	seq    uint64
	seqTxt []byte // "record N: " of seq, when set
	ev     *Event
	head   []byte // appendEventHead of ev
	tid    int32
	cpu    int32
	thread []byte // appendThread of tid and cpu, when set
	sec    uint64
	secTxt []byte // " time=SEC." of sec, when set
	pid    int32
	comm   string
	proc   []byte // appendProcess of pid and comm
}

// Append appends the line of record number seq, as AppendRecord does.
func (w *RecordWriter) Append(dst []byte, seq uint64, r *Record) []byte {
	if seq == w.seq+1 && w.seqTxt != nil && incDec(w.seqTxt[len("record "):len(w.seqTxt)-len(": ")]) {
		w.seq = seq
	} else if seq != w.seq || w.seqTxt == nil {
		w.seq = seq
		w.seqTxt = append(appendDec(append(w.seqTxt[:0], "record "...), seq), ": "...)
	}
	dst = append(dst, w.seqTxt...)
	if r.Event != w.ev {
		w.ev, w.head = r.Event, appendEventHead(w.head[:0], r.Event)
	}
	dst = append(dst, w.head...)
	dst = appendArgs(dst, r)
	if r.TID != w.tid || r.CPU != w.cpu || w.thread == nil {
		w.tid, w.cpu, w.thread = r.TID, r.CPU, appendThread(w.thread[:0], r.TID, r.CPU)
	}
	dst = append(dst, w.thread...)
	if r.Time != 0 {
		if sec := r.Time / 1e9; sec != w.sec || w.secTxt == nil {
			w.sec = sec
			w.secTxt = append(appendDec(append(w.secTxt[:0], " time="...), sec), '.')
		}
		dst = append(dst, w.secTxt...)
		dst = appendFrac9(dst, uint32(r.Time%1e9))
	}
	if r.PID != w.pid || r.Comm != w.comm {
		w.pid, w.comm, w.proc = r.PID, r.Comm, appendProcess(w.proc[:0], r.PID, r.Comm)
	}
	dst = append(dst, w.proc...)
	return append(dst, '\n')
}

// incDec adds one to the decimal number in b, in place, and reports
// false, leaving b changed, when it carries out of b (999 + 1 needs
// another digit).
func incDec(b []byte) bool {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] != '9' {
			b[i]++
			return true
		}
		b[i] = '0'
	}
	return false
}

// appendEventHead appends "event=GRP/EVENT id=0xID".
func appendEventHead(dst []byte, ev *Event) []byte {
	dst = append(dst, "event="...)
	dst = append(dst, ev.Group...)
	dst = append(dst, '/')
	dst = append(dst, ev.Name...)
	dst = append(dst, " id=0x"...)
	return appendHex(dst, uint64(ev.ID), 0)
}

// appendArgs appends " args=[...]".
func appendArgs(dst []byte, r *Record) []byte {
	dst = append(dst, " args=["...)
	for i := 0; i < r.N; i++ {
		if i > 0 {
			dst = append(dst, ", "...)
		}
		t, v := U64, r.Args[i]
		if i < len(r.Event.Args) {
			a := &r.Event.Args[i]
			if a.Name != "" {
				dst = append(dst, a.Name...)
				dst = append(dst, '=')
			}
			if a.Type == U64 && a.Bits == (Bitfield{}) {
				// The common whole u64: no type dispatch.
				dst = appendDec(dst, v)
				continue
			}
			t, v = a.Type, a.Bits.Extract(v)
		}
		if t.IsString() {
			var data []byte
			if r.Data != nil {
				data = *r.Data
			}
			dst = appendString(dst, data, v)
			continue
		}
		dst = AppendValue(dst, t, v)
	}
	return append(dst, ']')
}

// appendThread appends the known " tid=T" and " cpu=C".
func appendThread(dst []byte, tid, cpu int32) []byte {
	if tid >= 0 {
		dst = append(dst, " tid="...)
		dst = appendDec(dst, uint64(tid))
	}
	if cpu >= 0 {
		dst = append(dst, " cpu="...)
		dst = appendDec(dst, uint64(cpu))
	}
	return dst
}

// appendProcess appends the known " pid=P" and " comm=NAME".
func appendProcess(dst []byte, pid int32, comm string) []byte {
	if pid > 0 {
		dst = append(dst, " pid="...)
		dst = appendDec(dst, uint64(pid))
	}
	if comm != "" {
		dst = append(dst, " comm="...)
		dst = AppendComm(dst, comm)
	}
	return dst
}

// AppendComm appends a process name as one field: any process can name
// itself anything but NUL (prctl PR_SET_NAME), so bytes outside the
// printable ASCII range, space and backslash are written as \xHH.
func AppendComm(dst []byte, comm string) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(comm); i++ {
		c := comm[i]
		if c > ' ' && c < 0x7f && c != '\\' {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '\\', 'x', hex[c>>4], hex[c&0xf])
	}
	return dst
}

// AppendValue appends v printed as type t, as the kernel's print format
// for t does: unsigned types in decimal, signed ones with their sign, hex
// ones as 0x-prefixed hex, each from the low bytes of its size; char
// quoted ('A', escaped as strings are). A string type prints nothing here:
// its bytes are the record's (AppendRecord).
func AppendValue(dst []byte, t ArgType, v uint64) []byte {
	info := t.info()
	shift := 64 - 8*uint(info.size)
	switch {
	case info.hex:
		dst = append(dst, "0x"...)
		return appendHex(dst, v<<shift>>shift, 0)
	case info.signed:
		if n := int64(v<<shift) >> shift; n < 0 {
			return appendDec(append(dst, '-'), uint64(-n))
		}
		return appendDec(dst, v<<shift>>shift)
	case t == Char:
		dst = append(dst, '\'')
		dst = appendEscaped(dst, byte(v), '\'')
		return append(dst, '\'')
	case info.str:
		return dst
	}
	return appendDec(dst, v<<shift>>shift)
}

// AppendTime appends a nanosecond time as SEC.NSEC with nine fraction digits.
func AppendTime(dst []byte, ns uint64) []byte {
	dst = appendDec(dst, ns/1e9)
	dst = append(dst, '.')
	return appendFrac9(dst, uint32(ns%1e9))
}

// appendFrac9 appends f (< 1e9) as nine digits, zero-padded.
func appendFrac9(dst []byte, f uint32) []byte {
	dst = append(dst, byte('0'+f/1e8), 0, 0, 0, 0, 0, 0, 0, 0)
	put8(dst[len(dst)-8:], f%1e8)
	return dst
}

// AppendManual appends a manual ptwrite line. ip is printed only when hasIP.
func AppendManual(dst []byte, payload, ip uint64, hasIP bool) []byte {
	dst = append(dst, "manual ptwrite: payload=0x"...)
	dst = appendHex(dst, payload, 0)
	if hasIP {
		dst = append(dst, " ip=0x"...)
		dst = appendHex(dst, ip, 0)
	}
	return append(dst, '\n')
}

// AppendSummary appends the summary line of DESIGN §5.
func AppendSummary(dst []byte, c *Counters) []byte {
	dst = append(dst, "summary: records="...)
	dst = strconv.AppendUint(dst, c.Records, 10)
	dst = append(dst, " dropped="...)
	dst = strconv.AppendUint(dst, c.Dropped, 10)
	dst = append(dst, " stray="...)
	dst = strconv.AppendUint(dst, c.Stray, 10)
	dst = append(dst, " unknown="...)
	dst = strconv.AppendUint(dst, c.Unknown, 10)
	dst = append(dst, " errors="...)
	dst = strconv.AppendUint(dst, c.Errors, 10)
	return append(dst, '\n')
}

// digits2 holds "00" to "99": two digits per division.
const digits2 = "00010203040506070809" +
	"10111213141516171819" +
	"20212223242526272829" +
	"30313233343536373839" +
	"40414243444546474849" +
	"50515253545556575859" +
	"60616263646566676869" +
	"70717273747576777879" +
	"80818283848586878889" +
	"90919293949596979899"

// appendDec appends v in decimal. It writes the digits in place, where
// strconv formats into a scratch buffer and copies it: on the record path
// the copies cost more than the digits. Eight digits at a time are split
// off with one 64-bit division and written two per step with 32-bit
// arithmetic, which is cheaper than 64-bit steps for long (19-digit) values.
func appendDec(dst []byte, v uint64) []byte {
	// Digits from the bit length (1233/4096 ≈ log10 2), off by one at
	// most.
	n := bits.Len64(v)*1233>>12 + 1
	// Without a branch: for random values the digit count is a coin toss
	// (19 or 20) that the branch predictor loses.
	_, borrow := bits.Sub64(v, pow10[n-1], 0)
	n -= int(borrow)
	l := len(dst)
	if cap(dst)-l < n {
		dst = slices.Grow(dst, n)
	}
	dst = dst[:l+n]
	i := l + n
	for v >= 1e8 {
		q := v / 1e8
		put8(dst[i-8:i], uint32(v-q*1e8))
		i -= 8
		v = q
	}
	w := uint32(v)
	for w >= 100 {
		q := w / 100
		d := (w - q*100) * 2
		i -= 2
		dst[i], dst[i+1] = digits2[d], digits2[d+1]
		w = q
	}
	if w >= 10 {
		dst[i-2], dst[i-1] = digits2[w*2], digits2[w*2+1]
	} else {
		dst[i-1] = byte('0' + w)
	}
	return dst
}

// put8 writes w (< 1e8) as eight digits, zero-padded, into b[:8].
func put8(b []byte, w uint32) {
	_ = b[7]
	hi, lo := w/10000, w%10000
	a, c := hi/100*2, hi%100*2
	b[0], b[1], b[2], b[3] = digits2[a], digits2[a+1], digits2[c], digits2[c+1]
	a, c = lo/100*2, lo%100*2
	b[4], b[5], b[6], b[7] = digits2[a], digits2[a+1], digits2[c], digits2[c+1]
}

// pow10[i] is 10**i, with pow10[0] standing for the one-digit floor.
var pow10 = [20]uint64{0, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
	1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19}
