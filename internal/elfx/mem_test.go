package elfx

import (
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
)

func TestReadMemoryImageBuilt(t *testing.T) {
	const base = 0x7f1234560000
	for _, hash := range []string{"gnu", "sysv", ""} {
		for _, relocated := range []bool{false, true} {
			for _, link := range []uint64{0, 0x400000} {
				ti := defaultTinyImage()
				ti.hash, ti.relocated, ti.link = hash, relocated, link
				at := uint64(base)
				if link != 0 {
					at = link // a non-PIE executable runs at its link address
				}
				img, err := ReadMemoryImage(byteMem{at, ti.bytes(at)}, at)
				if err != nil {
					t.Fatalf("hash %q relocated %v link 0x%x: %v", hash, relocated, link, err)
				}
				bias := at - link
				if img.Bias != bias || img.Base != at || img.Soname != "libtiny.so.1" || img.BuildID != hex.EncodeToString(tinyBuildID) {
					t.Errorf("hash %q relocated %v link 0x%x: bias 0x%x base 0x%x soname %q build %q",
						hash, relocated, link, img.Bias, img.Base, img.Soname, img.BuildID)
				}
				want := map[string]Symbol{
					"ruby_version":    {Name: "ruby_version", Value: bias + 0x2000, Size: 8},
					"rb_func":         {Name: "rb_func", Value: bias + 0x3000, Size: 8},
					"ruby_current_ec": {Name: "ruby_current_ec", Value: 8, Size: 8, TLS: true},
					"abs_sym":         {Name: "abs_sym", Value: 0x1234, Size: 8},
				}
				for name, w := range want {
					if got, ok := img.Lookup(name); !ok || got != w {
						t.Errorf("hash %q relocated %v link 0x%x: Lookup(%s) = %+v, %v; want %+v", hash, relocated, link, name, got, ok, w)
					}
				}
				if _, ok := img.Lookup("rb_undefined"); ok {
					t.Error("an undefined (imported) symbol was found")
				}
				if len(img.Symbols) != len(want) {
					t.Errorf("%d symbols, want %d", len(img.Symbols), len(want))
				}
			}
		}
	}
}

func TestReadMemoryImageBad(t *testing.T) {
	const base = 0x10000
	good := defaultTinyImage().bytes(base)
	le := binary.LittleEndian
	patch := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	cases := []struct {
		name string
		mem  []byte
		want string
	}{
		{"no header", make([]byte, 64), "no ELF header"},
		{"32-bit", patch(func(b []byte) { b[4] = 1 }), "64-bit"},
		{"phnum", patch(func(b []byte) { le.PutUint16(b[56:], 0) }), "bad program header table"},
		{"phentsize", patch(func(b []byte) { le.PutUint16(b[54:], 64) }), "bad program header table"},
		{"phoff", patch(func(b []byte) { le.PutUint64(b[32:], 1<<40) }), "bad program header table"},
		{"no load", patch(func(b []byte) { le.PutUint32(b[tiPhdr:], 6) }), "no PT_LOAD"},
		{"no dynamic", patch(func(b []byte) { le.PutUint32(b[tiPhdr+56:], 6) }), "no dynamic section"},
		{"dynamic unmapped", patch(func(b []byte) { le.PutUint64(b[tiPhdr+56+16:], 1<<30) }), "read dynamic section"},
		{"no symtab", patch(func(b []byte) { le.PutUint64(b[tiDynamic+16:], 99) }), "lacks DT_SYMTAB"},
		{"strsz", patch(func(b []byte) { le.PutUint64(b[tiDynamic+2*16+8:], 1<<40) }), "over the"},
		{"syment", patch(func(b []byte) { le.PutUint64(b[tiDynamic+3*16+8:], 16) }), "not 24"},
		{"buckets", patch(func(b []byte) { le.PutUint32(b[tiHash:], 1<<30) }), "over the limit"},
		{"bloom", patch(func(b []byte) { le.PutUint32(b[tiHash+8:], 1<<20) }), "read GNU hash buckets"},
	}
	// A chain that never ends, in memory long enough to hit the cap.
	// The hash table moves past the image, all its chain words even.
	endless := append(append([]byte(nil), good...), make([]byte, 4*MaxMemSymbols+64)...)
	le.PutUint64(endless[tiDynamic+5*16+8:], tiSize)
	copy(endless[tiSize:], good[tiHash:tiHash+28])
	for i := tiSize + 28; i+4 <= len(endless); i += 4 {
		le.PutUint32(endless[i:], 2)
	}
	cases = append(cases, struct {
		name string
		mem  []byte
		want string
	}{"endless chain", endless, "GNU hash chain runs past"})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadMemoryImage(byteMem{base, c.mem}, base)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
		})
	}
	// Memory cut at every point: an error or (past what the symbols
	// need) an image, never a panic.
	for cut := 0; cut <= len(good); cut++ {
		img, err := ReadMemoryImage(byteMem{base, good[:cut]}, base)
		if err == nil && len(img.Symbols) != 4 {
			t.Fatalf("cut at %d: %d symbols", cut, len(img.Symbols))
		}
		if err == nil && cut < tiDynamic {
			t.Fatalf("cut at %d, before the dynamic section: no error", cut)
		}
	}
}
