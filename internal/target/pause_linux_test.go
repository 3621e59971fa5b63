package target

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/testutil"
	"golang.org/x/sys/unix"
)

// startSpinner starts a Ruby process with three busy threads besides the
// main one and waits until they exist. It is killed on cleanup.
func startSpinner(t *testing.T) *exec.Cmd { return startSpinnerB(t) }

func startSpinnerB(t testing.TB) *exec.Cmd {
	t.Helper()
	testutil.NeedRoot(t)
	ruby, err := exec.LookPath("ruby")
	if err != nil {
		testutil.Missing(t, "ruby not installed")
	}
	cmd := exec.Command(ruby, "-e", `
		ths = 3.times.map { Thread.new { x = 0; loop { x += 1 } } }
		$stdout.puts "ready"; $stdout.flush
		sleep`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("ruby did not start: %v %v", line, err)
	}
	return cmd
}

// taskStates maps each thread of pid to its kernel state letter.
func taskStates(t *testing.T, pid int) map[int]string {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		out[tid] = string(rune(procfs.TaskState(pid, tid)))
	}
	return out
}

func countState(states map[int]string, s string) int {
	n := 0
	for _, st := range states {
		if st == s {
			n++
		}
	}
	return n
}

func TestPauseStopsEveryThread(t *testing.T) {
	t.Run("Handoff", func(t *testing.T) { testPauseStops(t, NewPauser()) })
	t.Run("Thread", func(t *testing.T) { testPauseStops(t, NewThreadPauser()) })
}

func testPauseStops(t *testing.T, p *Pauser) {
	cmd := startSpinner(t)
	pid := cmd.Process.Pid
	defer p.Close()

	for i := 0; i < 50; i++ {
		info, resume, err := p.PauseInfo(pid)
		if err != nil {
			t.Fatalf("pause %d: %v", i, err)
		}
		states := taskStates(t, pid)
		if len(states) < 4 {
			t.Fatalf("only %d threads: %v", len(states), states)
		}
		if n := countState(states, "t"); n != len(states) || len(info.TIDs) != len(states) {
			resume()
			t.Fatalf("pause %d: states %v, paused %v: want every thread in 't'", i, states, info.TIDs)
		}
		if err := resume(); err != nil {
			t.Fatalf("resume %d: %v", i, err)
		}
		if err := resume(); err != nil { // idempotent
			t.Fatal(err)
		}
		states = taskStates(t, pid)
		if n := countState(states, "t") + countState(states, "T"); n != 0 {
			t.Fatalf("after resume %d: states %v", i, states)
		}
	}
	// The busy threads keep running between pauses.
	time.Sleep(50 * time.Millisecond)
	if n := countState(taskStates(t, pid), "R"); n == 0 {
		t.Errorf("no thread running after resuming: %v", taskStates(t, pid))
	}
}

func TestPauseExitedProcess(t *testing.T) {
	cmd := startSpinner(t)
	pid := cmd.Process.Pid
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	_, err := Pause(pid)
	if !IsExited(err) {
		t.Fatalf("pause of exited process: %v, want ExitedError", err)
	}
}

// TestPauseKilledWhilePaused: a process killed while paused resumes
// without error, and its parent can reap it: the tracer collects its
// threads' exits (a traced thread stays a zombie until its tracer waits
// for it, and the process with it).
func TestPauseKilledWhilePaused(t *testing.T) {
	t.Run("Handoff", func(t *testing.T) { testPauseKilled(t, NewPauser()) })
	t.Run("Thread", func(t *testing.T) { testPauseKilled(t, NewThreadPauser()) })
}

func testPauseKilled(t *testing.T, p *Pauser) {
	cmd := startSpinner(t)
	pid := cmd.Process.Pid
	defer p.Close()
	t.Run("not our child", func(t *testing.T) { testPauseKilledGrandchild(t, p) })
	resume, err := p.Pause(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := resume(); err != nil {
		t.Errorf("resume of a process killed while paused: %v", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatalf("the parent cannot reap process %d killed while paused: threads %v", pid, taskStates(t, pid))
	}
}

// testPauseKilledGrandchild: the same for a process whose parent is not
// rbscope (a shell's child): its leader's exit, collected by the tracer,
// goes back to its parent, which reaps it.
func testPauseKilledGrandchild(t *testing.T, p *Pauser) {
	ruby, err := exec.LookPath("ruby")
	if err != nil {
		testutil.Missing(t, "ruby not installed")
	}
	sh := exec.Command("sh", "-c", ruby+` -e '3.times { Thread.new { loop { } } }; puts Process.pid; $stdout.flush; sleep' & wait`)
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sh.Process.Kill(); _ = sh.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	resume, err := p.Pause(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := resume(); err != nil {
		t.Errorf("resume of a process killed while paused: %v", err)
	}
	for i := 0; ; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return
		}
		if i > 500 {
			t.Fatalf("process %d killed while paused was never reaped by its parent: threads %v", pid, taskStates(t, pid))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPauseSignalPreserved: a signal that arrives while the target is
// stopped is delivered after resuming (not swallowed by ptrace).
func TestPauseSignalPreserved(t *testing.T) {
	testutil.NeedRoot(t)
	ruby, err := exec.LookPath("ruby")
	if err != nil {
		testutil.Missing(t, "ruby not installed")
	}
	cmd := exec.Command(ruby, "-e", `
		trap("USR1") { $stdout.puts "got usr1"; $stdout.flush; exit 0 }
		$stdout.puts "ready"; $stdout.flush
		loop { sleep 0.01 }`)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	r := bufio.NewReader(out)
	if l, _ := r.ReadString('\n'); l != "ready\n" {
		t.Fatalf("ruby did not start: %v", l)
	}
	p := NewPauser()
	defer p.Close()
	resume, err := p.Pause(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGUSR1)
	time.Sleep(20 * time.Millisecond)
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() { l, _ := r.ReadString('\n'); done <- l }()
	select {
	case l := <-done:
		if l != "got usr1\n" {
			t.Fatalf("got %v", l)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("SIGUSR1 sent during the pause was never handled")
	}
}

// TestPauseHelperKilled: when the pausing process is SIGKILLed while the
// target is stopped, the kernel detaches and the target runs again.
func TestPauseHelperKilled(t *testing.T) {
	cmd := startSpinner(t)
	pid := cmd.Process.Pid
	helper := exec.Command(os.Args[0], "-test.run=^TestHelperPauseAndHang$")
	helper.Env = append(os.Environ(), "RBSCOPE_PAUSE_HELPER_PID="+strconv.Itoa(pid))
	hout, _ := helper.StdoutPipe()
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = helper.Process.Kill(); _ = helper.Wait() })
	sc := bufio.NewScanner(hout)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "paused") {
	}
	states := taskStates(t, pid)
	if n := countState(states, "t"); n != len(states) {
		t.Fatalf("helper did not pause the target: %v", states)
	}
	_ = helper.Process.Kill()
	_ = helper.Wait()
	deadline := time.Now().Add(time.Second)
	for {
		states = taskStates(t, pid)
		if countState(states, "t")+countState(states, "T") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("target still stopped 1 s after the pauser was killed: %v", states)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHelperPauseAndHang is not a test: TestPauseHelperKilled runs the
// test binary with this test selected to pause a process and hang.
func TestHelperPauseAndHang(t *testing.T) {
	pid, _ := strconv.Atoi(os.Getenv("RBSCOPE_PAUSE_HELPER_PID"))
	if pid == 0 {
		t.Skip("helper process for TestPauseHelperKilled")
	}
	if _, err := Pause(pid); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("paused")
	time.Sleep(time.Minute)
	os.Exit(0)
}

// BenchmarkPause measures one pause and resume of a Ruby process with four
// threads (three busy), through a Pauser's own thread (Handoff) and
// inline on the caller's thread (Thread).
func BenchmarkPause(b *testing.B) {
	cmd := startSpinnerB(b)
	for _, kind := range []string{"Handoff", "Thread"} {
		b.Run(kind, func(b *testing.B) {
			var p *Pauser
			if kind == "Thread" {
				p = NewThreadPauser()
			} else {
				p = NewPauser()
			}
			defer p.Close()
			for i := 0; i < b.N; i++ {
				resume, err := p.Pause(cmd.Process.Pid)
				if err != nil {
					b.Fatal(err)
				}
				if err := resume(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPausePhases splits one pause of the 4-thread spinner into its
// system calls, to weigh SEIZE/DETACH per sample against attaching once
// (which would still need INTERRUPT, the wait for each stop and a
// CONT, but also a thread that handles every signal-delivery stop
// between samples). Run on one OS thread, as ptrace requires.
func BenchmarkPausePhases(b *testing.B) {
	cmd := startSpinnerB(b)
	pid := cmd.Process.Pid
	p := NewPauser()
	defer p.Close()
	var seize, interrupt, wait, detachT time.Duration
	var threads int
	b.ResetTimer()
	_ = p.do(func() {
		for i := 0; i < b.N; i++ {
			tids, err := p.listTasks(pid)
			if err != nil {
				b.Fatal(err)
			}
			threads = len(tids)
			t0 := time.Now()
			for _, tid := range tids {
				if err := unix.PtraceSeize(tid); err != nil {
					b.Fatal(err)
				}
			}
			t1 := time.Now()
			for _, tid := range tids {
				_ = unix.PtraceInterrupt(tid)
			}
			t2 := time.Now()
			stopped := p.waitStops(pid, tids)
			t3 := time.Now()
			_ = p.resume(pid, stopped)
			t4 := time.Now()
			seize += t1.Sub(t0)
			interrupt += t2.Sub(t1)
			wait += t3.Sub(t2)
			detachT += t4.Sub(t3)
		}
	})
	n := float64(b.N)
	b.ReportMetric(float64(seize.Nanoseconds())/n, "seize-ns/op")
	b.ReportMetric(float64(interrupt.Nanoseconds())/n, "interrupt-ns/op")
	b.ReportMetric(float64(wait.Nanoseconds())/n, "wait-ns/op")
	b.ReportMetric(float64(detachT.Nanoseconds())/n, "detach-ns/op")
	b.ReportMetric(float64(threads), "threads")
}

// TestThreadPauserOtherThread: while a thread-bound Pauser has threads
// attached (from a pause to its resume), it refuses calls from another
// OS thread, whose ptrace requests the kernel would reject; once they are
// resumed, any thread may use it (the sampler's goroutine sleeps unlocked
// between ticks and may wake up on another thread).
func TestThreadPauserOtherThread(t *testing.T) {
	cmd := startSpinner(t)
	pid := cmd.Process.Pid
	p := NewThreadPauser()
	defer p.Close()
	// elsewhere runs f on a goroutine locked to its own OS thread.
	elsewhere := func(f func() error) error {
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // surely not the thread of a held pause
			defer runtime.UnlockOSThread()
			errc <- f()
		}()
		return <-errc
	}
	resume, err := p.Pause(pid)
	if err != nil {
		t.Fatal(err)
	}
	err = elsewhere(func() error { _, err := p.Pause(pid); return err })
	if err == nil || !strings.Contains(err.Error(), "another thread") {
		t.Errorf("pause from another thread while paused: %v", err)
	}
	if err := elsewhere(resume); err == nil {
		t.Errorf("resume from another thread accepted")
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	if n := countState(taskStates(t, pid), "t"); n != 0 {
		t.Fatalf("%d threads still stopped after resume", n)
	}
	err = elsewhere(func() error {
		resume, err := p.Pause(pid)
		if err != nil {
			return err
		}
		return resume()
	})
	if err != nil {
		t.Errorf("pause and resume from another thread once resumed: %v", err)
	}
}

// TestPauseTakesOverItsOwnSeize: a thread this pauser's thread seized
// and stopped earlier without detaching (a pause whose wait for the stop
// gave up, the stop coming later) is paused and detached by the next
// pause, instead of being refused as "already traced" and left stopped
// for good (seen in launch mode under load: the command never ended).
func TestPauseTakesOverItsOwnSeize(t *testing.T) {
	cmd := startSpinner(t)
	pid := cmd.Process.Pid
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p := NewThreadPauser()
	defer p.Close()
	var tid int
	for t2 := range taskStates(t, pid) {
		if t2 != pid {
			tid = t2
			break
		}
	}
	// The stale seize: traced by this thread and interrupted, its stop
	// not waited for, known to nobody.
	if err := ptrace(unix.PTRACE_SEIZE, tid, 0); err != nil {
		t.Fatal(err)
	}
	if err := ptrace(unix.PTRACE_INTERRUPT, tid, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // stopped by now
	info, resume, err := p.PauseInfo(pid)
	if err != nil {
		t.Fatalf("pause with a stale seize of thread %d: %v", tid, err)
	}
	if !slices.Contains(info.TIDs, tid) {
		t.Errorf("paused %v, not the stale thread %d", info.TIDs, tid)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	if tr := tracerPid(pid, tid); tr != 0 {
		t.Errorf("thread %d still traced by %d after resume", tid, tr)
	}
	if s := taskStates(t, pid)[tid]; s == "t" || s == "T" {
		t.Errorf("thread %d left stopped (%s)", tid, s)
	}
}

// TestInterruptedSleep: of a Ruby process whose main thread sleeps while
// three threads spin taking turns with the GVL, the stop of each thread
// tells the sleepers (in futex or poll, the waiters for the GVL too) from
// the one running Ruby code.
func TestInterruptedSleep(t *testing.T) {
	cmd := startSpinner(t)
	pid := cmd.Process.Pid
	pz := NewThreadPauser()
	defer pz.Close()
	// The new threads settle into taking turns with the GVL.
	time.Sleep(200 * time.Millisecond)
	oneRunning, mainAwake := 0, 0
	const pauses = 20
	for i := 0; i < pauses; i++ {
		info, resume, err := pz.PauseInfo(pid)
		if err != nil {
			t.Fatal(err)
		}
		running, mainAsleep := 0, false
		for _, tid := range info.TIDs {
			asleep, err := pz.InterruptedSleep(tid)
			if err != nil {
				resume()
				t.Fatalf("thread %d: %v", tid, err)
			}
			if !asleep {
				running++
			}
			if tid == pid {
				mainAsleep = asleep
			}
		}
		if err := resume(); err != nil {
			t.Fatal(err)
		}
		if !mainAsleep {
			mainAwake++
		}
		// More while the GVL changes hands: a thread woken from its
		// wait for it is runnable, and so running.
		if running == 1 {
			oneRunning++
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("one thread running in %d of %d pauses; the main thread awake in %d", oneRunning, pauses, mainAwake)
	// Ruby wakes a sleeping thread now and then (its timer's interrupt
	// checks): a pause may catch it on its way back to sleep (1 of 20 once
	// under CI's load, 0 of 300 on an idle machine).
	if mainAwake > pauses/10 {
		t.Errorf("the main thread (in sleep) was not asleep in %d of %d pauses", mainAwake, pauses)
	}
	if oneRunning < pauses*3/4 {
		t.Errorf("one thread running in %d of %d pauses", oneRunning, pauses)
	}
	if _, err := pz.InterruptedSleep(pid); err == nil {
		t.Error("the registers of a thread no pause holds were read")
	}
}
