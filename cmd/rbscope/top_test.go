package main

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/testutil"
)

// paneEnv is the env(1) prefix that gives rbscope, in a tmux pane, the
// environment it needs for Ruby rb.
func paneEnv(t *testing.T, rb testutil.RubyUnderTest) string {
	return fmt.Sprintf("env RBSCOPE_DEBUG_ROOT=%q RBSCOPE_CACHE_DIR=%q ", rb.DebugRoot, t.TempDir())
}

// TestTopInTmux runs rbscope top in a detached tmux session against a busy
// Ruby process: function names appear, 't' switches to the per-thread
// view, 'q' exits with status 0 and leaves the alternate screen.
func TestTopInTmux(t *testing.T) {
	bin := recBinary(t)
	if _, err := exec.LookPath("tmux"); err != nil {
		testutil.Missing(t, "tmux (scripts/install-deps.sh installs it)")
	}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := recStartRuby(t, rb, recBusyScript)
		sock := "rbscope-test-" + strconv.Itoa(p.Pid)
		tmux := func(args ...string) string {
			t.Helper()
			out, err := exec.Command("tmux", append([]string{"-L", sock}, args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("tmux %v: %v\n%s", args, err, out)
			}
			return string(out)
		}
		t.Cleanup(func() { _ = exec.Command("tmux", "-L", sock, "kill-server").Run() })
		tmux("-f", "/dev/null", "new-session", "-d", "-s", "top", "-x", "120", "-y", "30",
			fmt.Sprintf("%s%s top --pid %d --interval 300ms; echo rbscope-exit=$?; sleep 30", paneEnv(t, rb), bin, p.Pid))
		waitFor := func(what string, ok func(string) bool) string {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for {
				screen := tmux("capture-pane", "-t", "top", "-p")
				if ok(screen) {
					return screen
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s; screen:\n%s", what, screen)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		screen := waitFor("function names never appeared", func(s string) bool {
			return strings.Contains(s, "block in Object#busy_leaf") && strings.Contains(s, "Object#busy_mid")
		})
		if !strings.Contains(screen, fmt.Sprintf("pid %d", p.Pid)) || !strings.Contains(screen, "Threads: 4") {
			t.Errorf("header:\n%s", screen)
		}
		tmux("send-keys", "-t", "top", "t")
		waitFor("per-thread view never appeared", func(s string) bool {
			return strings.Contains(s, "Thread") && strings.Contains(s, "worker-1")
		})
		tmux("send-keys", "-t", "top", "4")
		waitFor("sort key never changed", func(s string) bool { return strings.Contains(s, "[TotalTime]") })
		tmux("send-keys", "-t", "top", "q")
		screen = waitFor("rbscope did not exit on q", func(s string) bool { return strings.Contains(s, "rbscope-exit=") })
		if !strings.Contains(screen, "rbscope-exit=0") {
			t.Errorf("exit status:\n%s", screen)
		}
		// Back on the normal screen: the table is gone.
		if strings.Contains(screen, "%Own") {
			t.Errorf("the alternate screen was not left:\n%s", screen)
		}
		// And the target was resumed.
		if strings.ContainsAny(recStates(p.Pid), "tT") {
			t.Errorf("target stopped after top exited: %s", recStates(p.Pid))
		}

		// Ctrl-C quits too (a key in raw mode).
		// (The new session first: a server without sessions exits.)
		tmux("new-session", "-d", "-s", "top2", "-x", "120", "-y", "30",
			fmt.Sprintf("%s%s top --pid %d --interval 300ms; echo rbscope-exit=$?; sleep 30", paneEnv(t, rb), bin, p.Pid))
		tmux("kill-session", "-t", "top")
		waitFor2 := func(what string, ok func(string) bool) string {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for {
				screen := tmux("capture-pane", "-t", "top2", "-p")
				if ok(screen) {
					return screen
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s; screen:\n%s", what, screen)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		waitFor2("top did not start", func(s string) bool { return strings.Contains(s, "Object#busy_mid") })
		tmux("send-keys", "-t", "top2", "C-c")
		screen = waitFor2("rbscope did not exit on Ctrl-C", func(s string) bool { return strings.Contains(s, "rbscope-exit=") })
		if !strings.Contains(screen, "rbscope-exit=0") || strings.Contains(screen, "%Own") {
			t.Errorf("after Ctrl-C:\n%s", screen)
		}
	})
}

// TestRecordProgressOnTerminal: on a terminal, record shows a progress
// line (elapsed, samples, errors, late) while it runs.
func TestRecordProgressOnTerminal(t *testing.T) {
	bin := recBinary(t)
	if _, err := exec.LookPath("tmux"); err != nil {
		testutil.Missing(t, "tmux (scripts/install-deps.sh installs it)")
	}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := recStartRuby(t, rb, recBusyScript)
		sock := "rbscope-rec-" + strconv.Itoa(p.Pid)
		t.Cleanup(func() { _ = exec.Command("tmux", "-L", sock, "kill-server").Run() })
		dir := t.TempDir()
		cmdline := fmt.Sprintf("%s%s record --pid %d --duration 4s --format summary -o %s/s.txt --raw %s/r.gz; sleep 30",
			paneEnv(t, rb), bin, p.Pid, dir, dir)
		if out, err := exec.Command("tmux", "-L", sock, "-f", "/dev/null", "new-session", "-d", "-s", "rec", "-x", "150", "-y", "10", cmdline).CombinedOutput(); err != nil {
			t.Fatalf("tmux: %v %s", err, out)
		}
		re := regexp.MustCompile(`\d+\.\ds\s+(\d+) samples\s+\d+ errors\s+\d+ late`)
		deadline := time.Now().Add(4 * time.Second)
		for {
			out, _ := exec.Command("tmux", "-L", sock, "capture-pane", "-t", "rec", "-p").Output()
			if m := re.FindStringSubmatch(string(out)); m != nil && m[1] != "0" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no progress line:\n%s", out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}
