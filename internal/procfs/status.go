package procfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
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

// ReadTaskNSpid returns the NSpid field of /proc/PID/task/TID/status: the
// thread's id in each PID namespace from the reader's down to the
// thread's own (one entry when they are the same namespace; nil on a
// kernel without the field, before 4.1).
func ReadTaskNSpid(pid, tid int) ([]int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return nil, fmt.Errorf("read status of thread %d of process %d: %w", tid, pid, err)
	}
	return ParseNSpid(b)
}

// ParseNSpid returns the ids of the NSpid line of a status file (nil when
// it has none).
func ParseNSpid(b []byte) ([]int, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "NSpid:")
		if !ok {
			continue
		}
		var ids []int
		for _, f := range strings.Fields(v) {
			id, err := strconv.Atoi(f)
			if err != nil || id <= 0 {
				return nil, fmt.Errorf("parse status: NSpid %q", strings.TrimSpace(v))
			}
			ids = append(ids, id)
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("parse status: empty NSpid")
		}
		return ids, nil
	}
	return nil, sc.Err()
}

// NamespaceTIDs maps the ids process pid's threads have in the process's
// own PID namespace (what the process, and the thread ids kept in its
// memory, know them by) to their ids in the reader's (what /proc/PID/task
// lists). It is nil when the process is in the reader's PID namespace:
// the ids are the same. A thread that exits while it is read is left out.
func NamespaceTIDs(pid int) (map[int]int, error) {
	tids, err := Tasks(pid)
	if err != nil {
		return nil, err
	}
	var m map[int]int
	for _, tid := range tids {
		ns, err := ReadTaskNSpid(pid, tid)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
				continue
			}
			return nil, err
		}
		if len(ns) < 2 {
			continue
		}
		if m == nil {
			m = make(map[int]int, len(tids))
		}
		m[ns[len(ns)-1]] = tid
	}
	return m, nil
}
