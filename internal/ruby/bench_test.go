package ruby

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// BenchmarkSnapshotLive50 is the cost of one full snapshot of a live
// process whose worker thread has a 50-frame stack (plus the main thread),
// with warm caches, and the process_vm_readv calls it makes.
func BenchmarkSnapshotLive50(b *testing.B) {
	p, tg := openScenario(b, "bench")
	ths, err := p.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	frames := 0
	for _, th := range ths {
		frames += len(th.Frames)
	}
	rc := tg.(target.ReadCounter)
	before := rc.ReadCalls()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := p.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rc.ReadCalls()-before)/float64(b.N), "readv/op")
	b.ReportMetric(float64(frames), "frames")
}

// BenchmarkSnapshotCore is one snapshot of the shared Ruby 3.1.0 dump.
func BenchmarkSnapshotCore(b *testing.B) {
	tg, err := target.OpenCore(core31(b), target.CoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer tg.Close()
	p, err := Open(context.Background(), Spec{Target: tg, Consistency: Stopped})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := p.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshotLiveCold opens the process and takes one snapshot with
// empty caches (what `rbscope snapshot` pays).
func BenchmarkSnapshotLiveCold(b *testing.B) {
	proc := testutil.StartRuby(b, "stacks.rb", "bench")
	tg, err := target.OpenLive(proc.Pid)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running, Options: Options{NoDWARF: true}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadBaseline64 is one 64-byte process_vm_readv of the same kind
// of target: the unit the snapshot benchmarks are compared with.
func BenchmarkReadBaseline64(b *testing.B) {
	proc := testutil.StartRuby(b, "stacks.rb", "bench")
	tg, err := target.OpenLive(proc.Pid)
	if err != nil {
		b.Fatal(err)
	}
	maps, err := tg.Mappings()
	if err != nil || len(maps) == 0 {
		b.Fatal(err)
	}
	buf := make([]byte, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := tg.ReadAt(buf, maps[0].Start); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshotAfterGC is the cost of a snapshot taken just after a
// GC, when every name cached by address must be checked again (a process
// that allocates runs a GC every few milliseconds): a thread with 50
// frames of 50 methods, and one that collects garbage all the time. Each
// timed snapshot waits (untimed) for the GC count to move.
func BenchmarkSnapshotAfterGC(b *testing.B) {
	p, tg := openScenario(b, "benchgc")
	if _, err := p.Snapshot(); err != nil {
		b.Fatal(err)
	}
	if p.gcCountAddr == 0 {
		b.Fatal("the GC count was not found: every snapshot is an epoch of its own")
	}
	rc := tg.(target.ReadCounter)
	reads, iovecs := uint64(0), uint64(0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := p.waitForGC(10 * time.Second); err != nil {
			b.Fatal(err)
		}
		before, iovBefore := rc.ReadCalls(), rc.ReadIovecs()
		b.StartTimer()
		ths, err := p.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		reads += rc.ReadCalls() - before
		iovecs += rc.ReadIovecs() - iovBefore
		frames := 0
		for _, th := range ths {
			frames += len(th.Frames)
		}
		if frames < 50 {
			b.Fatalf("%d frames", frames)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(reads)/float64(b.N), "readv/op")
	b.ReportMetric(float64(iovecs)/float64(b.N), "iovecs/op")
}

// openScenario starts stacks.rb's scenario and opens it live.
func openScenario(b *testing.B, scenario string) (*Process, target.Target) {
	proc := testutil.StartRuby(b, "stacks.rb", scenario)
	tg, err := target.OpenLive(proc.Pid)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tg.Close() })
	p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running})
	if err != nil {
		b.Fatal(err)
	}
	return p, tg
}

// waitForGC waits until the target's GC count differs from the one of the
// last snapshot (a GC ran since), polling every 100 µs.
func (p *Process) waitForGC(timeout time.Duration) error {
	last := p.epoch
	deadline := time.Now().Add(timeout)
	for {
		n, err := p.r.u64(p.gcCountAddr)
		if err != nil {
			return fmt.Errorf("read the GC count: %w", err)
		}
		if n+1 != last {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no GC in %v", timeout)
		}
		time.Sleep(100 * time.Microsecond)
	}
}
