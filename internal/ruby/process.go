// Package ruby finds the Ruby VM inside a process image (live or core) and
// walks every Ruby thread's control frames into named stack frames. One
// walker serves every Ruby version from 1.9 to 4.0; struct offsets come
// from a layout.Layout (DWARF or built-in tables) and small version
// predicates cover the places where Ruby's logic, not only its offsets,
// changed.
package ruby

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/target"
)

// Options tunes Open (Spec).
type Options struct {
	// Hints are addresses already known (from a core dump's manifest, say):
	// "ruby_current_vm_ptr", "ruby_current_thread",
	// "ruby_current_execution_context_ptr", "ruby_global_symbols".
	Hints map[string]uint64
	// Version overrides version detection ("3.1.2").
	Version string
	// NoSymbols ignores symbol tables and finds the VM by scanning memory.
	NoSymbols bool
	// DebugRoots are extra directories searched for separate debug files.
	DebugRoots []string
	// NoDWARF uses only the built-in layout tables.
	NoDWARF bool
	// Layout, when set, is used instead of looking one up.
	Layout *layout.Layout
	// LayoutCandidates, when set, are tried in order instead of looking a
	// layout up; the first whose reading of the process passes the checks
	// of validateLayout is used (tests of that choice).
	LayoutCandidates []*layout.Layout
	// Runtimes, when set, shares symbols, version and layout with the
	// other processes of the same Ruby build (see Runtimes).
	Runtimes *Runtimes

	// nextInsnLines reports the line of the instruction after the pc
	// instead of the one being executed. Ruby's own backtraces use the
	// executing one; rbspy's 2.6+ walker reports the next one, and the
	// shared core-dump manifests were written by rbspy. Tests only.
	nextInsnLines bool
}

// ErrNotRuby is returned when the process does not look like Ruby.
var ErrNotRuby = errors.New("not a Ruby process")

// ErrNoThread is SnapshotThread's error when no Ruby thread runs on the
// native thread it names.
var ErrNoThread = errors.New("no Ruby thread on that native thread")

// Binary describes one Ruby binary found in the target.
type Binary struct {
	Path      string `json:"path"`
	Base      uint64 `json:"base"`
	Bias      uint64 `json:"bias"`
	BuildID   string `json:"build_id,omitempty"`
	SymSource string `json:"symbol_source"` // "file .dynsym+.symtab", "memory .dynsym", "none"
	HasSymtab bool   `json:"has_symtab"`
	// FileError says why the binary's file could not be read (replaced
	// on disk since the process mapped it, say): symbols then come from
	// the image in memory and the layout from the built-in tables.
	FileError string `json:"file_error,omitempty"`
}

// Info says what Open found and how.
type Info struct {
	Version        string            `json:"ruby_version"`
	VersionSource  string            `json:"version_source"`
	Binaries       []Binary          `json:"binaries"`
	Addresses      map[string]uint64 `json:"addresses"`
	AddressSources map[string]string `json:"address_sources"`
	LayoutSource   string            `json:"layout_source"`
	// GVLSource says where GVL ownership is read from; GCSource where the
	// GC flags are (dwarf, scan, or none with the reason).
	GVLSource string `json:"gvl_source"`
	GCSource  string `json:"gc_source"`
}

// Process is a Ruby process whose VM has been located.
type Process struct {
	t    target.Target
	r    *reader
	opts Options

	rt   *Runtime // the build's facts (nil until versionAndLayout)
	w    *walker  // takes the snapshots
	n    *namer   // names the frames
	act  activityOffsets
	info Info

	syms []symSource

	vmAddr      uint64 // rb_vm_t* (0 before it is known)
	vmPtrAddr   uint64 // &ruby_current_vm_ptr
	ecPtrAddr   uint64 // &ruby_current_execution_context_ptr (2.5-2.7)
	thPtrAddr   uint64 // &ruby_current_thread (< 2.5)
	symbolsAddr uint64 // &ruby_global_symbols

	caches
}

type symSource struct {
	bin  Binary
	syms elfx.Symbols
}

func v(major, minor, patch int) int { return major*10000 + minor*100 + patch }

func parseVer(s string) int {
	s = strings.SplitN(s, "-", 2)[0]
	parts := strings.Split(s, ".")
	if len(parts) < 3 {
		return 0
	}
	var n [3]int
	for i := 0; i < 3; i++ {
		x, err := strconv.Atoi(parts[i])
		if err != nil {
			return 0
		}
		n[i] = x
	}
	return v(n[0], n[1], n[2])
}

// newProcess returns the Process of target t before Open has found
// anything in it.
func newProcess(t target.Target, opts Options) *Process {
	p := &Process{t: t, r: &reader{t: t}, opts: opts}
	p.w, p.n = &walker{Process: p}, &namer{Process: p}
	p.info.Addresses = map[string]uint64{}
	p.info.AddressSources = map[string]string{}
	p.caches.init()
	return p
}

// openTarget locates the Ruby VM in t, whose memory changes while it is
// read or not as c says (a live process does unless the caller pauses it
// for a snapshot: SnapshotWith).
func openTarget(t target.Target, opts Options, c Consistency) (*Process, error) {
	p := newProcess(t, opts)
	p.stoppedAll = c == Stopped
	p.w.stopped = p.stoppedAll
	op := &opener{p}
	if err := op.findBinaries(); err != nil {
		return nil, err
	}
	if err := op.versionAndLayout(); err != nil {
		return nil, err
	}
	if err := op.openLayout(); err != nil {
		return nil, err
	}
	p.ensureGCCount()
	op.resolveActivity()
	return p, nil
}

// Version is the Ruby version ("3.1.2").
func (p *Process) Version() string { return p.rt.version }

// LayoutSource says where struct offsets came from.
func (p *Process) LayoutSource() string { return p.rt.lay.Source }

// Layout returns the struct layout in use.
func (p *Process) Layout() *layout.Layout { return p.rt.lay }

// Target returns the process image.
func (p *Process) Target() target.Target { return p.t }

// Info says what Open found and how.
func (p *Process) Info() Info { return p.info }

// findBinaries finds libruby and the ruby executable among the mappings
// and reads their symbols, from the files when they can be opened and
// from the images in memory otherwise.
func (p *opener) findBinaries() error {
	maps, err := p.t.Mappings()
	if err != nil {
		return fmt.Errorf("read mappings: %w", err)
	}
	var paths []string
	seen := map[string]bool{}
	for _, m := range maps {
		if m.Path != "" && IsLibRuby(m.Path) && !seen[m.Path] {
			seen[m.Path] = true
			paths = append(paths, m.Path)
		}
	}
	exe := p.t.Executable()
	if exe != "" && !seen[exe] {
		seen[exe] = true
		paths = append(paths, exe)
	}
	for _, path := range paths {
		base, off, ok := firstMapping(maps, path)
		if !ok {
			continue
		}
		bin := Binary{Path: path, Base: base}
		var syms elfx.Symbols
		var ferr error
		eb, memID := p.sharedBinary(base, off)
		if eb != nil {
			// Another process of this build read the file already.
			bin.Bias = eb.LoadBias(base, off)
			bin.BuildID = eb.BuildID
			bin.HasSymtab = eb.HasSymtab
			bin.SymSource = "file .dynsym (shared)"
			if eb.HasSymtab {
				bin.SymSource = "file .dynsym+.symtab (shared)"
			}
			syms = biased{eb.Symbols, bin.Bias}
		} else if f, err := p.t.OpenFile(path); err != nil {
			p.opts.Runtimes.keepBinary(memID, nil)
			ferr = err
			// The process's own image in memory still holds the
			// dynamic symbols; the file's error says why not more.
			bin.FileError = ferr.Error()
		} else {
			p.opts.Runtimes.countSymbolLoad()
			eb, err := elfx.Open(f)
			if err != nil {
				p.opts.Runtimes.keepBinary(memID, nil)
			} else {
				p.opts.Runtimes.keepBinary(memID, eb)
				bin.Bias = eb.LoadBias(base, off)
				bin.BuildID = eb.BuildID
				bin.HasSymtab = eb.HasSymtab
				bin.SymSource = "file .dynsym"
				if eb.HasSymtab {
					bin.SymSource = "file .dynsym+.symtab"
				}
				syms = biased{eb.Symbols, bin.Bias}
			}
			f.Close()
		}
		if syms == nil && off == 0 {
			if img, err := readMemoryImage(p.t, base); err == nil {
				bin.Bias = img.bias
				bin.BuildID = img.buildID
				bin.SymSource = "memory .dynsym"
				syms = img.syms
			}
		}
		if syms == nil {
			bin.SymSource = "none"
			if target.IsReplaced(ferr) {
				return fmt.Errorf("read the symbols of %s: %w", path, ferr)
			}
		}
		if path == exe && len(paths) == 1 && !LooksLikeRuby(path, syms) {
			return fmt.Errorf("%w: %s maps no libruby and has no Ruby symbols", ErrNotRuby, exe)
		}
		p.info.Binaries = append(p.info.Binaries, bin)
		if syms != nil {
			p.syms = append(p.syms, symSource{bin: bin, syms: syms})
		}
	}
	return nil
}

func firstMapping(maps []target.Mapping, path string) (start, off uint64, ok bool) {
	// Ruby's crash reporter maps each binary a second time, whole and
	// read-only, to print its C backtrace; the loader's mapping is the one
	// at offset 0 that the file's next segment directly follows.
	for i, m := range maps {
		if m.Path == path && m.Offset == 0 && i+1 < len(maps) &&
			maps[i+1].Path == path && maps[i+1].Start == m.End && maps[i+1].Offset > 0 {
			return m.Start, 0, true
		}
	}
	for _, m := range maps {
		if m.Path == path {
			if !ok || m.Offset < off {
				start, off, ok = m.Start, m.Offset, true
			}
			if m.Offset == 0 {
				return m.Start, 0, true
			}
		}
	}
	return start, off, ok
}

// biased adds a load bias to link-time symbol values.
type biased struct {
	t    elfx.Symbols
	bias uint64
}

func (b biased) Lookup(name string) (elfx.Symbol, bool) {
	s, ok := b.t.Lookup(name)
	if ok && !s.TLS {
		s.Value += b.bias
	}
	return s, ok
}

// symbol returns the run-time address of a data symbol, from the hints or
// the symbol tables.
func (p *Process) symbol(name string) (uint64, bool) {
	if a, ok := p.opts.Hints[name]; ok && a != 0 {
		p.note(name, a, "hint")
		return a, true
	}
	if p.opts.NoSymbols {
		return 0, false
	}
	for _, s := range p.syms {
		if sym, ok := s.syms.Lookup(name); ok && sym.Value != 0 && !sym.TLS {
			p.note(name, sym.Value, "symbol in "+filepath.Base(s.bin.Path))
			return sym.Value, true
		}
	}
	return 0, false
}

func (p *Process) note(name string, addr uint64, src string) {
	p.info.Addresses[name] = addr
	p.info.AddressSources[name] = src
}

var versionRe = regexp.MustCompile(`ruby (\d+\.\d+\.\d+)(?:p\d+|dev|preview\d+|rc\d+)? \(`)
var pathVersionRe = regexp.MustCompile(`(?:versions|rubies|Ruby)/(?:ruby-)?(\d+\.\d+\.\d+)|/ruby-(\d+\.\d+\.\d+)/`)
var libVersionRe = regexp.MustCompile(`libruby[-.](?:so\.)?(\d+\.\d+\.\d+)`)

// detectVersion tells the Ruby version of the process and how it was told.
func (p *opener) detectVersion() (version, source string, err error) {
	if p.opts.Version != "" {
		return p.opts.Version, "option", nil
	}
	if a, ok := p.symbol("ruby_version"); ok {
		if s, err := p.r.cString(a, 32); err == nil && parseVer(s) != 0 {
			return s, "ruby_version symbol", nil
		}
	}
	if a, ok := p.symbol("ruby_description"); ok {
		if s, err := p.r.cString(a, 256); err == nil {
			if m := versionRe.FindStringSubmatch(s + " ("); m != nil {
				return m[1], "ruby_description symbol", nil
			}
		}
	}
	// Stripped: look for the description string in the binaries' files.
	for _, b := range p.info.Binaries {
		if s := p.scanFileForVersion(b.Path); s != "" {
			return s, "description string in " + filepath.Base(b.Path), nil
		}
		if m := libVersionRe.FindStringSubmatch(b.Path); m != nil {
			return m[1], "file name " + filepath.Base(b.Path), nil
		}
	}
	// Last resort: a version in the path of a mapped Ruby file
	// (~/.rbenv/versions/2.5.0/bin/ruby, /opt/ruby-2.7.2/lib/libruby.so).
	if len(p.info.Binaries) > 0 {
		if maps, err := p.t.Mappings(); err == nil {
			for _, m := range maps {
				if mm := pathVersionRe.FindStringSubmatch(m.Path); mm != nil {
					return mm[1], "path " + m.Path + " (the patch level may differ)", nil
				}
			}
		}
	}
	if len(p.info.Binaries) == 0 {
		return "", "", fmt.Errorf("%w: no ruby executable or libruby is mapped (executable %s)", ErrNotRuby, p.t.Executable())
	}
	return "", "", fmt.Errorf("%w: cannot tell the Ruby version of %s (no ruby_version symbol or description string); pass --ruby-version",
		ErrNotRuby, p.t.Executable())
}

// scanFileForVersion searches a binary for Ruby's description string
// ("ruby 3.1.2p20 (2022-04-12 ...") in bounded chunks.
func (p *opener) scanFileForVersion(path string) string {
	f, err := p.t.OpenFile(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const chunk = 1 << 20
	const maxScan = 256 << 20
	buf := make([]byte, chunk+64)
	for off := int64(0); off < maxScan && off < f.Size(); off += chunk {
		n, _ := f.ReadAt(buf, off)
		if n <= 0 {
			break
		}
		if m := versionRe.FindSubmatch(buf[:n]); m != nil {
			return string(m[1])
		}
	}
	return ""
}

// loadLayout makes the Runtime of a process of the given version: its
// layout from the caller's Options or looked up (see resolveLayout).
func (p *opener) loadLayout(version, source string) (*Runtime, error) {
	version = strings.TrimSpace(version)
	l := p.opts.Layout
	if l == nil {
		var err error
		if l, err = resolveLayout(p.Process, version); err != nil {
			return nil, err
		}
	}
	return newRuntime(version, source, l)
}

// resolveLayout finds the layout for the process: from DWARF in a Ruby
// binary or its separate debug file when there is one, completed field by
// field from the built-in table; else the built-in table.
//
// For a process in a container, files beside a binary (a debug file by
// its .gnu_debuglink) are looked for in the container's tree, and the
// container's /usr/lib/debug is searched after the given roots and
// before this host's.
func resolveLayout(p *Process, version string) (*layout.Layout, error) {
	var bins []layout.BinaryInfo
	roots := p.opts.DebugRoots
	root := p.t.FileRoot()
	if root != "" {
		roots = append(append([]string(nil), roots...), filepath.Join(root, layout.SystemDebugRoot))
	}
	for _, b := range p.info.Binaries {
		b := b
		host := ""
		if root != "" {
			host = filepath.Join(root, filepath.Clean("/"+b.Path))
		}
		bins = append(bins, layout.BinaryInfo{
			Path:     b.Path,
			HostPath: host,
			BuildID:  b.BuildID,
			Open: func() (io.ReaderAt, io.Closer, error) {
				f, err := p.t.OpenFile(b.Path)
				if err != nil {
					return nil, nil, err
				}
				return f, f, nil
			},
		})
	}
	l, err := layout.Resolve(bins, version, layout.ResolveOptions{
		DebugRoots: roots,
		NoDWARF:    p.opts.NoDWARF,
	})
	if err != nil {
		return nil, fmt.Errorf("choose struct layout: %w", err)
	}
	return l, nil
}

// Runtime returns the facts of the process's Ruby build, shared with the
// other processes of that build opened with the same Runtimes.
func (p *Process) Runtime() *Runtime { return p.rt }
