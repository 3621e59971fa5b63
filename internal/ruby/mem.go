package ruby

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/rbscope/rbscope/internal/target"
)

// maxString bounds every Ruby string rbscope reads.
const maxString = 4096

// Ruby object type tags (flags & 0x1f).
const (
	tClass   = 0x02
	tModule  = 0x03
	tString  = 0x05
	tArray   = 0x07
	tHash    = 0x08
	tImemo   = 0x1a
	tIClass  = 0x1c
	tMask    = 0x1f
	flUShift = 12
)

// imemo types (flags >> FL_USHIFT & 0x0f), stable from 2.3 on.
const (
	imemoCref  = 1
	imemoSvar  = 2
	imemoIfunc = 4
	imemoMent  = 6
	imemoIseq  = 7
)

// ErrInconsistent reports that memory read from the target did not have the
// shape a Ruby structure should have (a race with the target, the wrong
// layout, or not a Ruby process).
var ErrInconsistent = errors.New("inconsistent Ruby VM data")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInconsistent, fmt.Sprintf(format, args...))
}

// isHeapPtr reports whether v can be a pointer to a heap object (not an
// immediate such as nil, false, a Fixnum or a Symbol).
func isHeapPtr(v uint64) bool { return v >= 4096 && v&7 == 0 && v < 1<<56 }

// reader wraps a target with small typed reads.
type reader struct {
	t   target.Target
	buf [64]byte
}

func (r *reader) read(addr uint64, n int) ([]byte, error) {
	var b []byte
	if n <= len(r.buf) {
		b = r.buf[:n]
	} else {
		b = make([]byte, n)
	}
	if err := r.t.ReadAt(b, addr); err != nil {
		return nil, err
	}
	return b, nil
}

// readOwned returns a fresh buffer (safe to keep).
func (r *reader) readOwned(addr uint64, n int) ([]byte, error) {
	b := make([]byte, n)
	if err := r.t.ReadAt(b, addr); err != nil {
		return nil, err
	}
	return b, nil
}

func (r *reader) u64(addr uint64) (uint64, error) {
	b, err := r.read(addr, 8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (r *reader) u32(addr uint64) (uint32, error) {
	b, err := r.read(addr, 4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

// cString reads a NUL-terminated string of at most max bytes.
func (r *reader) cString(addr uint64, max int) (string, error) {
	var out []byte
	for len(out) < max {
		n := 64
		// Do not cross a page boundary in one read: the next page may be unmapped.
		if rem := int(4096 - addr%4096); rem < n {
			n = rem
		}
		b, err := r.read(addr, n)
		if err != nil {
			if len(out) > 0 {
				break
			}
			return "", err
		}
		for i, c := range b {
			if c == 0 {
				return string(append(out, b[:i]...)), nil
			}
		}
		out = append(out, b...)
		addr += uint64(n)
	}
	if len(out) > max {
		out = out[:max]
	}
	return string(out), nil
}

func le64(b []byte, off uint64) uint64 {
	if off+8 > uint64(len(b)) {
		return 0
	}
	return binary.LittleEndian.Uint64(b[off:])
}

func le32(b []byte, off uint64) uint32 {
	if off+4 > uint64(len(b)) {
		return 0
	}
	return binary.LittleEndian.Uint32(b[off:])
}

func le16(b []byte, off uint64) uint16 {
	if off+2 > uint64(len(b)) {
		return 0
	}
	return binary.LittleEndian.Uint16(b[off:])
}

func sanitize(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string([]rune(s))
}
