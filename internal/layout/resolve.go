package layout

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/rbscope/rbscope/internal/dwarfstruct"
)

// BinaryInfo names one binary of a Ruby process (libruby, the executable)
// for Resolve.
type BinaryInfo struct {
	// Path is the binary's path as the target names it.
	Path string
	// Open opens the binary's bytes; when nil, HostPath (or Path) is
	// opened from this host's file system.
	Open func() (io.ReaderAt, io.Closer, error)
	// HostPath is where this process finds the binary (for a process in
	// a container, under /proc/PID/root); "" means Path.
	HostPath string
	// BuildID is the binary's GNU build id in hex; read from the binary
	// when "".
	BuildID string
}

// ResolveOptions tunes Resolve.
type ResolveOptions struct {
	// DebugRoots are searched for separate debug files before
	// DefaultDebugRoots() ($RBSCOPE_DEBUG_ROOT, /usr/lib/debug).
	DebugRoots []string
	// CacheDir holds extracted layouts by build id; "" means
	// DefaultCacheDir().
	CacheDir string
	// NoCache neither reads nor writes the cache.
	NoCache bool
	// NoDWARF skips DWARF and returns the built-in table.
	NoDWARF bool
}

// coreStructs are the structs a DWARF layout must define to be used: one
// without them (an executable whose DWARF covers only main.c) says
// nothing about the VM.
var coreStructs = []string{"rb_execution_context_struct", "rb_control_frame_struct"}

// dwarfExtractions counts DWARF reads by Resolve, for tests of the cache.
var dwarfExtractions atomic.Int64

// DWARFExtractions returns how many times Resolve has read DWARF in this
// process (cache hits do not count).
func DWARFExtractions() int64 { return dwarfExtractions.Load() }

// Resolve returns the layout of a Ruby build: from the DWARF of the first
// of bins that has it (the structs NeededStructs(rubyVersion) names:
// reading stops once they are all found) (in the binary itself, then in a separate debug
// file), completed field by field from the built-in table for rubyVersion
// (fields taken from the table say so in Field.Source); otherwise the
// built-in table. Layouts read from DWARF are cached by build id, so a
// later run reads no DWARF.
func Resolve(bins []BinaryInfo, rubyVersion string, opts ResolveOptions) (*Layout, error) {
	builtin, berr := Builtin(rubyVersion)
	if opts.NoDWARF {
		return builtin, berr
	}
	roots := WithDefaultDebugRoots(opts.DebugRoots)
	cacheDir := opts.CacheDir
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	// Downloaded debug files are kept even when layouts are not cached.
	dlDir := debuginfodDir(cacheDir)
	if opts.NoCache {
		cacheDir = ""
	}
	want := NeededStructs(rubyVersion)
	var notes []string
	for _, b := range bins {
		l, err := dwarfLayout(b, want, roots, cacheDir, dlDir)
		if err != nil {
			notes = append(notes, err.Error())
			continue
		}
		if !usable(l) {
			notes = append(notes, fmt.Sprintf("%s: DWARF lacks %s", l.Source, strings.Join(coreStructs, " and ")))
			continue
		}
		return complete(l, builtin, rubyVersion), nil
	}
	if berr != nil {
		if len(notes) > 0 {
			return nil, fmt.Errorf("%w; no usable DWARF either: %s", berr, strings.Join(notes, "; "))
		}
		return nil, berr
	}
	return builtin, nil
}

func usable(l *Layout) bool {
	for _, s := range coreStructs {
		if l.Has(s, "") {
			return true
		}
	}
	return false
}

// dwarfLayout returns the DWARF layout of one binary, from the cache or
// by extraction (and then caches it).
func dwarfLayout(b BinaryInfo, want, roots []string, cacheDir, dlDir string) (*Layout, error) {
	if b.BuildID != "" {
		if l := cacheLoad(cacheDir, b.BuildID, want); l != nil {
			return l, nil
		}
	}
	r, closer, err := openBinary(b)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	host := b.HostPath
	if host == "" {
		host = b.Path
	}
	q, err := QueryFromELF(r, b.Path, host)
	if err != nil {
		return nil, err
	}
	if b.BuildID != "" {
		q.BuildID = b.BuildID
	} else if l := cacheLoad(cacheDir, q.BuildID, want); l != nil {
		return l, nil
	}
	l, err := extractFor(r, q, roots, want, dlDir, usable)
	if err != nil {
		return nil, err
	}
	// A cache that cannot be written costs time on the next run, nothing
	// more: the error is dropped.
	_ = cacheStore(cacheDir, q.BuildID, want, l)
	return l, nil
}

// FromBinaryFile extracts the layouts of the structs named in want from
// the DWARF of the ELF file at path or, when it has none (or none of
// those structs), from its separate debug file found under roots (see
// FindDebugFile). Source names the file read. The error of a failed
// search lists where it looked.
func FromBinaryFile(path string, want []string, roots []string) (*Layout, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open binary: %w", err)
	}
	defer f.Close()
	return FromBinary(f, path, path, want, roots)
}

// FromBinary is FromBinaryFile for a binary already open as r (the file a
// process mapped, say), named path in the target's file system and
// hostPath on this host (where files beside it are looked for).
func FromBinary(r io.ReaderAt, path, hostPath string, want []string, roots []string) (*Layout, error) {
	q, err := QueryFromELF(r, path, hostPath)
	if err != nil {
		return nil, err
	}
	return extractFor(r, q, roots, want, debuginfodDir(DefaultCacheDir()), func(l *Layout) bool { return len(l.Structs) > 0 })
}

// extractFor reads the layout from the binary's own DWARF, else from its
// separate debug file.
func extractFor(r io.ReaderAt, q DebugFileQuery, roots, want []string, dlDir string, ok func(*Layout) bool) (*Layout, error) {
	var own error
	if f, err := elf.NewFile(r); err == nil && dwarfstruct.HasDWARF(f) {
		dwarfExtractions.Add(1)
		l, err := FromDWARF(r, want)
		l, err = withAltFile(l, err, q.HostPath, want, roots)
		if err == nil && ok(l) {
			l.Source = "dwarf:" + q.Path
			return l, nil
		}
		own = err
	}
	dbg, tried := FindDebugFile(q, roots)
	if dbg == "" && q.BuildID != "" {
		if urls := DebuginfodURLs(); len(urls) > 0 {
			p, err := FetchDebuginfod(q.BuildID, urls, dlDir, debuginfodTimeout())
			if err == nil {
				dbg = p
			} else {
				tried = append(tried, err.Error())
			}
		}
	}
	if dbg == "" {
		msg := fmt.Sprintf("%s: no DWARF", q.Path)
		if own != nil {
			msg = fmt.Sprintf("%s: %v", q.Path, own)
		}
		if len(tried) == 0 {
			return nil, fmt.Errorf("%s and no debug file (no build id or .gnu_debuglink to look for)", msg)
		}
		return nil, fmt.Errorf("%s and no debug file (looked for %s)", msg, strings.Join(tried, ", "))
	}
	dwarfExtractions.Add(1)
	l, err := FromDWARFFile(dbg, want)
	return withAltFile(l, err, dbg, want, roots)
}

// withAltFile completes l, read from the DWARF file at path, from the dwz
// supplementary file that path's .gnu_debugaltlink names, when structs
// are missing (dwz moves types shared by several binaries there).
func withAltFile(l *Layout, err error, path string, want, roots []string) (*Layout, error) {
	if err != nil && !errors.Is(err, ErrNoDWARF) {
		return l, err
	}
	if l != nil && len(l.Structs) == len(want) {
		return l, nil
	}
	alt, tried := FindAltFile(path, roots)
	if alt == "" {
		if len(tried) > 0 && err != nil {
			return nil, fmt.Errorf("%w (its dwz file was not found: looked for %s)", err, strings.Join(tried, ", "))
		}
		return l, err
	}
	var missing []string
	for _, w := range want {
		if l == nil || !l.Has(w, "") {
			missing = append(missing, w)
		}
	}
	al, aerr := FromDWARFFile(alt, missing)
	if aerr != nil {
		if l == nil {
			return nil, fmt.Errorf("%s: %w", path, aerr)
		}
		return l, nil
	}
	if l == nil {
		al.Source = "dwarf:" + path
		return al, nil
	}
	for name, s := range al.Structs {
		l.Structs[name] = s
	}
	return l, nil
}

// debuginfodDir is where downloaded debug files are kept: in the layout
// cache, or in the temporary directory when there is none.
func debuginfodDir(cacheDir string) string {
	if cacheDir != "" {
		return filepath.Join(cacheDir, "debuginfod")
	}
	return filepath.Join(os.TempDir(), "rbscope-debuginfod")
}

func openBinary(b BinaryInfo) (io.ReaderAt, io.Closer, error) {
	if b.Open != nil {
		r, c, err := b.Open()
		if err != nil {
			return nil, nil, fmt.Errorf("open %s: %w", b.Path, err)
		}
		if c == nil {
			c = io.NopCloser(nil)
		}
		return r, c, nil
	}
	p := b.HostPath
	if p == "" {
		p = b.Path
	}
	if p == "" {
		return nil, nil, errors.New("binary has no path")
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, nil, fmt.Errorf("open binary: %w", err)
	}
	return f, f, nil
}

// complete copies the DWARF layout l and adds every struct and field of
// the built-in table that l lacks, marking them with the table's source.
func complete(l, builtin *Layout, rubyVersion string) *Layout {
	out := &Layout{RubyVersion: rubyVersion, Arch: l.Arch, Source: l.Source, Structs: map[string]Struct{}}
	for name, s := range l.Structs {
		fs := make(map[string]Field, len(s.Fields))
		for k, v := range s.Fields {
			fs[k] = v
		}
		out.Structs[name] = Struct{Size: s.Size, Align: s.Align, Fields: fs}
	}
	if builtin == nil {
		return out
	}
	for name, bs := range builtin.Structs {
		s, ok := out.Structs[name]
		if !ok {
			s = Struct{Size: bs.Size, Align: bs.Align, Fields: map[string]Field{}}
		}
		for k, f := range bs.Fields {
			if _, ok := s.Fields[k]; !ok {
				f.Source = builtin.Source
				s.Fields[k] = f
			}
		}
		out.Structs[name] = s
	}
	return out
}
