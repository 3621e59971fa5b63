package alloc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// replacedResult is what the child without CAP_SYS_ADMIN reports.
type replacedResult struct {
	Err      string `json:"err"`
	Replaced bool   `json:"replaced"`
}

// TestAttachReplacedBinary replaces a running Ruby's VM binary on disk
// (libruby, or the static executable) by another ELF file, as an upgrade
// does, then attaches. As root the probes go on the file the process
// mapped (its build id, and they count exactly the Widgets the script
// makes: probes on the new file would count none). Without CAP_SYS_ADMIN
// the mapped file cannot be opened and the file now at the path is
// another binary: Attach refuses with ReplacedError.
func TestAttachReplacedBinary(t *testing.T) {
	if os.Getenv(testutil.NoSysAdminEnv) == "1" {
		attachReplacedChild(t)
		return
	}
	needBPF(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		const n = 3000
		dir := t.TempDir()
		goFile, doneFile := filepath.Join(dir, "go"), filepath.Join(dir, "done")
		s := rb.StartSwappable(t, script(t, "swapped.rb"), strconv.Itoa(n), goFile, doneFile)
		s.Swap(t)

		tr := attachOrMissing(t, s.Pid, Options{Exact: true, NoStacks: true})
		if p := tr.Plan(); p.Binary != s.Path || p.BuildID != s.BuildID {
			t.Fatalf("planned on %s (build id %s), want the mapped %s (%s), not %s's", p.Binary, p.BuildID, s.Path, s.BuildID, s.Other)
		}
		if err := os.WriteFile(goFile, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			if _, err := os.Stat(doneFile); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the workload did not finish within 60 s")
			}
			time.Sleep(20 * time.Millisecond)
		}
		r, err := tr.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if got := classCount(r, "Widget"); got != n {
			t.Errorf("as root, after the swap: %d Widgets counted, want %d (probes on the mapped file)", got, n)
		}

		out := testutil.RunWithoutSysAdmin(t, "TestAttachReplacedBinary", "RBSCOPE_TEST_PID="+strconv.Itoa(s.Pid))
		var res replacedResult
		testutil.ChildResult(t, out, &res)
		if !res.Replaced {
			t.Fatalf("without CAP_SYS_ADMIN: Attach gave %q, want ReplacedError", res.Err)
		}
		for _, want := range []string{filepath.Base(s.Path) + " was replaced on disk after process " + strconv.Itoa(s.Pid) + " started", "map_files"} {
			if !strings.Contains(res.Err, want) {
				t.Errorf("error %q does not say %q", res.Err, want)
			}
		}
	})
}

// attachReplacedChild runs in the test binary restarted without
// CAP_SYS_ADMIN.
func attachReplacedChild(t *testing.T) {
	pid, _ := strconv.Atoi(os.Getenv("RBSCOPE_TEST_PID"))
	var res replacedResult
	tr, err := Attach(pid, Options{Exact: true, NoStacks: true})
	if err == nil {
		tr.Close()
		res.Err = "attached"
	} else {
		res.Err, res.Replaced = err.Error(), target.IsReplaced(err)
	}
	testutil.ReportResult(res)
}
