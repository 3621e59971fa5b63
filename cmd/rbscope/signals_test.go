package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/testutil"
)

// sigScript keeps 3 threads busy.
const sigScript = `
def busy_leaf; x = 0; 1000.times { x += 1 }; end
def worker_loop; loop { busy_leaf }; end
2.times { |i| Thread.new { worker_loop }.name = "worker-#{i}" }
puts "ready"; $stdout.flush
worker_loop
`

// taskStatus is every thread's State and TracerPid, from
// /proc/PID/task/*/status.
func taskStatus(t *testing.T, pid int) []procfs.Status {
	t.Helper()
	tids, err := procfs.Tasks(pid)
	if err != nil {
		t.Fatal(err)
	}
	var out []procfs.Status
	for _, tid := range tids {
		if st, err := procfs.ReadTaskStatus(pid, tid); err == nil {
			out = append(out, st)
		}
	}
	return out
}

// heldBy reports whether any thread of pid is stopped ('t' or 'T') or
// traced by tracer.
func heldBy(sts []procfs.Status, tracer int) bool {
	for _, st := range sts {
		if st.State == 't' || st.State == 'T' || (tracer != 0 && st.TracerPid == tracer) {
			return true
		}
	}
	return false
}

// startRecording starts a blocking rbscope record of pid at 1 kHz and
// waits for sampling to have begun.
func startRecording(t *testing.T, rb testutil.RubyUnderTest, pid int, dir string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(recBinary(t), "record", "--pid", strconv.Itoa(pid), "--rate", "1000", "--format", "summary",
		"-o", filepath.Join(dir, "prof.txt"), "--raw", filepath.Join(dir, "r.gz"))
	cmd.Env = rb.ProfilerEnv(t)
	var se bytes.Buffer
	cmd.Stderr = &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// Sampling has begun once the raw recording holds a first block
	// (512 samples, or a second's worth) past its header.
	raw, header := filepath.Join(dir, "r.gz"), int64(-1)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		n := fileSize(raw)
		if header < 0 && n > 0 {
			header = n
		}
		if header > 0 && n > header {
			break
		}
	}
	return cmd, &se
}

// TestRecordSIGHUP: SIGHUP (a dropped ssh connection) ends a recording
// like SIGTERM: exit 0, the profile written, the target running and
// untraced.
func TestRecordSIGHUP(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := rb.Start(t, recScript(t, sigScript))
		dir := t.TempDir()
		cmd, se := startRecording(t, rb, p.Pid, dir)
		_ = cmd.Process.Signal(syscall.SIGHUP)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("rbscope after SIGHUP: %v\n%s", err, se)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "prof.txt")); err != nil || !strings.Contains(string(b), "Object#busy_leaf") {
			t.Errorf("no profile after SIGHUP: %v\n%s", err, se)
		}
		if !strings.Contains(se.String(), "interrupted by hangup") {
			t.Errorf("stderr does not say why it stopped:\n%s", se)
		}
		if sts := taskStatus(t, p.Pid); heldBy(sts, cmd.Process.Pid) {
			t.Errorf("target held after rbscope exited: %+v", sts)
		}
	})
}

// TestRecordSIGTSTP: SIGTSTP stops rbscope only once the target is
// resumed: while rbscope is stopped, no thread of the target is stopped
// or traced by it (the default action, stopping rbscope mid-sample, left
// the target frozen 17 times in 20). SIGCONT resumes sampling: the
// recording goes on and SIGTERM then writes it.
func TestRecordSIGTSTP(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := rb.Start(t, recScript(t, sigScript))
		dir := t.TempDir()
		cmd, se := startRecording(t, rb, p.Pid, dir)
		var resumed time.Time
		for i := 0; i < 10; i++ {
			_ = cmd.Process.Signal(syscall.SIGTSTP)
			waitState(t, cmd.Process.Pid, 'T')
			time.Sleep(20 * time.Millisecond)
			if sts := taskStatus(t, p.Pid); heldBy(sts, cmd.Process.Pid) {
				t.Fatalf("try %d: rbscope is stopped and holds the target: %+v", i, sts)
			}
			resumed = time.Now()
			_ = cmd.Process.Signal(syscall.SIGCONT)
			waitState(t, cmd.Process.Pid, 'S', 'R')
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("rbscope after SIGTERM: %v\n%s", err, se)
		}
		// Sampling resumed after the last SIGCONT: the recording (all of
		// it, flushed at the end) holds samples taken after it.
		_, samples := recReadRaw(t, filepath.Join(dir, "r.gz"))
		after := 0
		for _, s := range samples {
			if s.Time.After(resumed) {
				after++
			}
		}
		if after == 0 {
			t.Errorf("no sample of %d taken after the last SIGCONT: sampling did not resume", len(samples))
		}
		if b, err := os.ReadFile(filepath.Join(dir, "prof.txt")); err != nil || !strings.Contains(string(b), "Object#busy_leaf") {
			t.Errorf("no profile: %v\n%s", err, se)
		}
	})
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return -1
	}
	return st.Size()
}

// waitState waits up to 15 s for process pid's state to be one of want
// (a sample in progress, which SIGTSTP waits for, can take seconds on a
// loaded machine).
func waitState(t *testing.T, pid int, want ...byte) {
	t.Helper()
	var st procfs.Stat
	var err error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if st, err = procfs.ReadStat(pid); err == nil && bytes.IndexByte(want, st.State) >= 0 {
			return
		}
	}
	t.Fatalf("process %d: state %q, want one of %q (%v)", pid, st.State, want, err)
}

// TestRecordFIFO records into FIFOs with real readers (cat): one opened
// before rbscope started (its check of the output used to hand it an end
// of file, and rbscope then blocked forever in the final open, swallowing
// the first SIGTERM), one that comes while rbscope says it waits, and
// none, where SIGTERM ends the wait at once, exit 1, naming the raw
// recording that keeps the samples. A FIFO as the raw recording is
// refused.
func TestRecordFIFO(t *testing.T) {
	testutil.NeedRoot(t)
	rb := testutil.SystemRuby(t)
	p := rb.Start(t, recScript(t, sigScript))
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	record := func() (*exec.Cmd, *bytes.Buffer) {
		cmd := exec.Command(recBinary(t), "record", "--pid", strconv.Itoa(p.Pid), "--duration", "1s",
			"--format", "collapsed", "-o", fifo, "--raw", filepath.Join(dir, "r.gz"))
		cmd.Env = rb.ProfilerEnv(t)
		var se bytes.Buffer
		cmd.Stderr = &se
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, &se
	}
	reader := func() (*exec.Cmd, *bytes.Buffer) {
		cat := exec.Command("cat", fifo)
		var out bytes.Buffer
		cat.Stdout = &out
		if err := cat.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cat.Process.Kill(); _ = cat.Wait() })
		return cat, &out
	}
	waitFor := func(se *bytes.Buffer, want string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(se.String(), want); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("rbscope never said %q:\n%s", want, se)
			}
		}
	}
	t.Run("reader first", func(t *testing.T) {
		cat, out := reader()
		// cat waits in openat(2) (x86_64 system call 257) for a writer.
		for i := 0; ; i++ {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", cat.Process.Pid)); strings.HasPrefix(string(b), "257 ") {
				break
			}
			if i == 500 {
				t.Fatal("cat never waited to open the FIFO")
			}
			time.Sleep(10 * time.Millisecond)
		}
		cmd, se := record()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("record: %v\n%s", err, se)
		}
		if err := cat.Wait(); err != nil || !strings.Contains(out.String(), "Object#busy_leaf") {
			t.Errorf("reader: %v, got %q", err, out.String())
		}
		if strings.Contains(se.String(), "waiting") {
			t.Errorf("said it waited with a reader there:\n%s", se)
		}
	})
	t.Run("reader second", func(t *testing.T) {
		cmd, se := record()
		waitFor(se, "waiting up to 30s for a reader of the FIFO "+fifo)
		cat, out := reader()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("record: %v\n%s", err, se)
		}
		if err := cat.Wait(); err != nil || !strings.Contains(out.String(), "Object#busy_leaf") {
			t.Errorf("reader: %v, got %q", err, out.String())
		}
	})
	t.Run("raw recording", func(t *testing.T) {
		// The raw recording is read back: a FIFO is refused before
		// anything starts (it used to block the start forever).
		cmd := exec.Command(recBinary(t), "record", "--pid", strconv.Itoa(p.Pid), "--duration", "1s",
			"-o", filepath.Join(dir, "out.txt"), "--raw", fifo)
		cmd.Env = rb.ProfilerEnv(t)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "raw recording "+fifo+" is a FIFO") {
			t.Errorf("--raw FIFO: %v\n%s", err, out)
		}
	})
	t.Run("no reader, SIGTERM", func(t *testing.T) {
		cmd, se := record()
		waitFor(se, "waiting up to 30s for a reader of the FIFO "+fifo)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Errorf("exit %v, want 1\n%s", err, se)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("rbscope still waits 20s after SIGTERM:\n%s", se)
		}
		for _, want := range []string{"interrupted by terminated", "rbscope report --input " + filepath.Join(dir, "r.gz")} {
			if !strings.Contains(se.String(), want) {
				t.Errorf("stderr lacks %q:\n%s", want, se)
			}
		}
		if fi, err := os.Lstat(fifo); err != nil || fi.Mode().Type() != os.ModeNamedPipe {
			t.Errorf("the FIFO is gone or replaced: %v", err)
		}
	})
}
