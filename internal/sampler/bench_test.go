package sampler

import (
	"context"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// deepThreads is the benchmark target: four threads (the main one and
// three more), each 50 Ruby frames deep, spinning.
const deepThreads = `
def deep(n, &blk); n > 0 ? deep(n - 1, &blk) : blk.call; end
def spin; x = 0; loop { x += 1 }; end
3.times { |i| Thread.new { deep(47) { spin } }.name = "t#{i}" }
sleep 0.2
puts "ready"; $stdout.flush
deep(47) { spin }
`

// BenchmarkSample measures one sample of every thread of a 4-thread,
// 50-frame Ruby process with the real walker; the CPU variants take
// on-CPU states as Mode cpu does (context-switch records at the tick's
// deadline). Compare the sub-benchmarks with ReadBaseline (one 8-byte
// process_vm_readv) in the same run:
//
//	go test -run XXX -bench . ./internal/sampler/
func BenchmarkSample(b *testing.B) {
	cmd := startRuby(b, testutil.SystemRuby(b), deepThreads)
	benchSample(b, cmd.Process.Pid)
}

// BenchmarkSamplePumaShaped is BenchmarkSample on a target shaped like
// puma serving Rails (testdata/ruby/pumashape.rb): 12 threads, 5 busy in
// 150-frame stacks sharing the GVL, 7 idle in sleep, IO.select,
// Queue#pop and Thread#join.
func BenchmarkSamplePumaShaped(b *testing.B) {
	proc := testutil.SystemRuby(b).Start(b, "pumashape.rb")
	benchSample(b, proc.Pid)
}

// benchSample runs the sampling sub-benchmarks on the Ruby process pid.
func benchSample(b *testing.B, pid int) {
	p := openRuby(b, pid)
	ctx := context.Background()

	b.Run("ReadBaseline", func(b *testing.B) {
		buf := make([]byte, 8)
		maps, err := p.Target().Mappings()
		if err != nil {
			b.Fatal(err)
		}
		addr := maps[0].Start
		for i := 0; i < b.N; i++ {
			if err := p.Target().ReadAt(buf, addr); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, mode := range []string{"Nonblocking", "Blocking", "BlockingHandoff", "NonblockingCPU", "BlockingCPU"} {
		b.Run(mode, func(b *testing.B) {
			var opts RubyOptions
			tk := &tick{Context: ctx, cpu: strings.HasSuffix(mode, "CPU")}
			switch mode {
			case "Blocking", "BlockingCPU":
				pz := target.NewThreadPauser() // this goroutine's thread
				defer pz.Close()
				opts.Pauser = pz
			case "BlockingHandoff":
				pz := target.NewPauser() // its own thread
				defer pz.Close()
				opts.Pauser = pz
			}
			src := NewRubySource(p, opts)
			defer src.Close()
			frames, fails := 0, 0
			rc, _ := p.Target().(target.ReadCounter)
			var reads0, iov0 uint64
			if rc != nil {
				reads0, iov0 = rc.ReadCalls(), rc.ReadIovecs()
			}
			cpu0 := cpuTime(b)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tk.deadline = time.Now()
				s, err := src.Sample(tk)
				if err != nil {
					fails++
					continue
				}
				for _, x := range s {
					frames += len(x.Frames)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/sample")
			if ok := b.N - fails; ok > 0 {
				b.ReportMetric(float64(frames)/float64(ok), "frames/sample")
			}
			b.ReportMetric(float64(fails)/float64(b.N), "errors/sample")
			if rc != nil {
				b.ReportMetric(float64(rc.ReadCalls()-reads0)/float64(b.N), "readv/sample")
				b.ReportMetric(float64(rc.ReadIovecs()-iov0)/float64(b.N), "iovecs/sample")
			}
			b.ReportMetric(float64(src.states.reads)/float64(b.N), "procreads/sample")
			if tk.cpuErr != nil {
				b.Fatalf("on-CPU states: %v", tk.cpuErr)
			}
		})
	}
	b.Run("Pause", func(b *testing.B) {
		pz := target.NewThreadPauser()
		defer pz.Close()
		for i := 0; i < b.N; i++ {
			resume, err := pz.Pause(pid)
			if err != nil {
				b.Fatal(err)
			}
			_ = resume()
		}
	})
}

// BenchmarkRunOverhead is the sampler's own cost per tick (scheduling,
// accounting, thread spans, the sink call) with a source that returns
// four ready samples, on the virtual clock: no sleeping.
func BenchmarkRunOverhead(b *testing.B) {
	batch := make([]stack.Sample, 4)
	for i := range batch {
		batch[i] = stack.Sample{Pid: 1, TID: i + 1, ThreadName: "t", OnCPU: true, Frames: make([]stack.Frame, 50)}
	}
	clk := newFakeClock()
	src := SourceFunc(func(ctx context.Context) ([]stack.Sample, error) { return batch, nil })
	n := 0
	b.ReportAllocs()
	b.ResetTimer()
	st, err := run(context.Background(), src, Config{Rate: 1000, Duration: time.Duration(b.N) * time.Millisecond}, func(s []stack.Sample) { n += len(s) }, clk, 0)
	if err != nil || st.Ticks != b.N {
		b.Fatalf("%v: %d ticks for %d", err, st.Ticks, b.N)
	}
}

// cpuTime is the CPU time this process has used: a sample's cost on a
// machine whose cores the spinning target keeps busy, where ns/op also
// counts the waits for a core.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(unix.TimevalToNsec(ru.Utime) + unix.TimevalToNsec(ru.Stime))
}
