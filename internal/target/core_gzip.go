package target

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
)

// gunzipToTemp decompresses the gzip file f into an unlinked temporary
// file (so that nothing is left behind, however rbscope ends) of at most
// limit bytes. A gzip stream cut short yields what it held: a partial core
// reads where it has bytes.
func gunzipToTemp(f *os.File, name string, limit int64) (*os.File, error) {
	zr, err := gzip.NewReader(io.NewSectionReader(f, 0, 1<<62))
	if err != nil {
		return nil, fmt.Errorf("decompress core %s: %w", name, err)
	}
	defer zr.Close()
	tmp, err := os.CreateTemp("", "rbscope-core-*")
	if err != nil {
		return nil, fmt.Errorf("decompress core %s: %w", name, err)
	}
	if err := os.Remove(tmp.Name()); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("decompress core %s: unlink temporary file: %w", name, err)
	}
	n, err := io.Copy(tmp, io.LimitReader(zr, limit+1))
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		tmp.Close()
		return nil, fmt.Errorf("decompress core %s (in %s): %w", name, os.TempDir(), err)
	}
	if n > limit {
		tmp.Close()
		return nil, fmt.Errorf("decompress core %s: it is larger than %d bytes decompressed "+
			"(CoreOptions.MaxDecompressed): decompress it yourself (gunzip) and pass the plain core", name, limit)
	}
	return tmp, nil
}
