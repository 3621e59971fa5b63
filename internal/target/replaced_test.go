package target_test

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// openFileResult is what the child without CAP_SYS_ADMIN reports.
type openFileResult struct {
	BuildID  string `json:"build_id"`
	Err      string `json:"err"`
	Replaced bool   `json:"replaced"`
}

// TestOpenFileReplaced replaces the VM binary of a running Ruby on disk
// (libruby for a shared build, the executable for a static one) and
// checks that OpenFile never hands out the file now at the path: as root
// it opens the mapped object itself (its build id is the one the process
// loaded), and without CAP_SYS_ADMIN it refuses with ReplacedError, whose
// message names the cause.
func TestOpenFileReplaced(t *testing.T) {
	if os.Getenv(testutil.NoSysAdminEnv) == "1" {
		openFileChild(t)
		return
	}
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		s := rb.StartSwappable(t, "stacks.rb", "nested")
		tg, err := target.OpenLive(s.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		// Before the swap: the file at the path is the mapped one.
		if id := openBuildID(t, tg, s.Path); id != s.BuildID {
			t.Fatalf("before the swap: OpenFile(%s) has build id %s, want %s", s.Path, id, s.BuildID)
		}
		s.Swap(t)
		maps, err := tg.Mappings()
		if err != nil {
			t.Fatal(err)
		}
		deleted := 0
		for _, m := range maps {
			if m.Path == s.Path {
				if !m.Deleted {
					t.Errorf("mapping %x-%x of %s not marked deleted after the swap", m.Start, m.End, m.Path)
				}
				deleted++
			}
		}
		if deleted == 0 {
			t.Fatalf("no mapping of %s after the swap (suffix not stripped?)", s.Path)
		}
		if id := openBuildID(t, tg, s.Path); id != s.BuildID {
			t.Errorf("after the swap, as root: OpenFile(%s) has build id %s, want the mapped %s (not %s's)",
				s.Path, id, s.BuildID, s.Other)
		}

		out := testutil.RunWithoutSysAdmin(t, "TestOpenFileReplaced",
			"RBSCOPE_TEST_PID="+strconv.Itoa(s.Pid), "RBSCOPE_TEST_PATH="+s.Path)
		var res openFileResult
		testutil.ChildResult(t, out, &res)
		if !res.Replaced || res.BuildID != "" {
			t.Fatalf("without CAP_SYS_ADMIN: OpenFile gave build id %q, error %q; want ReplacedError", res.BuildID, res.Err)
		}
		for _, want := range []string{filepath.Base(s.Path) + " was replaced on disk after process " + strconv.Itoa(s.Pid) + " started", "(deleted)", "map_files"} {
			if !strings.Contains(res.Err, want) {
				t.Errorf("error %q does not say %q", res.Err, want)
			}
		}
	})
}

func openBuildID(t *testing.T, tg target.Target, path string) string {
	t.Helper()
	f, err := tg.OpenFile(path)
	if err != nil {
		t.Fatalf("OpenFile(%s): %v", path, err)
	}
	defer f.Close()
	id, err := elfx.FileBuildID(f)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// openFileChild runs in the test binary restarted without CAP_SYS_ADMIN.
func openFileChild(t *testing.T) {
	pid, _ := strconv.Atoi(os.Getenv("RBSCOPE_TEST_PID"))
	tg, err := target.OpenLive(pid)
	if err != nil {
		t.Fatal(err)
	}
	var res openFileResult
	if f, err := tg.OpenFile(os.Getenv("RBSCOPE_TEST_PATH")); err != nil {
		res.Err, res.Replaced = err.Error(), target.IsReplaced(err)
	} else {
		res.BuildID, _ = elfx.FileBuildID(f)
		f.Close()
	}
	testutil.ReportResult(res)
}

// TestOpenFileNoHostFallback runs a process in its own mount namespace,
// where a directory is an empty tmpfs, and asks for a file that exists in
// that directory on the host only: OpenFile must fail, not open the
// host's file.
func TestOpenFileNoHostFallback(t *testing.T) {
	testutil.NeedRoot(t)
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		testutil.Missing(t, "unshare (util-linux): %v", err)
	}
	dir := t.TempDir()
	hostFile := filepath.Join(dir, "only-on-the-host")
	if err := os.WriteFile(hostFile, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unshare, "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs none "$1" && echo ready && exec sleep 600`, "sh", dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		testutil.Missing(t, "a private mount namespace with a tmpfs (unshare --mount): %q %v", line, err)
	}
	tg, err := target.OpenLive(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	f, err := tg.OpenFile(hostFile)
	if err == nil {
		b := make([]byte, 4)
		f.ReadAt(b, 0)
		f.Close()
		t.Fatalf("OpenFile(%s) of a process that has no such file opened %q (the host's file)", hostFile, b)
	}
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "/proc/") {
		t.Errorf("error %q: want a not-exist error naming the /proc/PID/root path", err)
	}
}

// TestCoreReplacedBinary dumps a Ruby with gcore, then replaces its VM
// binary on disk: the core must refuse the file now at the path (its
// build id differs from the one in the core's memory), both when the dump
// was taken before the swap and when it was taken after (the core then
// marks the mapping deleted).
func TestCoreReplacedBinary(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		s := rb.StartSwappable(t, "stacks.rb", "nested")
		before := gcoreOf(t, s.Pid)
		s.Swap(t)
		after := gcoreOf(t, s.Pid)
		for _, tc := range []struct {
			name, core string
			deleted    bool
		}{{"dumped before the swap", before, false}, {"dumped after the swap", after, true}} {
			tg, err := target.OpenCore(tc.core, target.CoreOptions{})
			if err != nil {
				t.Fatal(err)
			}
			maps, _ := tg.Mappings()
			var head *target.Mapping
			for i, m := range maps {
				if m.Path == s.Path {
					if m.Deleted != tc.deleted {
						t.Errorf("%s: mapping %x-%x Deleted = %v", tc.name, m.Start, m.End, m.Deleted)
					}
					if head == nil {
						head = &maps[i]
					}
				}
			}
			if head == nil {
				t.Fatalf("%s: the core maps no %s", tc.name, s.Path)
			}
			mem, err := elfx.ReadMemoryBuildID(tg, head.Start)
			if err != nil || mem != s.BuildID {
				t.Errorf("%s: build id in the core's memory %q (%v), want %s", tc.name, mem, err, s.BuildID)
			}
			f, err := tg.OpenFile(s.Path)
			if err == nil {
				id, _ := elfx.FileBuildID(f)
				f.Close()
				t.Errorf("%s: OpenFile(%s) opened the swapped-in file (build id %s)", tc.name, s.Path, id)
			} else if !target.IsReplaced(err) || !strings.Contains(err.Error(), s.BuildID) ||
				!strings.Contains(err.Error(), "not the file the process mapped") {
				t.Errorf("%s: OpenFile error %q: want ReplacedError naming build id %s", tc.name, err, s.BuildID)
			}
			tg.Close()
		}
	})
}
