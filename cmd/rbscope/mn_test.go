package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

// TestRecordMNThreads records stacks.rb's M:N scenario (RUBY_MN_THREADS=1:
// seven named Ruby threads, four spinning and three sleeping, on two
// shared native threads) and renders it as collapsed --threads and
// speedscope: each Ruby thread (by its Thread#name) is one thread, shown
// with a tid of the process or "no tid", however it moved between native
// threads while recorded.
func TestRecordMNThreads(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		var major, minor int
		if _, err := fmt.Sscanf(rb.Version, "%d.%d", &major, &minor); err != nil {
			t.Fatalf("Ruby version %q: %v", rb.Version, err)
		}
		if major < 3 || major == 3 && minor < 3 {
			t.Skipf("Ruby %s has no M:N threads (RUBY_MN_THREADS came with 3.3): nothing to test", rb.Version)
		}
		cmd := rb.Command(filepath.Join(testutil.RepoRoot(t), "testdata", "ruby", "stacks.rb"), "mn")
		cmd.Env = append(os.Environ(), "RUBY_MN_THREADS=1", "RUBY_MAX_CPU=2")
		p := rb.StartCmd(t, cmd)
		dir := t.TempDir()
		raw, collapsed, ss := filepath.Join(dir, "r.raw.gz"), filepath.Join(dir, "c.txt"), filepath.Join(dir, "s.json")
		res := recRun(t, rb, "record", "--pid", strconv.Itoa(p.Pid), "--duration", "1s", "-f", "collapsed", "--threads", "-o", collapsed, "--raw", raw)
		if res.err != nil {
			t.Fatalf("record: %v\n%s", res.err, res.stderr)
		}
		if res := recRun(t, rb, "report", raw, "-f", "speedscope", "-o", ss); res.err != nil {
			t.Fatalf("report: %v\n%s", res.err, res.stderr)
		}
		tasks := map[string]bool{"no tid": true}
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.Pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			tasks[e.Name()] = true
		}
		if len(ents) >= 8 {
			t.Fatalf("%d native threads for 8 Ruby threads: M:N threads not in effect", len(ents))
		}
		c, err := os.ReadFile(collapsed)
		if err != nil {
			t.Fatal(err)
		}
		shown := map[string]map[string]bool{} // Ruby thread name -> "thread NAME (TID)" prefixes
		re := regexp.MustCompile(`^thread (\S+) \(([^)]*)\);`)
		for _, l := range strings.Split(strings.TrimSpace(string(c)), "\n") {
			m := re.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("collapsed --threads line %q", l)
			}
			if !tasks[m[2]] {
				t.Errorf("thread %s shown with tid %q, neither a thread of %d nor \"no tid\"", m[1], m[2], p.Pid)
			}
			if shown[m[1]] == nil {
				shown[m[1]] = map[string]bool{}
			}
			shown[m[1]][m[0]] = true
		}
		b, err := os.ReadFile(ss)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Profiles []struct {
				Name string `json:"name"`
			} `json:"profiles"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"sleeper-0", "sleeper-1", "sleeper-2", "spinner-0", "spinner-1", "spinner-2", "spinner-3"} {
			if len(shown[name]) != 1 {
				t.Errorf("Ruby thread %s shown as %d threads in collapsed --threads: %v", name, len(shown[name]), shown[name])
			}
			n := 0
			for _, pr := range doc.Profiles {
				if strings.HasSuffix(pr.Name, " "+name) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("Ruby thread %s has %d speedscope profiles, want 1", name, n)
			}
		}
	})
}
