package testutil

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Swapped is a Ruby process whose VM binary (libruby for a shared build,
// the executable for a static one) was loaded from a private copy, which a
// test can then replace on disk, as a package upgrade replaces a running
// program's files.
type Swapped struct {
	*Proc
	// Path is the private copy the process mapped.
	Path string
	// BuildID is the mapped binary's build id (hex).
	BuildID string
	// Other is the ELF file Swap puts at Path: another Ruby's binary
	// when there is one, else the C library.
	Other string
}

// StartSwappable starts rb on script with its VM binary copied to a
// temporary directory first: a shared build preloads the copy of its
// libruby (LD_PRELOAD, which wins over the executable's RPATH), a static
// one runs a copy of its executable. Nothing outside the test's
// directories is touched.
func (r RubyUnderTest) StartSwappable(t testing.TB, script string, args ...string) *Swapped {
	t.Helper()
	if !filepath.IsAbs(script) {
		script = filepath.Join(RepoRoot(t), "testdata", "ruby", script)
	}
	dir := t.TempDir()
	s := &Swapped{}
	var cmd *exec.Cmd
	if r.Shared {
		lib := r.LibRuby(t)
		s.Path = filepath.Join(dir, filepath.Base(lib))
		copyFile(t, lib, s.Path)
		cmd = r.Command(append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), "LD_PRELOAD="+s.Path)
	} else {
		s.Path = filepath.Join(dir, filepath.Base(r.Exe))
		copyFile(t, r.Exe, s.Path)
		cmd = exec.Command(s.Path, append(append(append([]string{}, r.Args...), script), args...)...)
	}
	s.BuildID = FileBuildID(t, s.Path)
	s.Other = otherELF(t, r, s.BuildID)
	s.Proc = r.StartCmd(t, cmd)
	maps, err := os.ReadFile("/proc/" + itoa(s.Pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(maps, []byte(s.Path)) {
		t.Fatalf("%s: process %d did not map the copy %s", r.Name, s.Pid, s.Path)
	}
	return s
}

// Swap replaces the file the process mapped by another ELF file, the way
// package managers do (write a new file, rename it over the old one): the
// process keeps the old inode, its maps say "(deleted)".
func (s *Swapped) Swap(t testing.TB) {
	t.Helper()
	tmp := s.Path + ".new"
	copyFile(t, s.Other, tmp)
	if err := os.Rename(tmp, s.Path); err != nil {
		t.Fatal(err)
	}
}

// FileBuildID returns the GNU build id of the ELF file at path, read with
// the standard library (a truth independent of rbscope's ELF code).
func FileBuildID(t testing.TB, path string) string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := f.Section(".note.gnu.build-id")
	if s == nil {
		t.Fatalf("%s has no .note.gnu.build-id", path)
	}
	b, err := s.Data()
	if err != nil || len(b) < 16 {
		t.Fatalf("%s: build id note: %v", path, err)
	}
	return hex.EncodeToString(b[16:])
}

// otherELF picks the file Swap installs: another Ruby's VM binary with a
// different build id (a different build, the case where reading the file
// on disk would give wrong offsets), else the C library.
func otherELF(t testing.TB, r RubyUnderTest, id string) string {
	t.Helper()
	rubies.once.Do(loadRubies)
	var cands []string
	for _, o := range rubies.list {
		if o.Build == r.Build {
			continue
		}
		if o.Shared {
			cands = append(cands, o.LibRuby(t))
		} else {
			cands = append(cands, o.Exe)
		}
	}
	cands = append(cands, "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6")
	for _, c := range cands {
		if _, err := os.Stat(c); err == nil && FileBuildID(t, c) != id {
			return c
		}
	}
	t.Fatalf("no ELF file with another build id than %s to swap in", id)
	return ""
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
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

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for n >= 10 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	i--
	b[i] = byte('0' + n)
	return string(b[i:])
}

// NoSysAdminEnv is set in a test binary that RunWithoutSysAdmin started.
const NoSysAdminEnv = "RBSCOPE_TEST_NO_SYS_ADMIN"

// RunWithoutSysAdmin runs the top-level test named name again, in a new process of
// the test binary that has lost CAP_SYS_ADMIN and CAP_CHECKPOINT_RESTORE
// (what /proc/PID/map_files needs) but keeps CAP_SYS_PTRACE, as rbscope
// runs in a container given --cap-add=SYS_PTRACE. env is added to the
// child's environment, with NoSysAdminEnv=1. It returns the child's
// standard output; a failing child fails the test.
func RunWithoutSysAdmin(t testing.TB, name string, env ...string) []byte {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		Missing(t, "setpriv (util-linux) to drop CAP_SYS_ADMIN: %v", err)
	}
	cmd := exec.Command(setpriv, "--bounding-set=-sys_admin,-checkpoint_restore", "--inh-caps=-all",
		os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), NoSysAdminEnv+"=1"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s without CAP_SYS_ADMIN: %v\n%s\n%s", name, err, out, stderr.Bytes())
	}
	return out
}

// resultPrefix marks the line on which a child started by
// RunWithoutSysAdmin reports its result.
const resultPrefix = "RBSCOPE-RESULT "

// ReportResult, in a child started by RunWithoutSysAdmin, prints v (as
// JSON) as its result for ChildResult.
func ReportResult(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"err": "encode result: " + err.Error()})
	}
	os.Stdout.Write(append(append([]byte(resultPrefix), b...), '\n'))
}

// ChildResult decodes into v the result a child reported (ReportResult)
// in its output out; a child that reported none fails t.
func ChildResult(t testing.TB, out []byte, v any) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), resultPrefix); ok {
			if err := json.Unmarshal([]byte(rest), v); err != nil {
				t.Fatalf("child result: %v", err)
			}
			return
		}
	}
	t.Fatalf("the child printed no result:\n%s", out)
}
