package heap

import (
	"fmt"
	"sort"
)

// Object is what one slot holds now, read from outside by its address
// (rbscope alloc --retained checks the objects it tracked this way).
type Object struct {
	Addr uint64
	// Type is flags & 0x1f (0: the slot is free), Klass RBasic.klass.
	Type  uint8
	Klass uint64
	// Bytes are the slot's size plus what Ruby malloc'd for the object
	// outside it, as the census counts them (strings' and arrays' heap
	// buffers, 3.3 hashes' tables, 3.0-3.1 objects' ivars).
	Bytes uint64
	// Err says why the slot could not be read (its page is gone, the
	// address is no slot of it): the object is not there.
	Err error
}

// Objects reads the slots at addrs, each checked against its page (the
// body's header points at a heap_page whose slots include the address).
// The result is in the order of addrs.
func (h *Heap) Objects(addrs []uint64) []Object {
	out := make([]Object, len(addrs))
	idx := make([]int, len(addrs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return addrs[idx[a]] < addrs[idx[b]] })
	var cur pageInfo
	var curErr error
	curBody := ^uint64(0)
	buf := make([]byte, 32*baseSlot)
	for _, i := range idx {
		a := addrs[i]
		out[i].Addr = a
		body := a &^ (h.o.align - 1)
		if body != curBody {
			curBody = body
			cur, curErr = h.pageOf(body)
		}
		if curErr != nil {
			out[i].Err = curErr
			continue
		}
		if a < cur.start || a >= cur.end() || (a-cur.start)%cur.slot != 0 {
			out[i].Err = fmt.Errorf("0x%x is no slot of page 0x%x", a, cur.page)
			continue
		}
		b := buf[:cur.slot]
		if err := h.t.ReadAt(b, a); err != nil {
			out[i].Err = fmt.Errorf("read slot 0x%x: %w", a, err)
			continue
		}
		s := h.o.decodeSlot(b)
		out[i].Type, out[i].Klass = s.typ, s.klass
		out[i].Bytes = cur.slot
		if h.o.counted(s.typ, false) && s.table == 0 && !s.bad {
			out[i].Bytes += s.malloc
		}
	}
	return out
}

// pageOf reads the heap page whose body starts at body.
func (h *Heap) pageOf(body uint64) (pageInfo, error) {
	var hdr [8]byte
	if err := h.t.ReadAt(hdr[:], body); err != nil {
		return pageInfo{}, fmt.Errorf("read page body 0x%x: %w", body, err)
	}
	pg, err := h.o.readPage(h.t, le64(hdr[:], 0))
	if err != nil {
		return pageInfo{}, err
	}
	if pg.body != body {
		return pageInfo{}, fmt.Errorf("page 0x%x does not own the body at 0x%x", pg.page, body)
	}
	return pg, nil
}

// MarkBits says where the GC keeps its mark bits: the bit of the object
// at address a is bit n%64 of the word at page+Offset+8*(n/64), where
// page is the heap_page the first word of a's page body (a &^ (Align-1))
// points at, and n = (a - body) / BaseSlot. When a GC's sweep begins,
// the objects whose bit is clear are the ones it frees.
type MarkBits struct {
	Align, Offset, BaseSlot uint64
	Source                  string
}

// MarkBits finds heap_page.mark_bits: from DWARF, else from gc.c's
// layout (3.0-3.3: after start come freelist, a list node and the
// write-barrier-unprotected bitmap, HEAP_PAGE_BITMAP_LIMIT words of
// it), checked on the heap's first pages: no free slot is marked, and
// the classes (old objects, marked between GCs) are.
func (h *Heap) MarkBits() (MarkBits, error) {
	l := h.p.Layout()
	f, err := l.Field("heap_page", "mark_bits")
	if err != nil || f.Source != "" {
		return h.MarkBitsTable()
	}
	m := MarkBits{Align: h.o.align, BaseSlot: baseSlot, Offset: f.Offset, Source: "dwarf: heap_page.mark_bits at +" + fmt.Sprint(f.Offset)}
	if err := h.checkMarkBits(m); err != nil {
		return MarkBits{}, fmt.Errorf("mark bits (%s): %w", m.Source, err)
	}
	return m, nil
}

// MarkBitsTable is MarkBits from gc.c's layout alone, even where DWARF
// has it (the tests prove one against the other).
func (h *Heap) MarkBitsTable() (MarkBits, error) {
	m := MarkBits{Align: h.o.align, BaseSlot: baseSlot}
	m.Offset = h.o.start + 32 + 8*bitmapLimit(h.o.align, h.o.ver)
	m.Source = fmt.Sprintf("gc.c: heap_page.mark_bits at +%d (start at +%d, %d-word bitmaps)", m.Offset, h.o.start, bitmapLimit(h.o.align, h.o.ver))
	if err := h.checkMarkBits(m); err != nil {
		return MarkBits{}, fmt.Errorf("mark bits (%s): %w", m.Source, err)
	}
	return m, nil
}

// bitmapLimit is HEAP_PAGE_BITMAP_LIMIT: the bits of a page's base slots,
// in 64-bit words. HEAP_PAGE_SIZE is the aligned page less malloc's
// overhead (5 words) to 3.1, the whole aligned page from 3.2.
func bitmapLimit(align uint64, ver int) uint64 {
	size := align
	if ver < 30200 {
		size -= 5 * 8
	}
	slots := (size + baseSlot - 1) / baseSlot
	return (slots + 63) / 64
}

// checkMarkBits checks m on the first pages of the heap.
func (h *Heap) checkMarkBits(m MarkBits) error {
	pages, err := h.Pages()
	if err != nil {
		return err
	}
	var free, freeMarked, classes, classesMarked int
	for i, p := range pages {
		if i >= 16 {
			break
		}
		pg, err := h.pageOf(p.Body)
		if err != nil || pg.empty {
			continue
		}
		body := make([]byte, pg.end()-pg.body)
		if err := h.t.ReadAt(body, pg.body); err != nil {
			continue
		}
		bits := make([]byte, 8*bitmapLimit(m.Align, h.o.ver))
		if err := h.t.ReadAt(bits, pg.page+m.Offset); err != nil {
			return fmt.Errorf("read the mark bits of page 0x%x: %w", pg.page, err)
		}
		for a := pg.start; a < pg.end(); a += pg.slot {
			n := (a - pg.body) / baseSlot
			marked := le64(bits, 8*(n/64))&(1<<(n%64)) != 0
			flags := le64(body, a-pg.body)
			switch flags & tMask {
			case tNone:
				free++
				if marked {
					freeMarked++
				}
			case tClass, tModule:
				classes++
				if marked {
					classesMarked++
				}
			}
		}
	}
	if classes == 0 {
		return fmt.Errorf("no class in the first pages to check them with")
	}
	if freeMarked > free/10 || classesMarked < classes/2 {
		return fmt.Errorf("%d of %d free slots marked, %d of %d classes", freeMarked, free, classesMarked, classes)
	}
	return nil
}
