package target

import (
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/ulikunitz/xz"
)

// DecompressProgress says how far the decompression of a compressed core
// has come (CoreOptions.Progress).
type DecompressProgress struct {
	Path    string        // the compressed core
	Kind    string        // its compression: gzip, zstd, bzip2, xz or lz4
	Out     int64         // bytes of core decompressed so far
	In      int64         // compressed bytes read so far
	InSize  int64         // size of the compressed file
	Elapsed time.Duration // since the decompression began
	TempDir string        // where the decompressed core is written
	Done    bool          // the decompression has ended (the last call)
}

// String says where the decompression is, for a person.
func (p DecompressProgress) String() string {
	if p.Done {
		return fmt.Sprintf("decompressed %s (%s): %s of core in %.0fs", p.Path, p.Kind, humanBytes(p.Out), p.Elapsed.Seconds())
	}
	read := ""
	if p.InSize > 0 {
		read = fmt.Sprintf(", %.0f%% of the compressed file read", 100*float64(p.In)/float64(p.InSize))
	}
	return fmt.Sprintf("decompressing %s (%s) into %s: %s of core so far%s, %.0fs",
		p.Path, p.Kind, p.TempDir, humanBytes(p.Out), read, p.Elapsed.Seconds())
}

// DefaultProgressEvery is how often CoreOptions.Progress is called while a
// compressed core is decompressed, when CoreOptions.ProgressEvery is 0.
const DefaultProgressEvery = 2 * time.Second

// zstdMaxWindow bounds the zstd decoder's memory whatever the input
// claims: 128 MiB, zstd --long=27.
const zstdMaxWindow = 128 << 20

// compression names how a core file is compressed, from its magic bytes:
// "" for none (or unknown).
func compression(f *os.File) string {
	var m [6]byte
	n, _ := f.ReadAt(m[:], 0)
	b := m[:n]
	switch {
	case bytes.HasPrefix(b, []byte{0x1f, 0x8b}):
		return "gzip"
	case bytes.HasPrefix(b, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return "zstd" // systemd-coredump's default
	case bytes.HasPrefix(b, []byte("BZh")):
		return "bzip2"
	case bytes.HasPrefix(b, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return "xz" // systemd-coredump's before zstd
	case bytes.HasPrefix(b, []byte{0x04, 0x22, 0x4d, 0x18}):
		return "lz4" // and before xz
	}
	return ""
}

// countingReader counts the bytes read through it and keeps the first
// error other than io.EOF: an error reading the compressed file itself,
// told apart from the decoder's complaints about what it read.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

// newDecoder returns a reader of what src decompresses to, and a function
// that releases it.
func newDecoder(kind string, src io.Reader) (io.Reader, func(), error) {
	switch kind {
	case "gzip":
		zr, err := gzip.NewReader(src)
		if err != nil {
			return nil, nil, err
		}
		return zr, func() { zr.Close() }, nil
	case "zstd":
		// One goroutine and a bounded window keep the decoder's memory
		// bounded whatever the input claims.
		zr, err := zstd.NewReader(src, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	case "bzip2":
		return bzip2.NewReader(src), func() {}, nil
	case "xz":
		zr, err := xz.NewReader(src)
		if err != nil {
			return nil, nil, err
		}
		return zr, func() {}, nil
	case "lz4":
		return lz4.NewReader(src), func() {}, nil
	}
	return nil, nil, fmt.Errorf("unknown compression %q", kind)
}

// decompressToTemp decompresses the core f (compressed with kind) into an
// unlinked temporary file (so that nothing is left behind, however rbscope
// ends) of at most opts.MaxDecompressed bytes, calling opts.Progress on
// the way. What does not begin with an x86_64 core's ELF header is
// refused once its first bytes are decompressed. A stream cut short
// yields what it held: a partial core reads where it has bytes.
func decompressToTemp(f *os.File, kind, name string, opts CoreOptions) (*os.File, *cutShort, error) {
	limit := opts.MaxDecompressed
	var inSize int64
	if st, err := f.Stat(); err == nil {
		inSize = st.Size()
	}
	src := &countingReader{r: io.NewSectionReader(f, 0, 1<<62)}
	r, release, err := newDecoder(kind, src)
	if err != nil {
		if src.err != nil {
			return nil, nil, fmt.Errorf("read core %s: %w", name, src.err)
		}
		return nil, nil, corrupt(f, kind, name, 0, err)
	}
	defer release()

	// The ELF header first: what is not a core is refused before
	// anything is written.
	var hdr [elfHeaderSize]byte
	n, rerr := readUpTo(r, hdr[:])
	if src.err != nil {
		return nil, nil, fmt.Errorf("read core %s: %w", name, src.err)
	}
	if rerr == nil || rerr == io.EOF || n >= 4 && string(hdr[:4]) != "\x7fELF" {
		// A whole header, or all there is, or enough to tell it is
		// not ELF (even when the stream is damaged right after).
		if err := checkCoreHeader(hdr[:n], name, kind); err != nil {
			return nil, nil, err
		}
	}

	dir := os.TempDir()
	tmp, err := os.CreateTemp("", "rbscope-core-*")
	if err != nil {
		return nil, nil, fmt.Errorf("decompress core %s: create a temporary file in %s (set TMPDIR to another directory): %w", name, dir, err)
	}
	if err := os.Remove(tmp.Name()); err != nil {
		tmp.Close()
		return nil, nil, fmt.Errorf("decompress core %s: unlink temporary file: %w", name, err)
	}
	p := DecompressProgress{Path: name, Kind: kind, InSize: inSize, TempDir: dir}
	start := time.Now()
	every := opts.ProgressEvery
	if every <= 0 {
		every = DefaultProgressEvery
	}
	next := start.Add(every)
	told := false
	progress := func(out int64, done bool) {
		if opts.Progress == nil {
			return
		}
		now := time.Now()
		if done && !told || !done && now.Before(next) {
			return
		}
		next, told = now.Add(every), true
		p.Out, p.In, p.Elapsed, p.Done = out, src.n, now.Sub(start), done
		opts.Progress(p)
	}
	out, err := copyCore(tmp, r, hdr[:n], rerr, limit, func(out int64) { progress(out, false) })
	progress(out, true)
	fail := func(e error) (*os.File, *cutShort, error) {
		tmp.Close()
		return nil, nil, e
	}
	var we writeError
	switch {
	case err == nil:
	case errors.As(err, &we):
		if errors.Is(we.err, syscall.ENOSPC) || errors.Is(we.err, syscall.EDQUOT) {
			return fail(fmt.Errorf("decompress core %s into %s: %w after %s: set TMPDIR to a directory "+
				"with more room, or decompress it yourself (%s) and pass the plain core",
				name, dir, we.err, humanBytes(out), decompressCommand(kind, name)))
		}
		return fail(fmt.Errorf("decompress core %s into %s: %w", name, dir, we.err))
	case src.err != nil:
		return fail(fmt.Errorf("read core %s: %w", name, src.err))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return tmp, &cutShort{kind: kind, n: out}, nil
	case errors.Is(err, errOverLimit):
		return fail(fmt.Errorf("the %s-compressed core %s decompresses to more than %s, the most rbscope "+
			"decompresses itself: decompress it yourself (%s) and pass the plain core",
			kind, name, humanBytes(limit), decompressCommand(kind, name)))
	default:
		return fail(corrupt(f, kind, name, out, err))
	}
	return tmp, nil, nil
}

// errOverLimit: the core decompresses to more than the limit.
var errOverLimit = errors.New("over the limit")

// writeError is a failed write of the decompressed core.
type writeError struct{ err error }

func (w writeError) Error() string { return w.err.Error() }

// copyCore writes head (the first bytes read from r, which ended them
// with herr) then the rest of r to w, at most limit bytes, calling tick
// after each chunk. It returns the bytes written and the first error:
// the decoder's, a writeError, or errOverLimit.
func copyCore(w io.Writer, r io.Reader, head []byte, herr error, limit int64, tick func(int64)) (int64, error) {
	var out int64
	write := func(b []byte) error {
		if out+int64(len(b)) > limit {
			return errOverLimit
		}
		n, err := w.Write(b)
		out += int64(n)
		if err != nil {
			return writeError{err}
		}
		return nil
	}
	if err := write(head); err != nil {
		return out, err
	}
	if herr == io.EOF {
		return out, nil
	}
	if herr != nil {
		return out, herr
	}
	buf := make([]byte, 1<<20)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := write(buf[:n]); werr != nil {
				return out, werr
			}
			tick(out)
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// readUpTo reads into b until it is full or r ends; the error is nil when
// b was filled, io.EOF when r ended cleanly before, else r's error.
func readUpTo(r io.Reader, b []byte) (int, error) {
	n := 0
	for empty := 0; n < len(b); {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
		if m > 0 {
			empty = 0
		} else if empty++; empty == 100 {
			return n, io.ErrNoProgress
		}
	}
	return n, nil
}

// corrupt words a decoder's complaint about the compressed core f: out
// bytes of core had been decompressed.
func corrupt(f *os.File, kind, name string, out int64, err error) error {
	where := "its compressed stream is damaged"
	if out > 0 {
		where = fmt.Sprintf("its compressed stream is damaged after %s of core", humanBytes(out))
	}
	if kind == "zstd" && errors.Is(err, zstd.ErrWindowSizeExceeded) {
		if w, ok := zstdWindow(f); ok && w > zstdMaxWindow && w <= 1<<31 {
			// A real zstd --long=28..31 stream asks for this, and so
			// may a damaged one. (A block past its window is damage.)
			return fmt.Errorf("the zstd-compressed core %s is corrupt, or was compressed with a window of %s "+
				"(zstd --long), more than the %s rbscope allows itself: decompress it yourself "+
				"(zstd -d --long=31 -k %s) and pass the plain core",
				name, humanBytes(int64(w)), humanBytes(zstdMaxWindow), name)
		}
	}
	detail := err.Error()
	if kind == "zstd" && errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		// The decoder's words would name its own option.
		detail = "its frame header claims an implausible size"
	}
	return fmt.Errorf("the %s-compressed core %s is corrupt: %s (%s); copy or dump the core again",
		kind, name, where, detail)
}

// zstdWindow reads the window size the first zstd frame of f asks for.
// ok is false when the frame header is not readable or not valid.
func zstdWindow(f *os.File) (uint64, bool) {
	var h [6]byte
	if n, _ := f.ReadAt(h[:], 0); n < len(h) {
		return 0, false
	}
	fhd := h[4]
	if fhd&(1<<3) != 0 || fhd&(1<<5) != 0 {
		// The reserved bit, or a single segment: no window
		// descriptor.
		return 0, false
	}
	wd := h[5]
	base := uint64(1) << (10 + wd>>3)
	return base + base/8*uint64(wd&7), true
}

// decompressCommand is the command that decompresses the core path,
// keeping the compressed file.
func decompressCommand(kind, path string) string {
	if kind == "zstd" {
		return "zstd -d --long=31 -k " + path
	}
	return kind + " -dk " + path
}

// humanBytes writes n in binary units: 512 B, 3.5 MiB, 4 GiB.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n), ""
	for _, s := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v, u = v/unit, s
		if v < unit {
			break
		}
	}
	s := fmt.Sprintf("%.1f", v)
	if len(s) > 2 && s[len(s)-2:] == ".0" {
		s = s[:len(s)-2]
	}
	return s + " " + u
}

// cutShort records that a compressed core's stream ended early.
type cutShort struct {
	kind string
	n    int64 // bytes it decompressed to
}

// explain says why a core decompressed from a cut-short stream is not
// usable.
func (c *cutShort) explain(name string, err error) error {
	return fmt.Errorf("the %s-compressed core %s is truncated: its stream ends after %d bytes of core, "+
		"which are not a usable core (%w); copy or dump the core again", c.kind, name, c.n, err)
}
