package target

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
	"unsafe"

	"strings"

	"github.com/rbscope/rbscope/internal/elfx"
)

// Note types of Linux cores (name "CORE").
const (
	ntPrstatus = 1
	ntPrpsinfo = 3
	ntAuxv     = 6
	ntFile     = 0x46494c45
)

// Auxiliary vector keys rbscope uses.
const (
	atPhdr        = 3
	atEntry       = 9
	atExecfn      = 31
	atSysinfoEhdr = 33
)

// Offsets in the x86_64 kernel structures elf_prstatus and elf_prpsinfo.
const (
	prstatusPid   = 32
	prstatusRegs  = 112
	prstatusSize  = prstatusRegs + int(unsafe.Sizeof(Registers{}))
	prpsinfoPid   = 24
	prpsinfoFname = 40
	prpsinfoArgs  = 56
	prpsinfoSize  = 136
)

// CoreInfo is what a core file holds beyond the Target interface. The
// Target OpenCore returns implements it.
type CoreInfo interface {
	// Registers returns the registers of thread tid (FSBase is the thread
	// pointer, the base of its static TLS block).
	Registers(tid int) (Registers, bool)
	// Auxv returns the process's auxiliary vector (AT_* key to value).
	Auxv() map[uint64]uint64
	// Args returns the command line prpsinfo recorded (at most 80 bytes).
	Args() string
}

// Registers implements CoreInfo.
func (c *core) Registers(tid int) (Registers, bool) {
	for _, t := range c.threads {
		if t.tid == tid {
			return t.regs, true
		}
	}
	return Registers{}, false
}

// Auxv implements CoreInfo.
func (c *core) Auxv() map[uint64]uint64 {
	out := make(map[uint64]uint64, len(c.auxv))
	for k, v := range c.auxv {
		out[k] = v
	}
	return out
}

// Args implements CoreInfo.
func (c *core) Args() string { return c.args }

// parseNotes reads the notes of one PT_NOTE segment.
func (c *core) parseNotes(b []byte) error {
	return elfx.WalkNotes(b, binary.LittleEndian, func(n elfx.Note) error {
		if n.Name != "CORE" {
			return nil
		}
		return c.parseNote(n.Type, n.Desc)
	})
}

func (c *core) parseNote(typ uint32, d []byte) error {
	le := binary.LittleEndian
	switch typ {
	case ntPrstatus:
		if len(d) < prstatusPid+4 {
			return fmt.Errorf("NT_PRSTATUS note of %d bytes is too short", len(d))
		}
		t := coreThread{tid: int(int32(le.Uint32(d[prstatusPid:])))}
		if len(d) >= prstatusSize {
			t.regs, _ = DecodeRegisters(d[prstatusRegs:prstatusSize])
		}
		c.threads = append(c.threads, t)
	case ntPrpsinfo:
		if len(d) < prpsinfoSize {
			return fmt.Errorf("NT_PRPSINFO note of %d bytes is too short", len(d))
		}
		c.pid = int(int32(le.Uint32(d[prpsinfoPid:])))
		c.procName = cString(d[prpsinfoFname:prpsinfoArgs])
		c.args = string(bytes.TrimRight([]byte(cString(d[prpsinfoArgs:prpsinfoSize])), " "))
	case ntAuxv:
		c.auxv = map[uint64]uint64{}
		for i := 0; i+16 <= len(d); i += 16 {
			k := le.Uint64(d[i:])
			if k == 0 {
				break
			}
			c.auxv[k] = le.Uint64(d[i+8:])
		}
	case ntFile:
		return c.parseFileNote(d)
	}
	return nil
}

// parseFileNote reads NT_FILE: count, page size, count (start, end,
// offset in pages) triples, then count NUL-terminated paths.
func (c *core) parseFileNote(d []byte) error {
	le := binary.LittleEndian
	if len(d) < 16 {
		return fmt.Errorf("NT_FILE note of %d bytes is too short", len(d))
	}
	count := le.Uint64(d)
	page := le.Uint64(d[8:])
	if count > uint64(len(d)-16)/24 {
		return fmt.Errorf("NT_FILE note lists %d files but holds only %d bytes", count, len(d))
	}
	names := d[16+count*24:]
	files := make([]fileMapping, 0, count)
	for i := uint64(0); i < count; i++ {
		e := d[16+i*24:]
		start, end, pgoff := le.Uint64(e), le.Uint64(e[8:]), le.Uint64(e[16:])
		k := bytes.IndexByte(names, 0)
		if k < 0 {
			if len(names) == 0 {
				return fmt.Errorf("NT_FILE note lists %d files but names only %d", count, i)
			}
			k = len(names)
		}
		path := string(names[:k])
		names = names[min(k+1, len(names)):]
		if end <= start {
			continue
		}
		deleted := strings.HasSuffix(path, deletedSuffix)
		path = strings.TrimSuffix(path, deletedSuffix)
		files = append(files, fileMapping{start: start, end: end, off: pgoff * page, path: path, deleted: deleted})
	}
	sort.SliceStable(files, func(i, j int) bool { return files[i].start < files[j].start })
	// Drop overlaps (a damaged note) so that lookups by address stay sound.
	out := files[:0]
	for _, f := range files {
		if len(out) > 0 && f.start < out[len(out)-1].end {
			continue
		}
		out = append(out, f)
	}
	c.files = out
	return nil
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
