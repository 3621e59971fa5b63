package procfs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Status holds the fields of /proc/PID/status (or of one thread's,
// /proc/PID/task/TID/status) that rbscope uses.
type Status struct {
	State     byte   // 'R', 'S', 'T' (stopped), 't' (tracing stop), ...
	TracerPid int    // the process tracing it (ptrace), 0 for none
	Seccomp   int    // 0 none, 1 strict, 2 filter
	CapEff    uint64 // effective capabilities
	// UID is the real user id (the first of the Uid line); -1 when the
	// file has no Uid line.
	UID int
}

// ReadStatus reads /proc/PID/status.
func ReadStatus(pid int) (Status, error) {
	return readStatusFile("/proc/" + strconv.Itoa(pid) + "/status")
}

// ReadTaskStatus reads /proc/PID/task/TID/status.
func ReadTaskStatus(pid, tid int) (Status, error) {
	return readStatusFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/status")
}

func readStatusFile(path string) (Status, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Status{}, fmt.Errorf("read status: %w", err)
	}
	return ParseStatus(b)
}

// ParseStatus parses the contents of a status file. Fields it does not
// find stay zero.
func ParseStatus(b []byte) (Status, error) {
	st := Status{UID: -1}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		var err error
		switch k {
		case "State":
			if v == "" {
				return st, fmt.Errorf("parse status: empty State")
			}
			st.State = v[0]
		case "TracerPid":
			st.TracerPid, err = strconv.Atoi(v)
		case "Seccomp":
			st.Seccomp, err = strconv.Atoi(v)
		case "Uid":
			if f := strings.Fields(v); len(f) > 0 {
				st.UID, err = strconv.Atoi(f[0])
			}
		case "CapEff":
			st.CapEff, err = strconv.ParseUint(v, 16, 64)
		}
		if err != nil {
			return st, fmt.Errorf("parse status: %s: %w", k, err)
		}
	}
	return st, sc.Err()
}

// Tasks lists the thread ids of process pid.
func Tasks(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return nil, fmt.Errorf("list threads of process %d: %w", pid, err)
	}
	out := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	return out, nil
}
