package procfs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Stat holds the fields of /proc/PID/stat that rbscope uses.
type Stat struct {
	Pid        int
	Comm       string
	State      byte // 'R' running, 'S' sleeping, 'T' stopped, 't' traced, 'Z' zombie, ...
	PPid       int
	Flags      uint64 // the kernel's PF_* flags
	UTime      uint64 // clock ticks
	STime      uint64 // clock ticks
	StartTime  uint64 // clock ticks after boot
	StartCode  uint64
	StartStack uint64
}

// pfKthread is the kernel's PF_KTHREAD flag (include/linux/sched.h).
const pfKthread = 0x00200000

// KernelThread reports whether the process is a kernel thread: it has no
// user memory, so no Ruby.
func (s Stat) KernelThread() bool { return s.Flags&pfKthread != 0 }

// Gone reports whether the process has exited (a zombie or dead).
func (s Stat) Gone() bool { return s.State == 'Z' || s.State == 'X' }

// Identity tells a process image apart from a later one with the same pid:
// the start time changes when the pid is reused, the code and stack
// addresses change on exec (with address-space randomization).
type Identity struct {
	StartTime, StartCode, StartStack uint64
}

// Identity returns the process image's identity.
func (s Stat) Identity() Identity {
	return Identity{StartTime: s.StartTime, StartCode: s.StartCode, StartStack: s.StartStack}
}

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, fmt.Errorf("read stat of process %d: %w", pid, err)
	}
	return ParseStat(b)
}

// StatFile is a process's (or thread's) stat file kept open and re-read
// with pread: procfs regenerates the contents at each read from offset 0,
// with no path walk per read (opening the file costs several times
// reading it), and the open file stays bound to the task it was opened
// for: a later task given the same id reads as an error.
type StatFile struct {
	path string
	fd   int
}

// OpenStat opens /proc/PID/stat for repeated reads.
func OpenStat(pid int) (*StatFile, error) {
	return openStatFile("/proc/" + strconv.Itoa(pid) + "/stat")
}

// OpenTaskStat opens /proc/PID/task/TID/stat, thread tid's, for repeated
// reads.
func OpenTaskStat(pid, tid int) (*StatFile, error) {
	return openStatFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/stat")
}

func openStatFile(path string) (*StatFile, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return &StatFile{path: path, fd: fd}, nil
}

// ReadRaw reads the file anew into buf (as much as fits), returning the
// bytes read. The
// read is a raw system call (see target.vmReadv for why a short call is
// not announced to the scheduler); a task that exited reads ESRCH.
func (s *StatFile) ReadRaw(buf []byte) (int, error) {
	if len(buf) == 0 {
		return 0, fmt.Errorf("read %s: no buffer", s.path)
	}
	n, _, errno := unix.RawSyscall6(unix.SYS_PREAD64, uintptr(s.fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
	if errno != 0 {
		return 0, fmt.Errorf("read %s: %w", s.path, errno)
	}
	return int(n), nil
}

// Read reads and parses the file anew.
func (s *StatFile) Read() (Stat, error) {
	var buf [1024]byte
	n, err := s.ReadRaw(buf[:])
	if err != nil {
		return Stat{}, err
	}
	if n == len(buf) {
		return Stat{}, fmt.Errorf("read %s: longer than %d bytes", s.path, len(buf))
	}
	return ParseStat(buf[:n])
}

// State reads the task's state letter anew (see StateLetter), using buf;
// 0 when it cannot be read.
func (s *StatFile) State(buf []byte) byte {
	n, err := s.ReadRaw(buf)
	if err != nil || n == 0 {
		return 0
	}
	return StateLetter(buf[:n])
}

// Close closes the file.
func (s *StatFile) Close() error { return unix.Close(s.fd) }

// ParseStat parses the contents of a /proc/PID/stat file.
func ParseStat(b []byte) (Stat, error) {
	s := string(b)
	open := strings.IndexByte(s, '(')
	closing := strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return Stat{}, errors.New("parse stat: no command name")
	}
	var st Stat
	pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
	if err != nil {
		return Stat{}, fmt.Errorf("parse stat: pid: %w", err)
	}
	st.Pid = pid
	st.Comm = s[open+1 : closing]
	// Fields after the command name, numbered from 3 (state) as in proc(5).
	fields := strings.Fields(s[closing+1:])
	if len(fields) < 26 {
		return Stat{}, fmt.Errorf("parse stat: %d fields after the command name, want 26+", len(fields))
	}
	if len(fields[0]) != 1 {
		return Stat{}, fmt.Errorf("parse stat: bad state %q", fields[0])
	}
	st.State = fields[0][0]
	ppid, err := strconv.Atoi(fields[4-3])
	if err != nil {
		return Stat{}, fmt.Errorf("parse stat: ppid: %w", err)
	}
	st.PPid = ppid
	for _, f := range []struct {
		n   int
		dst *uint64
	}{{9, &st.Flags}, {14, &st.UTime}, {15, &st.STime}, {22, &st.StartTime}, {26, &st.StartCode}, {28, &st.StartStack}} {
		v, err := strconv.ParseUint(fields[f.n-3], 10, 64)
		if err != nil {
			return Stat{}, fmt.Errorf("parse stat: field %d: %w", f.n, err)
		}
		*f.dst = v
	}
	return st, nil
}

// StateLetter returns the state field of a stat line without parsing the
// rest: the first character after the last ')' and a space; 0 when the
// line is cut short. It does not allocate (for per-sample use).
func StateLetter(b []byte) byte {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' {
			if i+2 < len(b) {
				return b[i+2]
			}
			return 0
		}
	}
	return 0
}

// TaskState returns the kernel state letter of thread tid of pid from
// /proc/PID/task/TID/stat ('R' running, 'S' sleeping, ...), 0 if unknown.
func TaskState(pid, tid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/stat")
	if err != nil {
		return 0
	}
	return StateLetter(b)
}
