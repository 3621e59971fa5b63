// Package elfx reads what rbscope needs from ELF binaries: symbols from
// .dynsym and .symtab (and, for images found only in a process's memory,
// from the dynamic section), TLS symbols, the build id, .gnu_debuglink and
// the load bias of a mapped binary.
package elfx

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Symbol is one ELF symbol. Value is the link-time address (add the load
// bias for a run-time address); for TLS symbols it is the offset in the
// module's TLS block.
type Symbol struct {
	Name  string
	Value uint64
	Size  uint64
	TLS   bool
}

// Symbols is a name-indexed symbol table.
type Symbols interface {
	// Lookup returns the symbol called name.
	Lookup(name string) (Symbol, bool)
}

// Table is a Symbols backed by a map.
type Table map[string]Symbol

// Lookup implements Symbols.
func (t Table) Lookup(name string) (Symbol, bool) {
	s, ok := t[name]
	return s, ok
}

// Binary is an ELF file opened from disk (or any io.ReaderAt).
type Binary struct {
	f         *elf.File
	Symbols   Table  // .dynsym and .symtab merged (.symtab wins)
	BuildID   string // hex, "" when absent
	HasSymtab bool   // a full .symtab was present (not stripped)
	// FirstLoadVaddr is the p_vaddr of the first PT_LOAD segment, to
	// compute the load bias of a mapping at file offset 0.
	FirstLoadVaddr uint64
	Type           elf.Type
}

// Open reads the symbols, build id and load information of the ELF file r.
// Malformed input gives an error, never a panic.
func Open(r io.ReaderAt) (b *Binary, err error) {
	defer func() {
		// debug/elf has panicked on crafted files in the past; a profiler
		// pointed at a corrupt binary must report it, not crash.
		if p := recover(); p != nil {
			b, err = nil, fmt.Errorf("parse ELF: malformed file (%v)", p)
		}
	}()
	return open(r)
}

func open(r io.ReaderAt) (*Binary, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("parse ELF: %w", err)
	}
	b := &Binary{f: f, Symbols: Table{}, Type: f.Type}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			b.FirstLoadVaddr = p.Vaddr - p.Off
			break
		}
	}
	add := func(syms []elf.Symbol) {
		for _, s := range syms {
			if s.Name == "" || s.Section == elf.SHN_UNDEF {
				continue
			}
			typ := elf.ST_TYPE(s.Info)
			b.Symbols[s.Name] = Symbol{Name: s.Name, Value: s.Value, Size: s.Size, TLS: typ == elf.STT_TLS}
		}
	}
	if syms, err := f.DynamicSymbols(); err == nil {
		add(syms)
	} else if !errors.Is(err, elf.ErrNoSymbols) {
		return nil, fmt.Errorf("read .dynsym: %w", err)
	}
	if syms, err := f.Symbols(); err == nil {
		b.HasSymtab = true
		add(syms)
	} else if !errors.Is(err, elf.ErrNoSymbols) {
		return nil, fmt.Errorf("read .symtab: %w", err)
	}
	b.BuildID = buildID(f)
	return b, nil
}

// ELF returns the underlying debug/elf file.
func (b *Binary) ELF() *elf.File { return b.f }

// Section returns the named section, or nil.
func (b *Binary) Section(name string) *elf.Section { return b.f.Section(name) }

// LoadBias returns the difference between run-time and link-time
// addresses for a binary whose file offset mapOffset is mapped at
// mapStart.
func (b *Binary) LoadBias(mapStart, mapOffset uint64) uint64 {
	for _, p := range b.f.Progs {
		if p.Type == elf.PT_LOAD && p.Off <= mapOffset && mapOffset < p.Off+p.Filesz {
			return mapStart - (p.Vaddr + (mapOffset - p.Off))
		}
	}
	return mapStart - mapOffset - b.FirstLoadVaddr
}

// DebugLink returns the .gnu_debuglink file name and CRC.
func (b *Binary) DebugLink() (name string, crc uint32, ok bool) {
	s := b.f.Section(".gnu_debuglink")
	if s == nil {
		return "", 0, false
	}
	data, err := s.Data()
	if err != nil || len(data) < 8 {
		return "", 0, false
	}
	n := 0
	for n < len(data) && data[n] != 0 {
		n++
	}
	off := (n + 4) &^ 3
	if off+4 > len(data) {
		return "", 0, false
	}
	return string(data[:n]), binary.LittleEndian.Uint32(data[off:]), true
}

// FileBuildID returns the GNU build id (hex) of the ELF file r, "" when it
// has none. It reads the notes the program headers point to (what a
// process maps, so that the answer compares with ReadMemoryBuildID even
// for a file whose section headers are missing), and the note sections of
// a file without program headers. Malformed input gives an error, never a
// panic.
func FileBuildID(r io.ReaderAt) (id string, err error) {
	le := binary.LittleEndian
	var h [64]byte
	if _, err := r.ReadAt(h[:], 0); err != nil {
		return "", fmt.Errorf("read ELF header: %w", err)
	}
	if string(h[:4]) != "\x7fELF" || h[4] != 2 || h[5] != 1 {
		return "", errors.New("not a 64-bit little-endian ELF file")
	}
	phoff, phentsize, phnum := le.Uint64(h[32:]), le.Uint16(h[54:]), int(le.Uint16(h[56:]))
	if phnum > 0 && phentsize == 56 && phnum <= maxMemPhnum && phoff < 1<<32 {
		ph := make([]byte, phnum*56)
		if _, err := r.ReadAt(ph, int64(phoff)); err != nil {
			return "", fmt.Errorf("read program headers: %w", err)
		}
		for i := 0; i < phnum; i++ {
			p := ph[i*56:]
			if le.Uint32(p) != uint32(elf.PT_NOTE) {
				continue
			}
			off, size := le.Uint64(p[8:]), min(le.Uint64(p[32:]), maxMemNote)
			if off > 1<<40 {
				continue
			}
			b := make([]byte, size)
			if n, _ := r.ReadAt(b, int64(off)); n > 0 {
				if id := BuildIDFromNotes(b[:n]); id != "" {
					return id, nil
				}
			}
		}
	}
	defer func() {
		if p := recover(); p != nil {
			id, err = "", fmt.Errorf("parse ELF: malformed file (%v)", p)
		}
	}()
	f, err := elf.NewFile(r)
	if err != nil {
		return "", nil // no readable section headers: no other notes to look at
	}
	return buildID(f), nil
}

func buildID(f *elf.File) string {
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		if id := noteBuildID(s.Open()); id != "" {
			return id
		}
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		if id := noteBuildID(p.Open()); id != "" {
			return id
		}
	}
	return ""
}

// noteBuildID scans ELF notes for NT_GNU_BUILD_ID.
func noteBuildID(r io.Reader) string {
	data, err := io.ReadAll(io.LimitReader(r, 1<<16))
	if err != nil {
		return ""
	}
	return BuildIDFromNotes(data)
}
