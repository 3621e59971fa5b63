package agent

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// deepScript runs 4 threads 50 frames deep; with ARGV[0] "spin" they
// spin, else they sleep.
const deepScript = `
def deep(n, &blk); n > 0 ? deep(n - 1, &blk) : blk.call; end
def spin; x = 0; loop { x += 1 }; end
def nap; loop { sleep 0.01 }; end
work = ARGV[0] == "spin" ? method(:spin) : method(:nap)
3.times { |i| Thread.new { deep(47) { work.call } }.name = "t#{i}" }
$stdout.puts "ready"
$stdout.flush
deep(47) { work.call }
`

// BenchmarkAgentTick measures the agent's clock at 200 Hz over 10
// processes of 4 threads x 50 frames (Debian's Ruby), per process-tick:
// the reads, the walk and the profiles' bookkeeping, and the wake-up
// shared by the 10 (scripts/bench-agent.sh measures the whole agent, with
// discovery and pushes). -benchtime Nx runs N seconds. "sleep" targets hold
// their stacks still; "spin" ones run (on a machine with fewer cores
// than targets, mostly waiting for one).
func BenchmarkAgentTick(b *testing.B) {
	testutil.NeedRoot(b)
	rb := testutil.SystemRuby(b)
	dir := b.TempDir()
	script := filepath.Join(dir, "deep.rb")
	if err := os.WriteFile(script, []byte(deepScript), 0o644); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"sleep", "spin"} {
		b.Run(mode, func(b *testing.B) {
			a, err := New(Config{URL: "http://127.0.0.1:1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			defer a.up.Close(context.Background())
			c := newClock(a)
			const n = 10
			for i := 0; i < n; i++ {
				p := rb.StartCmd(b, rb.Command(script, mode))
				rp, err := ruby.Open(context.Background(), ruby.Spec{Pid: p.Pid, Wait: 10 * time.Second, Options: ruby.Options{Runtimes: a.runtimes}})
				if err != nil {
					b.Fatal(err)
				}
				ps, err := procfs.ReadStat(p.Pid)
				if err != nil {
					b.Fatal(err)
				}
				// The identity tells the clock the process is still the
				// one it opened when a read fails.
				c.targets = append(c.targets, &proc{pid: p.Pid, ident: ps.Identity(), src: sampler.NewRubySource(rp, sampler.RubyOptions{}),
					service: "bench", labels: map[string]string{"pid": "1"}})
			}
			defer c.finish()
			// As Run drives it: Mode cpu (context-switch records), at
			// 200 Hz for b.N seconds.
			c.Sample(context.Background()) // first reads fill the caches
			b.ResetTimer()
			st, err := sampler.Run(context.Background(), c, sampler.Config{Rate: 200, Mode: stack.ModeCPU,
				Duration: time.Duration(b.N) * time.Second}, nil)
			if err != nil {
				b.Fatal(err)
			}
			if got := len(c.targets); got != n {
				b.Fatalf("%d of the %d targets were dropped", n-got, n)
			}
			pt := float64(a.stats.targetTicks.Load() - n)
			b.ReportMetric(float64(st.CPU.Nanoseconds())/pt, "cpu-ns/process-tick")
			b.ReportMetric(float64(a.stats.tickNanos.Load())/pt, "ns/process-tick")
			b.ReportMetric(100*float64(st.CPU)/float64(st.End.Sub(st.Start)), "%cpu")
			b.ReportMetric(float64(a.stats.samples.Load())/pt, "samples/process-tick")
			skips := uint64(0)
			for _, t := range c.targets {
				skips += t.src.Process().StillSkips()
			}
			// Threads whose frames were not read: not run since.
			b.ReportMetric(float64(skips)/pt, "unread-threads/process-tick")
		})
	}
}

// BenchmarkAgentOpen measures opening a Ruby process (Debian's) whose
// build another process already resolved: what discovery pays for each
// new process (a Puma worker, a cron job).
func BenchmarkAgentOpen(b *testing.B) {
	testutil.NeedRoot(b)
	rb := testutil.SystemRuby(b)
	dir := b.TempDir()
	script := filepath.Join(dir, "deep.rb")
	if err := os.WriteFile(script, []byte(deepScript), 0o644); err != nil {
		b.Fatal(err)
	}
	p := rb.StartCmd(b, rb.Command(script, "sleep"))
	rt := ruby.NewRuntimes()
	for i := 0; i <= b.N; i++ {
		if i == 1 {
			b.ResetTimer()
		}
		rp, err := ruby.Open(context.Background(), ruby.Spec{Pid: p.Pid, Once: true, Options: ruby.Options{Runtimes: rt}})
		if err != nil {
			b.Fatal(err)
		}
		rp.Target().Close()
	}
}
