package procfs

import (
	"fmt"
	"os"
	"strconv"
)

// Pids lists the process ids in /proc (threads excluded), in the order
// the directory lists them.
func Pids() ([]int, error) {
	f, err := os.Open("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	out := make([]int, 0, len(names))
	for _, n := range names {
		if n == "" || n[0] < '0' || n[0] > '9' {
			continue
		}
		if pid, err := strconv.Atoi(n); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Exe is the path /proc/PID/exe points at, as the process sees it (in
// its mount namespace), with the kernel's " (deleted)" suffix kept.
func Exe(pid int) (string, error) {
	s, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return "", fmt.Errorf("read the executable of process %d: %w", pid, err)
	}
	return s, nil
}
