// Package cstruct describes the layout of a C struct: its size and
// alignment, and the byte offset, size, type name and (for bitfields) bit
// position of each field, and decodes a field from a copy of the struct's
// bytes.
//
// It is the vocabulary shared by the DWARF reader (internal/dwarfstruct),
// which produces these layouts, and internal/layout, which adds built-in
// tables and policy. Field names use dots for nesting ("as.heap.ptr"), as
// in the schema of ../shared/ruby-layouts, whose JSON tags these types
// carry.
package cstruct

import (
	"encoding/binary"
	"fmt"
)

// Bitfield locates a bitfield inside the bytes [Offset, Offset+Size) of its
// field: load Size bytes little-endian, shift right by BitOffset, keep
// BitWidth bits.
type Bitfield struct {
	BitOffset int `json:"bit_offset"`
	BitWidth  int `json:"bit_width"`
}

// Field is one (possibly nested) member of a struct.
type Field struct {
	Offset   uint64    `json:"offset"`
	Size     uint64    `json:"size"`
	Type     string    `json:"type,omitempty"`
	Bitfield *Bitfield `json:"bitfield,omitempty"`
	// Source says where this field's offset came from when it differs
	// from the source of the set of structs holding it (a DWARF layout
	// completed from a table).
	Source string `json:"source,omitempty"`
}

// Struct is the layout of one C struct.
type Struct struct {
	Size   uint64           `json:"size"`
	Align  uint64           `json:"align,omitempty"`
	Fields map[string]Field `json:"fields"`
}

// Decode reads field fl from buf, a copy of the struct's bytes. Fields of 1,
// 2, 4 or 8 bytes are read little-endian; bitfields are extracted. It fails
// when buf is too short or the field has another size.
func (fl Field) Decode(buf []byte) (uint64, error) {
	end := fl.Offset + fl.Size
	if end > uint64(len(buf)) || end < fl.Offset {
		return 0, fmt.Errorf("field at %d+%d outside %d-byte buffer", fl.Offset, fl.Size, len(buf))
	}
	b := buf[fl.Offset:end]
	var v uint64
	switch fl.Size {
	case 1:
		v = uint64(b[0])
	case 2:
		v = uint64(binary.LittleEndian.Uint16(b))
	case 4:
		v = uint64(binary.LittleEndian.Uint32(b))
	case 8:
		v = binary.LittleEndian.Uint64(b)
	default:
		if fl.Bitfield == nil || fl.Size > 8 {
			return 0, fmt.Errorf("cannot decode a %d-byte field as an integer", fl.Size)
		}
		var tmp [8]byte
		copy(tmp[:], b)
		v = binary.LittleEndian.Uint64(tmp[:])
	}
	if bf := fl.Bitfield; bf != nil {
		v >>= uint(bf.BitOffset)
		if bf.BitWidth < 64 {
			v &= (uint64(1) << uint(bf.BitWidth)) - 1
		}
	}
	return v, nil
}
