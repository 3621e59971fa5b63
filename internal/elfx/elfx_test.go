package elfx

import (
	"bytes"
	"os"
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

const libruby = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"

func TestOpenLibruby(t *testing.T) {
	f, err := os.Open(libruby)
	if err != nil {
		testutil.Missing(t, "Debian libruby not installed: %v", err)
	}
	defer f.Close()
	b, err := Open(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ruby_current_vm_ptr", "ruby_version", "ruby_description"} {
		if s, ok := b.Symbols.Lookup(name); !ok || s.Value == 0 {
			t.Errorf("symbol %s missing", name)
		}
	}
	if s, ok := b.Symbols.Lookup("ruby_current_ec"); !ok || !s.TLS {
		t.Errorf("ruby_current_ec should be a TLS symbol: %+v %v", s, ok)
	}
	if len(b.BuildID) != 40 {
		t.Errorf("build id %q", b.BuildID)
	}
	if name, _, ok := b.DebugLink(); !ok || name == "" {
		t.Errorf("no .gnu_debuglink in Debian's libruby")
	}
	if b.HasSymtab {
		t.Errorf("Debian's libruby is stripped, but a .symtab was reported")
	}
	// Mapped at 0x7f0000000000 with file offset 0: bias is the base.
	if bias := b.LoadBias(0x7f0000000000, 0); bias != 0x7f0000000000 {
		t.Errorf("load bias 0x%x", bias)
	}
}

func TestOpenGarbage(t *testing.T) {
	for _, in := range [][]byte{nil, []byte("\x7fELF"), bytes.Repeat([]byte{0xff}, 4096)} {
		if _, err := Open(bytes.NewReader(in)); err == nil {
			t.Errorf("Open(%d junk bytes) succeeded", len(in))
		}
	}
}

// FuzzOpen feeds arbitrary bytes to the ELF reader: errors are fine,
// panics are not.
func FuzzOpen(f *testing.F) {
	if data, err := os.ReadFile("/bin/true"); err == nil && len(data) > 4096 {
		f.Add(data[:4096])
	}
	f.Add([]byte("\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00>\x00\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		Open(bytes.NewReader(data))
	})
}

func TestBuildIDFromNotes(t *testing.T) {
	note := []byte{4, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 'G', 'N', 'U', 0, 0xde, 0xad, 0xbe, 0xef}
	if got := BuildIDFromNotes(note); got != "deadbeef" {
		t.Errorf("build id %q, want deadbeef", got)
	}
	// A namesz that wraps a 32-bit sum must not panic.
	crafted := []byte{0xfe, 0xff, 0xff, 0xff, 4, 0, 0, 0, 3, 0, 0, 0, 'G', 'N', 'U', 0}
	if got := BuildIDFromNotes(crafted); got != "" {
		t.Errorf("crafted note gave %q", got)
	}
}

func FuzzBuildIDFromNotes(f *testing.F) {
	f.Add([]byte{4, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 'G', 'N', 'U', 0, 1, 2, 3, 4})
	f.Add([]byte{0xfe, 0xff, 0xff, 0xff, 4, 0, 0, 0, 3, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) { BuildIDFromNotes(data) })
}
