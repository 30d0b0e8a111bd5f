package decode

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"strconv"
	"unsafe"
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
// itself (appendComm escapes what could split the line or the field).
// Like every formatter here that prints decimals (appendDec), it may write
// scratch bytes past the returned length within dst's capacity: dst's
// spare capacity must hold nothing that is still needed.
func AppendRecord(dst []byte, seq uint64, r *Record) []byte {
	dst = appendHead(appendSeq(dst, seq), r.Event)
	dst = appendThread(append(appendArgs(dst, r), ']'), r.TID, r.CPU)
	if r.Time != 0 {
		dst = append(dst, " time="...)
		dst = AppendTime(dst, r.Time)
	}
	return append(appendProcess(dst, r.PID, r.Comm), '\n')
}

// appendSeq appends a record line's start, "record N: ".
func appendSeq(dst []byte, seq uint64) []byte {
	dst = append(dst, "record "...)
	dst = appendDec(dst, seq)
	return append(dst, ": "...)
}

// appendHead appends what a record line holds of its event alone:
// "event=GRP/EVENT id=0xID args=[".
func appendHead(dst []byte, ev *Event) []byte {
	dst = append(dst, "event="...)
	dst = append(dst, ev.Group...)
	dst = append(dst, '/')
	dst = append(dst, ev.Name...)
	dst = append(dst, " id=0x"...)
	dst = appendHex(dst, uint64(ev.ID), 0)
	return append(dst, " args=["...)
}

// appendArgs appends the N arguments of r, separated by ", ".
func appendArgs(dst []byte, r *Record) []byte {
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
	return dst
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
		dst = appendComm(dst, comm)
	}
	return dst
}

// RecordWriter appends the lines of AppendRecord, byte for byte, keeping
// the text of what repeats from line to line: the record number (the
// next one below 1e8 is the last one's digits counted up, in place of a
// conversion whose chain of multiplications cost a seventh of the line),
// each event's text (": ", group, name, id) and whether every argument is
// an unnamed whole u64 (which then prints without a look at its type),
// and the line's end after the arguments (the thread, the time's seconds
// and the process, joined into one text whose nine digits of the time's
// fraction are filled in per line). A line is so "record " and the
// number as two 8-byte stores, the event's kept text, the argument list,
// the kept end and the fraction's digits written into it, with the room
// for all of it made once.
// Both the live record path and ptfs decode format through it. For one
// formatting goroutine; an Event must not change while its records are
// formatted (events are replaced, never edited). The zero value is ready
// to use.
type RecordWriter struct {
	// cache is direct-mapped by event id, checked by pointer: a few
	// events alternate record by record.
	cache [64]lineEvent
	// seq is the last line's number and seqDigits its eight digits
	// (while it is below 1e8), the last digit in the low byte and each
	// biased by 0xf6, so that adding 1 counts up the next number, the
	// carry running from digit to digit as in binary.
	seq       uint64
	seqDigits uint64
	// end is the text after the arguments for the thread, time and
	// process below: "]", appendThread, " time=SEC." and nine bytes for
	// the fraction when timed, appendProcess and "\n"; "" until made.
	// secBase is the time the seconds' text stands for (SEC * 1e9), so
	// that a time of the same second is its fraction by a subtraction.
	end []byte
	// fracAt is where in end the fraction's nine digits are (0 when
	// untimed, so it also tells whether end is timed), kept so that a
	// line does not add the parts' lengths.
	fracAt  int
	tid     int32
	cpu     int32
	secBase uint64
	pid     int32
	comm    string
	// The parts of end, each made again only when what it shows changes.
	thread   []byte // appendThread of tid and cpu
	secTxt   []byte // " time=SEC." of secShown (SEC * 1e9)
	secShown uint64
	proc     []byte // appendProcess of pid and comm
}

// biased0 is eight biased zero digits of RecordWriter.seqDigits.
const biased0 = 0xf6f6f6f6_f6f6f6f6

// lineEvent is what RecordWriter keeps of one event.
type lineEvent struct {
	ev    *Event
	head  []byte // ": " and appendHead's text
	plain bool   // every argument an unnamed whole u64
}

// lineSlack is the room a line needs beyond its text: the last 8-byte
// store of the number may end 8 bytes past it.
const lineSlack = 8

// Append appends the line of record number seq, as AppendRecord does (and
// like it may write scratch bytes into dst's spare capacity).
func (w *RecordWriter) Append(dst []byte, seq uint64, r *Record) []byte {
	e := &w.cache[r.Event.ID&uint16(len(w.cache)-1)]
	if e.ev != r.Event {
		e.set(r.Event)
	}
	// Comm by pointer: a source names a run of records with one cached
	// string (another string of the same name only remakes end).
	if frac := r.Time - w.secBase; frac >= 1e9 || r.TID != w.tid || r.CPU != w.cpu || (r.Time != 0) != (w.fracAt != 0) ||
		r.PID != w.pid || len(r.Comm) != len(w.comm) || unsafe.StringData(r.Comm) != unsafe.StringData(w.comm) || len(w.end) == 0 {
		w.setEnd(r)
	}
	// One check of the room for the longest line of this event: the
	// number's 20 digits, the kept texts and the argument list's longest
	// (other arguments make their own room).
	room := listRoom(r.N) // once: each use is a max and its branch
	need := len("record ") + 20 + len(e.head) + lineSlack
	if e.plain {
		need += room + len(w.end)
	}
	if cap(dst)-len(dst) < need {
		dst = slices.Grow(dst, need)
	}
	dst = w.appendSeq(dst, seq)
	l := len(dst)
	l += copy(dst[l:l+len(e.head)], e.head)
	if e.plain {
		l += putList(dst[l:l+room], r.Args[:r.N])
	} else {
		dst = appendArgs(dst[:l], r)
		l = len(dst)
		if cap(dst)-l < len(w.end) {
			dst = slices.Grow(dst, len(w.end))
		}
	}
	dst = dst[:l+len(w.end)]
	copy(dst[l:], w.end)
	if w.fracAt != 0 {
		putFrac9(dst[l+w.fracAt:], uint32(r.Time-w.secBase))
	}
	return dst
}

// AppendRun appends the lines of rs, numbered from seq on, as Append does
// each, while dst's capacity holds them: it never grows dst, so that lines
// formatted in place stay there. It returns dst and how many records it
// appended: fewer than len(rs) when the next one may not fit (its room
// bounded before its end is made: endRoom), or is of an event whose
// arguments are not all unnamed whole u64 (whose line's length is not
// known before it is written); the caller appends that one with Append.
// A run of one event's records looks the event up once for the room.
func (w *RecordWriter) AppendRun(dst []byte, seq uint64, rs []Record) ([]byte, int) {
	var (
		ev   *Event
		base int // the line's room but for its arguments and end
	)
	for i := range rs {
		r := &rs[i]
		if r.Event != ev {
			e := &w.cache[r.Event.ID&uint16(len(w.cache)-1)]
			if e.ev != r.Event {
				e.set(r.Event)
			}
			if !e.plain {
				return dst, i
			}
			ev, base = r.Event, len("record ")+20+len(e.head)+lineSlack
		}
		if cap(dst)-len(dst) < base+listRoom(r.N)+endRoom(r) {
			return dst, i
		}
		dst = w.Append(dst, seq+uint64(i), r)
	}
	return dst, len(rs)
}

// endRoom bounds the length of the text after r's arguments (setEnd): "]",
// " tid=" and " cpu=" with ten digits each, " time=" with the seconds'
// eleven and the fraction's nine, " pid=" with ten, " comm=" with each
// byte of the name escaped to four, and the newline.
func endRoom(r *Record) int {
	return len("] tid= cpu= time=. pid= comm=\n") + 10 + 10 + 11 + 9 + 10 + 4*len(r.Comm)
}

// setEnd makes w.end the text after r's arguments, remaking only the
// parts whose fields changed.
func (w *RecordWriter) setEnd(r *Record) {
	if r.TID != w.tid || r.CPU != w.cpu || len(w.end) == 0 {
		w.tid, w.cpu = r.TID, r.CPU
		w.thread = appendThread(w.thread[:0], r.TID, r.CPU)
	}
	timed := r.Time != 0
	w.secBase = 0
	if timed {
		sec := r.Time / 1e9
		if w.secBase = sec * 1e9; w.secBase != w.secShown || len(w.secTxt) == 0 {
			w.secShown = w.secBase
			w.secTxt = append(appendDec(append(w.secTxt[:0], " time="...), sec), '.')
		}
	}
	if r.PID != w.pid || r.Comm != w.comm || len(w.end) == 0 {
		w.proc = appendProcess(w.proc[:0], r.PID, r.Comm)
	}
	w.pid, w.comm = r.PID, r.Comm
	w.end = append(append(w.end[:0], ']'), w.thread...)
	w.fracAt = 0
	if timed {
		w.end = append(w.end, w.secTxt...)
		w.fracAt = len(w.end)
		w.end = append(w.end, "000000000"...)
	}
	w.end = append(append(w.end, w.proc...), '\n')
}

// appendSeq appends "record N" (AppendRecord's start without its ": ",
// which the event's kept text begins with), counting the next number
// after the last one (below 1e8) up. dst has room for 16 bytes.
func (w *RecordWriter) appendSeq(dst []byte, seq uint64) []byte {
	if seq != w.seq+1 || seq >= 1e8 || w.seqDigits == 0 {
		w.seq = seq
		w.seqDigits = 0
		if seq < 1e8 {
			w.seqDigits = bits.ReverseBytes64(digits8(uint32(seq))) + biased0
		}
		return appendDec(append(dst, "record "...), seq)
	}
	w.seq = seq
	d := w.seqDigits + 1
	// The digits that carried over wrapped to 0x00 (the first one that
	// did not is never 0): biased zeros again.
	d |= biased0 & (1<<(bits.TrailingZeros64(d)&^7) - 1)
	w.seqDigits = d
	v := bits.ReverseBytes64(d) - biased0             // digit values, the first in the low byte
	z := uint(min(bits.TrailingZeros64(v)>>3, 7)) & 7 // & 7: no shift guard
	l := len(dst)
	b := dst[l : l+16]
	binary.LittleEndian.PutUint64(b[:8], recordPrefix)
	binary.LittleEndian.PutUint64(b[7:15], (v|ascii8)>>(8*z))
	return dst[:l+15-int(z)]
}

// recordPrefix is "record " as a little-endian word (its eighth byte is
// overwritten by the number).
const recordPrefix = 0x0020_6472_6f63_6572

// set makes e describe ev.
func (e *lineEvent) set(ev *Event) {
	e.ev, e.head, e.plain = ev, appendHead(append(e.head[:0], ": "...), ev), true
	for _, a := range ev.Args {
		if a.Name != "" || a.Type != U64 || a.Bits != (Bitfield{}) {
			e.plain = false
		}
	}
}

// appendComm appends a process name as one field: any process can name
// itself anything but NUL (prctl PR_SET_NAME), so bytes outside the
// printable ASCII range, space and backslash are written as \xHH.
func appendComm(dst []byte, comm string) []byte {
	for i := 0; i < len(comm); i++ {
		c := comm[i]
		if c > ' ' && c < 0x7f && c != '\\' {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '\\', 'x', hexDigits[c>>4], hexDigits[c&0xf])
	}
	return dst
}

// AppendValue appends v printed as type t, as the kernel's print format
// for t does: unsigned types in decimal, signed ones with their sign, hex
// ones as 0x-prefixed hex, each from the low bytes of its size; char
// quoted ('A', escaped as strings are). A string type prints nothing here:
// its bytes are the record's (AppendRecord). It may write scratch bytes
// into dst's spare capacity (appendDec).
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

// AppendTime appends a nanosecond time as SEC.NSEC with nine fraction
// digits. It may write scratch bytes into dst's spare capacity (appendDec).
func AppendTime(dst []byte, ns uint64) []byte {
	dst = appendDec(dst, ns/1e9)
	dst = append(dst, '.')
	return appendFrac9(dst, uint32(ns%1e9))
}

// appendFrac9 appends f (< 1e9) as nine digits, zero-padded.
func appendFrac9(dst []byte, f uint32) []byte {
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	putFrac9(dst[len(dst)-9:], f)
	return dst
}

// putFrac9 writes f (< 1e9) as nine digits, zero-padded, into b[:9]
// (RecordWriter fills a kept line end's fraction in place).
func putFrac9(b []byte, f uint32) {
	b[0] = byte('0' + f/1e8)
	binary.LittleEndian.PutUint64(b[1:9], digits8(f%1e8)|ascii8)
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

// appendDec appends v in decimal. It writes the digits in place, where
// strconv formats into a scratch buffer and copies it: on the record path
// the copies cost more than the digits. On amd64 the digits come from
// SIMD registers, sixteen at once (putList, dec_amd64.s); elsewhere eight
// at a time are split off (a 64-bit division by a constant) and turned
// into ASCII together in one word (digits8), stored with one 8-byte
// write, the first group's leading zeros shifted out of its word. No
// loop runs per digit or digit pair: for the random lengths of record
// arguments the loop exits were mispredicted branches. It writes up to 24
// bytes past len(dst), within the capacity, that later appends overwrite.
func appendDec(dst []byte, v uint64) []byte {
	l := len(dst)
	if cap(dst)-l < 24 {
		dst = slices.Grow(dst, 24)
	}
	return dst[:l+putList(dst[l:l+24], []uint64{v})]
}

// listRoom is the room putList needs for n values: 24 bytes for the
// longest, 2 more for each separator.
func listRoom(n int) int { return max(26*n-2, 0) }

// putListGo is putList in plain Go: where there is no SIMD version
// (dec_amd64.go), and the oracle of its tests. It writes vals in decimal,
// separated by ", ", at the start of b, and returns the length; it may
// write scratch bytes past it within listRoom(len(vals)).
func putListGo(b []byte, vals []uint64) int {
	l := 0
	for i, v := range vals {
		// The separator is written before every value, one store,
		// and kept from the second on.
		binary.LittleEndian.PutUint16(b[l:], ','|' '<<8)
		l += 2 * min(i, 1)
		l += putDecGo((*[24]byte)(b[l:l+24]), v)
	}
	return l
}

// putDecGo writes v in decimal at the start of b and returns its length.
// Each group's leading zero count z is masked to 0-7, the range it has,
// so that the compiler drops its guards of shifts by 64 and more and of
// empty slices (a tenth of the instructions).
func putDecGo(b *[24]byte, v uint64) int {
	if v < 1e8 {
		d := digits8(uint32(v))
		// Leading zero digits are zero bytes at the low end; zero
		// itself keeps its last digit.
		z := uint(min(bits.TrailingZeros64(d)>>3, 7)) & 7
		binary.LittleEndian.PutUint64(b[:], (d|ascii8)>>(8*z))
		return 8 - int(z)
	}
	hi, lo := v/1e8, uint32(v%1e8)
	if hi < 1e8 {
		d := digits8(uint32(hi))
		z := uint(bits.TrailingZeros64(d)>>3) & 7 // hi > 0: z < 8
		binary.LittleEndian.PutUint64(b[:], (d|ascii8)>>(8*z))
		binary.LittleEndian.PutUint64(b[8-z:], digits8(lo)|ascii8)
		return 16 - int(z)
	}
	top, mid := uint32(hi/1e8), uint32(hi%1e8)
	d := digits8(top)
	z := uint(bits.TrailingZeros64(d)>>3) & 7 // 0 < top < 1845: 4 <= z < 8
	binary.LittleEndian.PutUint64(b[:], (d|ascii8)>>(8*z))
	binary.LittleEndian.PutUint64(b[8-z:], digits8(mid)|ascii8)
	binary.LittleEndian.PutUint64(b[16-z:], digits8(lo)|ascii8)
	return 24 - int(z)
}

// ascii8 turns eight digit values (0-9 per byte) into ASCII.
const ascii8 = 0x3030303030303030

// digits8 returns the eight decimal digits of w (< 1e8, zero-padded) as
// byte values 0-9, the first digit in the low byte (a little-endian store
// writes them in order). Each step splits every lane of the word in two
// with a multiplication by a reciprocal, no division: 10486/2**20 is 1/100
// and 103/2**10 is 1/10 closely enough for lanes below 10000 and 100.
func digits8(w uint32) uint64 {
	v := uint64(w/10000) | uint64(w%10000)<<32 // two 4-digit lanes
	q := v * 10486 >> 20 & 0x0000007f_0000007f
	v = q | (v-q*100)<<16 // four 2-digit lanes
	q = v * 103 >> 10 & 0x000f_000f_000f_000f
	return q | (v-q*10)<<8 // eight digits
}
