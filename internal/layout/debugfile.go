package layout

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/rbscope/rbscope/internal/dwarfstruct"
	"github.com/rbscope/rbscope/internal/elfx"
)

// SystemDebugRoot is where distributions install separate debug files.
const SystemDebugRoot = "/usr/lib/debug"

// DefaultDebugRoots returns the directories searched for separate debug
// files: the colon-separated entries of RBSCOPE_DEBUG_ROOT, then
// /usr/lib/debug.
func DefaultDebugRoots() []string {
	var roots []string
	for _, r := range strings.Split(os.Getenv("RBSCOPE_DEBUG_ROOT"), ":") {
		if r != "" {
			roots = append(roots, r)
		}
	}
	return append(roots, SystemDebugRoot)
}

// WithDefaultDebugRoots returns roots followed by DefaultDebugRoots(),
// each directory once.
func WithDefaultDebugRoots(roots []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range append(append([]string(nil), roots...), DefaultDebugRoots()...) {
		if r != "" && !seen[filepath.Clean(r)] {
			seen[filepath.Clean(r)] = true
			out = append(out, r)
		}
	}
	return out
}

// DebugFileQuery names a binary whose separate debug file is wanted.
type DebugFileQuery struct {
	// Path is the binary's path as the target names it; debuglink
	// lookups under a root use its directory.
	Path string
	// HostPath is where this process can open the binary (may equal
	// Path); "next to the file" lookups use its directory.
	HostPath string
	// BuildID is the binary's GNU build id in hex ("" when it has none).
	BuildID string
	// DebugLink and DebugLinkCRC come from its .gnu_debuglink ("" when
	// absent).
	DebugLink    string
	DebugLinkCRC uint32
}

// QueryFromELF fills a DebugFileQuery from the binary r.
func QueryFromELF(r io.ReaderAt, path, hostPath string) (DebugFileQuery, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return DebugFileQuery{}, fmt.Errorf("parse ELF %s: %w", path, err)
	}
	q := DebugFileQuery{Path: path, HostPath: hostPath, BuildID: elfBuildID(f)}
	q.DebugLink, q.DebugLinkCRC = debugLink(f)
	return q, nil
}

// FindDebugFile looks for the separate debug file of q's binary, in this
// order: <root>/.build-id/xx/yyyy.debug for each root; then the
// .gnu_debuglink name next to the binary, in .debug/ beside it, and under
// <root>/<directory of Path> for each root, accepting only a file whose
// CRC32 matches the link's. A candidate must carry DWARF. It returns the
// file found ("" if none) and every place it looked, with the reason a
// present candidate was rejected.
func FindDebugFile(q DebugFileQuery, roots []string) (string, []string) {
	var tried []string
	if id := q.BuildID; len(id) > 2 && isHex(id) {
		for _, root := range roots {
			p := filepath.Join(root, ".build-id", id[:2], id[2:]+".debug")
			ok, why := usableDebugFile(p, func(f *elf.File, _ *os.File) string {
				if got := elfBuildID(f); got != "" && got != id {
					return "build id " + got
				}
				return ""
			})
			if ok {
				return p, append(tried, p)
			}
			tried = append(tried, p+why)
		}
	}
	if q.DebugLink != "" && !strings.Contains(q.DebugLink, "/") {
		host := q.HostPath
		if host == "" {
			host = q.Path
		}
		cands := []string{
			filepath.Join(filepath.Dir(host), q.DebugLink),
			filepath.Join(filepath.Dir(host), ".debug", q.DebugLink),
		}
		for _, root := range roots {
			cands = append(cands, filepath.Join(root, filepath.Dir(q.Path), q.DebugLink))
		}
		for _, p := range cands {
			if same(p, host) {
				continue
			}
			ok, why := usableDebugFile(p, func(_ *elf.File, fh *os.File) string {
				crc, err := fileCRC(fh)
				if err != nil {
					return "CRC: " + err.Error()
				}
				if crc != q.DebugLinkCRC {
					return fmt.Sprintf("CRC %08x, link wants %08x", crc, q.DebugLinkCRC)
				}
				return ""
			})
			if ok {
				return p, append(tried, p)
			}
			tried = append(tried, p+why)
		}
	}
	return "", tried
}

// usableDebugFile opens p and reports whether it is an ELF file with DWARF
// that check accepts; otherwise why not, as " (reason)", or "" when p does
// not exist.
func usableDebugFile(p string, check func(*elf.File, *os.File) string) (bool, string) {
	fh, err := os.Open(p)
	if err != nil {
		if os.IsNotExist(err) {
			return false, ""
		}
		return false, " (" + err.Error() + ")"
	}
	defer fh.Close()
	f, err := elf.NewFile(fh)
	if err != nil {
		return false, " (not ELF)"
	}
	if !dwarfstruct.HasDWARF(f) {
		return false, " (no DWARF)"
	}
	if why := check(f, fh); why != "" {
		return false, " (" + why + ")"
	}
	return true, ""
}

func same(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// fileCRC is the CRC32 (IEEE) of the whole file, as .gnu_debuglink uses.
func fileCRC(fh *os.File) (uint32, error) {
	h := crc32.NewIEEE()
	if _, err := io.Copy(h, io.NewSectionReader(fh, 0, 1<<62)); err != nil {
		return 0, err
	}
	return h.Sum32(), nil
}

func isHex(s string) bool {
	if len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// elfBuildID returns f's GNU build id in hex, or "".
func elfBuildID(f *elf.File) string {
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOTE || s.Size > 1<<16 {
			continue
		}
		data, err := s.Data()
		if err != nil {
			continue
		}
		if id := elfx.BuildIDFromNotes(data); id != "" {
			return id
		}
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE || p.Filesz > 1<<16 {
			continue
		}
		data, err := io.ReadAll(p.Open())
		if err != nil {
			continue
		}
		if id := elfx.BuildIDFromNotes(data); id != "" {
			return id
		}
	}
	return ""
}

// debugLink returns the file name and CRC of f's .gnu_debuglink.
func debugLink(f *elf.File) (string, uint32) {
	s := f.Section(".gnu_debuglink")
	if s == nil || s.Size > 4096 {
		return "", 0
	}
	data, err := s.Data()
	if err != nil {
		return "", 0
	}
	n := 0
	for n < len(data) && data[n] != 0 {
		n++
	}
	off := (n + 4) &^ 3
	if n == 0 || off+4 > len(data) {
		return "", 0
	}
	return string(data[:n]), binary.LittleEndian.Uint32(data[off:])
}

// altLink returns the file name and build id (hex) of f's
// .gnu_debugaltlink: the dwz supplementary file holding the DWARF that
// several binaries share.
func altLink(f *elf.File) (string, string) {
	s := f.Section(".gnu_debugaltlink")
	if s == nil || s.Size > 4096 {
		return "", ""
	}
	data, err := s.Data()
	if err != nil {
		return "", ""
	}
	n := 0
	for n < len(data) && data[n] != 0 {
		n++
	}
	if n == 0 || n+1 >= len(data) {
		return "", ""
	}
	return string(data[:n]), hex.EncodeToString(data[n+1:])
}

// FindAltFile looks for the dwz supplementary file of the DWARF file at
// path: the .gnu_debugaltlink name (absolute, or relative to path's
// directory, also under each root), then <root>/.build-id/xx/yyyy.debug by
// its build id. It returns "" when path has no altlink or none is found.
func FindAltFile(path string, roots []string) (string, []string) {
	fh, err := os.Open(path)
	if err != nil {
		return "", nil
	}
	defer fh.Close()
	f, err := elf.NewFile(fh)
	if err != nil {
		return "", nil
	}
	name, id := altLink(f)
	if name == "" {
		return "", nil
	}
	var cands []string
	if filepath.IsAbs(name) {
		cands = append(cands, name)
		for _, root := range roots {
			if root != SystemDebugRoot {
				cands = append(cands, filepath.Join(root, name))
			}
		}
	} else {
		cands = append(cands, filepath.Join(filepath.Dir(path), name))
	}
	if len(id) > 2 {
		for _, root := range roots {
			cands = append(cands, filepath.Join(root, ".build-id", id[:2], id[2:]+".debug"))
		}
	}
	var tried []string
	for _, p := range cands {
		ok, why := usableDebugFile(p, buildIDCheck(id))
		if ok {
			return p, append(tried, p)
		}
		tried = append(tried, p+why)
	}
	return "", tried
}

// FileRubyVersion returns the ruby_version string ("3.3.8") that libruby
// and a static ruby export, read from the ELF file r: from .dynsym, and
// from .symtab only when .dynsym lacks it (a large table in a build with
// debug info). It returns "" when the file has no such symbol. The tables
// are searched in place, without building a Go value per symbol.
func FileRubyVersion(r io.ReaderAt) string {
	f, err := elf.NewFile(r)
	if err != nil {
		return ""
	}
	for _, tab := range []elf.SectionType{elf.SHT_DYNSYM, elf.SHT_SYMTAB} {
		if v, ok := symbolValue(f, tab, "ruby_version"); ok {
			for _, s := range f.Sections {
				if s.Type != elf.SHT_PROGBITS || v < s.Addr || v >= s.Addr+s.Size {
					continue
				}
				var buf [32]byte
				n, _ := s.ReadAt(buf[:], int64(v-s.Addr))
				if i := bytes.IndexByte(buf[:n], 0); i > 0 {
					return string(buf[:i])
				}
			}
		}
	}
	return ""
}

// symbolValue finds the defined symbol name in f's first symbol table of
// type typ (64-bit little-endian entries) and returns its value.
func symbolValue(f *elf.File, typ elf.SectionType, name string) (uint64, bool) {
	if f.Class != elf.ELFCLASS64 || f.ByteOrder != binary.LittleEndian {
		return 0, false
	}
	for _, s := range f.Sections {
		if s.Type != typ || s.Link >= uint32(len(f.Sections)) || s.Size > 64<<20 {
			continue
		}
		strs := f.Sections[s.Link]
		if strs.Size > 64<<20 {
			return 0, false
		}
		syms, err := s.Data()
		if err != nil {
			return 0, false
		}
		names, err := strs.Data()
		if err != nil {
			return 0, false
		}
		want := []byte(name)
		for i := 0; i+24 <= len(syms); i += 24 {
			e := syms[i : i+24]
			off := uint64(binary.LittleEndian.Uint32(e))
			shndx := binary.LittleEndian.Uint16(e[6:])
			if shndx == uint16(elf.SHN_UNDEF) || off+uint64(len(want)) >= uint64(len(names)) {
				continue
			}
			if names[off+uint64(len(want))] == 0 && bytes.Equal(names[off:off+uint64(len(want))], want) {
				return binary.LittleEndian.Uint64(e[8:]), true
			}
		}
		return 0, false
	}
	return 0, false
}
