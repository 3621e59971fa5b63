package heap

import (
	"bufio"
	"strconv"

	"github.com/rbscope/rbscope/internal/target"
)

// A heap dump in the format of Ruby's ObjectSpace.dump_all (JSON lines, one
// per live object: address, type, slot_size, class, memsize, references and
// some per-type fields), written while the census walks the heap, batch by
// batch. What it holds, and what it leaves out of dump_all's lines:
//
//   - every live slot, with its address, type, slot_size, class address
//     (hidden objects have none) and memsize (as the census counts it);
//   - references: an array's elements (a shared array: the array it
//     shares), an object's instance variables (3.0-3.1, and 3.3 through
//     the shape list), a shared string's string: the heap objects among
//     them; other types list none;
//   - STRING: bytesize, embedded, shared; ARRAY: length, embedded,
//     shared; HASH: size (3.3, and 3.0-3.1 st tables); OBJECT: embedded;
//     CLASS/MODULE: name;
//   - no ROOT lines, no string contents, no allocation sites, no GC flags.

// dumpTypeNames are dump_all's type names (obj_type in objspace_dump.c).
var dumpTypeNames = func() [32]string {
	var n [32]string
	for i, s := range typeNames {
		if len(s) > 2 && s[:2] == "T_" {
			n[i] = s[2:]
		}
	}
	n[tNone] = "NONE"
	return n
}()

// maxRefBytes bounds the buffer read for one object's references (an
// array's elements, an object's ivars): 128k references.
const maxRefBytes = 1 << 20

// Flags of the dump.
const (
	flFrozen          = 1 << 11    // FL_FREEZE
	aryEmbedLenMask   = 0x7f << 15 // RARRAY_EMBED_LEN_MASK, 3.2+ (FL_USER3..9)
	aryEmbedLenMask31 = 0x3 << 15  // before 3.2 (FL_USER3..4)
	aryEmbedShift     = 15
	hashArSizeMask    = 0xf << 16 // RHASH_AR_TABLE_SIZE_MASK (FL_USER4..7)
	hashArSizeShift   = 16
)

// dumpRec is one object of a batch, written once the batch's extra reads
// are done.
type dumpRec struct {
	addr, klass, slotSize, memsize uint64
	typ                            uint8
	flags                          uint64
	// inline are references held in the slot; buf the index of a read
	// of out-of-slot references (-1: none); table the index of the
	// hash's st_table read (-1: none).
	inline     []uint64
	buf, table int
	length     int64 // array length, string bytesize, hash size; -1 unknown
}

// dumper writes dump_all lines.
type dumper struct {
	w      *bufio.Writer
	recs   []dumpRec
	reads  []target.Read
	refBuf []byte
	names  map[uint64]string
	err    error
	n      uint64
	// tableBytes and tableEntries are the sizes of the batch's st_tables
	// (walk.tables), filled by readTables.
	tableBytes   []uint64
	tableEntries []int64
}

// record takes one live slot of a batch (sb its bytes, at addr).
func (d *dumper) record(w *walk, addr uint64, pg pageInfo, sb []byte, s slot, table int) {
	o := w.h.o
	flags := le64(sb, 0)
	r := dumpRec{addr: addr, klass: s.klass, slotSize: pg.slot, memsize: pg.slot + s.malloc, typ: s.typ, flags: flags, buf: -1, table: table, length: -1}
	switch s.typ {
	case tImemo, tNode, tZombie, tMoved:
		r.klass = 0
	case tString:
		r.length = int64(le64(sb, 16)) // RString.len (3.2+; as.heap.len before, the same offset)
		if flags&flUser1 == 0 && o.ver < 30200 {
			r.length = int64(flags >> 14 & 0x1f) // RSTRING_EMBED_LEN before 3.2
		}
		if flags&(flUser1|o.sharedFlag()) == flUser1|o.sharedFlag() {
			// Shared: dump_all names the string it shares instead of
			// its size (as.heap.aux.shared).
			r.length = -1
			r.inline = append(r.inline, le64(sb, o.strCapa))
		}
	case tArray:
		if flags&flUser1 != 0 { // embedded
			mask := uint64(aryEmbedLenMask)
			if o.ver < 30200 {
				mask = aryEmbedLenMask31
			}
			n := (flags & mask) >> aryEmbedShift
			r.length = int64(n)
			for i := uint64(0); i < n && 16+8*i+8 <= uint64(len(sb)); i++ {
				r.inline = append(r.inline, le64(sb, 16+8*i))
			}
		} else {
			n := le64(sb, 16) // as.heap.len
			r.length = int64(n)
			if flags&o.sharedFlag() != 0 {
				// Shared: the array it shares is its one reference
				// (as.heap.aux.shared_root).
				r.inline = append(r.inline, le64(sb, o.aryCapa))
			} else {
				r.buf = d.addRead(le64(sb, 32), n*8) // as.heap.ptr
			}
		}
	case tObject:
		d.objectRefs(w, &r, sb, s)
	case tHash:
		if flags&flUser3 == 0 {
			r.length = int64((flags & hashArSizeMask) >> hashArSizeShift)
		} else if o.hashInline && len(sb) >= 24+stSize {
			r.length = int64(le64(sb, 24+stNumEntries))
		}
	}
	d.recs = append(d.recs, r)
}

// objectRefs finds where an object's ivars are.
func (d *dumper) objectRefs(w *walk, r *dumpRec, sb []byte, s slot) {
	o := w.h.o
	embedded := r.flags&flUser1 != 0
	switch {
	case o.ver < 30200:
		if embedded {
			for off := uint64(16); off+8 <= uint64(len(sb)) && off < 40; off += 8 {
				r.inline = append(r.inline, le64(sb, off))
			}
		} else {
			r.buf = d.addRead(le64(sb, 24), le32(sb, 16)*8) // as.heap.ivptr, numiv
		}
	case o.ver >= 30300 && w.shapes != nil:
		id := uint32(r.flags >> 32)
		off := uint64(id) * shapeSize
		if off+shapeSize > uint64(len(w.shapes)) {
			return
		}
		sh := w.shapes[off : off+shapeSize]
		if sh[shapeType] == shapeTooComplex {
			return
		}
		n := le32(sh, shapeNextIv)
		if embedded {
			for i := uint64(0); i < n && 16+8*i+8 <= uint64(len(sb)); i++ {
				r.inline = append(r.inline, le64(sb, 16+8*i))
			}
		} else {
			r.buf = d.addRead(le64(sb, robjectHeapIvptr), n*8)
		}
	}
}

func (d *dumper) addRead(addr, n uint64) int {
	if n == 0 || !isPtr(addr) {
		return -1
	}
	n = min(n, maxRefBytes)
	d.reads = append(d.reads, target.Read{Addr: addr, Buf: make([]byte, n)})
	return len(d.reads) - 1
}

// flush reads the batch's out-of-slot references and writes its lines.
func (d *dumper) flush(w *walk) {
	ok := w.readAll(d.reads)
	for _, r := range d.recs {
		if r.table >= 0 && r.table < len(d.tableBytes) {
			r.memsize += d.tableBytes[r.table]
			if r.typ == tHash {
				r.length = d.tableEntries[r.table]
			}
		}
		d.line(w, r, ok)
	}
	d.recs, d.reads = d.recs[:0], d.reads[:0]
}

func appendHex(b []byte, v uint64) []byte {
	b = append(b, `"0x`...)
	b = strconv.AppendUint(b, v, 16)
	return append(b, '"')
}

func (d *dumper) line(w *walk, r dumpRec, ok []bool) {
	if d.err != nil {
		return
	}
	shared := w.h.o.sharedFlag()
	b := make([]byte, 0, 256)
	b = append(b, `{"address":`...)
	b = appendHex(b, r.addr)
	b = append(b, `, "type":"`...)
	name := dumpTypeNames[r.typ]
	if name == "" {
		name = TypeName(r.typ)
	}
	b = append(b, name...)
	b = append(b, `", "slot_size":`...)
	b = strconv.AppendUint(b, r.slotSize, 10)
	if r.klass != 0 {
		b = append(b, `, "class":`...)
		b = appendHex(b, r.klass)
	}
	if r.flags&flFrozen != 0 {
		b = append(b, `, "frozen":true`...)
	}
	switch r.typ {
	case tString:
		if r.flags&flUser1 == 0 {
			b = append(b, `, "embedded":true`...)
		}
		if r.flags&(flUser1|shared) == flUser1|shared {
			b = append(b, `, "shared":true`...)
		}
		if r.length >= 0 {
			b = append(b, `, "bytesize":`...)
			b = strconv.AppendInt(b, r.length, 10)
		}
	case tArray:
		b = append(b, `, "length":`...)
		b = strconv.AppendInt(b, r.length, 10)
		if r.length > 0 && r.flags&shared != 0 {
			b = append(b, `, "shared":true`...)
		}
		if r.flags&flUser1 != 0 {
			b = append(b, `, "embedded":true`...)
		}
	case tHash:
		if r.length >= 0 {
			b = append(b, `, "size":`...)
			b = strconv.AppendInt(b, r.length, 10)
		}
	case tObject:
		if r.flags&flUser1 != 0 {
			b = append(b, `, "embedded":true`...)
		}
	case tClass, tModule:
		nm, seen := d.names[r.addr]
		if !seen {
			if n, err := w.h.p.ClassName(r.addr); err == nil {
				nm = n
			}
			d.names[r.addr] = nm
		}
		if nm != "" {
			b = append(b, `, "name":`...)
			b = strconv.AppendQuote(b, nm)
		}
	}
	refs := 0
	ref := func(v uint64) {
		if !isPtr(v) {
			return
		}
		if refs == 0 {
			b = append(b, `, "references":[`...)
		} else {
			b = append(b, ", "...)
		}
		b = appendHex(b, v)
		refs++
	}
	for _, v := range r.inline {
		ref(v)
	}
	if r.buf >= 0 && ok[r.buf] {
		buf := d.reads[r.buf].Buf
		for off := 0; off+8 <= len(buf); off += 8 {
			ref(le64(buf, uint64(off)))
		}
	}
	if refs > 0 {
		b = append(b, ']')
	}
	b = append(b, `, "memsize":`...)
	b = strconv.AppendUint(b, r.memsize, 10)
	b = append(b, "}\n"...)
	if _, err := d.w.Write(b); err != nil {
		d.err = err
	}
	d.n++
}
