package ruby

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/testutil"
)

// TestMNThreadsKeepIdentity: under M:N threads (RUBY_MN_THREADS=1, Ruby
// 3.3+) seven Ruby threads share fewer native threads, move between them
// and may have none. Every snapshot lists every Ruby thread, each with
// the same ThreadID every time (distinct between threads) and a tid that
// is 0 or one of the process's native threads; the sleeping threads'
// stacks are Ruby's own (caller_locations).
func TestMNThreadsKeepIdentity(t *testing.T) {
	testutil.EachRuby(t, testMNThreadsKeepIdentity)
}

func testMNThreadsKeepIdentity(t *testing.T, rb testutil.RubyUnderTest) {
	var major, minor int
	if _, err := fmt.Sscanf(rb.Version, "%d.%d", &major, &minor); err != nil {
		t.Fatalf("Ruby version %q: %v", rb.Version, err)
	}
	if major < 3 || major == 3 && minor < 3 {
		t.Skipf("Ruby %s has no M:N threads (RUBY_MN_THREADS came with 3.3): nothing to test", rb.Version)
	}
	rb.SetProfilerEnv(t)
	cmd := rb.Command(testutil.RepoRoot(t)+"/testdata/ruby/stacks.rb", "mn")
	cmd.Env = append(os.Environ(), "RUBY_MN_THREADS=1", "RUBY_MAX_CPU=2")
	proc := rb.StartCmd(t, cmd)
	want := reports(t, proc)
	_, p := snapshotLive(t, proc.Pid)

	names := []string{"sleeper-0", "sleeper-1", "sleeper-2", "spinner-0", "spinner-1", "spinner-2", "spinner-3"}
	ids := map[string]uint64{}
	tids := map[string]map[int]bool{}
	matched := map[string]bool{}
	var lastMismatch string
	for i := 0; i < 40; i++ {
		threads, err := p.Snapshot()
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		if len(threads) != 8 {
			t.Fatalf("snapshot %d: %d threads, want 8 (main and seven named):\n%+v", i, len(threads), threads)
		}
		tasks := map[int]bool{}
		if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", proc.Pid)); err == nil {
			for _, e := range ents {
				var tid int
				fmt.Sscan(e.Name(), &tid)
				tasks[tid] = true
			}
		}
		seen := map[uint64]string{}
		for _, name := range names {
			th, ok := findThread(threads, name)
			if !ok {
				t.Fatalf("snapshot %d: no thread named %q", i, name)
			}
			if th.ThreadID == 0 {
				t.Fatalf("snapshot %d: %s has no ThreadID", i, name)
			}
			if other, dup := seen[th.ThreadID]; dup {
				t.Fatalf("snapshot %d: %s and %s share ThreadID %#x", i, name, other, th.ThreadID)
			}
			seen[th.ThreadID] = name
			if id, ok := ids[name]; ok && id != th.ThreadID {
				t.Fatalf("snapshot %d: %s's ThreadID changed from %#x to %#x", i, name, id, th.ThreadID)
			}
			ids[name] = th.ThreadID
			if th.TID != 0 && !tasks[th.TID] && th.TID != proc.Pid {
				t.Errorf("snapshot %d: %s on tid %d, not a thread of %d", i, name, th.TID, proc.Pid)
			}
			if tids[name] == nil {
				tids[name] = map[int]bool{}
			}
			tids[name][th.TID] = true
			if strings.HasPrefix(name, "sleeper") && !matched[name] {
				if m := mismatch(th, want[name]); m == "" {
					matched[name] = true
				} else {
					lastMismatch = m
				}
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	for _, name := range names[:3] {
		if !matched[name] {
			t.Errorf("%s's stack never matched Ruby's: %s", name, lastMismatch)
		}
	}
	// M:N in effect: some Ruby thread was seen without a native thread
	// or on more than one, else this test shows nothing.
	moved := false
	for _, name := range names {
		if len(tids[name]) > 1 || tids[name][0] {
			moved = true
		}
	}
	if !moved {
		t.Errorf("no Ruby thread was ever without a native thread or on two: M:N threads not in effect? tids %v", tids)
	}
}
