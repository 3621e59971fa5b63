package sampler

import (
	"context"
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
