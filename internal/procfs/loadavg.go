package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// LoadAvg is /proc/loadavg's first field: the number of tasks running or
// waiting for a CPU (and in uninterruptible sleep), averaged over the last
// minute.
func LoadAvg() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, fmt.Errorf("read load average: %w", err)
	}
	return ParseLoadAvg(b)
}

// ParseLoadAvg parses /proc/loadavg's content (its first field).
func ParseLoadAvg(b []byte) (float64, error) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("parse /proc/loadavg: empty")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc/loadavg %q: %w", f[0], err)
	}
	return v, nil
}
