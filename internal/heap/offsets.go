package heap

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
)

// Facts from gc.c (gc/default/default.c from 3.4) that DWARF does not
// give (macros and enum values):
//
//   - struct heap_page_header { struct heap_page *page; } opens every page
//     body, which is aligned to HEAP_PAGE_ALIGN (16 KiB to 3.1, 64 KiB from
//     3.2) and HEAP_PAGE_SIZE long; the first slot follows the header,
//     moved up to a multiple of the base slot size (40, sizeof(RVALUE)), and
//     total_slots slots of slot_size fill the rest of the body.
//   - rb_objspace.heap_pages, 3.0-3.3: sorted (the pages, by address),
//     allocated_pages (how many), allocatable_pages, sorted_length (>=
//     allocated_pages), range[2] (the lowest slot, the end of the highest
//     page).
//   - rb_objspace.heap_pages, 3.4: sorted is an rb_darray (darray.h: a
//     pointer to {size_t size, capa; struct heap_page *data[]}), then
//     allocated_pages and freed_pages (counts since start: size =
//     allocated - freed), range[2] (the lowest body plus its header, the
//     end of the highest body). Pages of the global empty pool stay in
//     sorted with start, total_slots and slot_size zeroed.
//   - A slot's first word is RBasic.flags (type = flags & 0x1f, 0 when
//     free), its second RBasic.klass.
const (
	baseSlot      = 40
	maxPageHeader = 64
	// maxPages bounds allocated_pages: 2^24 pages of 16 KiB is 256 GiB of
	// Ruby heap.
	maxPages = 1 << 24
	// objspaceScan is how much of rb_objspace the shape search reads.
	objspaceScan = 4096
)

// Ruby's object types (flags & 0x1f, include/ruby/internal/value_type.h).
const (
	tNone     = 0x00
	tObject   = 0x01
	tClass    = 0x02
	tModule   = 0x03
	tFloat    = 0x04
	tString   = 0x05
	tRegexp   = 0x06
	tArray    = 0x07
	tHash     = 0x08
	tStruct   = 0x09
	tBignum   = 0x0a
	tFile     = 0x0b
	tData     = 0x0c
	tMatch    = 0x0d
	tComplex  = 0x0e
	tRational = 0x0f
	tSymbol   = 0x14
	tImemo    = 0x1a
	tNode     = 0x1b
	tIClass   = 0x1c
	tZombie   = 0x1d
	tMoved    = 0x1e
	tMask     = 0x1f
)

// Flag bits (FL_USHIFT = 12): FL_USER1 is RSTRING_NOEMBED, RARRAY_EMBED_FLAG
// and ROBJECT_EMBED; FL_USER2 is STR_SHARED / ELTS_SHARED; FL_USER3 is
// RHASH_ST_TABLE_FLAG.
const (
	flUser1 = 1 << 13
	flUser2 = 1 << 14
	flUser3 = 1 << 15
	flUser0 = 1 << 12
)

// sharedFlag is ELTS_SHARED (STR_SHARED, RARRAY_SHARED_FLAG): FL_USER2 to
// 3.3, FL_USER0 from 3.4.
func (o *offsets) sharedFlag() uint64 {
	if o.ver >= 30400 {
		return flUser0
	}
	return flUser2
}

// singletonFlag is FL_SINGLETON: FL_USER0 to 3.3, FL_USER1 from 3.4.
func (o *offsets) singletonFlag() uint64 {
	if o.ver >= 30400 {
		return flUser1
	}
	return flUser0
}

// typeNames are the names ObjectSpace.count_objects uses.
var typeNames = [32]string{
	tNone: "FREE", tObject: "T_OBJECT", tClass: "T_CLASS", tModule: "T_MODULE",
	tFloat: "T_FLOAT", tString: "T_STRING", tRegexp: "T_REGEXP", tArray: "T_ARRAY",
	tHash: "T_HASH", tStruct: "T_STRUCT", tBignum: "T_BIGNUM", tFile: "T_FILE",
	tData: "T_DATA", tMatch: "T_MATCH", tComplex: "T_COMPLEX", tRational: "T_RATIONAL",
	0x11: "T_NIL", 0x12: "T_TRUE", 0x13: "T_FALSE", tSymbol: "T_SYMBOL",
	0x15: "T_FIXNUM", 0x16: "T_UNDEF", tImemo: "T_IMEMO", tNode: "T_NODE",
	tIClass: "T_ICLASS", tZombie: "T_ZOMBIE", tMoved: "T_MOVED",
}

// TypeName is the count_objects name of object type t ("T_STRING").
func TypeName(t uint8) string {
	if int(t) < len(typeNames) && typeNames[t] != "" {
		return typeNames[t]
	}
	return fmt.Sprintf("T_0x%02x", t)
}

// offsets is where the census finds what it reads, resolved once per
// process.
type offsets struct {
	ver      int    // ruby.Process.VersionNumber
	objspace uint64 // rb_objspace address
	sorted   uint64 // rb_objspace.heap_pages.sorted
	npages   uint64 // rb_objspace.heap_pages.allocated_pages
	// darray: sorted is an rb_darray whose size is the page count (3.4+;
	// allocated_pages counts every page ever allocated).
	darray bool

	// struct heap_page
	slotSize int    // offset of slot_size (short), -1: every slot is baseSlot
	total    uint64 // offset of total_slots (short)
	start    uint64 // offset of start
	body     int    // offset of body (3.4+), -1: the body is found from start
	hdrLen   int    // bytes of heap_page read
	align    uint64 // HEAP_PAGE_ALIGN

	strCapa, aryCapa uint64 // as.heap.aux.capa of RString, RArray
	objNumiv         int    // RObject.as.heap.numiv (3.0-3.1), -1 after
	hashInline       bool   // 3.3: the st_table sits in the slot after RHash
	hashPtr          uint64 // 3.0-3.2: RHash.as.st / as.ar
	arSize           uint64 // a malloc'd ar_table (3.0-3.1), 0 from 3.2
	// shapeTree is &rb_shape_tree_ptr (3.3), 0 when unknown: objects'
	// ivar capacity is their shape's. shapeSource says how it was found
	// (or why not).
	shapeTree   uint64
	shapeSource string

	source string
}

// pageCand is one heap_page layout of the built-in tables.
type pageCand struct {
	slotSize int
	total    uint64
	start    uint64
	body     int
	note     string
}

// pageCands are the heap_page layouts gc.c has had from 3.0 to 3.4:
//
//	3.0:     short total_slots, free_slots, pinned_slots, final_slots;
//	         flags (4 bytes); free_next; RVALUE *start
//	3.1-3.3: short slot_size, total_slots, free_slots, pinned_slots (final_slots
//	         in 3.3's order), final_slots; flags; size_pool; free_next; start
//	3.4:     unsigned short slot_size, total_slots, free_slots, final_slots,
//	         pinned_slots; flags (4 bytes); rb_heap_t *heap; free_next;
//	         struct heap_page_body *body; uintptr_t start
//	         (gc/default/default.c)
//
// 3.1's is tried with and without the size_pool pointer; the pages
// themselves decide (see checkPage).
func pageCands(ver int) []pageCand {
	switch {
	case ver >= 30400:
		return []pageCand{{0, 2, 40, 32, "gc/default/default.c 3.4"}}
	case ver >= 30200:
		return []pageCand{{0, 2, 32, -1, "gc.c 3.2-3.3"}}
	case ver >= 30100:
		return []pageCand{{0, 2, 32, -1, "gc.c 3.1"}, {0, 2, 24, -1, "gc.c 3.1 (no size_pool)"}, {-1, 0, 24, -1, "gc.c 3.0 shape"}}
	default:
		return []pageCand{{-1, 0, 24, -1, "gc.c 3.0"}}
	}
}

func le64(b []byte, off uint64) uint64 {
	if off+8 > uint64(len(b)) {
		return 0
	}
	return binary.LittleEndian.Uint64(b[off:])
}

func le16(b []byte, off uint64) uint64 {
	if off+2 > uint64(len(b)) {
		return 0
	}
	return uint64(binary.LittleEndian.Uint16(b[off:]))
}

func le32(b []byte, off uint64) uint64 {
	if off+4 > uint64(len(b)) {
		return 0
	}
	return uint64(binary.LittleEndian.Uint32(b[off:]))
}

func isPtr(v uint64) bool { return v >= 4096 && v&7 == 0 && v < 1<<56 }

// ErrUnsupported says the census cannot read this Ruby's heap.
var ErrUnsupported = errors.New("heap census not supported")

// resolve finds the offsets for p: DWARF when the layout has the GC's
// structs, else the tables and the objspace shape search; either way the
// first and last pages must pass checkPage.
func resolve(p *ruby.Process) (*offsets, error) { return resolveFrom(p, false) }

// resolveFrom is resolve; with noDWARF it takes the tables and the shape
// search even where DWARF has the structs (the tests prove one against the
// other).
func resolveFrom(p *ruby.Process, noDWARF bool) (*offsets, error) {
	ver := p.VersionNumber()
	if ver < 30000 || ver >= 30500 {
		return nil, fmt.Errorf("%w for Ruby %s: rbscope reads the heaps of Ruby 3.0 to 3.4", ErrUnsupported, p.Version())
	}
	os, src, err := p.Objspace()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	o := &offsets{ver: ver, objspace: os, align: 1 << 14, objNumiv: -1, body: -1, darray: ver >= 30400}
	if ver >= 30200 {
		o.align = 1 << 16
	}
	l := p.Layout()
	if err := o.objectFields(l); err != nil {
		return nil, err
	}
	if ver >= 30300 {
		if o.shapeTree, o.shapeSource, err = findShapeTree(p); err != nil {
			o.shapeTree, o.shapeSource = 0, err.Error()
		}
	}
	t := p.Target()
	sorted, sErr := l.Field("rb_objspace", "heap_pages.sorted")
	alloc, aErr := l.Field("rb_objspace", "heap_pages.allocated_pages")
	start, stErr := l.Field("heap_page", "start")
	total, tErr := l.Field("heap_page", "total_slots")
	if !noDWARF && sErr == nil && aErr == nil && stErr == nil && tErr == nil && sorted.Source == "" && start.Source == "" {
		c := pageCand{slotSize: -1, total: total.Offset, start: start.Offset, body: -1}
		if ss, err := l.Field("heap_page", "slot_size"); err == nil {
			c.slotSize = int(ss.Offset)
		}
		if o.darray {
			b, err := l.Field("heap_page", "body")
			if err != nil {
				return nil, fmt.Errorf("%w: Ruby %s's heap_page has no body field in DWARF (%s): %v", ErrUnsupported, p.Version(), l.Source, err)
			}
			c.body = int(b.Offset)
		}
		o.sorted, o.npages = sorted.Offset, alloc.Offset
		o.setPage(c)
		if _, err := o.checkEnds(t); err != nil {
			return nil, fmt.Errorf("heap pages at the DWARF offsets (%s) fail their checks: %w", l.Source, err)
		}
		o.source = fmt.Sprintf("dwarf: rb_objspace.heap_pages.sorted at +%d, heap_page.start at +%d (%s); objspace from %s", o.sorted, o.start, l.Source, src)
		o.addShapeSource()
		return o, nil
	}
	if err := o.scanObjspace(t); err != nil {
		return nil, err
	}
	o.source = fmt.Sprintf("scan: rb_objspace.heap_pages.sorted found at +%d by its shape, %s; objspace from %s", o.sorted, o.source, src)
	o.addShapeSource()
	return o, nil
}

func (o *offsets) addShapeSource() {
	if o.shapeSource != "" {
		o.source += "; " + o.shapeSource
	}
}

// objectFields resolves the object fields the byte counts read: from the
// layout where it has them, else gc.c's (identical in 3.0-3.3).
func (o *offsets) objectFields(l *layout.Layout) error {
	o.strCapa, o.aryCapa = 32, 24
	if f, err := l.Field("RString", "as.heap.aux.capa"); err == nil {
		o.strCapa = f.Offset
	}
	if f, err := l.Field("RArray", "as.heap.aux.capa"); err == nil {
		o.aryCapa = f.Offset
	}
	if o.strCapa+8 > baseSlot || o.aryCapa+8 > baseSlot {
		return fmt.Errorf("layout %s puts RString/RArray capa outside a slot", l.Source)
	}
	switch {
	case o.ver >= 30300:
		o.hashInline = true // RHash is {basic, ifnone}, then the table
	case o.ver >= 30200:
		o.hashPtr = 16
	default:
		o.hashPtr, o.arSize, o.objNumiv = 16, 128, 16
	}
	return nil
}

func (o *offsets) setPage(c pageCand) {
	o.slotSize, o.total, o.start, o.body = c.slotSize, c.total, c.start, c.body
	o.hdrLen = max(int(c.start+8), c.body+8, 16)
	o.source = c.note
}

// scanObjspace finds heap_pages in rb_objspace by its shape and picks the
// page layout whose pages pass checkPage. Exactly one (offset, layout)
// may pass.
func (o *offsets) scanObjspace(t target.Target) error {
	var b []byte
	for n := objspaceScan; n >= 512; n /= 2 {
		b = make([]byte, n)
		if err := t.ReadAt(b, o.objspace); err == nil {
			break
		}
		b = nil
	}
	if b == nil {
		return fmt.Errorf("read rb_objspace at 0x%x: unreadable", o.objspace)
	}
	type hit struct {
		off uint64
		c   pageCand
	}
	var hits []hit
	var lastErr error
	for off := uint64(0); off+48 <= uint64(len(b)); off += 8 {
		lo, hi, ok := o.listShape(t, b, off)
		if !ok {
			continue
		}
		for _, c := range pageCands(o.ver) {
			o.sorted, o.npages = off, off+8
			o.setPage(c)
			r, err := o.checkEnds(t)
			if err != nil {
				lastErr = err
				continue
			}
			if r[0] != lo || r[1] != hi {
				lastErr = fmt.Errorf("pages span 0x%x-0x%x, heap_pages.range says 0x%x-0x%x", r[0], r[1], lo, hi)
				continue
			}
			hits = append(hits, hit{off, c})
		}
	}
	switch len(hits) {
	case 0:
		if lastErr != nil {
			return fmt.Errorf("%w: no word of rb_objspace leads to checked heap pages (last: %v)", ErrUnsupported, lastErr)
		}
		return fmt.Errorf("%w: no word of rb_objspace looks like heap_pages.sorted", ErrUnsupported)
	case 1:
		o.sorted, o.npages = hits[0].off, hits[0].off+8
		o.setPage(hits[0].c)
		return nil
	}
	return fmt.Errorf("%w: %d places in rb_objspace look like heap_pages.sorted", ErrUnsupported, len(hits))
}

// listShape reports whether the words of rb_objspace b at off have the
// shape of heap_pages, and returns its range[2]. 3.0-3.3: sorted (a
// pointer), allocated_pages (1 to maxPages), allocatable_pages,
// sorted_length (>= allocated_pages), range. 3.4: sorted (an rb_darray
// whose size is allocated_pages - freed_pages and whose capacity is no
// less), allocated_pages, freed_pages, range.
func (o *offsets) listShape(t target.Target, b []byte, off uint64) (lo, hi uint64, ok bool) {
	sorted, n := le64(b, off), le64(b, off+8)
	if !isPtr(sorted) || n == 0 {
		return 0, 0, false
	}
	if !o.darray {
		length := le64(b, off+24)
		lo, hi = le64(b, off+32), le64(b, off+40)
		return lo, hi, n <= maxPages && length >= n && length <= 4*maxPages && isPtr(lo) && hi > lo
	}
	freed := le64(b, off+16)
	lo, hi = le64(b, off+24), le64(b, off+32)
	if freed >= n || n-freed > maxPages || !isPtr(lo) || hi <= lo {
		return 0, 0, false
	}
	var meta [16]byte
	if t.ReadAt(meta[:], sorted) != nil {
		return 0, 0, false
	}
	size, capa := le64(meta[:], 0), le64(meta[:], 8)
	return lo, hi, size == n-freed && capa >= size && capa <= 4*maxPages
}

// pageList reads where the sorted page list's entries are and how many
// there are.
func (o *offsets) pageList(t target.Target) (list, n uint64, err error) {
	var b [16]byte
	if err := t.ReadAt(b[:8], o.objspace+o.sorted); err != nil {
		return 0, 0, fmt.Errorf("read heap_pages.sorted: %w", err)
	}
	list = le64(b[:], 0)
	if !isPtr(list) {
		return 0, 0, fmt.Errorf("%w: heap_pages.sorted is 0x%x", ruby.ErrInconsistent, list)
	}
	if o.darray {
		if err := t.ReadAt(b[:], list); err != nil {
			return 0, 0, fmt.Errorf("read the size of the heap_pages.sorted array at 0x%x: %w", list, err)
		}
		n, capa := le64(b[:], 0), le64(b[:], 8)
		if n > maxPages || capa < n {
			return 0, 0, fmt.Errorf("%w: heap_pages.sorted holds %d pages of %d", ruby.ErrInconsistent, n, capa)
		}
		return list + 16, n, nil
	}
	if err := t.ReadAt(b[8:], o.objspace+o.npages); err != nil {
		return 0, 0, fmt.Errorf("read heap_pages.allocated_pages: %w", err)
	}
	n = le64(b[:], 8)
	if n > maxPages {
		return 0, 0, fmt.Errorf("%w: heap_pages.sorted 0x%x with %d pages", ruby.ErrInconsistent, list, n)
	}
	return list, n, nil
}

// checkEnds checks the first and last pages of the sorted list (and one in
// the middle, and on 3.4 the first page that holds slots) and returns the
// range they span as heap_pages.range holds it: to 3.3 [first slot, end
// of the last page's slots), from 3.4 [first body + its header, end of
// the last body).
func (o *offsets) checkEnds(t target.Target) ([2]uint64, error) {
	var r [2]uint64
	list, n, err := o.pageList(t)
	if err != nil {
		return r, err
	}
	if n == 0 {
		return r, errors.New("heap_pages.sorted holds no page")
	}
	idx := []uint64{0, n / 2, n - 1}
	full := 0
	for k, i := range idx {
		pg, err := o.checkListed(t, list, i)
		if err != nil {
			return r, err
		}
		if !pg.empty {
			full++
		}
		switch {
		case k == 0 && o.darray:
			r[0] = pg.body + 8
		case k == 0:
			r[0] = pg.start
		case k == len(idx)-1 && o.darray:
			r[1] = pg.body + o.align
		case k == len(idx)-1:
			r[1] = pg.end()
		}
	}
	// Pages of the empty pool prove little of the layout: check one
	// with slots.
	for i := uint64(0); full == 0 && i < min(n, listChunk); i++ {
		pg, err := o.checkListed(t, list, i)
		if err != nil {
			return r, err
		}
		if !pg.empty {
			full++
		}
	}
	if full == 0 {
		return r, fmt.Errorf("none of the first %d heap pages holds slots", min(n, listChunk))
	}
	return r, nil
}

// checkListed reads entry i of the sorted page list at list, decodes its
// page and checks that the page's body points back at it.
func (o *offsets) checkListed(t target.Target, list, i uint64) (pageInfo, error) {
	var pb [8]byte
	if err := t.ReadAt(pb[:], list+8*i); err != nil {
		return pageInfo{}, fmt.Errorf("read heap_pages.sorted[%d]: %w", i, err)
	}
	page := le64(pb[:], 0)
	pg, err := o.readPage(t, page)
	if err != nil {
		return pageInfo{}, fmt.Errorf("heap_pages.sorted[%d]: %w", i, err)
	}
	var back [8]byte
	if err := t.ReadAt(back[:], pg.body); err != nil {
		return pageInfo{}, fmt.Errorf("read the body header of page 0x%x: %w", page, err)
	}
	if le64(back[:], 0) != page {
		return pageInfo{}, fmt.Errorf("page 0x%x: its body at 0x%x does not point back at it", page, pg.body)
	}
	return pg, nil
}

func (o *offsets) readPage(t target.Target, page uint64) (pageInfo, error) {
	if !isPtr(page) {
		return pageInfo{}, fmt.Errorf("page pointer 0x%x", page)
	}
	b := make([]byte, o.hdrLen)
	if err := t.ReadAt(b, page); err != nil {
		return pageInfo{}, fmt.Errorf("read heap_page at 0x%x: %w", page, err)
	}
	return o.decodePage(page, b)
}
