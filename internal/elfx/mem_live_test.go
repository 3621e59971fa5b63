package elfx_test

import (
	"bufio"
	"debug/elf"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestReadMemoryImageLive reads libruby's and ruby's dynamic symbols from
// a running Debian ruby and checks every one against the same files on
// disk (elfx.Open), load bias applied.
func TestReadMemoryImageLive(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, testReadMemoryImageLive)
}

func testReadMemoryImageLive(t *testing.T, rb testutil.RubyUnderTest) {
	cmd := rb.Command("-e", "puts 1; $stdout.flush; sleep")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	tg, err := target.OpenLive(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	maps, err := tg.Mappings()
	if err != nil {
		t.Fatal(err)
	}
	checked := map[string]int{}
	for _, m := range maps {
		if m.Offset != 0 || !(strings.Contains(m.Path, "libruby") || m.Path == tg.Executable()) {
			continue
		}
		img, err := elfx.ReadMemoryImage(tg, m.Start)
		if err != nil {
			t.Fatalf("ReadMemoryImage(%s at 0x%x): %v", m.Path, m.Start, err)
		}
		f, err := tg.OpenFile(m.Path)
		if err != nil {
			t.Fatal(err)
		}
		bin, err := elfx.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		if bias := bin.LoadBias(m.Start, 0); img.Bias != bias {
			t.Errorf("%s: bias 0x%x, from the file 0x%x", m.Path, img.Bias, bias)
		}
		if img.BuildID == "" || img.BuildID != bin.BuildID {
			t.Errorf("%s: build id %q, file's %q", m.Path, img.BuildID, bin.BuildID)
		}
		dyn, err := bin.ELF().DynamicSymbols()
		if err != nil {
			t.Fatal(err)
		}
		defined := map[string]bool{}
		for _, s := range dyn {
			if s.Section == elf.SHN_UNDEF || s.Name == "" || defined[s.Name] {
				continue
			}
			defined[s.Name] = true
			got, ok := img.Lookup(s.Name)
			want := s.Value + img.Bias
			if elf.ST_TYPE(s.Info) == elf.STT_TLS || s.Section == elf.SHN_ABS {
				want = s.Value
			}
			if !ok || got.Value != want || got.Size != s.Size {
				t.Errorf("%s: Lookup(%s) = %+v, %v; want value 0x%x size %d", m.Path, s.Name, got, ok, want, s.Size)
			}
		}
		if len(img.Symbols) != len(defined) {
			t.Errorf("%s: %d symbols from memory, %d defined in .dynsym", m.Path, len(img.Symbols), len(defined))
		}
		checked[m.Path] = len(defined)
		f.Close()
	}
	// A static Ruby has the VM, and its exported symbols, in the executable.
	want := 1
	if rb.Shared {
		want = 2
	}
	if len(checked) != want {
		t.Fatalf("checked %v; want %d images (libruby and the executable, or a static executable)", checked, want)
	}
	for p, n := range checked {
		if (strings.Contains(p, "libruby") || !rb.Shared) && n < 1000 {
			t.Errorf("only %d symbols in %s", n, p)
		}
	}
	t.Logf("checked %v", checked)
}
