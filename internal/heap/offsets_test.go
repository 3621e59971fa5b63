package heap

import (
	"context"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestTablesMatchDWARF proves the built-in page layouts and the objspace
// shape search against DWARF, and the search for rb_shape_tree_ptr against
// its symbol: on a Ruby with DWARF both must give the same offsets; on one
// without, the census runs on the tables (and the census tests check its
// counts).
func TestTablesMatchDWARF(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, "heap_leak.rb", "0")
		tg, err := target.OpenLive(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		p, err := ruby.Open(context.Background(), ruby.Spec{Target: tg, Consistency: ruby.Running})
		if err != nil {
			t.Fatal(err)
		}
		o, err := resolve(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", o.source)
		if !rb.HasDWARF {
			if !strings.HasPrefix(o.source, "scan:") {
				t.Errorf("no DWARF, yet offsets from %s", o.source)
			}
			return
		}
		if !strings.HasPrefix(o.source, "dwarf:") {
			t.Fatalf("DWARF build, yet offsets from %s", o.source)
		}
		s, err := resolveFrom(p, true)
		if err != nil {
			t.Fatalf("tables and shape search: %v", err)
		}
		t.Logf("%s", s.source)
		type view struct {
			sorted, npages, total, start uint64
			slotSize, body               int
			darray                       bool
		}
		d := view{o.sorted, o.npages, o.total, o.start, o.slotSize, o.body, o.darray}
		b := view{s.sorted, s.npages, s.total, s.start, s.slotSize, s.body, s.darray}
		if d != b {
			t.Errorf("DWARF %+v, tables and search %+v", d, b)
		}
		if p.VersionNumber() >= 30300 {
			sym, ok := p.Symbol("rb_shape_tree_ptr")
			if !ok {
				if rb.Shared {
					t.Fatalf("libruby of %s has no symbol rb_shape_tree_ptr", rb.Name)
				}
				// A stripped executable (its debug file's symbols are not
				// read): the shared build proves the search.
				return
			}
			scanned, err := scanShapeTree(p)
			if err != nil || scanned != sym {
				t.Errorf("rb_shape_tree_ptr: symbol 0x%x, scan 0x%x (%v)", sym, scanned, err)
			}
		}
	})
}
