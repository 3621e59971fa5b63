// Package usdt reads SystemTap/DTrace user-space probes (USDT) from the
// .note.stapsdt section of an ELF binary: each probe's provider and name,
// its address and semaphore converted to file offsets (what the kernel's
// uprobe interface wants), and its argument specifications decoded into a
// form an eBPF program can evaluate against x86_64 pt_regs.
//
// The note format is described in
// https://sourceware.org/systemtap/wiki/UserSpaceProbeImplementation.
package usdt

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/rbscope/rbscope/internal/elfx"
)

// ntStapsdt is the note type of a stapsdt probe descriptor.
const ntStapsdt = 3

// maxNotes bounds how many probes one section may describe; real binaries
// have a few hundred at most.
const maxNotes = 1 << 16

// Probe is one USDT probe site. A probe name may appear at several sites
// (inlined call sites): each is its own Probe.
type Probe struct {
	Provider string
	Name     string
	// PC, Base and Semaphore are the note's link-time addresses, with PC
	// and Semaphore already adjusted for prelinking (.stapsdt.base).
	PC, Base, Semaphore uint64
	// Offset is the file offset of PC, SemaphoreOffset the file offset of
	// the semaphore (0 when the probe has none).
	Offset, SemaphoreOffset uint64
	// ArgSpec is the raw argument string ("8@%rax -4@4(%rsp)").
	ArgSpec string
	// Args are the decoded arguments; nil when ArgErr is set.
	Args []Arg
	// ArgErr says why ArgSpec could not be decoded, if it could not.
	ArgErr error
}

// Note is one raw stapsdt note, before address conversion.
type Note struct {
	PC, Base, Semaphore uint64
	Provider, Name      string
	Args                string
}

// ParseNotes parses the contents of a .note.stapsdt section. order is the
// ELF file's byte order and addrSize its address size (4 or 8). Notes of
// other types are skipped. It never panics and allocates no more than a
// small multiple of len(data).
func ParseNotes(data []byte, order binary.ByteOrder, addrSize int) ([]Note, error) {
	if addrSize != 4 && addrSize != 8 {
		return nil, fmt.Errorf("bad address size %d", addrSize)
	}
	var out []Note
	err := elfx.WalkNotes(data, order, func(en elfx.Note) error {
		if en.Type != ntStapsdt || en.Name != "stapsdt" {
			return nil
		}
		if len(out) >= maxNotes {
			return fmt.Errorf("more than %d probes", maxNotes)
		}
		n, err := parseDesc(en.Desc, order, addrSize)
		if err != nil {
			return fmt.Errorf("note %d: %w", len(out), err)
		}
		out = append(out, n)
		return nil
	})
	if err != nil {
		return out, err
	}
	return out, nil
}

func parseDesc(desc []byte, order binary.ByteOrder, addrSize int) (Note, error) {
	var n Note
	if len(desc) < 3*addrSize {
		return n, fmt.Errorf("descriptor of %d bytes is too short", len(desc))
	}
	word := func(i int) uint64 {
		if addrSize == 8 {
			return order.Uint64(desc[i*8:])
		}
		return uint64(order.Uint32(desc[i*4:]))
	}
	n.PC, n.Base, n.Semaphore = word(0), word(1), word(2)
	rest := desc[3*addrSize:]
	var strs [3]string
	for i := range strs {
		j := 0
		for j < len(rest) && rest[j] != 0 {
			j++
		}
		if j == len(rest) {
			if i == 2 {
				// Tolerate a missing final NUL on the argument string.
				strs[i] = string(rest)
				rest = nil
				break
			}
			return n, errors.New("unterminated provider or probe name")
		}
		strs[i] = string(rest[:j])
		rest = rest[j+1:]
	}
	n.Provider, n.Name, n.Args = strs[0], strs[1], strs[2]
	if n.Provider == "" || n.Name == "" {
		return n, errors.New("empty provider or probe name")
	}
	return n, nil
}

// Read returns every probe in the ELF file r, with addresses converted to
// file offsets and arguments decoded. A binary without a .note.stapsdt
// section has no probes (nil, nil).
func Read(r io.ReaderAt) ([]Probe, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("parse ELF: %w", err)
	}
	defer f.Close()
	return FromELF(f)
}

// FromELF is Read for an already parsed ELF file.
func FromELF(f *elf.File) ([]Probe, error) {
	sec := f.Section(".note.stapsdt")
	if sec == nil || sec.Type == elf.SHT_NOBITS {
		return nil, nil
	}
	if sec.Size > 64<<20 {
		return nil, fmt.Errorf(".note.stapsdt of %d bytes is implausibly large", sec.Size)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .note.stapsdt: %w", err)
	}
	addrSize := 8
	if f.Class == elf.ELFCLASS32 {
		addrSize = 4
	}
	notes, err := ParseNotes(data, f.ByteOrder, addrSize)
	if err != nil {
		return nil, fmt.Errorf("parse .note.stapsdt: %w", err)
	}
	// Prelink may have moved the binary after the notes were written: the
	// difference between .stapsdt.base's actual address and the base
	// recorded in each note is added to PC and semaphore.
	var baseAddr uint64
	haveBase := false
	if b := f.Section(".stapsdt.base"); b != nil {
		baseAddr, haveBase = b.Addr, true
	}
	out := make([]Probe, 0, len(notes))
	for _, n := range notes {
		p := Probe{Provider: n.Provider, Name: n.Name, Base: n.Base, ArgSpec: n.Args}
		p.PC, p.Semaphore = adjust(n, baseAddr, haveBase)
		off, err := VaddrToOffset(f, p.PC)
		if err != nil {
			return nil, fmt.Errorf("probe %s:%s: %w", p.Provider, p.Name, err)
		}
		p.Offset = off
		if p.Semaphore != 0 {
			soff, err := VaddrToOffset(f, p.Semaphore)
			if err != nil {
				return nil, fmt.Errorf("semaphore of probe %s:%s: %w", p.Provider, p.Name, err)
			}
			p.SemaphoreOffset = soff
		}
		p.Args, p.ArgErr = ParseArgs(n.Args)
		out = append(out, p)
	}
	return out, nil
}

// adjust applies the prelink correction: PC and semaphore move by the
// distance between .stapsdt.base's address and the note's recorded base.
func adjust(n Note, baseAddr uint64, haveBase bool) (pc, sem uint64) {
	pc, sem = n.PC, n.Semaphore
	if haveBase && n.Base != 0 {
		pc += baseAddr - n.Base
		if sem != 0 {
			sem += baseAddr - n.Base
		}
	}
	return pc, sem
}

// VaddrToOffset converts the link-time virtual address vaddr to a file
// offset through the PT_LOAD segment that contains it.
func VaddrToOffset(f *elf.File, vaddr uint64) (uint64, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD {
			continue
		}
		if vaddr >= p.Vaddr && vaddr < p.Vaddr+p.Memsz {
			return vaddr - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("address 0x%x is in no loadable segment", vaddr)
}
