package procfs

import (
	"strconv"
	"strings"
)

// CgroupPath returns the cgroup of process pid as one string, for filters
// that match a pattern against it: on cgroup v2 the unified hierarchy's
// path ("/system.slice/puma.service"); on v1 or hybrid hosts every
// hierarchy's line joined by newlines ("12:pids:/docker/abc...\n..."), so
// that a pattern can match any.
func CgroupPath(pid int) (string, error) {
	cs, err := ReadCgroups(pid)
	if err != nil {
		return "", err
	}
	return cs.String(), nil
}

// String is CgroupPath's form of the cgroups.
func (cs Cgroups) String() string {
	if p, ok := cs.Unified(); ok && len(cs) == 1 {
		return p
	}
	lines := make([]string, len(cs))
	for i, c := range cs {
		lines[i] = strconv.Itoa(c.Hierarchy) + ":" + c.Controllers + ":" + c.Path
	}
	return strings.Join(lines, "\n")
}
