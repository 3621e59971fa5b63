package sampler

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/oncpu"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// stillScript runs three threads that each sleep 2 to 14 ms at a time in
// stacks that change from one sleep to the next: 10, 18 or 26 frames of
// down, ending at one of three call lines of nap (the same depth, so the
// same cfp, with another caller's line). Each sleep is logged with the
// thread's native id, its CLOCK_MONOTONIC bounds and the script's own
// caller_locations (lines in this file, innermost first): the truth of
// every sample taken inside it. The time reading, the sleep and the
// caller_locations share one line, so every instant between the two
// readings has that stack.
const stillScript = `
$log = File.open(ARGV[0], "w")
$log.sync = true
LOCK = Mutex.new
def nap(i)
  d = 0.002 + rand * 0.012
  locs = caller_locations(0).select { |l| l.path == __FILE__ }.map(&:lineno); t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond); sleep(d); t1 = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  LOCK.synchronize { $log.puts "#{Thread.current.native_thread_id} #{t0} #{t1} #{locs.join(",")}" }
end
def down(n, i, k)
  if n > 0
    down(n - 1, i, k)
  elsif k % 3 == 0
    nap(i)
  elsif k % 3 == 1
    nap(i)
  else
    nap(i)
  end
end
ths = 3.times.map do |i|
  Thread.new do
    k = 0
    while true
      down(10 + (k / 3 % 3) * 8, i, k)
      k += 1
    end
  end
end
sleep 0.1
puts "ready"; $stdout.flush
ths.each(&:join)
`

// TestStillThreadsNeverStale samples stillScript's threads as Mode wall
// and Mode cpu do, nonblocking, where threads that have not run since their frames
// were read are not read again (ruby.OffCPUWatch): every sample taken
// wholly inside one of a thread's logged sleeps must be that sleep's
// stack, line for line, though most were served without a read and
// consecutive stacks often share their depth.
func TestStillThreadsNeverStale(t *testing.T) {
	eachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		for _, mode := range []string{"wall", "cpu"} {
			t.Run(mode, func(t *testing.T) { testStillThreadsNeverStale(t, rb, mode == "cpu") })
		}
	})
}

func testStillThreadsNeverStale(t *testing.T, rb testutil.RubyUnderTest, cpu bool) {
	logPath := filepath.Join(t.TempDir(), "sleeps")
	cmd := startRuby(t, rb, stillScript, logPath)
	p := openRuby(t, cmd.Process.Pid)
	src := NewRubySource(p, RubyOptions{})
	defer src.Close()
	type obs struct {
		from, to int64
		tid      int
		lines    []int
	}
	var seen []obs
	tk := &tick{Context: context.Background(), cpu: cpu}
	fails := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Microsecond) {
		tk.deadline = time.Now()
		from := oncpu.Now()
		s, err := src.Sample(tk)
		to := oncpu.Now()
		if tk.cpuErr != nil {
			t.Fatalf("watch context switches: %v", tk.cpuErr)
		}
		if err != nil {
			fails++
		}
		for _, x := range s {
			var lines []int
			for _, f := range x.Frames {
				if f.Kind == stack.KindRuby && filepath.Base(f.Path) == "script.rb" {
					lines = append(lines, f.Line)
				}
			}
			if len(lines) > 0 {
				seen = append(seen, obs{from, to, x.TID, lines})
			}
		}
	}
	skips := p.StillSkips()
	_ = cmd.Process.Kill()
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type sleepSpan struct {
		t0, t1 int64
		lines  []int
	}
	sleeps := map[int][]sleepSpan{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 4 {
			continue // the last line, cut by the kill
		}
		tid, _ := strconv.Atoi(fs[0])
		t0, _ := strconv.ParseInt(fs[1], 10, 64)
		t1, _ := strconv.ParseInt(fs[2], 10, 64)
		var lines []int
		for _, l := range strings.Split(fs[3], ",") {
			n, _ := strconv.Atoi(l)
			lines = append(lines, n)
		}
		sleeps[tid] = append(sleeps[tid], sleepSpan{t0, t1, lines})
	}
	checked, wrong, shapes := 0, 0, map[string]bool{}
	for _, o := range seen {
		for _, sl := range sleeps[o.tid] {
			if sl.t0 > o.from || o.to > sl.t1 {
				continue
			}
			checked++
			shapes[fmtInts(sl.lines)] = true
			if !slices.Equal(o.lines, sl.lines) {
				wrong++
				if wrong <= 5 {
					t.Errorf("thread %d at [%d, %d], inside its sleep [%d, %d]: sampled lines %v, caller_locations %v", o.tid, o.from, o.to, sl.t0, sl.t1, o.lines, sl.lines)
				}
			}
			break
		}
	}
	t.Logf("%d samples inside a logged sleep checked (%d stacks), %d wrong; %d threads' frames not read (not run since); %d failed samples; threads logged: %d",
		checked, len(shapes), wrong, skips, fails, len(sleeps))
	if checked < 300 || len(shapes) < 6 {
		t.Fatalf("only %d samples inside a logged sleep, of %d stacks: too few to tell", checked, len(shapes))
	}
	if skips == 0 {
		t.Fatal("no thread was skipped as not run since its last read: the test did not exercise the kept frames")
	}
}

func fmtInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
