package heap

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

// fuzzOffsets are the three page layouts the census meets: 3.1 (16 KiB
// pages, ar tables malloc'd, st tables behind a pointer), 3.3 (64 KiB
// pages, st tables in the slot) and 3.4 (3.3's with the page's body in
// its heap_page, an empty pool, and ELTS_SHARED moved to FL_USER0).
func fuzzOffsets() []*offsets {
	o31 := &offsets{ver: 30102, align: 1 << 14, objNumiv: -1}
	o31.setPage(pageCand{0, 2, 32, -1, "3.1"})
	o33 := &offsets{ver: 30308, align: 1 << 16, objNumiv: -1}
	o33.setPage(pageCand{0, 2, 32, -1, "3.3"})
	o34 := &offsets{ver: 30405, align: 1 << 16, objNumiv: -1, darray: true}
	o34.setPage(pageCand{0, 2, 40, 32, "3.4"})
	for _, o := range []*offsets{o31, o33, o34} {
		o.strCapa, o.aryCapa = 32, 24
		if o.ver < 30200 {
			o.hashPtr, o.arSize, o.objNumiv = 16, 128, 16
		} else {
			o.hashInline = true
		}
	}
	return []*offsets{o31, o33, o34}
}

// fuzzPageAddr is where fuzz inputs say their heap_page is.
const fuzzPageAddr = 0x5555_0000_1000

// seedPage builds a heap_page struct and the start of its body: a page of
// slots of size slot at body 0x7f00_0000_0000 with a few objects of every
// kind the census decodes (the rest of the body is zeros: free slots).
func seedPage(o *offsets, slot uint64) []byte {
	body := uint64(0x7f00_0000_0000)
	start := body + 40 // 8-byte header, moved up to a multiple of 40
	total := (o.align - 40) / slot
	hdr := make([]byte, o.hdrLen)
	binary.LittleEndian.PutUint16(hdr[0:], uint16(slot))
	binary.LittleEndian.PutUint16(hdr[o.total:], uint16(total))
	binary.LittleEndian.PutUint64(hdr[o.start:], start)
	if o.body >= 0 {
		binary.LittleEndian.PutUint64(hdr[o.body:], body)
	}
	b := make([]byte, 40+8*slot)
	binary.LittleEndian.PutUint64(b, fuzzPageAddr)
	put := func(i int, words ...uint64) {
		for k, w := range words {
			binary.LittleEndian.PutUint64(b[40+uint64(i)*slot+uint64(8*k):], w)
		}
	}
	klass := uint64(0x7f00_1000_0000)
	put(0, tString|flUser1, klass, 1024, 0x7f00_2000_0000, 1024)           // heap string
	put(1, tArray, klass, 100, 100, 0x7f00_2000_1000)                      // heap array, capa 100
	put(2, tHash|flUser3, klass, 0x7f00_2000_2000, 0x0000_0000_0000_0403)  // st hash
	put(3, tObject, klass, 4, 0x7f00_2000_3000)                            // heap ivars
	put(4, tImemo, 8, 0, 0)                                                // klass is no class
	put(5, tString|flUser1|o.sharedFlag(), klass, 10, 0x7f00_2000_4000, 0) // shared string
	return append(hdr, b...)
}

func fuzzSeeds() map[string][]byte {
	os := fuzzOffsets()
	return map[string][]byte{
		"page-3.1":     seedPage(os[0], 40),
		"page-3.3-80":  seedPage(os[1], 80),
		"page-3.3-640": seedPage(os[1], 640),
		"page-3.4-160": seedPage(os[2], 160),
	}
}

const seedDir = "testdata/fuzz/FuzzPage"

// FuzzPage decodes arbitrary bytes as a heap_page struct followed by its
// body (zero-padded to the page) with both page layouts and counts the
// slots: no panic, no allocation beyond one page, and counts that add up.
func FuzzPage(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, o := range fuzzOffsets() {
			if len(data) < o.hdrLen {
				continue
			}
			pg, err := o.decodePage(fuzzPageAddr, data[:o.hdrLen])
			if err != nil {
				continue
			}
			if pg.span() > o.align || pg.start < pg.body || pg.end() > pg.body+o.align {
				t.Fatalf("page %+v passed its checks but spans %d bytes of a %d-byte page", pg, pg.span(), o.align)
			}
			body := make([]byte, pg.span())
			copy(body, data[o.hdrLen:])
			c := &Census{Types: map[string]uint64{}}
			w := &walk{h: &Heap{o: o}, c: c, byKey: map[key]*acc{}, stopped: true}
			w.slots(pg, body, nil)
			w.countTypes()
			if c.Slots != pg.total {
				t.Fatalf("%d slots counted of %d", c.Slots, pg.total)
			}
			var sum uint64
			for _, n := range c.Types {
				sum += n
			}
			if sum+c.Bad != c.Slots {
				t.Fatalf("types add up to %d + %d bad, %d slots", sum, c.Bad, c.Slots)
			}
			for i := range w.tables {
				w.tables[i].Buf = make([]byte, stSize)
				copy(w.tables[i].Buf, data[min(len(data), o.hdrLen):])
				stMemsize(w.tables[i].Buf)
			}
		}
	})
}

// TestFuzzPageSeeds checks the committed seed corpus and that every seed
// reaches the slot decoder (so that fuzzing starts deep).
func TestFuzzPageSeeds(t *testing.T) {
	os := fuzzOffsets()
	for name, data := range fuzzSeeds() {
		got := testutil.CommittedFuzzSeed(t, seedDir, name, data)
		o := os[1]
		switch {
		case name == "page-3.1":
			o = os[0]
		case strings.HasPrefix(name, "page-3.4"):
			o = os[2]
		}
		pg, err := o.decodePage(fuzzPageAddr, got[:o.hdrLen])
		if err != nil {
			t.Errorf("seed %s: %v", name, err)
			continue
		}
		c := &Census{Types: map[string]uint64{}}
		w := &walk{h: &Heap{o: o}, c: c, byKey: map[key]*acc{}, stopped: true}
		body := make([]byte, pg.span())
		copy(body, got[o.hdrLen:])
		w.slots(pg, body, nil)
		w.countTypes()
		if c.Types["T_STRING"] != 2 || c.Types["T_ARRAY"] != 1 || c.Types["T_HASH"] != 1 || c.Bad != 0 {
			t.Errorf("seed %s: types %v, %d bad", name, c.Types, c.Bad)
		}
	}
}

// TestStMemsize checks st_memsize's arithmetic on tables st.c makes: 8
// entries without bins, 64 entries with 128 one-byte bins.
func TestStMemsize(t *testing.T) {
	tab := make([]byte, stSize)
	tab[0] = 3 // entry_power: 8 entries
	if n, ok := stMemsize(tab); !ok || n != 8*24 {
		t.Errorf("8-entry table without bins: %d, %v", n, ok)
	}
	tab[0], tab[1], tab[2] = 6, 7, 0
	binary.LittleEndian.PutUint64(tab[stBins:], 0x1000)
	if n, ok := stMemsize(tab); !ok || n != 64*24+128 {
		t.Errorf("64-entry table with 128 bins: %d, %v", n, ok)
	}
	binary.LittleEndian.PutUint64(tab[stNumEntries:], 65)
	if _, ok := stMemsize(tab); ok {
		t.Error("65 entries in a 64-entry table passed")
	}
}
