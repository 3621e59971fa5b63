package stack

import "testing"

// TestDerived: stacks derived from one stack share an ID, their own (not
// the parent's), those of other stacks differ, an unknown parent gives
// an unknown ID, and past its bound a Derived makes IDs anew.
func TestDerived(t *testing.T) {
	var d Derived
	a, b := NewID(), NewID()
	da := d.Of(a)
	if da == 0 || da == a || da == b {
		t.Fatalf("derived from %d: %d", a, da)
	}
	if again := d.Of(a); !Same(again, da) {
		t.Errorf("derived from %d twice: %d, then %d", a, da, again)
	}
	if db := d.Of(b); db == 0 || db == da {
		t.Errorf("derived from %d: %d, from %d: %d", a, da, b, db)
	}
	if z := d.Of(0); z != 0 {
		t.Errorf("derived from an unknown stack: %d, want 0", z)
	}
	for i := 0; i < maxDerived; i++ {
		d.Of(NewID())
	}
	if len(d.ids) > maxDerived {
		t.Errorf("%d IDs kept, bound %d", len(d.ids), maxDerived)
	}
	if again := d.Of(a); again == 0 || again == da {
		t.Errorf("derived from %d after the bound: %d, want a new ID", a, again)
	}
}
