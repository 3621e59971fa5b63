package ruby

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// replacedResult is what a snapshot of a process with a replaced binary
// gives: its threads, and what Open said about the binaries.
type replacedResult struct {
	Threads []stack.Thread `json:"threads"`
	Info    Info           `json:"info"`
	Err     string         `json:"err"`
}

// TestReplacedBinaryStacks replaces a running Ruby's VM binary on disk
// (libruby, or the static executable) by another Ruby's, as an upgrade
// does, and checks that rbscope still reads the binary the process runs:
// as root through /proc/PID/map_files (same build id, same DWARF layout
// source as before the swap), and without CAP_SYS_ADMIN from the image in
// memory, saying why the file was not read. Both must give the stacks
// Ruby itself reports.
func TestReplacedBinaryStacks(t *testing.T) {
	if os.Getenv(testutil.NoSysAdminEnv) == "1" {
		replacedChild(t)
		return
	}
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		s := rb.StartSwappable(t, "stacks.rb", "nested")
		want := reports(t, s.Proc)
		_, p0 := snapshotLive(t, s.Pid)
		s.Swap(t)

		// A fresh layout cache: DWARF must come from the mapped binary.
		t.Setenv("RBSCOPE_CACHE_DIR", t.TempDir())
		threads, p := snapshotLive(t, s.Pid)
		checkWorker(t, "as root", threads, want)
		if p.LayoutSource() != p0.LayoutSource() {
			t.Errorf("layout source %q after the swap, %q before", p.LayoutSource(), p0.LayoutSource())
		}
		if rb.HasDWARF && !strings.HasPrefix(p.LayoutSource(), "dwarf:") {
			t.Errorf("layout source %q: want DWARF of the mapped binary", p.LayoutSource())
		}
		checkBinary(t, "as root", p.Info(), s, false)

		out := testutil.RunWithoutSysAdmin(t, "TestReplacedBinaryStacks",
			"RBSCOPE_TEST_PID="+strconv.Itoa(s.Pid), "RBSCOPE_DEBUG_ROOT="+rb.DebugRoot, "RBSCOPE_CACHE_DIR="+t.TempDir())
		var res replacedResult
		testutil.ChildResult(t, out, &res)
		if res.Err != "" {
			t.Fatalf("without CAP_SYS_ADMIN: %s", res.Err)
		}
		checkWorker(t, "without CAP_SYS_ADMIN", res.Threads, want)
		checkBinary(t, "without CAP_SYS_ADMIN", res.Info, s, true)
		if res.Info.LayoutSource == "dwarf:"+s.Path {
			t.Errorf("without CAP_SYS_ADMIN: layout read from %s, the swapped-in file", s.Path)
		}
	})
}

func checkWorker(t *testing.T, how string, threads []stack.Thread, want map[string]rubyReport) {
	t.Helper()
	for _, th := range threads {
		if !th.Main {
			checkAgainstRuby(t, th, want["main"])
			return
		}
	}
	t.Errorf("%s: no worker thread in %+v", how, threads)
}

// checkBinary checks what Open says of the replaced binary: the build id
// of the binary the process mapped, and, when the file could not be read,
// why.
func checkBinary(t *testing.T, how string, info Info, s *testutil.Swapped, refused bool) {
	t.Helper()
	for _, b := range info.Binaries {
		if b.Path != s.Path {
			continue
		}
		if b.BuildID != s.BuildID {
			t.Errorf("%s: %s has build id %q, the process mapped %s", how, b.Path, b.BuildID, s.BuildID)
		}
		if refused && !strings.Contains(b.FileError, "was replaced on disk after process") {
			t.Errorf("%s: file error %q does not name the cause", how, b.FileError)
		}
		if !refused && b.FileError != "" {
			t.Errorf("%s: file error %q", how, b.FileError)
		}
		return
	}
	t.Errorf("%s: %s is not among the binaries %+v", how, s.Path, info.Binaries)
}

// replacedChild runs in the test binary restarted without CAP_SYS_ADMIN.
func replacedChild(t *testing.T) {
	pid, _ := strconv.Atoi(os.Getenv("RBSCOPE_TEST_PID"))
	var res replacedResult
	tg, err := target.OpenLive(pid)
	if err == nil {
		var p *Process
		if p, err = Open(context.Background(), Spec{Target: tg, Consistency: Running}); err == nil {
			res.Info = p.Info()
			res.Threads, err = p.Snapshot()
		}
	}
	if err != nil {
		res.Err = err.Error()
	}
	testutil.ReportResult(res)
}
