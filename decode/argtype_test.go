package decode

import "testing"

func TestIntType(t *testing.T) {
	tests := []struct {
		size        int
		signed, hex bool
		want        ArgType
		ok          bool
	}{
		{1, false, false, U8, true}, // not Char, also one unsigned byte
		{2, false, false, U16, true},
		{4, false, false, U32, true},
		{8, false, false, U64, true},
		{1, true, false, S8, true},
		{8, true, false, S64, true},
		{1, false, true, X8, true},
		{4, false, true, X32, true},
		{8, false, true, X64, true},
		{4, true, true, 0, false},
		{3, false, false, 0, false},
		{0, false, false, 0, false},
	}
	for _, tt := range tests {
		got, ok := IntType(tt.size, tt.signed, tt.hex)
		if got != tt.want || ok != tt.ok {
			t.Errorf("IntType(%d, %v, %v) = %v, %v; want %v, %v", tt.size, tt.signed, tt.hex, got, ok, tt.want, tt.ok)
		}
	}
}
