package decode

import "strconv"

// ArgType is the type of one probe argument, as tracefs names it.
type ArgType uint8

// Argument types: the fetch types of the kernel's classic uprobes. The zero
// value is u64, ptfs's default (printed in decimal). ptwrite uprobes write
// only u64 and u32/s32/x32 words; the other types are formatting ptfs does
// on those words (probes.Spec.PTWWire).
const (
	U64 ArgType = iota
	U32
	S32
	X32
	U8
	U16
	S8
	S16
	S64
	X8
	X16
	X64
	// Char is one byte, printed quoted ('A').
	Char
	// String and UString are a NUL-terminated string read from memory
	// (the kernel's string and ustring: both read user memory in a
	// uprobe), printed quoted and escaped.
	String
	UString
	numArgTypes
)

// typeInfo is one row of the type table.
type typeInfo struct {
	name string
	// size is the bytes of the value in a classic sample; a string's is
	// its 4-byte __data_loc word.
	size   uint8
	signed bool
	hex    bool
	str    bool
}

// argTypes is the type table: what the kernel's fetch types are called,
// how big their field is and how its print format shows them.
var argTypes = [numArgTypes]typeInfo{
	U64: {name: "u64", size: 8}, U32: {name: "u32", size: 4}, U16: {name: "u16", size: 2}, U8: {name: "u8", size: 1},
	S64: {name: "s64", size: 8, signed: true}, S32: {name: "s32", size: 4, signed: true},
	S16: {name: "s16", size: 2, signed: true}, S8: {name: "s8", size: 1, signed: true},
	X64: {name: "x64", size: 8, hex: true}, X32: {name: "x32", size: 4, hex: true},
	X16: {name: "x16", size: 2, hex: true}, X8: {name: "x8", size: 1, hex: true},
	Char:    {name: "char", size: 1},
	String:  {name: "string", size: 4, str: true},
	UString: {name: "ustring", size: 4, str: true},
}

// info returns t's row of the table; a value beyond it is u64's.
func (t ArgType) info() *typeInfo {
	if t >= numArgTypes {
		return &argTypes[U64]
	}
	return &argTypes[t]
}

// ParseArgType returns the type the kernel calls name (not a bitfield).
func ParseArgType(name string) (ArgType, bool) {
	for t := range argTypes {
		if argTypes[t].name == name {
			return ArgType(t), true
		}
	}
	return 0, false
}

// IntType returns the integer type of size bytes (1, 2, 4 or 8) that is
// signed or hex as asked (a signed hex type does not exist): the one
// place that maps a field's size to its type, for format files and
// bitfield containers.
func IntType(size int, signed, hex bool) (ArgType, bool) {
	for t := range argTypes {
		i := &argTypes[t]
		if ArgType(t) != Char && !i.str && int(i.size) == size && i.signed == signed && i.hex == hex {
			return ArgType(t), true
		}
	}
	return 0, false
}

// ArgTypeNames lists the names ParseArgType takes, for error messages.
func ArgTypeNames() []string {
	names := make([]string, len(argTypes))
	for t := range argTypes {
		names[t] = argTypes[t].name
	}
	return names
}

// String returns the tracefs spelling of t.
func (t ArgType) String() string { return t.info().name }

// Size returns the bytes of a t value in a classic sample: 1, 2, 4 or 8
// (a string's __data_loc word is 4).
func (t ArgType) Size() int { return int(t.info().size) }

// Signed tells whether t prints with a sign.
func (t ArgType) Signed() bool { return t.info().signed }

// IsString tells whether t is a string type, whose bytes travel in
// Record.Data.
func (t ArgType) IsString() bool { return t.info().str }

// Bitfield is the kernel's b<Width>@<Offset>/<container bits> type: Width
// bits from bit Offset (from the least significant) of a container, whose
// size is the argument's Type. The zero value is no bitfield.
type Bitfield struct {
	Width, Offset uint8
}

// Extract returns the bits of v that b selects, or v when b is zero.
func (b Bitfield) Extract(v uint64) uint64 {
	if b.Width == 0 || b.Width >= 64 {
		return v >> (b.Offset & 63)
	}
	return v >> (b.Offset & 63) & (1<<b.Width - 1)
}

// Text returns the kernel's spelling of b on a container of type t, such
// as "b4@2/32".
func (b Bitfield) Text(t ArgType) string {
	return "b" + strconv.Itoa(int(b.Width)) + "@" + strconv.Itoa(int(b.Offset)) + "/" + strconv.Itoa(8*t.Size())
}

// StringRef is the word of a string argument of a record: n bytes of
// Record.Data from off, as the kernel stored them (the NUL included; n = 0
// when the read faulted).
func StringRef(off, n int) uint64 { return uint64(off)<<32 | uint64(uint32(n)) }

// appendString appends the string that ref locates in data, quoted as the
// kernel prints it ("..." up to the first NUL), or (fault), as the kernel
// prints a string it could not read (also for a ref beyond data). Bytes
// that could split or spoof a record line are escaped: \" \\ \n \t \r,
// and \xHH for the other control bytes and every byte from 0x7f.
func appendString(dst, data []byte, ref uint64) []byte {
	off, n := ref>>32, ref&0xffffffff
	if n == 0 || off > uint64(len(data)) || n > uint64(len(data))-off {
		return append(dst, "(fault)"...)
	}
	dst = append(dst, '"')
	for _, c := range data[off : off+n] {
		if c == 0 {
			break
		}
		dst = appendEscaped(dst, c, '"')
	}
	return append(dst, '"')
}

// appendEscaped appends byte c of a string or char quoted by quote.
func appendEscaped(dst []byte, c, quote byte) []byte {
	switch {
	case c == quote || c == '\\':
		return append(dst, '\\', c)
	case c == '\n':
		return append(dst, '\\', 'n')
	case c == '\t':
		return append(dst, '\\', 't')
	case c == '\r':
		return append(dst, '\\', 'r')
	case c < 0x20 || c >= 0x7f:
		return append(dst, '\\', 'x', hexDigits[c>>4], hexDigits[c&15])
	}
	return append(dst, c)
}
