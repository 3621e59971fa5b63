package ruby

import (
	"bytes"
	"slices"

	"github.com/rbscope/rbscope/internal/target"
)

// A name cached by an object's address serves only in the GC epoch it was
// read in (see names.go): a GC may free the object and put another at the
// same address. Reading every name again after each GC costs about ten
// reads per frame (the iseq body, its label, its path Array and strings,
// the method's owner and its class path), a millisecond for a 50-frame
// stack, and a process that allocates collects garbage every few
// milliseconds. So each cached name keeps its witness: the bytes it was
// decoded from (only those it used: a header's type and layout bits, the
// fields read, the characters), and after a GC one batched read of the
// witness tells whether the name still holds. A name decoded from the same
// bytes is the same name; any difference (the object freed and reused,
// moved by compaction, or a young object's flags aging) reads it anew.

// witness is every range of target memory a cached fact was decoded
// from, nested facts' included: the bits used of each (a few hundred
// bytes for an iseq, mostly its body), kept compact since a cache holds
// tens of thousands.
type witness struct {
	ranges []wrange
	data   []byte // each range's bytes (masked), then its mask if inline
	// lost is set when a range could not be kept (too long): the fact
	// cannot be checked and is read again after each GC.
	lost bool
}

// wrange is one range of a witness: n bytes at addr, held in data at off.
type wrange struct {
	addr uint64
	off  uint32
	n    uint16
	mask uint8 // maskNone, maskInline (n more bytes in data) or maskBody
}

const (
	maskNone   = iota // every bit used
	maskInline        // the mask follows the bytes in data
	maskBody          // the iseq body mask (see bodyMask)
)

// empty reports whether w holds no range (the fact must be read again).
func (w witness) empty() bool { return len(w.ranges) == 0 || w.lost }

// clip returns w in storage of its own, exactly sized (recording grows
// slices by doubling, and the spare room would be kept with the cache).
func (w witness) clip() witness {
	return witness{ranges: slices.Clone(w.ranges), data: slices.Clone(w.data), lost: w.lost}
}

// add appends n bytes at addr with the given mask kind; mask is the
// inline mask, for maskInline.
func (w *witness) add(addr uint64, b []byte, kind uint8, mask []byte) {
	if len(b) == 0 {
		return
	}
	if len(b) > 0xffff || len(w.data) > 1<<30 {
		w.lost = true
		return
	}
	off := len(w.data)
	w.data = append(w.data, b...)
	switch kind {
	case maskInline:
		for i := range b {
			w.data[off+i] &= mask[i]
		}
		w.data = append(w.data, mask...)
	case maskBody:
		for i := range b {
			if i < len(mask) {
				w.data[off+i] &= mask[i]
			}
		}
	}
	w.ranges = append(w.ranges, wrange{addr: addr, off: uint32(off), n: uint16(len(b)), mask: kind})
}

// saw records, while a fact is being decoded (see startWitness), that it
// used data read at addr.
func (p *namer) saw(addr uint64, data []byte) {
	if p.rec != nil {
		p.rec.add(addr, data, maskNone, nil)
	}
}

// sawBody records the iseq body b read at addr, of which the fields in
// bodyMask were used.
func (p *namer) sawBody(addr uint64, b []byte) {
	if p.rec != nil {
		p.rec.add(addr, b, maskBody, p.rt.bodyMask)
	}
}

// sawWord records the 8-byte word v read at addr, of which only the bits
// in mask were used.
func (p *namer) sawWord(addr, v, mask uint64) {
	if p.rec == nil {
		return
	}
	var d, m [8]byte
	putLE64(d[:], v)
	putLE64(m[:], mask)
	kind := uint8(maskInline)
	if mask == ^uint64(0) {
		kind = maskNone
	}
	p.rec.add(addr, d[:], kind, m[:])
}

// sawField records field f of the object at addr, read into b.
func (p *namer) sawField(addr uint64, b []byte, f fieldOff) {
	if p.rec == nil || !f.ok || f.off+f.size > uint64(len(b)) {
		return
	}
	p.saw(addr+f.off, b[f.off:f.off+f.size])
}

// sawU64 reads the word at addr and records it.
func (p *namer) sawU64(addr uint64) (uint64, error) {
	b, err := p.r.read(addr, 8)
	if err != nil {
		return 0, err
	}
	p.saw(addr, b)
	return le64(b, 0), nil
}

// startWitness starts recording the witness of a fact, into scratch
// storage reused from fact to fact (keep witness.clip() of it); it must
// be ended by endWitness, which adds it to the witness of the fact being
// decoded around this one, if any (a name built from a cached path
// carries the path's witness).
func (p *namer) startWitness() *witness {
	depth := len(p.witOuter)
	if depth == len(p.witStack) {
		p.witStack = append(p.witStack, &witness{})
	}
	w := p.witStack[depth]
	w.ranges, w.data, w.lost = w.ranges[:0], w.data[:0], false
	p.witOuter = append(p.witOuter, p.rec)
	p.rec = w
	return w
}

// endWitness stops recording w (see startWitness).
func (p *namer) endWitness(w *witness) {
	n := len(p.witOuter) - 1
	p.rec = p.witOuter[n]
	p.witOuter = p.witOuter[:n]
	p.reuse(*w)
}

// notRecording pauses recording (for facts cached for the life of the
// process, such as symbol names) and returns the function that resumes it.
func (p *namer) notRecording() func() {
	outer := p.rec
	p.rec = nil
	return func() { p.rec = outer }
}

// reuse adds the witness of a cached fact used while another is decoded.
func (p *namer) reuse(w witness) {
	if p.rec == nil {
		return
	}
	if w.lost {
		p.rec.lost = true
		return
	}
	base := uint32(len(p.rec.data))
	p.rec.data = append(p.rec.data, w.data...)
	for _, r := range w.ranges {
		r.off += base
		p.rec.ranges = append(p.rec.ranges, r)
	}
}

// current reports whether a cached fact of epoch *gen with witness w
// holds in this epoch: read in it, or its witness read again unchanged
// (then *gen becomes this epoch). A fact without a witness is read again.
func (p *namer) current(gen *uint64, w witness) bool {
	if *gen == p.epoch {
		return true
	}
	if w.empty() || !p.unchanged(w) {
		return false
	}
	*gen = p.epoch
	return true
}

// cachedString returns cache m's string for key k when it holds in this
// GC epoch (see current), adding its witness to the fact being decoded
// around this lookup, if any.
func (p *namer) cachedString(m map[uint64]genString, k uint64) (string, bool) {
	c, ok := m[k]
	if !ok || !p.current(&c.gen, c.wit) {
		return "", false
	}
	m[k] = c
	p.reuse(c.wit)
	return c.s, true
}

// unchanged reads every range of w in one batch and compares the bits
// that were used.
func (p *namer) unchanged(w witness) bool {
	p.witOK = p.unchangedAll([]witness{w}, p.witOK[:0])
	return p.witOK[0]
}

// maxWitnessGap is how far apart two ranges of a witness may be to be
// read as one (the fields of one object, mostly).
const maxWitnessGap = 64

// unchangedAll reads the ranges of every witness in ws in one batch and
// appends to ok whether each is unchanged. Neighbouring ranges are read
// as one.
func (p *namer) unchangedAll(ws []witness, ok []bool) []bool {
	spans := p.witSpans[:0]
	for _, w := range ws {
		for _, r := range w.ranges {
			end := r.addr + uint64(r.n)
			if n := len(spans); n > 0 {
				last := &spans[n-1]
				if r.addr >= last.start && r.addr <= last.end+maxWitnessGap && end-last.start <= 4096 {
					last.end = max(last.end, end)
					continue
				}
			}
			spans = append(spans, witSpan{r.addr, end})
		}
	}
	p.witSpans = spans[:0]
	n := 0
	for _, sp := range spans {
		n += int(sp.end - sp.start)
	}
	if cap(p.witBuf) < n {
		p.witBuf = make([]byte, n)
	}
	buf := p.witBuf[:n]
	reqs := p.witReqs[:0]
	off := 0
	for _, sp := range spans {
		l := int(sp.end - sp.start)
		reqs = append(reqs, target.Read{Addr: sp.start, Buf: buf[off : off+l]})
		off += l
	}
	p.witReqs = reqs[:0]
	p.witChecks++
	if len(reqs) == 0 || p.witMerged.ReadBatch(p.t, reqs) != nil {
		// One range failing fails the batch: check each witness alone.
		for _, w := range ws {
			ok = append(ok, len(ws) > 1 && !w.empty() && p.unchanged(w))
		}
		return ok
	}
	// Walk the witnesses again in the same order as the spans.
	si, soff := 0, 0
	for _, w := range ws {
		same := !w.empty()
		for _, r := range w.ranges {
			for r.addr < spans[si].start || r.addr+uint64(r.n) > spans[si].end {
				soff += int(spans[si].end - spans[si].start)
				si++
			}
			if !same {
				continue
			}
			at := soff + int(r.addr-spans[si].start)
			now := buf[at : at+int(r.n)]
			was := w.data[r.off : r.off+uint32(r.n)]
			var mask []byte
			switch r.mask {
			case maskNone:
				same = bytes.Equal(now, was)
				continue
			case maskInline:
				mask = w.data[r.off+uint32(r.n) : r.off+2*uint32(r.n)]
			case maskBody:
				mask = p.rt.bodyMask
			}
			for j := range now {
				m := byte(0xff)
				if j < len(mask) {
					m = mask[j]
				}
				if now[j]&m != was[j] {
					same = false
					break
				}
			}
		}
		ok = append(ok, same)
	}
	return ok
}

// witSpan is a range of target memory read to check witnesses.
type witSpan struct{ start, end uint64 }

// bodyMaskOf is the mask of the iseq body bytes readIseqInfo decodes,
// with offsets o.
func bodyMaskOf(o *offsets) []byte {
	m := make([]byte, o.bodySize)
	for _, f := range []fieldOff{o.bEncoded, o.bIseqSize, o.bFirstLineno, o.bType, o.bLabel, o.bPathobj, o.bPath, o.bAbsPath,
		o.bInsnsInfo, o.bInsnsInfoSize, o.bInsnsPositions, o.bSuccTable, o.bLineInfoTable, o.bLineInfoSize,
		o.bInsnInfoTable, o.bInsnInfoSize, o.iseqName, o.iseqFilename, o.iseqFilepath} {
		if !f.ok {
			continue
		}
		for i := f.off; i < f.off+max(f.size, 1) && i < uint64(len(m)); i++ {
			m[i] = 0xff
		}
	}
	return m
}

func putLE64(b []byte, v uint64) {
	for i := 0; i < 8; i++ {
		b[i] = byte(v >> (8 * i))
	}
}
