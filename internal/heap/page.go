package heap

import (
	"fmt"
)

// pageInfo is one heap page, decoded from its struct heap_page.
type pageInfo struct {
	page  uint64 // the struct heap_page
	body  uint64 // the page body (its header points back at page)
	start uint64 // the first slot
	total uint64 // slots
	slot  uint64 // slot size
	// empty: a page of 3.4's global empty pool (no slots; start is body
	// and total 0).
	empty bool
}

// end is the end of the page's last slot.
func (pg pageInfo) end() uint64 { return pg.start + pg.total*pg.slot }

// span is the bytes a census reads for the page: from the body header to
// the end of the last slot.
func (pg pageInfo) span() uint64 { return pg.end() - pg.body }

// decodePage decodes struct heap_page bytes b (read from address page) and
// checks what gc.c guarantees: a slot size that is a multiple of the base
// slot (at most 32 of them), a first slot past the body header by less
// than one slot (gc.c moves it up to a multiple of the base slot size
// from 3.1, of the slot size in 3.3.0, and 3.4 by up to one slot more),
// slots that fill the body to within one slot of its end, and (3.4) a
// body field that is the page the first slot is in. A 3.4 page of the
// global empty pool (start, total_slots and slot_size zero) decodes as
// empty, with its body. Whether the body header points back at the page
// is checked by the caller, which reads the body.
func (o *offsets) decodePage(page uint64, b []byte) (pageInfo, error) {
	if len(b) < o.hdrLen {
		return pageInfo{}, fmt.Errorf("page 0x%x: %d bytes of heap_page, want %d", page, len(b), o.hdrLen)
	}
	pg := pageInfo{page: page, start: le64(b, o.start), total: le16(b, o.total), slot: baseSlot}
	if o.slotSize >= 0 {
		pg.slot = le16(b, uint64(o.slotSize))
	}
	body := uint64(0)
	if o.body >= 0 {
		body = le64(b, uint64(o.body))
		if !isPtr(body) || body&(o.align-1) != 0 {
			return pageInfo{}, fmt.Errorf("page 0x%x: body 0x%x", page, body)
		}
		if o.darray && pg.start == 0 && pg.total == 0 && pg.slot == 0 {
			return pageInfo{page: page, body: body, start: body, slot: baseSlot, empty: true}, nil
		}
	}
	if pg.slot < baseSlot || pg.slot%baseSlot != 0 || pg.slot > 32*baseSlot {
		return pageInfo{}, fmt.Errorf("page 0x%x: slot size %d", page, pg.slot)
	}
	if !isPtr(pg.start) || pg.total == 0 {
		return pageInfo{}, fmt.Errorf("page 0x%x: start 0x%x, %d slots", page, pg.start, pg.total)
	}
	pg.body = pg.start &^ (o.align - 1)
	if o.body >= 0 && body != pg.body {
		return pageInfo{}, fmt.Errorf("page 0x%x: first slot 0x%x is not in its body 0x%x", page, pg.start, body)
	}
	gap := pg.start - pg.body
	if gap < 8 || gap >= 8+pg.slot {
		return pageInfo{}, fmt.Errorf("page 0x%x: first slot 0x%x is %d bytes into its body", page, pg.start, gap)
	}
	if room := o.align - gap; pg.total*pg.slot > room || room-pg.total*pg.slot >= pg.slot {
		return pageInfo{}, fmt.Errorf("page 0x%x: %d slots of %d bytes do not fill a %d-byte page", page, pg.total, pg.slot, o.align)
	}
	return pg, nil
}

// slot is what the census takes from one slot.
type slot struct {
	typ    uint8
	klass  uint64
	malloc uint64 // bytes malloc'd outside the slot, known from the slot
	table  uint64 // 3.0-3.2: address of an st_table to read for its size
	bad    bool   // the slot's fields are impossible (torn or corrupt)
	// shape is the shape id of a 3.3 object whose ivars are out of its
	// slot (heapIvars): their capacity is the shape's.
	shape     uint32
	heapIvars bool
}

// st_table (st.c, the same from 2.6 to 3.4): entry_power, bin_power and
// size_ind bytes, then rebuilds_num, type, num_entries, bins, entries_start,
// entries_bound, entries.
const (
	stSize       = 56
	stNumEntries = 16
	stBins       = 24
	stEntrySize  = 24 // st_table_entry: hash, key, record
	maxCapa      = 1 << 40
)

// stMemsize is st_memsize(tab) minus sizeof(st_table) (the table's entries
// and bins) from the table's bytes, or false when they are impossible.
func stMemsize(b []byte) (uint64, bool) {
	if len(b) < stSize {
		return 0, false
	}
	ep, bp, si := uint64(b[0]), uint64(b[1]), uint64(b[2])
	if ep > 30 || si > 3 || (bp != 0 && bp > 31) || le64(b, stNumEntries) > 1<<ep {
		return 0, false
	}
	size := (uint64(1) << ep) * stEntrySize
	if le64(b, stBins) != 0 {
		bins := (uint64(1) << bp) << si
		size += (bins + 7) &^ 7
	}
	return size, true
}

// decodeSlot decodes one slot's bytes (at least baseSlot of them).
func (o *offsets) decodeSlot(b []byte) slot {
	flags := le64(b, 0)
	s := slot{typ: uint8(flags & tMask), klass: le64(b, 8)}
	if flags == 0 {
		s.typ = tNone
		return s
	}
	switch s.typ {
	case tString:
		if flags&(flUser1|o.sharedFlag()) == flUser1 { // heap buffer, not shared
			capa := le64(b, o.strCapa)
			if capa > maxCapa {
				s.bad = true
			}
			s.malloc = capa + 1 // TERM_LEN of a single-byte terminator
		}
	case tArray:
		if flags&(flUser1|o.sharedFlag()) == 0 { // owns its heap buffer
			capa := le64(b, o.aryCapa)
			if capa > maxCapa {
				s.bad = true
			}
			s.malloc = capa * 8
		}
	case tObject:
		switch {
		case flags&flUser1 != 0: // embedded
		case o.objNumiv >= 0:
			s.malloc = le32(b, uint64(o.objNumiv)) * 8
		case o.ver >= 30300:
			s.heapIvars, s.shape = true, uint32(flags>>32)
		}
	case tHash:
		st := flags&flUser3 != 0
		switch {
		case o.hashInline:
			if st {
				if len(b) < 24+stSize {
					s.bad = true
					break
				}
				n, ok := stMemsize(b[24 : 24+stSize])
				s.malloc, s.bad = n, !ok
			}
		case st:
			s.table = le64(b, o.hashPtr)
			if !isPtr(s.table) {
				s.bad = true
			}
		case le64(b, o.hashPtr) != 0:
			s.malloc = o.arSize
		}
	}
	if classOf(s.typ, s.klass) != 0 && !isPtr(s.klass) {
		s.bad = true
	}
	return s
}

// counted reports whether the census counts out-of-slot bytes for type t
// (the others count their slot only); shapes says whether the 3.3 shape
// list was read.
func (o *offsets) counted(t uint8, shapes bool) bool {
	switch t {
	case tString, tArray, tHash:
		return true
	case tObject:
		return o.objNumiv >= 0 || shapes
	}
	return false
}

// rb_shape_t (shape.h, 3.3): edges, edge_name, next_iv_index (u32),
// capacity (u32), type (u8), size_pool_index (u8), parent_id (u32),
// ancestor_index; rb_shape_tree_t: shape_list, root_shape, next_shape_id.
const (
	shapeSize        = 40
	shapeNextIv      = 16
	shapeCapacity    = 20
	shapeType        = 24
	shapeTooComplex  = 4 // SHAPE_OBJ_TOO_COMPLEX
	maxShapes        = 1 << 18
	treeNextShapeID  = 16
	robjectHeapIvptr = 16
)

// shapeIvars is what a 3.3 object with shape id out of its slot holds
// outside it: capacity * 8 bytes of ivars, or (too complex) an st_table
// at its ivptr to read. ok is false when the shape is unknown or
// impossible.
func shapeIvars(shapes []byte, id uint32) (bytes uint64, tooComplex bool, ok bool) {
	off := uint64(id) * shapeSize
	if off+shapeSize > uint64(len(shapes)) {
		return 0, false, false
	}
	sh := shapes[off : off+shapeSize]
	capa, next, typ := le32(sh, shapeCapacity), le32(sh, shapeNextIv), sh[shapeType]
	if typ == shapeTooComplex {
		return 0, true, true
	}
	if typ > shapeTooComplex || capa < next || capa > 1<<16 {
		return 0, false, false
	}
	return capa * 8, false, true
}
