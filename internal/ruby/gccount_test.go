package ruby

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestGCCount reads the GC count through rb_gc_count's code and compares
// it with what the script's GC.count says, before and after more GCs.
func TestGCCount(t *testing.T) {
	testutil.NeedRoot(t)
	script, err := filepath.Abs(filepath.Join("testdata", "gccount.rb"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		cmd := rb.Command(script)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		proc := rb.StartCmd(t, cmd)
		want := func(line string) uint64 {
			t.Helper()
			s, ok := strings.CutPrefix(line, "count=")
			n, err := strconv.ParseUint(s, 10, 64)
			if !ok || err != nil {
				t.Fatalf("script printed %q, not count=N", line)
			}
			return n
		}
		tg, err := target.OpenLive(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running})
		if err != nil {
			t.Fatal(err)
		}
		got, ok, err := p.GCCount()
		if err != nil || !ok {
			t.Fatalf("GC count not found (ok=%v, err=%v); addresses: %v", ok, err, p.Info().AddressSources)
		}
		if w := want(proc.Lines[len(proc.Lines)-1]); got != w {
			t.Fatalf("GC count %d, script says %d", got, w)
		}
		// The script's stdout is drained by StartCmd after "ready"; ask
		// for more GCs and poll until the count moves by as many.
		for i := 0; i < 3; i++ {
			fmt.Fprintln(stdin, "again")
		}
		w := got + 3
		for tries := 0; ; tries++ {
			n, _, err := p.GCCount()
			if err != nil {
				t.Fatal(err)
			}
			if n == w {
				break
			}
			if n > w || tries > 500 {
				t.Fatalf("GC count %d after three more GC.start, want %d", n, w)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// TestLastLoad decodes the rb_gc_count of Debian's Ruby 3.1 and of 3.3.8
// (shared library: through the GOT) and of a static PIE (direct), and
// refuses code that is anything else.
func TestLastLoad(t *testing.T) {
	mem := map[uint64]uint64{
		0x1000 + 7 + 0x100: 0x5000, // GOT entry -> &ruby_current_vm_ptr
		0x5000:             0x9000, // ruby_current_vm_ptr -> vm
		0x9000 + 0x458:     0xa000, // vm->objspace
		0xa000 + 0x1b8:     42,     // objspace->profile.count
	}
	load := func(a uint64) (uint64, error) {
		v, ok := mem[a]
		if !ok {
			return 0, fmt.Errorf("unmapped 0x%x", a)
		}
		return v, nil
	}
	shared := []byte{
		0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, // mov rax, [rip+0x100]
		0x48, 0x8b, 0x00, // mov rax, [rax]
		0x48, 0x8b, 0x80, 0x58, 0x04, 0x00, 0x00, // mov rax, [rax+0x458]
		0x48, 0x8b, 0x80, 0xb8, 0x01, 0x00, 0x00, // mov rax, [rax+0x1b8]
		0xc3,
	}
	if a, err := lastLoad(shared, 0x1000, load, nil); err != nil || a != 0xa000+0x1b8 {
		t.Errorf("shared: 0x%x, %v", a, err)
	}
	mem[0x1000+4+7+0x100] = 0x9000
	static := []byte{
		0xf3, 0x0f, 0x1e, 0xfa, // endbr64
		0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, // mov rax, [rip+0x100] (the VM pointer itself)
		0x48, 0x8b, 0x90, 0x58, 0x04, 0x00, 0x00, // mov rdx, [rax+0x458]
		0x48, 0x8b, 0x82, 0xb8, 0x01, 0x00, 0x00, // mov rax, [rdx+0x1b8]
		0xc3,
	}
	if a, err := lastLoad(static, 0x1000, load, nil); err != nil || a != 0xa000+0x1b8 {
		t.Errorf("static: 0x%x, %v", a, err)
	}
	lea := []byte{
		0x48, 0x8d, 0x05, 0xf1, 0x0f, 0x00, 0x00, // lea rax, [rip+0xff1] (&ruby_current_vm_ptr, 3.3.8)
		0x48, 0x8b, 0x00, // mov rax, [rax]
		0x48, 0x8b, 0x80, 0x58, 0x04, 0x00, 0x00, // mov rax, [rax+0x458]
		0x48, 0x8b, 0x80, 0xb8, 0x01, 0x00, 0x00, // mov rax, [rax+0x1b8]
		0xc3,
	}
	if a, err := lastLoad(lea, 0x4000-7-0xff1+0x1000, load, nil); err != nil || a != 0xa000+0x1b8 {
		t.Errorf("lea: 0x%x, %v", a, err)
	}
	// 3.4.5's: the objspace from a call to rb_gc_get_objspace.
	modular := []byte{
		0x48, 0x83, 0xec, 0x08, // sub rsp, 8
		0xe8, 0xc7, 0x17, 0xf0, 0xff, // call rb_gc_get_objspace@plt
		0x48, 0x8b, 0x80, 0xb8, 0x01, 0x00, 0x00, // mov rax, [rax+0x1b8]
		0x48, 0x83, 0xc4, 0x08, // add rsp, 8
		0xc3,
	}
	getObjspace := func() (uint64, error) { return 0xa000, nil }
	if a, err := lastLoad(modular, 0x1000, load, getObjspace); err != nil || a != 0xa000+0x1b8 {
		t.Errorf("modular: 0x%x, %v", a, err)
	}
	clobbered := []byte{
		0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, // mov rax, [rip+0x100]
		0xe8, 0, 0, 0, 0, // call
		0x48, 0x8b, 0x43, 0x08, // mov rax, [rbx+8]: rbx unknown after the call
		0xc3,
	}
	if a, err := lastLoad(clobbered, 0x1000, load, getObjspace); err == nil {
		t.Errorf("a register the call clobbered: decoded to 0x%x", a)
	}
	for name, code := range map[string][]byte{
		"call":          {0xe8, 0, 0, 0, 0, 0xc3},
		"no load":       {0xc3},
		"unknown reg":   {0x48, 0x8b, 0x43, 0x08, 0xc3}, // mov rax, [rbx+8]
		"indexed":       {0x48, 0x8b, 0x04, 0xc8, 0xc3}, // mov rax, [rax+rcx*8]
		"truncated":     {0x48, 0x8b, 0x05, 0x00},
		"register move": {0x48, 0x8b, 0xc1, 0xc3},
	} {
		if a, err := lastLoad(code, 0x1000, load, nil); err == nil {
			t.Errorf("%s: decoded to 0x%x", name, a)
		}
	}
}
