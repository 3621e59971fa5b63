package target

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
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
	prstatusSize  = prstatusRegs + 27*8
	prpsinfoPid   = 24
	prpsinfoFname = 40
	prpsinfoArgs  = 56
	prpsinfoSize  = 136
)

// Registers are a thread's general registers as the core recorded them
// (x86_64 user_regs_struct).
type Registers struct {
	R15, R14, R13, R12, Rbp, Rbx, R11, R10, R9, R8  uint64
	Rax, Rcx, Rdx, Rsi, Rdi, OrigRax, Rip, Cs       uint64
	Eflags, Rsp, Ss, FSBase, GSBase, Ds, Es, Fs, Gs uint64
}

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
	le := binary.LittleEndian
	for len(b) > 0 {
		if len(b) < 12 {
			return fmt.Errorf("note header cut short (%d bytes left)", len(b))
		}
		namesz := uint64(le.Uint32(b))
		descsz := uint64(le.Uint32(b[4:]))
		typ := le.Uint32(b[8:])
		nameEnd := 12 + align4(namesz)
		descEnd := nameEnd + align4(descsz)
		if nameEnd > uint64(len(b)) || nameEnd+descsz > uint64(len(b)) {
			return fmt.Errorf("note of type 0x%x runs past the end of its segment", typ)
		}
		name := b[12 : 12+namesz]
		desc := b[nameEnd : nameEnd+descsz]
		if string(bytes.TrimRight(name, "\x00")) == "CORE" {
			if err := c.parseNote(typ, desc); err != nil {
				return err
			}
		}
		if descEnd >= uint64(len(b)) {
			break
		}
		b = b[descEnd:]
	}
	return nil
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

func (c *core) parseNote(typ uint32, d []byte) error {
	le := binary.LittleEndian
	switch typ {
	case ntPrstatus:
		if len(d) < prstatusPid+4 {
			return fmt.Errorf("NT_PRSTATUS note of %d bytes is too short", len(d))
		}
		t := coreThread{tid: int(int32(le.Uint32(d[prstatusPid:])))}
		if len(d) >= prstatusSize {
			r := d[prstatusRegs:prstatusSize]
			regs := []*uint64{&t.regs.R15, &t.regs.R14, &t.regs.R13, &t.regs.R12, &t.regs.Rbp, &t.regs.Rbx,
				&t.regs.R11, &t.regs.R10, &t.regs.R9, &t.regs.R8, &t.regs.Rax, &t.regs.Rcx, &t.regs.Rdx,
				&t.regs.Rsi, &t.regs.Rdi, &t.regs.OrigRax, &t.regs.Rip, &t.regs.Cs, &t.regs.Eflags,
				&t.regs.Rsp, &t.regs.Ss, &t.regs.FSBase, &t.regs.GSBase, &t.regs.Ds, &t.regs.Es,
				&t.regs.Fs, &t.regs.Gs}
			for i, p := range regs {
				*p = le.Uint64(r[i*8:])
			}
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
