package sampler

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/rtprio"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
	"golang.org/x/sys/unix"
)

// TestRealtime: with Config.Realtime every tick runs at real-time
// priority, and afterwards every thread of this process has its policy
// back.
func TestRealtime(t *testing.T) {
	testutil.NeedRoot(t)
	if err := rtprio.Check(); err != nil {
		testutil.Missing(t, "%v", err)
	}
	before := map[int]int{}
	tids, err := procfs.Tasks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, tid := range tids {
		if pol, err := rtprio.Policy(tid); err == nil {
			before[tid] = pol
		}
	}
	ticks, fifo := 0, 0
	_, err = Run(context.Background(), SourceFunc(func(context.Context) ([]stack.Sample, error) {
		ticks++
		if pol, err := rtprio.Policy(0); err == nil && pol == unix.SCHED_FIFO {
			fifo++
		}
		return nil, nil
	}), Config{Rate: 200, Duration: 300 * time.Millisecond, Realtime: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ticks < 20 || fifo != ticks {
		t.Errorf("%d of %d ticks ran at real-time priority", fifo, ticks)
	}
	after, err := procfs.Tasks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, tid := range after {
		pol, err := rtprio.Policy(tid)
		if err != nil {
			continue
		}
		want, ok := before[tid]
		if !ok {
			want = unix.SCHED_NORMAL
		}
		if pol != want {
			t.Errorf("thread %d: policy %d after sampling, want %d", tid, pol, want)
		}
	}
}

// TestRealtimeClock: with Config.RealtimeClock every tick runs on one
// thread at real-time priority while every other thread of this process
// stays ordinary (a goroutine started meanwhile, and the threads it may
// start, included), and afterwards that thread has its policy back.
func TestRealtimeClock(t *testing.T) {
	testutil.NeedRoot(t)
	if err := rtprio.Check(); err != nil {
		testutil.Missing(t, "%v", err)
	}
	// Work on other goroutines while sampling, so that the runtime has
	// threads to start and run them on.
	stop := make(chan struct{})
	defer close(stop)
	for i := 0; i < 4; i++ {
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
					time.Sleep(50 * time.Microsecond)
				}
			}
		}()
	}
	ticks, fifo := 0, 0
	clockTIDs := map[int]bool{}
	var others []string
	_, err := Run(context.Background(), SourceFunc(func(context.Context) ([]stack.Sample, error) {
		ticks++
		me := unix.Gettid()
		clockTIDs[me] = true
		if pol, err := rtprio.Policy(0); err == nil && pol == unix.SCHED_FIFO {
			fifo++
		}
		if ticks%10 == 0 {
			tids, _ := procfs.Tasks(os.Getpid())
			for _, tid := range tids {
				if pol, err := rtprio.Policy(tid); err == nil && tid != me && pol != unix.SCHED_NORMAL {
					others = append(others, fmt.Sprintf("thread %d policy %d", tid, pol))
				}
			}
		}
		return nil, nil
	}), Config{Rate: 200, Duration: 300 * time.Millisecond, RealtimeClock: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ticks < 20 || fifo != ticks || len(clockTIDs) != 1 {
		t.Errorf("%d of %d ticks ran at real-time priority, on %d threads (want all, on one)", fifo, ticks, len(clockTIDs))
	}
	if len(others) > 0 {
		t.Errorf("other threads raised while sampling: %v", others)
	}
	for tid := range clockTIDs {
		if pol, err := rtprio.Policy(tid); err == nil && pol != unix.SCHED_NORMAL {
			t.Errorf("the clock's thread %d: policy %d after sampling, want ordinary", tid, pol)
		}
	}
}
