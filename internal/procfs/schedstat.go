package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Schedstat is a thread's /proc/PID/task/TID/schedstat: the scheduler's
// account of its time.
type Schedstat struct {
	RunNs      uint64 // time on a CPU
	WaitNs     uint64 // time runnable, waiting in a run queue for a CPU
	Timeslices uint64 // times it was given a CPU
}

// ReadTaskSchedstat reads /proc/PID/task/TID/schedstat.
func ReadTaskSchedstat(pid, tid int) (Schedstat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/schedstat")
	if err != nil {
		return Schedstat{}, fmt.Errorf("read schedstat: %w", err)
	}
	return ParseSchedstat(b)
}

// ParseSchedstat parses a schedstat file: three numbers on one line.
func ParseSchedstat(b []byte) (Schedstat, error) {
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return Schedstat{}, fmt.Errorf("parse schedstat: %d fields in %q, want 3", len(f), b)
	}
	var v [3]uint64
	for i := range f {
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return Schedstat{}, fmt.Errorf("parse schedstat: field %d: %w", i+1, err)
		}
		v[i] = n
	}
	return Schedstat{RunNs: v[0], WaitNs: v[1], Timeslices: v[2]}, nil
}
