package agent

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/testutil"
)

// execScript spins until the file ARGV[0] appears, then execs ARGV[1..].
const execScript = `
def wait_for(path)
  until File.exist?(path)
    sleep 0.01
  end
end
$stdout.puts "ready"
$stdout.flush
wait_for(ARGV[0])
exec(*ARGV[1..])
`

// TestAgentExec: a profiled Ruby process that execs another Ruby (a
// deploy) is dropped and opened again as the new image; one that execs a
// program that is not Ruby is dropped and left alone, and the agent goes
// on.
func TestAgentExec(t *testing.T) {
	testutil.NeedRoot(t)
	rb := testutil.SystemRuby(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "execer.rb")
	second := filepath.Join(dir, "second.rb")
	if err := os.WriteFile(script, []byte(execScript), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(second, []byte("loop { sleep 0.01 }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	toRuby := rb.StartCmd(t, rb.Command(script, filepath.Join(dir, "go1"), rb.Exe, second, dir))
	toSleep := rb.StartCmd(t, rb.Command(script, filepath.Join(dir, "go2"), "/bin/sleep", "60"))
	a := startAgent(t, Config{URL: acceptAll(t), Interval: 2 * time.Second, FlushTimeout: 5 * time.Second,
		Include: regexp.MustCompile(regexp.QuoteMeta(dir))})
	waitPids(t, a.Agent, 2, 5*time.Second)
	before := a.Stats()
	for _, f := range []string{"go1", "go2"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Wait for the exec'd Ruby to be profiled as its new image.
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := a.Stats()
		cmd, _ := procfs.Cmdline(toRuby.Pid)
		pids := a.Pids()
		if st.Opened == before.Opened+1 && slices.Contains(pids, toRuby.Pid) && !slices.Contains(pids, toSleep.Pid) &&
			slices.Contains(cmd, second) {
			t.Logf("after the execs: %v sampled; stats %+v", pids, st)
			if st.Reexecs < 2 {
				t.Errorf("%d re-execs counted, want 2", st.Reexecs)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the execs: sampling %v (ruby %d, sleep %d), opened %d (before %d); stats %+v",
				pids, toRuby.Pid, toSleep.Pid, st.Opened, before.Opened, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
