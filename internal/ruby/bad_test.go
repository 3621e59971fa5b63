package ruby

import (
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

func TestProcessExitsBeforeSnapshot(t *testing.T) {
	testutil.EachRuby(t, testProcessExitsBeforeSnapshot)
}

func testProcessExitsBeforeSnapshot(t *testing.T, rb testutil.RubyUnderTest) {
	rb.SetProfilerEnv(t)
	proc := rb.Start(t, "stacks.rb", "nested")
	tg, err := target.OpenLive(proc.Pid)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running})
	if err != nil {
		t.Fatal(err)
	}
	syscall.Kill(proc.Pid, syscall.SIGKILL)
	proc.Cmd.Wait()
	_, err = p.Snapshot()
	if err == nil {
		t.Fatal("snapshot of a dead process succeeded")
	}
	if !target.IsExited(err) {
		t.Errorf("error %q does not say the process exited", err)
	}
}

func TestNotRuby(t *testing.T) {
	tg, err := target.OpenLive(os.Getpid()) // this Go test binary
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(context.Background(), Spec{Target: tg, Consistency: Running})
	if !errors.Is(err, ErrNotRuby) {
		t.Fatalf("Open(go test binary) = %v, want ErrNotRuby", err)
	}
}

// overlay is a real core-file target whose reads see some bytes replaced,
// to feed the walker corrupt VM memory.
type overlay struct {
	target.Target
	mu      sync.Mutex
	patches map[uint64][]byte
}

func (o *overlay) ReadAt(p []byte, addr uint64) error {
	if err := o.Target.ReadAt(p, addr); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for a, b := range o.patches {
		for i := range b {
			x := a + uint64(i)
			if x >= addr && x < addr+uint64(len(p)) {
				p[x-addr] = b[i]
			}
		}
	}
	return nil
}

func (o *overlay) ReadBatch(reqs []target.Read) error {
	for _, r := range reqs {
		if err := o.ReadAt(r.Buf, r.Addr); err != nil {
			return err
		}
	}
	return nil
}

var coreOnce struct {
	sync.Once
	path string
	err  error
}

// core31 returns the shared Ruby 3.1.0 dump, decompressed once per run.
func core31(t testing.TB) string {
	shared := testutil.SharedDir(t)
	coreOnce.Do(func() {
		src := filepath.Join(shared, "testdata", "coredumps", "ruby-coredump-3.1.0.gz")
		dst := filepath.Join(os.TempDir(), "rbscope-test-core-3.1.0")
		if st, err := os.Stat(dst); err == nil && st.Size() > 0 {
			coreOnce.path = dst
			return
		}
		in, err := os.Open(src)
		if err != nil {
			coreOnce.err = err
			return
		}
		defer in.Close()
		zr, err := gzip.NewReader(in)
		if err != nil {
			coreOnce.err = err
			return
		}
		tmp := dst + ".tmp"
		out, err := os.Create(tmp)
		if err != nil {
			coreOnce.err = err
			return
		}
		if _, err := io.Copy(out, zr); err != nil {
			coreOnce.err = err
			return
		}
		out.Close()
		coreOnce.err = os.Rename(tmp, dst)
		coreOnce.path = dst
	})
	if coreOnce.err != nil {
		t.Fatal(coreOnce.err)
	}
	return coreOnce.path
}

const vmPtr31 = 0x7f0dc0c83c58 // manifest: ruby_current_vm_ptr_addr of the 3.1.0 dump

// corruptAndWalk patches the dump's memory at the VM struct, the main
// thread, its execution context or its first control frame and walks it.
// Any outcome but a panic or a hang is fine; errors must say something.
func corruptAndWalk(t testing.TB, where byte, off uint16, data []byte) {
	tg, err := target.OpenCore(core31(t), target.CoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	ov := &overlay{Target: tg, patches: map[uint64][]byte{}}
	var buf [8]byte
	if err := tg.ReadAt(buf[:], vmPtr31); err != nil {
		t.Fatal(err)
	}
	vm := binary.LittleEndian.Uint64(buf[:])
	base := vm
	if where%4 != 0 {
		// Walk to the structure to corrupt with a clean reader first.
		p, err := Open(context.Background(), Spec{Target: tg, Consistency: Stopped, Options: Options{Hints: map[string]uint64{"ruby_current_vm_ptr": vmPtr31}}})
		if err != nil {
			t.Fatal(err)
		}
		refs, err := p.w.threadList()
		if err != nil || len(refs) == 0 {
			t.Fatal(err)
		}
		th := refs[0].addr
		base = th
		if where%4 >= 2 {
			tg.ReadAt(buf[:], th+p.rt.o.thEC.off)
			base = binary.LittleEndian.Uint64(buf[:])
			if where%4 == 3 {
				tg.ReadAt(buf[:], base+p.rt.o.ecCFP.off)
				base = binary.LittleEndian.Uint64(buf[:])
			}
		}
	}
	ov.patches[base+uint64(off%512)] = data
	done := make(chan struct{})
	go func() {
		defer close(done)
		p, err := Open(context.Background(), Spec{Target: ov, Consistency: Stopped, Options: Options{Hints: map[string]uint64{"ruby_current_vm_ptr": vmPtr31}}})
		if err != nil {
			if err.Error() == "" {
				t.Error("empty error")
			}
			return
		}
		ths, err := p.Snapshot()
		if err != nil && err.Error() == "" {
			t.Error("empty error")
		}
		for _, th := range ths {
			if len(th.Frames) > maxFrameBytes/56 {
				t.Errorf("unbounded frames: %d", len(th.Frames))
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("walker hung on corrupt memory")
	}
}

func TestCorruptMemory(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for where := byte(0); where < 4; where++ {
		zero := make([]byte, 256)
		corruptAndWalk(t, where, 0, zero)
		for i := 0; i < 10; i++ {
			junk := make([]byte, 8+rng.Intn(64))
			rng.Read(junk)
			corruptAndWalk(t, where, uint16(rng.Intn(256)&^7), junk)
		}
	}
}

// FuzzWalker walks the 3.1.0 dump with fuzzed bytes written over the VM,
// a thread, its execution context or its control frames.
func FuzzWalker(f *testing.F) {
	f.Add(byte(0), uint16(8), []byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(byte(1), uint16(16), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add(byte(2), uint16(16), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Add(byte(3), uint16(0), make([]byte, 64))
	f.Fuzz(func(t *testing.T, where byte, off uint16, data []byte) {
		if len(data) > 512 {
			data = data[:512]
		}
		corruptAndWalk(t, where, off, data)
	})
}
