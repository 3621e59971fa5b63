package elfx

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// Note is one ELF note: its owner name (without the trailing NUL), type
// and descriptor (a slice of the walked data).
type Note struct {
	Name string
	Type uint32
	Desc []byte
}

// ntGNUBuildID is NT_GNU_BUILD_ID, in notes named "GNU".
const ntGNUBuildID = 3

// WalkNotes calls f for each note in data, the contents of a PT_NOTE
// segment or SHT_NOTE section in byte order order (4-byte aligned, as
// every Linux note is). It stops at the first error f returns, and
// returns an error for a note cut short; the notes before it were
// walked. Sizes are 32-bit in the file and added in 64 bits, so a crafted
// size cannot wrap around.
func WalkNotes(data []byte, order binary.ByteOrder, f func(Note) error) error {
	for off := uint64(0); off < uint64(len(data)); {
		b := data[off:]
		if len(b) < 12 {
			return fmt.Errorf("note header cut short at offset %d (%d bytes left)", off, len(b))
		}
		namesz := uint64(order.Uint32(b))
		descsz := uint64(order.Uint32(b[4:]))
		typ := order.Uint32(b[8:])
		descStart := 12 + align4(namesz)
		if descStart > uint64(len(b)) || descStart+descsz > uint64(len(b)) {
			return fmt.Errorf("note of type 0x%x at offset %d runs past the end of its segment or section", typ, off)
		}
		name := string(bytes.TrimRight(b[12:12+namesz], "\x00"))
		if err := f(Note{Name: name, Type: typ, Desc: b[descStart : descStart+descsz]}); err != nil {
			return err
		}
		off += min(descStart+align4(descsz), uint64(len(b)))
	}
	return nil
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

// errFound stops a walk that found what it looked for.
var errFound = fmt.Errorf("found")

// BuildIDFromNotes returns the hex GNU build id found in a block of ELF
// notes (little endian), or "".
func BuildIDFromNotes(data []byte) string {
	id := ""
	_ = WalkNotes(data, binary.LittleEndian, func(n Note) error {
		if n.Type == ntGNUBuildID && n.Name == "GNU" {
			id = hex.EncodeToString(n.Desc)
			return errFound
		}
		return nil
	})
	return id
}
