package ruby

import "testing"

// TestQualificationOfClauses: a block's or clause's label is qualified
// from the method it is in, also through a clause inside a block ("ensure
// in block in <main>" stays as it is: <main> is no method, and asking for
// its method entry made every read of such a frame look torn).
func TestQualificationOfClauses(t *testing.T) {
	p := newProcess(nil, Options{})
	p.rt = &Runtime{}
	for _, c := range []struct {
		label        string
		typ          uint64
		prefix, meth string // "" when not qualifiable
	}{
		{"work", iseqMethod, "", "work"},
		{"block in work", iseqBlock, "block in ", "work"},
		{"block (2 levels) in work", iseqBlock, "block (2 levels) in ", "work"},
		{"rescue in work", iseqRescue, "rescue in ", "work"},
		{"ensure in block in work", iseqEnsure, "ensure in block in ", "work"},
		{"rescue in block (3 levels) in work", iseqRescue, "rescue in block (3 levels) in ", "work"},
		{"block in <main>", iseqBlock, "", ""},
		{"ensure in block in <main>", iseqEnsure, "", ""},
		{"rescue in block in <class:Foo>", iseqRescue, "", ""},
		{"block in Foo#bar", iseqBlock, "", ""},
	} {
		info := &iseqInfo{label: c.label, typ: c.typ}
		p.n.setQualification(info)
		if info.qualifiable != (c.meth != "") || info.prefix != c.prefix || info.method != c.meth {
			t.Errorf("%q: qualifiable %v prefix %q method %q, want prefix %q method %q",
				c.label, info.qualifiable, info.prefix, info.method, c.prefix, c.meth)
		}
	}
}
