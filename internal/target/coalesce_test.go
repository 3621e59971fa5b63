package target

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// patternPages maps n fresh pages of this process filled with a
// pattern (unmapped on cleanup) and opens this process as a target.
func patternPages(t testing.TB, n int) (mem []byte, base uint64, tg Target) {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, n*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	for i := range mem {
		mem[i] = byte(i*7 + i>>8)
	}
	if tg, err = OpenLive(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	return mem, uint64(uintptr(unsafe.Pointer(&mem[0]))), tg
}

// TestCoalescer reads this process's own memory (a pattern on four fresh
// pages, the last one made unreadable) in merged spans and checks every
// request's bytes against the pattern.
func TestCoalescer(t *testing.T) {
	mem, base, tg := patternPages(t, 4)
	if err := unix.Mprotect(mem[3*pageSize:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	type req struct{ off, n int }
	for _, tc := range []struct {
		name  string
		reqs  []req
		spans int // spans read; 0: as given (nothing merged)
	}{
		// Page 0 twice, one crossing into page 1, page 1 (starts on the
		// page where that one ends), page 2 apart; given out of order.
		{"merged", []req{{3000, 16}, {2*pageSize + 1000, 32}, {100, 8}, {pageSize + 50, 8}, {4000, 200}}, 2},
		{"overlapping", []req{{10, 100}, {20, 10}, {10, 100}, {pageSize - 8, 16}}, 1},
		{"one per page", []req{{0, 8}, {pageSize + 8, 8}, {2*pageSize + 16, 8}}, 0},
		{"ends on a boundary", []req{{pageSize - 8, 8}, {pageSize, 8}, {pageSize + 100, 8}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Coalescer
			reqs := make([]Read, len(tc.reqs))
			for i, r := range tc.reqs {
				reqs[i] = Read{Addr: base + uint64(r.off), Buf: make([]byte, r.n)}
			}
			if err := c.ReadBatch(tg, reqs); err != nil {
				t.Fatal(err)
			}
			for i, r := range tc.reqs {
				if !bytes.Equal(reqs[i].Buf, mem[r.off:r.off+r.n]) {
					t.Errorf("request %d (offset %d, %d bytes): wrong bytes", i, r.off, r.n)
				}
			}
			if got := len(c.spans); tc.spans > 0 && got != tc.spans {
				t.Errorf("%d spans read, want %d", got, tc.spans)
			}
			if tc.spans == 0 && len(c.spans) != len(tc.reqs) {
				t.Errorf("%d spans for %d requests on distinct pages", len(c.spans), len(tc.reqs))
			}
		})
	}
	// A request on the unreadable page fails the batch with its address,
	// also when it would merge with a readable one.
	var c Coalescer
	bad := base + 3*pageSize + 16
	reqs := []Read{{Addr: base + 3*pageSize - 16, Buf: make([]byte, 8)}, {Addr: bad, Buf: make([]byte, 8)}, {Addr: base, Buf: make([]byte, 8)}}
	err := c.ReadBatch(tg, reqs)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%#x", bad)) {
		t.Errorf("read of an unreadable page: %v, want an error naming %#x", err, bad)
	}
}

// TestCoalescerThen reads merged requests and, in the same system call,
// ordered ones after them (one address twice, reads across the others'
// pages), and then ordered reads that fail: the merged requests are still
// read, and only the ordered ones fail.
func TestCoalescerThen(t *testing.T) {
	mem, base, tg := patternPages(t, 4)
	if err := unix.Mprotect(mem[3*pageSize:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	rc := tg.(ReadCounter)
	read := func(offs ...int) []Read {
		reqs := make([]Read, len(offs))
		for i, off := range offs {
			reqs[i] = Read{Addr: base + uint64(off), Buf: make([]byte, 24)}
		}
		return reqs
	}
	check := func(what string, reqs []Read) {
		t.Helper()
		for i, r := range reqs {
			off := int(r.Addr - base)
			if !bytes.Equal(r.Buf, mem[off:off+len(r.Buf)]) {
				t.Errorf("%s request %d (offset %d): wrong bytes", what, i, off)
			}
		}
	}
	var c Coalescer
	for _, merge := range [][]int{{100, 10, pageSize + 8, 2 * pageSize}, {8}} {
		reqs, then := read(merge...), read(pageSize+8, 16, pageSize+8, 2*pageSize+100)
		calls := rc.ReadCalls()
		err, thenErr := c.ReadBatchThen(tg, reqs, then)
		if err != nil || thenErr != nil {
			t.Fatalf("ReadBatchThen: %v, %v", err, thenErr)
		}
		if n := rc.ReadCalls() - calls; n != 1 {
			t.Errorf("%d process_vm_readv calls, want 1", n)
		}
		check("merged", reqs)
		check("ordered", then)
	}
	reqs, then := read(100, 10, pageSize+8), read(16, 3*pageSize+8)
	err, thenErr := c.ReadBatchThen(tg, reqs, then)
	if err != nil || thenErr == nil {
		t.Fatalf("ReadBatchThen with an unreadable ordered read: %v, %v; want nil and an error", err, thenErr)
	}
	check("merged", reqs)
	for _, r := range c.all {
		if r.Buf != nil {
			t.Fatalf("the coalescer keeps a caller's buffer")
		}
	}
}

// BenchmarkCoalescer compares a thread list's small reads (as a 4-thread
// sample makes them: 12 requests on 6 pages) read as given and merged.
func BenchmarkCoalescer(b *testing.B) {
	_, base, tg := patternPages(b, 8)
	offs := [][2]int{{0x39b8, 8}, {0x1328, 4}, {0x3810, 4}, {0x3f80, 664}, {0x00f0, 376}, {0x3d70, 24},
		{0x65d0 + pageSize, 376}, {0x5ba0, 24}, {0x5ea0, 376}, {0x7530 - pageSize, 24}, {0x77a0 - pageSize, 376}, {0x7970 - pageSize, 24}}
	reqs := make([]Read, len(offs))
	for i, o := range offs {
		reqs[i] = Read{Addr: base + uint64(o[0]), Buf: make([]byte, o[1])}
	}
	b.Run("as-given", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := tg.ReadBatch(reqs); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("merged", func(b *testing.B) {
		var c Coalescer
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if err := c.ReadBatch(tg, reqs); err != nil {
				b.Fatal(err)
			}
		}
	})
}
