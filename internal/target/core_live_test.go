package target_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// startRuby starts Debian's ruby on script (testutil's one way to start
// a Ruby: it waits for "ready", and the process dies with the test).
func startRuby(t testing.TB, script string) *exec.Cmd {
	t.Helper()
	return testutil.SystemRuby(t).StartSource(t, "two.rb", script).Cmd
}

// gcoreOf dumps pid with gdb's gcore into a test directory.
func gcoreOf(t testing.TB, pid int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.Missing(t, "root (gcore needs to ptrace the process)")
	}
	if _, err := exec.LookPath("gcore"); err != nil {
		testutil.Missing(t, "gcore (gdb; scripts/install-deps.sh installs it): %v", err)
	}
	prefix := filepath.Join(t.TempDir(), "core")
	if out, err := exec.Command("gcore", "-o", prefix, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		t.Fatalf("gcore: %v\n%s", err, out)
	}
	return fmt.Sprintf("%s.%d", prefix, pid)
}

const twoThreads = `t = Thread.new { sleep }; sleep 0.05; puts "ready"; $stdout.flush; sleep`

// TestCoreMatchesLive dumps a live Ruby with gcore and checks that the core
// target says what the live target says: pid, threads, executable, file
// mappings, and the bytes at the same addresses (including pages gcore
// left out, read from the files on disk).
func TestCoreMatchesLive(t *testing.T) {
	cmd := startRuby(t, twoThreads)
	pid := cmd.Process.Pid
	path := gcoreOf(t, pid)
	live, err := target.OpenLive(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	core, err := target.OpenCore(path, target.CoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer core.Close()

	if core.Pid() != pid {
		t.Errorf("core Pid() = %d, want %d", core.Pid(), pid)
	}
	if core.Executable() != live.Executable() {
		t.Errorf("core Executable() = %q, live %q", core.Executable(), live.Executable())
	}
	tids := func(tg target.Target) []int {
		th, err := tg.Threads()
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		for _, x := range th {
			out = append(out, x.TID)
		}
		sort.Ints(out)
		return out
	}
	if c, l := tids(core), tids(live); fmt.Sprint(c) != fmt.Sprint(l) || len(c) < 2 {
		t.Errorf("core threads %v, live threads %v (want the same, at least 2)", c, l)
	}
	regs, ok := core.(target.CoreInfo).Registers(pid)
	if !ok {
		t.Fatal("no registers for the main thread")
	}

	lmaps, _ := live.Mappings()
	cmaps, _ := core.Mappings()
	byStart := map[uint64]target.Mapping{}
	for _, m := range lmaps {
		byStart[m.Start] = m
	}
	files, stackOK := 0, false
	var text []target.Mapping
	for _, m := range cmaps {
		l, ok := byStart[m.Start]
		if m.Path == "[stack]" {
			stackOK = ok && l.Path == "[stack]" && m.Contains(regs.Rsp)
		}
		if m.Path == "" || strings.HasPrefix(m.Path, "[") {
			continue
		}
		files++
		if !ok || l.End != m.End || l.Offset != m.Offset || l.Path != m.Path || l.Perms[:3] != m.Perms[:3] {
			t.Errorf("core mapping %x-%x %s %x %s; live has %+v", m.Start, m.End, m.Perms, m.Offset, m.Path, l)
		}
		if l.Perms == "r-xp" && strings.Contains(m.Path, "libruby") {
			text = append(text, m)
		}
	}
	if files < 10 || len(text) != 1 || !stackOK {
		t.Fatalf("%d file mappings, libruby text %v, [stack] holding rsp %v", files, text, stackOK)
	}

	// Bytes: libruby's text (not in the core: read from disk), its data,
	// the main thread's stack near rsp (stopped while dumping), and the
	// VM's globals through libruby's dynamic symbols.
	compare := func(what string, addr uint64, n int) {
		t.Helper()
		c, l := make([]byte, n), make([]byte, n)
		if err := core.ReadAt(c, addr); err != nil {
			t.Errorf("core read of %s (0x%x): %v", what, addr, err)
			return
		}
		if err := live.ReadAt(l, addr); err != nil {
			t.Fatalf("live read of %s (0x%x): %v", what, addr, err)
		}
		if !bytes.Equal(c, l) {
			t.Errorf("%s at 0x%x differs between the core and the live process", what, addr)
		}
	}
	compare("libruby text", text[0].Start, int(min(text[0].End-text[0].Start, 1<<20)))
	var base uint64
	for _, m := range cmaps {
		if strings.Contains(m.Path, "libruby") && m.Offset == 0 {
			base = m.Start
		}
	}
	ci, err := elfx.ReadMemoryImage(core, base)
	if err != nil {
		t.Fatal(err)
	}
	li, err := elfx.ReadMemoryImage(live, base)
	if err != nil {
		t.Fatal(err)
	}
	if ci.Bias != li.Bias || ci.BuildID != li.BuildID || len(ci.Symbols) != len(li.Symbols) || len(ci.Symbols) < 1000 {
		t.Errorf("core image bias %x build %s %d symbols; live %x %s %d", ci.Bias, ci.BuildID, len(ci.Symbols), li.Bias, li.BuildID, len(li.Symbols))
	}
	for _, name := range []string{"ruby_version", "ruby_description", "ruby_current_vm_ptr"} {
		s, ok := ci.Lookup(name)
		if !ok {
			t.Fatalf("%s not in libruby's dynamic symbols", name)
		}
		compare(name, s.Value, 16)
	}
	v, _ := ci.Lookup("ruby_version")
	var b [6]byte
	want := testutil.SystemRuby(t).Version
	if err := core.ReadAt(b[:], v.Value); err != nil || string(b[:]) != want+"\x00" {
		t.Errorf("ruby_version from the core = %q, %v; want %s", b, err, want)
	}
	vm, _ := ci.Lookup("ruby_current_vm_ptr")
	var p [8]byte
	core.ReadAt(p[:], vm.Value)
	compare("the VM", uint64(p[0])|uint64(p[1])<<8|uint64(p[2])<<16|uint64(p[3])<<24|uint64(p[4])<<32|uint64(p[5])<<40, 256)
	compare("the stack", regs.Rsp&^7, 512)

	// The text came from disk: with an empty sysroot it is unreadable,
	// and the error names the file.
	bare, err := target.OpenCore(path, target.CoreOptions{SysRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	var u target.UnmappedError
	err = bare.ReadAt(b[:], text[0].Start)
	if !errors.As(err, &u) || u.Addr != text[0].Start || !strings.Contains(err.Error(), text[0].Path) {
		t.Errorf("text read without the files: %v; want UnmappedError naming %s", err, text[0].Path)
	}
}

// TestKernelCore has the kernel dump a Debian ruby (SIGABRT under ulimit
// -c unlimited, with the machine's plain "core" core_pattern, which it
// holds the tests' core_pattern lock to keep) and checks
// the core against what the live process showed just before: threads,
// mappings with permissions, libruby's dynamic symbols, the VM pointer,
// and file-backed pages the kernel leaves out (filesz 0), read from disk.
func TestKernelCore(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.Missing(t, "root (reading the live process needs CAP_SYS_PTRACE)")
	}
	// Tests that change core_pattern (internal/postmortem) hold this lock
	// exclusively meanwhile; a shared hold keeps it as it is while this
	// ruby dumps, and keeps this crash out of their handler.
	lock, err := os.OpenFile("/tmp/rbscope-core_pattern.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		lock.Close()
	})
	pattern, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	if err != nil || strings.TrimSpace(string(pattern)) != "core" {
		testutil.Missing(t, "core_pattern is %q, not the plain \"core\" this test relies on", pattern)
	}
	ruby := testutil.SystemRuby(t).Exe
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", `ulimit -c unlimited && exec "$0" -e "$1"`, ruby, twoThreads)
	cmd.Dir = dir
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatalf("ruby did not start: %v", err)
	}
	pid := cmd.Process.Pid
	live, err := target.OpenLive(pid)
	if err != nil {
		t.Fatal(err)
	}
	lthreads, _ := live.Threads()
	lmaps, _ := live.Mappings()
	lexe := live.Executable()
	var base uint64
	for _, m := range lmaps {
		if strings.Contains(m.Path, "libruby") && m.Offset == 0 {
			base = m.Start
		}
	}
	limg, err := elfx.ReadMemoryImage(live, base)
	if err != nil {
		t.Fatal(err)
	}
	vmSym, _ := limg.Lookup("ruby_current_vm_ptr")
	var lvm [8]byte
	if err := live.ReadAt(lvm[:], vmSym.Value); err != nil {
		t.Fatal(err)
	}

	cmd.Process.Signal(syscall.SIGABRT)
	cmd.Wait()
	cores, _ := filepath.Glob(filepath.Join(dir, "core*"))
	if len(cores) != 1 {
		t.Fatalf("the kernel wrote %v, want one core", cores)
	}
	core, err := target.OpenCore(cores[0], target.CoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer core.Close()

	if core.Pid() != pid || core.Executable() != lexe {
		t.Errorf("core pid %d exe %q; live %d %q", core.Pid(), core.Executable(), pid, lexe)
	}
	cthreads, _ := core.Threads()
	if len(cthreads) != len(lthreads) || len(cthreads) < 2 {
		t.Errorf("core threads %v, live %v", cthreads, lthreads)
	}
	for i := range cthreads {
		found := false
		for _, l := range lthreads {
			found = found || l.TID == cthreads[i].TID
		}
		if !found {
			t.Errorf("core thread %d was not a live thread (%v)", cthreads[i].TID, lthreads)
		}
	}
	cmaps, _ := core.Mappings()
	byStart := map[uint64]target.Mapping{}
	for _, m := range cmaps {
		byStart[m.Start] = m
	}
	files := 0
	var text target.Mapping
	for _, l := range lmaps {
		if l.Path == "" || strings.HasPrefix(l.Path, "[") {
			continue
		}
		files++
		c, ok := byStart[l.Start]
		if !ok || c.End != l.End || c.Offset != l.Offset || c.Path != l.Path || c.Perms[:3] != l.Perms[:3] {
			t.Errorf("live mapping %+v; core has %+v", l, c)
		}
		if strings.Contains(l.Path, "libruby") && l.Perms == "r-xp" {
			text = l
		}
	}
	if files < 10 || text.Path == "" {
		t.Fatalf("%d file mappings, libruby text %+v", files, text)
	}

	cimg, err := elfx.ReadMemoryImage(core, base)
	if err != nil {
		t.Fatal(err)
	}
	if cimg.Bias != limg.Bias || cimg.BuildID != limg.BuildID || len(cimg.Symbols) != len(limg.Symbols) {
		t.Errorf("core image %x %s %d symbols; live %x %s %d", cimg.Bias, cimg.BuildID, len(cimg.Symbols), limg.Bias, limg.BuildID, len(limg.Symbols))
	}
	var cvm [8]byte
	if err := core.ReadAt(cvm[:], vmSym.Value); err != nil || cvm != lvm {
		t.Errorf("ruby_current_vm_ptr in the core = %x, %v; live %x", cvm, err, lvm)
	}
	v, _ := cimg.Lookup("ruby_version")
	var ver [6]byte
	err = core.ReadAt(ver[:], v.Value)
	if want := testutil.SystemRuby(t).Version; err != nil || string(ver[:]) != want+"\x00" {
		t.Errorf("ruby_version from the core = %q, %v; want %s", ver, err, want)
	}
	// The text is not in the core (filesz 0): it reads from the file.
	f, err := os.Open(text.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := make([]byte, 4096)
	if _, err := f.ReadAt(want, int64(text.Offset)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if err := core.ReadAt(got, text.Start); err != nil || !bytes.Equal(got, want) {
		t.Errorf("libruby text from the core differs from the file (%v)", err)
	}
}

// TestCompressedLiveCore dumps a live Ruby with gcore, compresses the core
// with each tool OpenCore reads (fast levels: the bytes are the same),
// and checks that each opens as the plain core does: threads, registers,
// mappings, and the bytes of every mapping the core holds, Ruby's
// version string among them.
func TestCompressedLiveCore(t *testing.T) {
	t.Setenv("MALLOC_ARENA_MAX", "1") // no 64 MiB arena per thread: a smaller core
	cmd := startRuby(t, twoThreads)
	path := gcoreOf(t, cmd.Process.Pid)
	plain, err := target.OpenCore(path, target.CoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pthreads, _ := plain.Threads()
	pmaps, _ := plain.Mappings()
	var rubyVersion uint64
	for _, m := range pmaps {
		if strings.Contains(m.Path, "libruby") && m.Offset == 0 {
			img, err := elfx.ReadMemoryImage(plain, m.Start)
			if err != nil {
				t.Fatal(err)
			}
			s, ok := img.Lookup("ruby_version")
			if !ok {
				t.Fatal("no ruby_version in libruby's dynamic symbols")
			}
			rubyVersion = s.Value
		}
	}
	if rubyVersion == 0 || len(pthreads) < 2 {
		t.Fatalf("plain core: %d threads, ruby_version at 0x%x", len(pthreads), rubyVersion)
	}
	for _, c := range []struct{ tool, level, suffix string }{
		{"gzip", "-1", ".gz"}, {"zstd", "-1", ".zst"}, {"xz", "-0", ".xz"}, {"bzip2", "-1", ".bz2"}, {"lz4", "-1", ".lz4"},
	} {
		t.Run(c.tool, func(t *testing.T) {
			if _, err := exec.LookPath(c.tool); err != nil {
				testutil.Missing(t, "%s not installed (scripts/install-deps.sh installs it): %v", c.tool, err)
			}
			out := path + c.suffix
			sh := exec.Command("sh", "-c", `"$0" "$1" -c "$2" > "$3"`, c.tool, c.level, path, out)
			if b, err := sh.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", c.tool, err, b)
			}
			defer os.Remove(out)
			core, err := target.OpenCore(out, target.CoreOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer core.Close()
			if th, _ := core.Threads(); fmt.Sprint(th) != fmt.Sprint(pthreads) {
				t.Errorf("threads %v, plain core's %v", th, pthreads)
			}
			if r1, _ := core.(target.CoreInfo).Registers(pthreads[0].TID); r1 != mustRegs(t, plain, pthreads[0].TID) {
				t.Errorf("registers of thread %d differ from the plain core's", pthreads[0].TID)
			}
			cmaps, _ := core.Mappings()
			if fmt.Sprint(cmaps) != fmt.Sprint(pmaps) {
				t.Fatalf("mappings differ from the plain core's")
			}
			for _, m := range pmaps {
				n := int(min(m.End-m.Start, 1<<20))
				a, b := make([]byte, n), make([]byte, n)
				perr, cerr := plain.ReadAt(a, m.Start), core.ReadAt(b, m.Start)
				if (perr == nil) != (cerr == nil) || !bytes.Equal(a, b) {
					t.Errorf("%x-%x %s: reads differ from the plain core's (%v, %v)", m.Start, m.End, m.Path, perr, cerr)
				}
			}
			var v [6]byte
			if err := core.ReadAt(v[:], rubyVersion); err != nil || string(v[:]) != testutil.SystemRuby(t).Version+"\x00" {
				t.Errorf("ruby_version = %q, %v", v, err)
			}
		})
	}
}

func mustRegs(t *testing.T, tg target.Target, tid int) target.Registers {
	t.Helper()
	r, ok := tg.(target.CoreInfo).Registers(tid)
	if !ok {
		t.Fatalf("no registers for thread %d", tid)
	}
	return r
}
