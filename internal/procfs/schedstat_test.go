package procfs

import (
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestTaskSchedstatRunTime: a thread's time on a CPU by schedstat is its
// CPU clock (CLOCK_THREAD_CPUTIME_ID), read around a busy loop.
func TestTaskSchedstatRunTime(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pid, tid := os.Getpid(), unix.Gettid()
	cpu := func() uint64 {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
			t.Fatal(err)
		}
		return uint64(ts.Nano())
	}
	s0, err := ReadTaskSchedstat(pid, tid)
	if err != nil {
		t.Fatal(err)
	}
	c0 := cpu()
	for start := time.Now(); time.Since(start) < 200*time.Millisecond; {
	}
	c1 := cpu()
	s1, err := ReadTaskSchedstat(pid, tid)
	if err != nil {
		t.Fatal(err)
	}
	run, clock := s1.RunNs-s0.RunNs, c1-c0
	// The reads sit outside the clock's: schedstat's delta may exceed
	// it by the two file reads, never fall short.
	if run < clock || run > clock+5_000_000 {
		t.Errorf("schedstat run time %d ns over the loop, the thread's CPU clock %d ns", run, clock)
	}
	if s1.Timeslices < s0.Timeslices {
		t.Errorf("timeslices went back: %d -> %d", s0.Timeslices, s1.Timeslices)
	}
}

func TestParseSchedstat(t *testing.T) {
	st, err := ParseSchedstat([]byte("123 456 7\n"))
	if err != nil || st != (Schedstat{RunNs: 123, WaitNs: 456, Timeslices: 7}) {
		t.Errorf("got %+v, %v", st, err)
	}
	for _, bad := range []string{"", "1 2", "1 2 3 4", "1 x 3", "-1 2 3"} {
		if _, err := ParseSchedstat([]byte(bad)); err == nil {
			t.Errorf("ParseSchedstat(%q) gave no error", bad)
		}
	}
}
