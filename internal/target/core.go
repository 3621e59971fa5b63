package target

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rbscope/rbscope/internal/elfx"
)

// CoreOptions configures OpenCore.
type CoreOptions struct {
	// Exe is the main executable on this machine. When set, it stands in
	// for the executable the core's process ran (for reads of pages the
	// core does not hold and for OpenFile of the executable's path).
	Exe string
	// SysRoot is the directory under which the files the process mapped
	// are looked up ("/" when empty), e.g. a copy of the machine's root
	// file system where the core was taken.
	SysRoot string
	// MaxDecompressed caps the size of a compressed core once
	// decompressed (DefaultMaxDecompressed when 0).
	MaxDecompressed int64
	// Progress, when set, is called every ProgressEvery
	// (DefaultProgressEvery when 0) while a compressed core is
	// decompressed, and once more when that ends; never for a
	// decompression that ends sooner.
	Progress      func(DecompressProgress)
	ProgressEvery time.Duration
}

// DefaultMaxDecompressed is the default cap on a decompressed core's size.
const DefaultMaxDecompressed = 4 << 30

// maxNoteBytes caps the total size of a core's notes (NT_FILE of a process
// with many mappings is the largest; a few MiB at most in practice).
const maxNoteBytes = 256 << 20

const (
	elfHeaderSize = 64
	progHeaderLen = 56
	etCore        = 4
	emX86_64      = 62
	ptLoad        = 1
	ptNote        = 4
	pnXNum        = 0xffff
	pfX           = 1
	pfW           = 2
	pfR           = 4
)

// segment is one PT_LOAD segment of the core.
type segment struct {
	vaddr, memsz uint64
	off          uint64 // file offset of the segment's bytes
	filesz       uint64 // bytes the header says the file holds
	avail        uint64 // bytes the file actually holds (< filesz when truncated)
	flags        uint32
}

// fileMapping is one NT_FILE entry.
type fileMapping struct {
	start, end, off uint64
	path            string
	deleted         bool // the kernel marked the path " (deleted)"
}

// hostFile is a mapped file opened on this machine (or why it could not be).
type hostFile struct {
	f    *os.File
	path string // where it was looked for
	err  error
}

// core is a Target backed by an ELF core file.
type core struct {
	name string // the core's path, for messages
	f    *os.File
	size int64
	opts CoreOptions

	segs  []segment     // sorted by vaddr
	files []fileMapping // sorted by start
	maps  []Mapping

	pid      int
	procName string
	args     string
	threads  []coreThread
	auxv     map[uint64]uint64
	exe      string

	mu    sync.Mutex
	host  map[string]*hostFile
	close bool
}

type coreThread struct {
	tid  int
	regs Registers
}

// OpenCore opens the ELF core file path (x86_64; plain, or compressed with
// zstd, xz or lz4 as systemd-coredump stores cores, gzip or bzip2:
// decompressed to an unlinked temporary file, and refused as soon as its
// first bytes are not a core's) as a Target. Memory reads
// are served from the core's PT_LOAD segments, and for file-backed pages
// the core does not hold, from the mapped files under opts.SysRoot
// (opts.Exe for the executable) when their first page matches the core's
// copy. Executable reports the path the process ran, even with opts.Exe.
// The Target also implements CoreInfo (registers, auxiliary vector).
func OpenCore(path string, opts CoreOptions) (Target, error) {
	if opts.SysRoot == "" {
		opts.SysRoot = "/"
	}
	if opts.MaxDecompressed <= 0 {
		opts.MaxDecompressed = DefaultMaxDecompressed
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open core: %w", err)
	}
	var cut *cutShort
	if kind := compression(f); kind != "" {
		plain, short, err := decompressToTemp(f, kind, path, opts)
		f.Close()
		if err != nil {
			return nil, err
		}
		f, cut = plain, short
	}
	c, err := newCore(f, path, opts)
	if err != nil {
		f.Close()
		if cut != nil {
			return nil, cut.explain(path, err)
		}
		return nil, err
	}
	return c, nil
}

func newCore(f *os.File, name string, opts CoreOptions) (*core, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat core %s: %w", name, err)
	}
	c := &core{name: name, f: f, size: st.Size(), opts: opts, host: map[string]*hostFile{}}
	notes, err := c.readHeaders()
	if err != nil {
		return nil, err
	}
	for _, n := range notes {
		if err := c.parseNotes(n); err != nil {
			return nil, fmt.Errorf("core %s: %w", name, err)
		}
	}
	if c.pid == 0 && len(c.threads) > 0 {
		c.pid = c.threads[0].tid
	}
	c.exe = c.findExecutable()
	c.maps = c.buildMappings()
	return c, nil
}

// readHeaders checks the ELF header, indexes the PT_LOAD segments and
// returns the contents of the PT_NOTE segments.
func (c *core) readHeaders() ([][]byte, error) {
	var h [elfHeaderSize]byte
	n, err := c.f.ReadAt(h[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read ELF header of %s: %w", c.name, err)
	}
	if err := checkCoreHeader(h[:n], c.name, ""); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	phoff := le.Uint64(h[32:])
	shoff := le.Uint64(h[40:])
	phentsize := le.Uint16(h[54:])
	phnum := uint64(le.Uint16(h[56:]))
	if phnum == pnXNum {
		// The real count is in sh_info of section header 0.
		var sh [4]byte
		if shoff > uint64(c.size) || shoff+48 > uint64(c.size) {
			return nil, c.truncated("section header 0 (program header count)", shoff+48)
		}
		if _, err := c.f.ReadAt(sh[:], int64(shoff+44)); err != nil {
			return nil, fmt.Errorf("read section header 0 of %s: %w", c.name, err)
		}
		phnum = uint64(le.Uint32(sh[:]))
	}
	if phnum == 0 {
		return nil, fmt.Errorf("%s has no program headers: it is not a usable core file", c.name)
	}
	if phentsize != progHeaderLen {
		return nil, fmt.Errorf("%s has program headers of %d bytes, not %d: the core is damaged", c.name, phentsize, progHeaderLen)
	}
	end := phoff + phnum*progHeaderLen
	if phoff > uint64(c.size) || end > uint64(c.size) || end < phoff {
		return nil, c.truncated("program headers", end)
	}
	ph := make([]byte, phnum*progHeaderLen)
	if _, err := c.f.ReadAt(ph, int64(phoff)); err != nil {
		return nil, fmt.Errorf("read program headers of %s: %w", c.name, err)
	}
	var notes [][]byte
	noteBytes := uint64(0)
	for i := uint64(0); i < phnum; i++ {
		p := ph[i*progHeaderLen:]
		typ := le.Uint32(p)
		flags := le.Uint32(p[4:])
		off := le.Uint64(p[8:])
		vaddr := le.Uint64(p[16:])
		filesz := le.Uint64(p[32:])
		memsz := le.Uint64(p[40:])
		switch typ {
		case ptLoad:
			if memsz == 0 {
				continue
			}
			if vaddr+memsz < vaddr {
				return nil, fmt.Errorf("%s: segment %d at 0x%x of %d bytes wraps around the address space: the core is damaged", c.name, i, vaddr, memsz)
			}
			if filesz > memsz {
				filesz = memsz
			}
			s := segment{vaddr: vaddr, memsz: memsz, off: off, filesz: filesz, flags: flags}
			switch {
			case off >= uint64(c.size):
				s.avail = 0
			case off+filesz > uint64(c.size) || off+filesz < off:
				s.avail = uint64(c.size) - off
			default:
				s.avail = filesz
			}
			c.segs = append(c.segs, s)
		case ptNote:
			if filesz == 0 {
				continue
			}
			if off > uint64(c.size) || off+filesz > uint64(c.size) || off+filesz < off {
				return nil, c.truncated("notes (threads, mapped files)", off+filesz)
			}
			noteBytes += filesz
			if noteBytes > maxNoteBytes {
				return nil, fmt.Errorf("%s: notes are larger than %d bytes: the core is damaged", c.name, maxNoteBytes)
			}
			b := make([]byte, filesz)
			if _, err := c.f.ReadAt(b, int64(off)); err != nil {
				return nil, fmt.Errorf("read notes of %s: %w", c.name, err)
			}
			notes = append(notes, b)
		}
	}
	if len(notes) == 0 {
		return nil, fmt.Errorf("%s has no notes (PT_NOTE): without them its threads and mapped files are unknown; "+
			"dump the core again with gcore or the kernel", c.name)
	}
	sort.SliceStable(c.segs, func(i, j int) bool { return c.segs[i].vaddr < c.segs[j].vaddr })
	return notes, nil
}

func (c *core) truncated(what string, end uint64) error {
	return fmt.Errorf("%s is truncated: its %s end at byte %d, past the end of the file (%d bytes); "+
		"copy or dump the core again", c.name, what, end, c.size)
}

// checkCoreHeader checks h, the first bytes (up to elfHeaderSize) of what
// should be an x86_64 ELF core named name: the ELF magic, then, as far as
// h reaches, 64-bit little-endian, a core, x86_64. compressed names how
// the file was compressed ("" for not at all): what it decompressed to
// is checked from its first bytes, before the rest is decompressed.
func checkCoreHeader(h []byte, name, compressed string) error {
	if len(h) < 4 || string(h[:4]) != "\x7fELF" {
		if compressed != "" {
			what := fmt.Sprintf("it starts with % x", h[:min(len(h), 8)])
			if len(h) < 4 {
				what = fmt.Sprintf("it holds %d bytes", len(h))
			}
			return fmt.Errorf("%s is %s-compressed, but what it holds is not an ELF core file "+
				"(%s): pass a core dump made by gcore or the kernel, compressed or not",
				name, compressed, what)
		}
		return fmt.Errorf("%s is not an ELF core file (nor a compressed one): "+
			"pass a core dump made by gcore or the kernel", name)
	}
	if len(h) < elfHeaderSize {
		return fmt.Errorf("%s is truncated: its ELF header is incomplete (%d of %d bytes); "+
			"copy or dump the core again", name, len(h), elfHeaderSize)
	}
	if h[4] != 2 || h[5] != 1 {
		return fmt.Errorf("%s is not a 64-bit little-endian ELF file: rbscope reads x86_64 cores only", name)
	}
	le := binary.LittleEndian
	if typ := le.Uint16(h[16:]); typ != etCore {
		return fmt.Errorf("%s is an ELF %s, not a core file: pass a core dump "+
			"(gcore PID, or a kernel core), and the executable with --exe", name, elfTypeName(typ))
	}
	if m := le.Uint16(h[18:]); m != emX86_64 {
		return fmt.Errorf("%s is a core of a machine of ELF type %d, not x86_64: rbscope reads x86_64 cores only", name, m)
	}
	return nil
}

func elfTypeName(t uint16) string {
	switch t {
	case 0:
		return "file of no type"
	case 1:
		return "relocatable object"
	case 2:
		return "executable"
	case 3:
		return "shared object (or PIE executable)"
	}
	return fmt.Sprintf("file of type %d", t)
}

func (c *core) Pid() int { return c.pid }

// HostTID returns tid: a core's thread ids are the ones it recorded.
func (c *core) HostTID(tid int) int { return tid }

// FileRoot returns "": a core's files are found by OpenFile.
func (c *core) FileRoot() string { return "" }

// Executable returns the path of the executable as the core's process saw
// it (from NT_FILE and the auxiliary vector), or CoreOptions.Exe when the
// core does not say.
func (c *core) Executable() string { return c.exe }

func (c *core) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.close {
		return nil
	}
	c.close = true
	var errs []error
	for _, h := range c.host {
		if h.f != nil {
			errs = append(errs, h.f.Close())
		}
	}
	c.host = nil
	errs = append(errs, c.f.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close core %s: %w", c.name, err)
	}
	return nil
}

// ReadAt fills p from address addr: from the core's segments, or for
// file-backed pages the core does not hold, from the mapped file.
func (c *core) ReadAt(p []byte, addr uint64) error {
	for len(p) > 0 {
		if addr+uint64(len(p)) < addr {
			return UnmappedError{Addr: addr, Len: len(p)}
		}
		n, err := c.readSome(p, addr)
		if err != nil {
			return err
		}
		p = p[n:]
		addr += uint64(n)
	}
	return nil
}

// ReadBatch performs the reads one after the other (a core file has no
// system call to save).
func (c *core) ReadBatch(reqs []Read) error {
	for i := range reqs {
		if err := c.ReadAt(reqs[i].Buf, reqs[i].Addr); err != nil {
			return err
		}
	}
	return nil
}

// readSome reads a prefix of p (at least one byte) from one source.
func (c *core) readSome(p []byte, addr uint64) (int, error) {
	i := sort.Search(len(c.segs), func(i int) bool { return c.segs[i].vaddr > addr }) - 1
	if i >= 0 && addr-c.segs[i].vaddr < c.segs[i].memsz {
		s := &c.segs[i]
		rel := addr - s.vaddr
		switch {
		case rel < s.avail:
			n := min(uint64(len(p)), s.avail-rel)
			if _, err := c.f.ReadAt(p[:n], int64(s.off+rel)); err != nil {
				return 0, fmt.Errorf("read 0x%x from core %s: %w", addr, c.name, err)
			}
			return int(n), nil
		case rel < s.filesz:
			return 0, fmt.Errorf("%w: the core file %s is truncated before these bytes", UnmappedError{Addr: addr, Len: len(p)}, c.name)
		default:
			n := min(uint64(len(p)), s.memsz-rel)
			return c.readMapped(p[:n], addr)
		}
	}
	n := uint64(len(p))
	if i+1 < len(c.segs) {
		n = min(n, c.segs[i+1].vaddr-addr)
	}
	return c.readMapped(p[:n], addr)
}

// readMapped reads a prefix of p from the file mapped at addr.
func (c *core) readMapped(p []byte, addr uint64) (int, error) {
	j := sort.Search(len(c.files), func(j int) bool { return c.files[j].end > addr })
	if j == len(c.files) || addr < c.files[j].start {
		return 0, UnmappedError{Addr: addr, Len: len(p)}
	}
	m := &c.files[j]
	n := min(uint64(len(p)), m.end-addr)
	h := c.hostFile(m.path)
	if h.err != nil {
		return 0, fmt.Errorf("%w: it is in %s, which the core does not hold and which cannot be read here (%v); "+
			"pass the executable with --exe or a copy of the target's files with --sysroot",
			UnmappedError{Addr: addr, Len: len(p)}, m.path, h.err)
	}
	off := m.off + (addr - m.start)
	got, err := h.f.ReadAt(p[:n], int64(off))
	if got == int(n) {
		return got, nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("%w: it maps offset 0x%x of %s, beyond the end of that file here (%s): "+
			"the file differs from the one the process mapped", UnmappedError{Addr: addr, Len: len(p)}, off, m.path, h.path)
	}
	return 0, fmt.Errorf("read 0x%x from %s: %w", addr, h.path, err)
}

// hostPath says where on this machine the mapped file path is. The path
// comes from the core: cleaned as an absolute path, it cannot climb out
// of the sysroot.
func (c *core) hostPath(path string) string {
	if c.opts.Exe != "" && path == c.exe {
		return c.opts.Exe
	}
	return filepath.Join(c.opts.SysRoot, filepath.Clean("/"+path))
}

// openRegular opens path if it is a regular file: a core naming a device
// or a FIFO must not make rbscope block on it.
func openRegular(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return os.Open(path)
}

// hostFile returns the mapped file path opened on this machine (cached).
func (c *core) hostFile(path string) *hostFile {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.close {
		return &hostFile{err: errors.New("core is closed")}
	}
	if h, ok := c.host[path]; ok {
		return h
	}
	h := &hostFile{path: c.hostPath(path)}
	h.f, h.err = openRegular(h.path)
	if h.err == nil {
		if h.err = c.sameFile(path, h.f); h.err != nil {
			h.f.Close()
			h.f = nil
		}
	}
	c.host[path] = h
	return h
}

// sameFile checks that f is the file the process mapped as path, as far
// as the core can tell: the build id in the core's copy of the file's
// notes must be the file's, and the bytes the core holds of the file's
// first page (its ELF headers, which the kernel and gcore both keep) must
// be the file's. A different build of a library must not be read as if
// it were the mapped one. When the core holds none of the file and marks
// it (deleted), the file at its path on this machine's own root is
// refused too: it is not the one the process mapped.
func (c *core) sameFile(path string, f *os.File) error {
	for _, m := range c.files {
		if m.path != path || m.off != 0 {
			continue
		}
		if mem, err := elfx.ReadMemoryBuildID(coreMemory{c}, m.start); err == nil && mem != "" {
			disk, err := elfx.FileBuildID(f)
			if err != nil || disk != mem {
				return ReplacedError{Path: path, Why: fmt.Sprintf("build id %s in the core, %s in %s", mem, orNone(disk), f.Name())}
			}
		}
		n := min(m.end-m.start, 4096)
		i := sort.Search(len(c.segs), func(i int) bool { return c.segs[i].vaddr > m.start }) - 1
		if i < 0 || m.start-c.segs[i].vaddr >= c.segs[i].avail {
			// The core holds none of it: nothing to compare.
			if m.deleted && c.opts.SysRoot == "/" && !(c.opts.Exe != "" && path == c.exe) {
				return ReplacedError{Path: path, Why: "the core marks its mapping (deleted) and holds none of it to compare"}
			}
			return nil
		}
		s := &c.segs[i]
		n = min(n, s.avail-(m.start-s.vaddr))
		inCore := make([]byte, n)
		onDisk := make([]byte, n)
		if _, err := c.f.ReadAt(inCore, int64(s.off+m.start-s.vaddr)); err != nil {
			return fmt.Errorf("read the first page of %s from the core: %w", path, err)
		}
		if k, _ := f.ReadAt(onDisk, 0); k != len(onDisk) || !bytes.Equal(inCore, onDisk) {
			return ReplacedError{Path: path, Why: fmt.Sprintf("the first page of %s differs from the core's copy", f.Name())}
		}
		return nil
	}
	return nil
}

// coreMemory reads only the bytes the core file itself holds, never the
// mapped files: to tell what the process mapped.
type coreMemory struct{ c *core }

func (r coreMemory) ReadAt(p []byte, addr uint64) error {
	c := r.c
	for len(p) > 0 {
		i := sort.Search(len(c.segs), func(i int) bool { return c.segs[i].vaddr > addr }) - 1
		if i < 0 || addr-c.segs[i].vaddr >= c.segs[i].avail {
			return UnmappedError{Addr: addr, Len: len(p)}
		}
		s := &c.segs[i]
		rel := addr - s.vaddr
		n := min(uint64(len(p)), s.avail-rel)
		if _, err := c.f.ReadAt(p[:n], int64(s.off+rel)); err != nil {
			return fmt.Errorf("read 0x%x from core %s: %w", addr, c.name, err)
		}
		p = p[n:]
		addr += n
	}
	return nil
}

// OpenFile opens the file the process mapped as path: under SysRoot, or
// CoreOptions.Exe for the executable. A file whose first page differs from
// the core's copy is refused (it is another build).
func (c *core) OpenFile(path string) (File, error) {
	hp := c.hostPath(path)
	f, err := openRegular(hp)
	if err != nil {
		return nil, fmt.Errorf("open %s, mapped by the core's process, as %s: %w "+
			"(pass the executable with --exe or a copy of the target's files with --sysroot)", path, hp, err)
	}
	if err := c.sameFile(path, f); err != nil {
		f.Close()
		return nil, fmt.Errorf("open %s, mapped by the core's process: %w", path, err)
	}
	return osFile{f}, nil
}

func (c *core) Mappings() ([]Mapping, error) {
	return append([]Mapping(nil), c.maps...), nil
}

func (c *core) Threads() ([]Thread, error) {
	out := make([]Thread, len(c.threads))
	for i, t := range c.threads {
		out[i] = Thread{TID: t.tid, Name: c.procName}
	}
	return out, nil
}

// buildMappings lists the NT_FILE mappings (with permissions from the
// PT_LOAD segment at their start) and the parts of PT_LOAD segments no
// file covers (anonymous memory), sorted by address.
func (c *core) buildMappings() []Mapping {
	var out []Mapping
	for _, f := range c.files {
		var perms string
		if i := sort.Search(len(c.segs), func(i int) bool { return c.segs[i].vaddr > f.start }) - 1; i >= 0 &&
			f.start-c.segs[i].vaddr < c.segs[i].memsz {
			perms = permString(c.segs[i].flags)
		} else {
			// gcore leaves read-only file mappings out entirely: the
			// file's own program headers say what was mapped how.
			perms = c.filePerms(f.path, f.off)
		}
		out = append(out, Mapping{Start: f.start, End: f.end, Offset: f.off, Perms: perms, Path: f.path, Deleted: f.deleted})
	}
	stack := uint64(0)
	for _, t := range c.threads {
		if t.tid == c.pid {
			stack = t.regs.Rsp
		}
	}
	vdso := c.auxv[atSysinfoEhdr]
	for _, s := range c.segs {
		start, end := s.vaddr, s.vaddr+s.memsz
		j := sort.Search(len(c.files), func(j int) bool { return c.files[j].end > start })
		for start < end {
			gapEnd := end
			if j < len(c.files) && c.files[j].start < end {
				gapEnd = max(start, c.files[j].start)
			}
			if gapEnd > start {
				m := Mapping{Start: start, End: gapEnd, Perms: permString(s.flags)}
				switch {
				case vdso != 0 && m.Contains(vdso):
					m.Path = "[vdso]"
				case stack != 0 && m.Contains(stack):
					m.Path = "[stack]"
				}
				out = append(out, m)
			}
			if j >= len(c.files) || c.files[j].start >= end {
				break
			}
			start = c.files[j].end
			j++
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

// filePerms returns the permissions of the PT_LOAD segment of the mapped
// ELF file path that holds file offset off, "r--p" when the file cannot be
// read here or does not say.
func (c *core) filePerms(path string, off uint64) string {
	const unknown = "r--p"
	h := c.hostFile(path)
	if h.err != nil {
		return unknown
	}
	le := binary.LittleEndian
	var eh [elfHeaderSize]byte
	if _, err := h.f.ReadAt(eh[:], 0); err != nil || string(eh[:4]) != "\x7fELF" || eh[4] != 2 || eh[5] != 1 {
		return unknown
	}
	phoff, phnum := le.Uint64(eh[32:]), int(le.Uint16(eh[56:]))
	if le.Uint16(eh[54:]) != progHeaderLen || phnum > 1024 || phoff > 1<<32 {
		return unknown
	}
	ph := make([]byte, phnum*progHeaderLen)
	if _, err := h.f.ReadAt(ph, int64(phoff)); err != nil {
		return unknown
	}
	for i := 0; i < phnum; i++ {
		p := ph[i*progHeaderLen:]
		pOff, pFilesz := le.Uint64(p[8:])&^0xfff, le.Uint64(p[8:])+le.Uint64(p[32:])
		if le.Uint32(p) == ptLoad && off >= pOff && off < pFilesz {
			return permString(le.Uint32(p[4:]))
		}
	}
	return unknown
}

func permString(flags uint32) string {
	b := []byte("---p")
	if flags&pfR != 0 {
		b[0] = 'r'
	}
	if flags&pfW != 0 {
		b[1] = 'w'
	}
	if flags&pfX != 0 {
		b[2] = 'x'
	}
	return string(b)
}

// findExecutable names the main executable: the NT_FILE mapping holding
// the program headers or entry point (from the auxiliary vector), else
// the mapped file AT_EXECFN names, else a mapped file named like the
// process, else CoreOptions.Exe, else AT_EXECFN as it is.
func (c *core) findExecutable() string {
	for _, key := range []uint64{atPhdr, atEntry} {
		if a, ok := c.auxv[key]; ok && a != 0 {
			if j := sort.Search(len(c.files), func(j int) bool { return c.files[j].end > a }); j < len(c.files) && a >= c.files[j].start {
				return c.files[j].path
			}
		}
	}
	execfn := ""
	if a, ok := c.auxv[atExecfn]; ok && a != 0 {
		execfn = c.readCString(a, 4096)
	}
	if execfn != "" {
		for _, f := range c.files {
			if f.path == execfn {
				return f.path
			}
		}
	}
	if c.procName != "" {
		for _, f := range c.files {
			if filepath.Base(f.path) == c.procName || (len(c.procName) == 15 && strings.HasPrefix(filepath.Base(f.path), c.procName)) {
				return f.path
			}
		}
	}
	if c.opts.Exe != "" {
		return c.opts.Exe
	}
	return execfn
}

// readCString reads a NUL-terminated string of at most limit bytes at
// addr, "" when unreadable.
func (c *core) readCString(addr uint64, limit int) string {
	var out []byte
	buf := make([]byte, 64)
	for len(out) < limit {
		if err := c.ReadAt(buf, addr); err != nil {
			// Near the end of a mapping: fall back to byte reads.
			if err := c.ReadAt(buf[:1], addr); err != nil {
				return ""
			}
			buf = buf[:1]
		}
		if i := strings.IndexByte(string(buf), 0); i >= 0 {
			return string(append(out, buf[:i]...))
		}
		out = append(out, buf...)
		addr += uint64(len(buf))
	}
	return ""
}
