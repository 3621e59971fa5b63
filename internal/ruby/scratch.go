package ruby

// scratch hands out byte buffers that live until the next reset: the
// struct copies and control-frame regions of one snapshot, which nothing
// keeps past it (the frames a snapshot returns are decoded into strings
// and ints). In steady state a snapshot then allocates only the frames it
// returns.
type scratch struct {
	buf []byte
	off int
}

// reset makes the whole slab free again (for the next snapshot).
func (s *scratch) reset() { s.off = 0 }

// take returns n bytes, valid until reset. When the slab is full a larger
// one replaces it: the buffers taken before stay valid (they keep the old
// slab alive until they are dropped), and the next snapshot fits.
func (s *scratch) take(n int) []byte {
	if s.off+n > len(s.buf) {
		s.buf = make([]byte, max(2*len(s.buf), 2*n, 16<<10))
		s.off = 0
	}
	b := s.buf[s.off : s.off+n : s.off+n]
	s.off += n
	return b
}
