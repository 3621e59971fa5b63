package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// CgroupPath returns the cgroup of process pid as one string: on cgroup
// v2 the unified hierarchy's path ("/system.slice/puma.service"); on v1
// or hybrid hosts every hierarchy's line joined by newlines
// ("12:pids:/docker/abc...\n..."), so that a pattern can match any.
func CgroupPath(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", fmt.Errorf("read cgroup of process %d: %w", pid, err)
	}
	return ParseCgroupPath(b), nil
}

// ParseCgroupPath is CgroupPath on the contents of a cgroup file.
func ParseCgroupPath(b []byte) string {
	lines := strings.Split(string(bytes.TrimSpace(b)), "\n")
	if len(lines) == 1 && strings.HasPrefix(lines[0], "0::") {
		return strings.TrimPrefix(lines[0], "0::")
	}
	return strings.Join(lines, "\n")
}
