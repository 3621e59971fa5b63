package procfs

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// maxCgroupFile bounds how much of /proc/PID/cgroup is read: a line per
// hierarchy, each a path of at most a few hundred bytes.
const maxCgroupFile = 64 << 10

// Cgroup is one line of /proc/PID/cgroup: the process's cgroup in one
// hierarchy.
type Cgroup struct {
	// Hierarchy is the hierarchy's id: 0 for cgroup v2's unified
	// hierarchy.
	Hierarchy int
	// Controllers are cgroup v1's controllers of the hierarchy, comma
	// separated ("cpu,cpuacct", "name=systemd"); "" for cgroup v2.
	Controllers string
	// Path is the cgroup's path from the hierarchy's root (as the
	// reader's cgroup namespace shows it).
	Path string
}

// Cgroups are the cgroups of one process, in the order of its
// /proc/PID/cgroup.
type Cgroups []Cgroup

// ReadCgroups reads /proc/PID/cgroup.
func ReadCgroups(pid int) (Cgroups, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read cgroups of process %d: %w", pid, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCgroupFile))
	if err != nil {
		return nil, fmt.Errorf("read cgroups of process %d: %w", pid, err)
	}
	cs, err := ParseCgroups(b)
	if err != nil {
		return nil, fmt.Errorf("read cgroups of process %d: %w", pid, err)
	}
	return cs, nil
}

// ParseCgroups parses the contents of a /proc/PID/cgroup file
// ("ID:CONTROLLERS:PATH" lines). A malformed line is an error.
func ParseCgroups(b []byte) (Cgroups, error) {
	var out Cgroups
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), maxCgroupFile)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		id, rest, ok1 := strings.Cut(line, ":")
		ctl, path, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("parse cgroup line %q: want ID:CONTROLLERS:PATH", line)
		}
		h, err := strconv.Atoi(id)
		if err != nil || h < 0 {
			return nil, fmt.Errorf("parse cgroup line %q: bad hierarchy id", line)
		}
		out = append(out, Cgroup{Hierarchy: h, Controllers: ctl, Path: path})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse cgroups: %w", err)
	}
	return out, nil
}

// Unified returns the path in cgroup v2's unified hierarchy (the "0::"
// line), and whether the process has one.
func (cs Cgroups) Unified() (string, bool) {
	for _, c := range cs {
		if c.Hierarchy == 0 && c.Controllers == "" {
			return c.Path, true
		}
	}
	return "", false
}

// ordered returns the paths to look in: the unified hierarchy's first,
// then the others in the file's order.
func (cs Cgroups) ordered() []string {
	out := make([]string, 0, len(cs))
	if p, ok := cs.Unified(); ok {
		out = append(out, p)
	}
	for _, c := range cs {
		if !(c.Hierarchy == 0 && c.Controllers == "") {
			out = append(out, c.Path)
		}
	}
	return out
}

// containerPrefixes are the prefixes container runtimes give a
// container's cgroup under systemd (docker-ID.scope, crio-ID.scope,
// cri-containerd-ID.scope, libpod-ID.scope).
var containerPrefixes = []string{"docker-", "cri-containerd-", "crio-", "libpod-", "containerd-"}

// ContainerID returns the id of the container the process runs in, as
// its cgroup path names it (the 64 hex digits docker, containerd, CRI-O
// and podman use), "" when the path names none. The innermost container
// wins (a container in a container); the unified hierarchy is looked at
// first. Shapes:
//
//	0::/system.slice/docker-ID.scope                          docker, systemd driver
//	12:pids:/docker/ID                                        docker, cgroupfs driver (v1)
//	0::/kubepods.slice/.../cri-containerd-ID.scope            containerd (crio-ID.scope: CRI-O)
//	0::/kubepods/besteffort/podUID/ID                         Kubernetes, cgroupfs driver
//	0::/machine.slice/libpod-ID.scope/container               podman
//
// A runtime's monitor (crio-conmon-ID.scope, libpod-conmon-ID.scope) is not
// in the container: its process has no container id.
func (cs Cgroups) ContainerID() string {
	for _, p := range cs.ordered() {
		if id := containerIDOf(p); id != "" {
			return id
		}
	}
	return ""
}

func containerIDOf(path string) string {
	segs := strings.Split(path, "/")
	for i := len(segs) - 1; i >= 0; i-- {
		seg := strings.TrimSuffix(segs[i], ".scope")
		if strings.Contains(seg, "-conmon-") {
			return ""
		}
		if isHexID(seg) {
			return seg
		}
		for _, pre := range containerPrefixes {
			if id, ok := strings.CutPrefix(seg, pre); ok && isHexID(id) {
				return id
			}
		}
	}
	return ""
}

// isHexID reports whether s is a container id: 64 lower-case hex digits.
func isHexID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// PodUID returns the UID of the Kubernetes pod the process runs in, as
// its cgroup path names it, "" when it names none. Under the systemd
// driver the UID's dashes are underscores in the path; the UID returned
// has dashes, as the Kubernetes API gives it:
//
//	/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b..._....slice/...
//	/kubepods.slice/kubepods-pod1a2b..._....slice/...            (Guaranteed QoS)
//	/kubepods/besteffort/pod1a2b...-.../ID                       (cgroupfs driver)
func (cs Cgroups) PodUID() string {
	for _, p := range cs.ordered() {
		if uid := podUIDOf(p); uid != "" {
			return uid
		}
	}
	return ""
}

func podUIDOf(path string) string {
	kube := false
	for _, seg := range strings.Split(path, "/") {
		seg = strings.TrimSuffix(seg, ".slice")
		var cand string
		switch {
		case kube && strings.HasPrefix(seg, "pod"):
			cand = seg[len("pod"):]
		case strings.Contains(seg, "kubepods"):
			kube = true
			if i := strings.LastIndex(seg, "-pod"); i >= 0 {
				cand = seg[i+len("-pod"):]
			}
		}
		if cand == "" {
			continue
		}
		if uid := strings.ReplaceAll(cand, "_", "-"); isUID(uid) {
			return uid
		}
	}
	return ""
}

// isUID reports whether s is a lower-case UUID (8-4-4-4-12 hex digits).
func isUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// ContainerID returns the container id of process pid from its cgroups
// (see Cgroups.ContainerID), "" when it runs in none.
func ContainerID(pid int) (string, error) {
	cs, err := ReadCgroups(pid)
	if err != nil {
		return "", err
	}
	return cs.ContainerID(), nil
}

// PodUID returns the Kubernetes pod UID of process pid from its cgroups
// (see Cgroups.PodUID), "" when it runs in none.
func PodUID(pid int) (string, error) {
	cs, err := ReadCgroups(pid)
	if err != nil {
		return "", err
	}
	return cs.PodUID(), nil
}
