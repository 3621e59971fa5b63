package dwarfstruct

import (
	"compress/zlib"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// dwarfLimits bounds what reading DWARF may decompress and hold in memory.
type dwarfLimits struct {
	// section caps each section that is loaded whole (.debug_abbrev,
	// .debug_str, ...): a larger declared size is refused and the reader
	// stops one byte past it.
	section int64
	// unit caps one compilation unit of .debug_info (the only part of
	// .debug_info held in memory at a time).
	unit int64
	// info caps the declared size of .debug_info, which is streamed.
	info int64
	// whole caps .debug_info when it must be held whole, because its
	// units refer to each other (dwz, LTO).
	whole int64
}

// defaultLimits are generous for any real Ruby (libruby 3.4's largest
// compilation unit is a few MiB, its .debug_str about 2 MiB).
var defaultLimits = dwarfLimits{section: 64 << 20, unit: 64 << 20, info: 2 << 30, whole: 512 << 20}

// debugSections finds the DWARF sections of f by canonical name
// (".debug_info"), whether stored plain, SHF_COMPRESSED or as legacy
// ".zdebug_*".
func debugSections(f *elf.File) map[string]*elf.Section {
	m := map[string]*elf.Section{}
	for _, s := range f.Sections {
		name := s.Name
		switch {
		case strings.HasPrefix(name, ".debug_"):
		case strings.HasPrefix(name, ".zdebug_"):
			name = ".debug_" + strings.TrimPrefix(name, ".zdebug_")
			if _, ok := m[name]; ok {
				continue // a plain copy wins
			}
		default:
			continue
		}
		if s.Type == elf.SHT_NOBITS {
			continue
		}
		m[name] = s
	}
	return m
}

// openSection returns a reader of s's uncompressed bytes and their declared
// size, refusing sizes above max.
func openSection(s *elf.Section, max int64) (io.Reader, int64, error) {
	var (
		r    io.Reader
		size int64
	)
	switch {
	case strings.HasPrefix(s.Name, ".zdebug_"):
		raw := io.NewSectionReader(s.ReaderAt, 0, int64(s.FileSize))
		var hdr [12]byte
		if _, err := io.ReadFull(raw, hdr[:]); err != nil {
			return nil, 0, fmt.Errorf("read %s header: %w", s.Name, err)
		}
		if string(hdr[:4]) != "ZLIB" {
			return nil, 0, fmt.Errorf("%s: no ZLIB header", s.Name)
		}
		u := binary.BigEndian.Uint64(hdr[4:])
		if u > uint64(max) {
			return nil, 0, fmt.Errorf("%s: declared size %d exceeds the %d-byte cap", s.Name, u, max)
		}
		zr, err := zlib.NewReader(raw)
		if err != nil {
			return nil, 0, fmt.Errorf("decompress %s: %w", s.Name, err)
		}
		r, size = zr, int64(u)
	case s.Flags&elf.SHF_COMPRESSED != 0:
		// debug/elf parsed the compression header: Size is the
		// uncompressed size it declares; Open decompresses zlib or zstd
		// as it is read.
		if s.Size > uint64(max) {
			return nil, 0, fmt.Errorf("%s: declared size %d exceeds the %d-byte cap", s.Name, s.Size, max)
		}
		r, size = s.Open(), int64(s.Size)
	default:
		if s.Size > uint64(max) {
			return nil, 0, fmt.Errorf("%s: size %d exceeds the %d-byte cap", s.Name, s.Size, max)
		}
		r, size = io.NewSectionReader(s.ReaderAt, 0, int64(s.Size)), int64(s.Size)
	}
	// Never read more than declared, whatever the stream holds.
	return io.LimitReader(r, size), size, nil
}

// loadSection reads a whole section (nil when absent), checking that its
// content has exactly the declared size.
func loadSection(secs map[string]*elf.Section, name string, lim dwarfLimits) ([]byte, error) {
	s := secs[name]
	if s == nil {
		return nil, nil
	}
	return readSection(s, lim)
}

// readSection reads section s whole (decompressed), within lim.
func readSection(s *elf.Section, lim dwarfLimits) ([]byte, error) {
	r, size, err := openSection(s, lim.section)
	if err != nil {
		return nil, err
	}
	data, err := readAppend(r, size, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", s.Name, err)
	}
	return data, nil
}

// exactAlloc is how much of a declared size readAppend allocates at once:
// real sections and units are read into one buffer of their exact size,
// with no copies as it grows, while a lying size (a corrupt or hostile
// file) costs at most this much beyond the data really present.
const exactAlloc = 16 << 20

// readAppend appends exactly n bytes from r to buf, growing the buffer
// only as data arrives beyond exactAlloc, so that a lying size costs no
// more memory than the data really present plus exactAlloc.
func readAppend(r io.Reader, n int64, buf []byte) ([]byte, error) {
	if first := min(n, exactAlloc); int64(cap(buf)-len(buf)) < first {
		nb := make([]byte, len(buf), int64(len(buf))+first)
		copy(nb, buf)
		buf = nb
	}
	for read := int64(0); read < n; {
		// Past exactAlloc, read in chunks that double: a lying size
		// costs at most twice the data really present.
		want := n - read
		if chunk := max64(64<<10, int64(len(buf))); want > chunk {
			want = chunk
		}
		if int64(cap(buf)-len(buf)) < want {
			nb := make([]byte, len(buf), int64(len(buf))+max64(want, int64(len(buf))))
			copy(nb, buf)
			buf = nb
		}
		got, err := io.ReadFull(r, buf[len(buf):int64(len(buf))+want])
		buf = buf[:len(buf)+got]
		read += int64(got)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("data ends after %d of %d declared bytes", read, n)
			}
			return nil, err
		}
	}
	return buf, nil
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// unitStream yields the compilation units of .debug_info one at a time,
// decompressing as it goes, so that at most one unit is in memory.
type unitStream struct {
	r    io.Reader
	left int64 // declared bytes not yet consumed
	lim  dwarfLimits
	buf  []byte
	off  int64 // section offset of the next unit
}

func newUnitStream(s *elf.Section, lim dwarfLimits) (*unitStream, error) {
	r, size, err := openSection(s, lim.info)
	if err != nil {
		return nil, err
	}
	return &unitStream{r: r, left: size, lim: lim}, nil
}

// next returns the next unit's bytes (header included, valid until the
// following call) and its offset in the section, or io.EOF at the end.
func (u *unitStream) next() ([]byte, int64, error) {
	if u.left == 0 {
		return nil, 0, io.EOF
	}
	var hdr [12]byte
	if u.left < 4 {
		return nil, 0, fmt.Errorf(".debug_info: %d trailing bytes at offset %d", u.left, u.off)
	}
	if _, err := io.ReadFull(u.r, hdr[:4]); err != nil {
		return nil, 0, fmt.Errorf("read unit header at %d: %w", u.off, err)
	}
	n := uint64(binary.LittleEndian.Uint32(hdr[:4]))
	hlen := int64(4)
	if n == 0xffffffff {
		if u.left < 12 {
			return nil, 0, fmt.Errorf(".debug_info: truncated 64-bit unit header at %d", u.off)
		}
		if _, err := io.ReadFull(u.r, hdr[4:12]); err != nil {
			return nil, 0, fmt.Errorf("read unit header at %d: %w", u.off, err)
		}
		n = binary.LittleEndian.Uint64(hdr[4:12])
		hlen = 12
	} else if n >= 0xfffffff0 {
		return nil, 0, fmt.Errorf(".debug_info: reserved unit length %#x at %d", n, u.off)
	}
	if n < 7 {
		// Shorter than any unit header: a corrupt or decompression-bomb
		// stream, which would otherwise yield millions of empty units.
		return nil, 0, fmt.Errorf(".debug_info: unit at %d declares only %d bytes", u.off, n)
	}
	if n > uint64(u.lim.unit) || n > uint64(u.left-hlen) {
		return nil, 0, fmt.Errorf(".debug_info: unit at %d declares %d bytes (%d left, cap %d)", u.off, n, u.left-hlen, u.lim.unit)
	}
	total := hlen + int64(n)
	buf, err := readAppend(u.r, int64(n), append(u.buf[:0], hdr[:hlen]...))
	if err != nil {
		return nil, 0, fmt.Errorf("read unit at %d: %w", u.off, err)
	}
	u.buf = buf
	off := u.off
	u.off += total
	u.left -= total
	return u.buf, off, nil
}

// HasDWARF reports whether f carries DWARF debug information (a
// .debug_info and a .debug_abbrev section, plain or compressed).
func HasDWARF(f *elf.File) bool {
	secs := debugSections(f)
	return secs[".debug_info"] != nil && secs[".debug_abbrev"] != nil
}

var errShortBuffer = errors.New("short buffer")

// uleb decodes an unsigned LEB128 number.
func uleb(b []byte) (uint64, error) {
	var v uint64
	var shift uint
	for i, c := range b {
		if shift >= 64 {
			return 0, errors.New("LEB128 overflow")
		}
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			_ = i
			return v, nil
		}
		shift += 7
	}
	return 0, errShortBuffer
}
