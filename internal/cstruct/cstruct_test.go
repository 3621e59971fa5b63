package cstruct

import (
	"encoding/binary"
	"testing"
)

// TestDecode checks each integer size, bitfields (within a byte, across
// bytes, a 5-byte storage unit, 64 bits wide) and the refusals, against
// values written with encoding/binary.
func TestDecode(t *testing.T) {
	buf := make([]byte, 32)
	buf[1] = 0xab
	binary.LittleEndian.PutUint16(buf[2:], 0xbeef)
	binary.LittleEndian.PutUint32(buf[4:], 0xdeadbeef)
	binary.LittleEndian.PutUint64(buf[8:], 0x0123456789abcdef)
	buf[16] = 0b1011_0110
	binary.LittleEndian.PutUint64(buf[20:], 0x00ff_fe12_3456_7800) // bytes 20..27
	for _, c := range []struct {
		name string
		fl   Field
		want uint64
	}{
		{"u8", Field{Offset: 1, Size: 1}, 0xab},
		{"u16", Field{Offset: 2, Size: 2}, 0xbeef},
		{"u32", Field{Offset: 4, Size: 4}, 0xdeadbeef},
		{"u64", Field{Offset: 8, Size: 8}, 0x0123456789abcdef},
		{"bits 2-4 of a byte", Field{Offset: 16, Size: 1, Bitfield: &Bitfield{BitOffset: 2, BitWidth: 3}}, 0b101},
		{"12 bits across bytes", Field{Offset: 20, Size: 3, Bitfield: &Bitfield{BitOffset: 8, BitWidth: 12}}, 0x678},
		{"40 bits in 5 bytes", Field{Offset: 20, Size: 5, Bitfield: &Bitfield{BitOffset: 0, BitWidth: 40}}, 0x12_3456_7800},
		{"64-bit bitfield", Field{Offset: 8, Size: 8, Bitfield: &Bitfield{BitOffset: 0, BitWidth: 64}}, 0x0123456789abcdef},
	} {
		got, err := c.fl.Decode(buf)
		if err != nil || got != c.want {
			t.Errorf("%s: %#x, %v; want %#x", c.name, got, err, c.want)
		}
	}
	for _, c := range []struct {
		name string
		fl   Field
	}{
		{"past the end", Field{Offset: 30, Size: 4}},
		{"offset overflow", Field{Offset: ^uint64(0), Size: 2}},
		{"3 bytes, no bitfield", Field{Offset: 0, Size: 3}},
		{"16 bytes", Field{Offset: 0, Size: 16}},
	} {
		if v, err := c.fl.Decode(buf); err == nil {
			t.Errorf("%s: decoded %#x, want an error", c.name, v)
		}
	}
}
