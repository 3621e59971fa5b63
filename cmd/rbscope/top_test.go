package main

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
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
		// The directory first: cleanups run last-registered first, and
		// rbscope, ended by the server's SIGHUP, still writes its output
		// there while it stops.
		dir, env := t.TempDir(), paneEnv(t, rb)
		t.Cleanup(func() {
			_ = exec.Command("tmux", "-L", sock, "kill-server").Run()
			waitNoProcessWith(t, dir, 30*time.Second)
		})
		cmdline := fmt.Sprintf("%s%s record --pid %d --duration 4s --format summary -o %s/s.txt --raw %s/r.gz; sleep 30",
			env, bin, p.Pid, dir, dir)
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

// waitNoProcessWith waits until no process has s in its command line.
func waitNoProcessWith(t *testing.T, s string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		pids, err := procfs.Pids()
		if err != nil {
			t.Fatal(err)
		}
		left := 0
		for _, pid := range pids {
			if args, err := procfs.Cmdline(pid); err == nil && strings.Contains(strings.Join(args, " "), s) {
				left = pid
				break
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("process %d still runs with %s in its command line after %v", left, s, within)
			return
		}
	}
}

// tmuxPane runs command in a detached 120x30 tmux session of its own
// (killed on cleanup) and returns a function that waits, up to 15 s, for
// the screen to satisfy ok and returns it, and one that sends keys.
func tmuxPane(t *testing.T, name, command string) (waitScreen func(what string, ok func(string) bool) string, send func(keys ...string)) {
	sock := "rbscope-test-" + name
	tmux := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("tmux", append([]string{"-L", sock}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", sock, "kill-server").Run() })
	tmux("-f", "/dev/null", "new-session", "-d", "-s", "top", "-x", "120", "-y", "30", command)
	waitScreen = func(what string, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
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
	send = func(keys ...string) { tmux(append([]string{"send-keys", "-t", "top"}, keys...)...) }
	return waitScreen, send
}

// TestTopModeAndThreads runs top on names.rb, whose threads mostly sleep
// (Queue#pop, Kernel#sleep, Thread#join) while two run Object#spin:
// --mode cpu shows what the running threads run and none of the sleeping
// threads' functions, which wall mode shows; the first row is on the
// screen's fourth line; the per-thread view names every thread whole
// with its tid, the two threads named "worker" apart.
func TestTopModeAndThreads(t *testing.T) {
	bin := recBinary(t)
	if _, err := exec.LookPath("tmux"); err != nil {
		testutil.Missing(t, "tmux (scripts/install-deps.sh installs it)")
	}
	sleeping := []string{"Thread::Queue#pop", "Kernel#sleep", "Thread#join"}
	rowRe := regexp.MustCompile(`^\s*\d+\.\d\d% `)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := rb.Start(t, "names.rb")
		reports := namesReports(t, p)
		run := func(mode string) string {
			return fmt.Sprintf("%s%s top --pid %d --interval 500ms --mode %s; echo rbscope-exit=$?; sleep 30", paneEnv(t, rb), bin, p.Pid, mode)
		}

		wait, send := tmuxPane(t, fmt.Sprintf("%d-cpu", p.Pid), run("cpu"))
		wait("Object#spin never appeared", func(s string) bool {
			return strings.Contains(s, "Object#spin") && strings.Contains(s, "mode cpu")
		})
		// A few refreshes: what cpu mode drops would be there by now.
		time.Sleep(1500 * time.Millisecond)
		screen := wait("", func(string) bool { return true })
		for _, f := range sleeping {
			if strings.Contains(screen, f) {
				t.Errorf("--mode cpu shows %s, which only sleeping threads run:\n%s", f, screen)
			}
		}
		if lines := strings.Split(screen, "\n"); len(lines) < 4 || !rowRe.MatchString(lines[3]) {
			t.Errorf("the first row is not on the fourth line:\n%s", screen)
		}
		send("q")
		wait("rbscope did not exit on q", func(s string) bool { return strings.Contains(s, "rbscope-exit=0") })

		wait, send = tmuxPane(t, fmt.Sprintf("%d-wall", p.Pid), run("wall"))
		wait("the sleeping threads' functions never appeared in wall mode", func(s string) bool {
			for _, f := range sleeping {
				if !strings.Contains(s, f) {
					return false
				}
			}
			return strings.Contains(s, "mode wall")
		})
		send("t")
		screen = wait("per-thread view never showed every thread", func(s string) bool {
			for _, r := range reports {
				if r.Name != nil && !strings.Contains(s, fmt.Sprintf("%s (%d)", *r.Name, r.TID)) {
					return false
				}
			}
			return true
		})
		if strings.Contains(screen, "…") {
			t.Errorf("a name was cut on a 120-column terminal:\n%s", screen)
		}
		send("q")
		wait("rbscope did not exit on q", func(s string) bool { return strings.Contains(s, "rbscope-exit=0") })
	})
}
