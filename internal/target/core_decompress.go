package target

import (
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/klauspost/compress/zstd"
)

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
		return "xz"
	case bytes.HasPrefix(b, []byte{0x04, 0x22, 0x4d, 0x18}):
		return "lz4"
	}
	return ""
}

// decompressToTemp decompresses the core f (compressed with kind) into an
// unlinked temporary file (so that nothing is left behind, however rbscope
// ends) of at most limit bytes. A stream cut short yields what it held: a
// partial core reads where it has bytes.
func decompressToTemp(f *os.File, kind, name string, limit int64) (*os.File, *cutShort, error) {
	src := io.NewSectionReader(f, 0, 1<<62)
	var r io.Reader
	switch kind {
	case "gzip":
		zr, err := gzip.NewReader(src)
		if err != nil {
			return nil, nil, fmt.Errorf("decompress core %s: %w", name, err)
		}
		defer zr.Close()
		r = zr
	case "zstd":
		// One goroutine and a bounded window (128 MiB: zstd --long=27)
		// keep the decoder's memory bounded whatever the input claims.
		zr, err := zstd.NewReader(src, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(128<<20))
		if err != nil {
			return nil, nil, fmt.Errorf("decompress core %s: %w", name, err)
		}
		defer zr.Close()
		r = zr
	case "bzip2":
		r = bzip2.NewReader(src)
	default:
		return nil, nil, fmt.Errorf("core %s is %s-compressed, which rbscope does not read: decompress it first "+
			"(%s -dk %s) and pass the result", name, kind, kind, name)
	}
	tmp, err := os.CreateTemp("", "rbscope-core-*")
	if err != nil {
		return nil, nil, fmt.Errorf("decompress core %s: %w", name, err)
	}
	if err := os.Remove(tmp.Name()); err != nil {
		tmp.Close()
		return nil, nil, fmt.Errorf("decompress core %s: unlink temporary file: %w", name, err)
	}
	n, err := io.Copy(tmp, io.LimitReader(r, limit+1))
	var cut *cutShort
	if errors.Is(err, io.ErrUnexpectedEOF) {
		cut = &cutShort{kind: kind, n: n}
	} else if err != nil {
		tmp.Close()
		return nil, nil, fmt.Errorf("decompress core %s (into %s): %w", name, os.TempDir(), err)
	}
	if n > limit {
		tmp.Close()
		return nil, nil, fmt.Errorf("decompress core %s: it is larger than %d bytes decompressed "+
			"(CoreOptions.MaxDecompressed): decompress it yourself and pass the plain core", name, limit)
	}
	return tmp, cut, nil
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
