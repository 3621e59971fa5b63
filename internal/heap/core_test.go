package heap_test

import (
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/heap"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// gcore dumps pid with gdb's gcore into a test directory.
func gcore(t *testing.T, pid int) string {
	t.Helper()
	testutil.NeedRoot(t)
	if _, err := exec.LookPath("gcore"); err != nil {
		testutil.Missing(t, "gcore (gdb; scripts/install-deps.sh installs it): %v", err)
	}
	prefix := filepath.Join(t.TempDir(), "core")
	if out, err := exec.Command("gcore", "-o", prefix, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		t.Fatalf("gcore: %v\n%s", err, out)
	}
	return fmt.Sprintf("%s.%d", prefix, pid)
}

func openCore(t *testing.T, path string) target.Target {
	t.Helper()
	tg, err := target.OpenCore(path, target.CoreOptions{})
	if err != nil {
		t.Fatalf("open core: %v", err)
	}
	t.Cleanup(func() { tg.Close() })
	return tg
}

// TestCensusFromCore dumps the census script with gcore and censuses the
// core: the same truth as the live process.
func TestCensusFromCore(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc, tr := startCensusScript(t, rb)
		core := gcore(t, proc.Pid)
		_, h := openHeap(t, openCore(t, core), ruby.Stopped)
		c, err := h.Census(context.Background(), heap.Options{})
		if err != nil {
			t.Fatalf("census of the core: %v", err)
		}
		if !c.Stopped || c.Pause != 0 {
			t.Errorf("core census: stopped=%v pause=%v", c.Stopped, c.Pause)
		}
		checkCensus(t, c, tr)
	})
}

// segOffset is the file offset of address addr in an ELF core.
func segOffset(t *testing.T, core string, addr uint64) uint64 {
	t.Helper()
	f, err := elf.Open(core)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && addr >= p.Vaddr && addr < p.Vaddr+p.Filesz {
			return p.Off + addr - p.Vaddr
		}
	}
	t.Fatalf("0x%x is in no PT_LOAD of %s", addr, core)
	return 0
}

// pageAddrs lists the heap_page structs and page bodies of a heap, from
// the census's own page list.
func pageAddrs(t *testing.T, h *heap.Heap) (pages, bodies []uint64) {
	t.Helper()
	pl, err := h.Pages()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pl {
		pages = append(pages, p.Page)
		bodies = append(bodies, p.Body)
	}
	return pages, bodies
}

func patch(t *testing.T, path string, off uint64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, int64(off)); err != nil {
		t.Fatal(err)
	}
}

// TestBadCores: a core whose page headers are corrupt gives a partial
// census that says so and still counts the other pages; a core truncated
// inside the heap gives a clear error or a partial census, never a panic
// or made-up counts.
func TestBadCores(t *testing.T) {
	testutil.NeedRoot(t)
	rb := testutil.SystemRuby(t)
	proc, tr := startCensusScript(t, rb)
	core := gcore(t, proc.Pid)
	_, h := openHeap(t, openCore(t, core), ruby.Stopped)
	good, err := h.Census(context.Background(), heap.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pages, bodies := pageAddrs(t, h)
	if len(pages) < 8 {
		t.Fatalf("only %d pages", len(pages))
	}

	t.Run("corrupt page headers", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "core")
		copyFile(t, core, bad)
		// One heap_page struct filled with garbage, one page body whose
		// header no longer points back at its page.
		patch(t, bad, segOffset(t, bad, pages[2]), []byte(strings.Repeat("\xa5", 48)))
		patch(t, bad, segOffset(t, bad, bodies[5]), make([]byte, 8))
		_, h := openHeap(t, openCore(t, bad), ruby.Stopped)
		c, err := h.Census(context.Background(), heap.Options{})
		if err != nil {
			t.Fatalf("census: %v", err)
		}
		if !c.Partial || c.PagesBad != 2 || !strings.Contains(c.Why, "page") {
			t.Errorf("partial=%v pages_bad=%d why=%q, want a partial census with 2 bad pages", c.Partial, c.PagesBad, c.Why)
		}
		if c.Slots >= good.Slots || c.Slots == 0 {
			t.Errorf("%d slots counted, %d in the good core", c.Slots, good.Slots)
		}
		n, _ := byClass(c, "Leaky::Node")
		if n > tr.Classes["Leaky::Node"].Count || n == 0 {
			t.Errorf("%d Leaky::Node, at most %d", n, tr.Classes["Leaky::Node"].Count)
		}
		var out strings.Builder
		c.WriteText(&out, 5)
		if !strings.Contains(out.String(), "PARTIAL") {
			t.Errorf("text report does not say partial:\n%s", out.String())
		}
	})

	t.Run("truncated file", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "core")
		copyFile(t, core, bad)
		if err := os.Truncate(bad, int64(segOffset(t, bad, bodies[len(bodies)/2])+100)); err != nil {
			t.Fatal(err)
		}
		err := censusOf(t, bad)
		if err == nil || !strings.Contains(err.Error(), "truncated") {
			t.Errorf("census of a truncated core: %v, want an error that says it is truncated", err)
		}
	})

	t.Run("truncated inside the heap", func(t *testing.T) {
		// A core cut short inside the heap with its notes intact (as a
		// kernel core cut by RLIMIT_CORE is: the kernel writes the notes
		// first; gcore writes them last, so the core is first rewritten
		// notes first, and the segment to cut last): the pages past the
		// cut are unreadable, the census partial.
		bad := filepath.Join(t.TempDir(), "core")
		cut := bodies[len(bodies)*3/4]
		notesFirst(t, core, bad, cut)
		if err := os.Truncate(bad, int64(segOffset(t, bad, cut)+100)); err != nil {
			t.Fatal(err)
		}
		tg, err := target.OpenCore(bad, target.CoreOptions{})
		if err != nil {
			t.Fatalf("open the truncated core: %v", err)
		}
		defer tg.Close()
		p, err := ruby.Open(context.Background(), ruby.Spec{Target: tg, Consistency: ruby.Stopped})
		if err != nil {
			t.Fatalf("open Ruby in the truncated core: %v", err)
		}
		h, err := heap.Open(p)
		if err != nil {
			// The checks read the last page, which may lie past the cut.
			if !strings.Contains(err.Error(), "truncated") {
				t.Errorf("heap of a truncated core: %v, want an error that says truncated", err)
			}
			t.Logf("heap: %v", err)
			return
		}
		c, err := h.Census(context.Background(), heap.Options{})
		if err != nil {
			t.Fatalf("census: %v", err)
		}
		if !c.Partial || c.PagesBad == 0 || !strings.Contains(c.Why, "unreadable") {
			t.Errorf("partial=%v pages_bad=%d why=%q, want a partial census", c.Partial, c.PagesBad, c.Why)
		}
		if c.Slots == 0 || c.Slots >= good.Slots {
			t.Errorf("%d slots counted, %d in the whole core", c.Slots, good.Slots)
		}
		t.Logf("partial census: %d of %d pages bad: %s", c.PagesBad, c.Pages, c.Why)
	})
}

// notesFirst rewrites core from (gcore: segments, then notes) as to with
// the notes right after the program headers, then the segments in order
// but the one holding address last, which comes last; no section headers.
func notesFirst(t *testing.T, from, to string, last uint64) {
	t.Helper()
	f, err := elf.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var ehdr [64]byte
	if _, err := in.ReadAt(ehdr[:], 0); err != nil {
		t.Fatal(err)
	}
	n := len(f.Progs)
	off := uint64(64 + 56*n)
	offs := make([]uint64, n)
	order := make([]int, 0, n)
	for i, p := range f.Progs {
		if p.Type == elf.PT_NOTE {
			order = append(order, i)
		}
	}
	holds := func(p *elf.Prog) bool { return last >= p.Vaddr && last < p.Vaddr+p.Memsz }
	for i, p := range f.Progs {
		if p.Type != elf.PT_NOTE && !holds(p) {
			order = append(order, i)
		}
	}
	for i, p := range f.Progs {
		if p.Type != elf.PT_NOTE && holds(p) {
			order = append(order, i)
		}
	}
	for _, i := range order {
		offs[i] = off
		off += f.Progs[i].Filesz
		off = (off + 7) &^ 7
	}
	binary.LittleEndian.PutUint64(ehdr[0x20:], 64) // e_phoff
	binary.LittleEndian.PutUint64(ehdr[0x28:], 0)  // e_shoff
	binary.LittleEndian.PutUint16(ehdr[0x3c:], 0)  // e_shnum
	binary.LittleEndian.PutUint16(ehdr[0x3e:], 0)  // e_shstrndx
	out.WriteAt(ehdr[:], 0)
	for i, p := range f.Progs {
		var ph [56]byte
		binary.LittleEndian.PutUint32(ph[0:], uint32(p.Type))
		binary.LittleEndian.PutUint32(ph[4:], uint32(p.Flags))
		binary.LittleEndian.PutUint64(ph[8:], offs[i])
		binary.LittleEndian.PutUint64(ph[16:], p.Vaddr)
		binary.LittleEndian.PutUint64(ph[24:], p.Paddr)
		binary.LittleEndian.PutUint64(ph[32:], p.Filesz)
		binary.LittleEndian.PutUint64(ph[40:], p.Memsz)
		binary.LittleEndian.PutUint64(ph[48:], p.Align)
		if _, err := out.WriteAt(ph[:], int64(64+56*i)); err != nil {
			t.Fatal(err)
		}
		if p.Filesz > 0 {
			if _, err := io.Copy(io.NewOffsetWriter(out, int64(offs[i])), io.NewSectionReader(in, int64(p.Off), int64(p.Filesz))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// censusOf opens a core and censuses it, returning the first error.
func censusOf(t *testing.T, path string) error {
	tg, err := target.OpenCore(path, target.CoreOptions{})
	if err != nil {
		return err
	}
	defer tg.Close()
	p, err := ruby.Open(context.Background(), ruby.Spec{Target: tg, Consistency: ruby.Stopped})
	if err != nil {
		return err
	}
	h, err := heap.Open(p)
	if err != nil {
		return err
	}
	c, err := h.Census(context.Background(), heap.Options{})
	if err == nil && c.Partial {
		return errors.New(c.Why)
	}
	return err
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSharedCoreDumps censuses the shared core dumps: Ruby 3.0 to 3.3 give
// sensible censuses (a heap of a small script: thousands of strings, every
// slot accounted for, nothing bad); older ones a clear "not supported".
func TestSharedCoreDumps(t *testing.T) {
	dir := filepath.Join(testutil.SharedDir(t), "testdata", "coredumps")
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Dumps []struct {
			File    string `json:"file"`
			Version string `json:"ruby_version"`
		} `json:"dumps"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, d := range m.Dumps {
		t.Run(d.Version, func(t *testing.T) {
			tg := openCore(t, filepath.Join(dir, d.File))
			p, err := ruby.Open(context.Background(), ruby.Spec{Target: tg, Consistency: ruby.Stopped})
			if err != nil {
				t.Fatalf("open Ruby: %v", err)
			}
			h, err := heap.Open(p)
			if !strings.HasPrefix(d.Version, "3.") {
				if !errors.Is(err, heap.ErrUnsupported) {
					t.Fatalf("Ruby %s: want ErrUnsupported, got %v", d.Version, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("open heap: %v", err)
			}
			c, err := h.Census(context.Background(), heap.Options{})
			if err != nil {
				t.Fatalf("census: %v", err)
			}
			var free uint64
			var sum uint64
			for typ, n := range c.Types {
				sum += n
				if typ == "FREE" {
					free = n
				}
			}
			t.Logf("%s: %d pages, %d slots (%d free), strings %d, objects %d, source %s",
				d.Version, c.Pages, c.Slots, free, c.Types["T_STRING"], c.Types["T_OBJECT"], h.Source())
			if c.Partial || c.Bad != 0 || c.PagesBad != 0 || sum != c.Slots {
				t.Errorf("partial=%v (%s), %d bad slots, %d bad pages, types add up to %d of %d slots", c.Partial, c.Why, c.Bad, c.PagesBad, sum, c.Slots)
			}
			if c.Types["T_STRING"] < 1000 || c.Types["T_CLASS"] < 100 || c.Slots < 10000 {
				t.Errorf("implausible census: %v", c.Types)
			}
			if n, _ := byClass(c, "String"); n < 1000 {
				t.Errorf("only %d Strings", n)
			}
		})
	}
}
