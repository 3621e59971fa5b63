package target

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/procfs"
	"golang.org/x/sys/unix"
)

// maxIovecs is the kernel's limit on iovecs per process_vm_readv call.
const maxIovecs = 1024

type live struct {
	pid    int
	exe    string
	calls  atomic.Uint64
	iovecs atomic.Uint64
	ns     nsTIDs
}

// ReadCounter is implemented by targets that count the system calls their
// reads cost (live processes: process_vm_readv calls).
type ReadCounter interface {
	ReadCalls() uint64
	// ReadIovecs is the number of remote iovecs of those calls: the
	// kernel pins and looks up each on its own (~0.3 µs apiece here,
	// against ~1 µs a call and ~0.1 µs a KiB copied).
	ReadIovecs() uint64
}

// ReadCalls returns the number of process_vm_readv calls made so far.
func (l *live) ReadCalls() uint64 { return l.calls.Load() }

// ReadIovecs returns the number of remote iovecs read so far.
func (l *live) ReadIovecs() uint64 { return l.iovecs.Load() }

// OpenLive opens the running process pid for reading. It checks that the
// process exists and that its memory can be read.
func OpenLive(pid int) (Target, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("invalid pid %d", pid)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
		return nil, ExitedError{Pid: pid}
	}
	l := &live{pid: pid}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return nil, NewDeniedError(pid, "inspect", err)
		}
		if errors.Is(err, os.ErrNotExist) {
			return nil, notUserProcess(pid)
		}
		return nil, fmt.Errorf("read executable of process %d: %w", pid, err)
	}
	l.exe = strings.TrimSuffix(exe, " (deleted)")
	return l, nil
}

// notUserProcess explains why a process that exists has no executable:
// it is a kernel thread, it has exited (a zombie), or it has no memory map.
func notUserProcess(pid int) error {
	st, err := procfs.ReadStat(pid)
	switch {
	case err != nil || st.Gone():
		return ExitedError{Pid: pid}
	case st.KernelThread():
		return NotUserProcessError{Pid: pid, Why: fmt.Sprintf("(%s) is a kernel thread: it has no user memory", st.Comm)}
	}
	return NotUserProcessError{Pid: pid, Why: fmt.Sprintf("(%s) has no executable or memory map", st.Comm)}
}

func (l *live) Pid() int           { return l.pid }
func (l *live) Executable() string { return l.exe }
func (l *live) Close() error       { return nil }

func (l *live) ReadAt(p []byte, addr uint64) error {
	if len(p) == 0 {
		return nil
	}
	local := [1]unix.Iovec{{Base: &p[0]}}
	local[0].SetLen(len(p))
	remote := [1]unix.RemoteIovec{{Base: uintptr(addr), Len: len(p)}}
	l.calls.Add(1)
	l.iovecs.Add(1)
	n, err := vmReadv(l.pid, local[:], remote[:])
	if err != nil {
		return l.readErr(err, addr, len(p))
	}
	if n != len(p) {
		return UnmappedError{Addr: addr + uint64(n), Len: len(p) - n}
	}
	return nil
}

// smallBatch is the batch size whose iovecs live on the stack.
const smallBatch = 64

// vmReadv is process_vm_readv made as a raw system call: it does not tell
// the Go scheduler that the thread enters a system call. The call copies
// memory and returns within microseconds; announcing it would wake the
// runtime's monitor thread, which then polls every 20 µs for as long as
// the sample lasts (measured: more wake-ups than samples).
func vmReadv(pid int, local []unix.Iovec, remote []unix.RemoteIovec) (int, error) {
	if len(local) == 0 {
		return 0, nil
	}
	n, _, errno := unix.RawSyscall6(unix.SYS_PROCESS_VM_READV, uintptr(pid),
		uintptr(unsafe.Pointer(&local[0])), uintptr(len(local)),
		uintptr(unsafe.Pointer(&remote[0])), uintptr(len(remote)), 0)
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}

func (l *live) readErr(err error, addr uint64, n int) error {
	switch {
	case errors.Is(err, unix.ESRCH):
		return ExitedError{Pid: l.pid}
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return NewDeniedError(l.pid, "read memory of", err)
	case errors.Is(err, unix.EFAULT):
		if !l.alive() {
			return ExitedError{Pid: l.pid}
		}
		return UnmappedError{Addr: addr, Len: n}
	}
	return fmt.Errorf("read %d bytes at 0x%x of process %d: %w", n, addr, l.pid, err)
}

func (l *live) alive() bool {
	return unix.Kill(l.pid, 0) == nil || errors.Is(unix.Kill(l.pid, 0), unix.EPERM)
}

// ReadBatch reads all requests with as few process_vm_readv calls as
// possible. process_vm_readv stops at the first failing remote iovec, so
// on a partial result the remaining requests are retried one by one to
// name the failing address.
func (l *live) ReadBatch(reqs []Read) error {
	for len(reqs) > 0 {
		n := len(reqs)
		if n > maxIovecs {
			n = maxIovecs
		}
		chunk := reqs[:n]
		reqs = reqs[n:]
		// Small batches (every batch of a sample) use arrays on the stack.
		var localArr [smallBatch]unix.Iovec
		var remoteArr [smallBatch]unix.RemoteIovec
		local, remote := localArr[:0], remoteArr[:0]
		if n > smallBatch {
			local = make([]unix.Iovec, 0, n)
			remote = make([]unix.RemoteIovec, 0, n)
		}
		total := 0
		for i := range chunk {
			if len(chunk[i].Buf) == 0 {
				continue
			}
			iv := unix.Iovec{Base: &chunk[i].Buf[0]}
			iv.SetLen(len(chunk[i].Buf))
			local = append(local, iv)
			remote = append(remote, unix.RemoteIovec{Base: uintptr(chunk[i].Addr), Len: len(chunk[i].Buf)})
			total += len(chunk[i].Buf)
		}
		if len(local) == 0 {
			continue
		}
		l.calls.Add(1)
		l.iovecs.Add(uint64(len(remote)))
		got, err := vmReadv(l.pid, local, remote)
		if err == nil && got == total {
			continue
		}
		if err != nil && (errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EPERM)) {
			return l.readErr(err, chunk[0].Addr, len(chunk[0].Buf))
		}
		for i := range chunk {
			if err := l.ReadAt(chunk[i].Buf, chunk[i].Addr); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *live) Mappings() ([]Mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", l.pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ExitedError{Pid: l.pid}
		}
		return nil, fmt.Errorf("read mappings of process %d: %w", l.pid, err)
	}
	defer f.Close()
	maps, err := ParseMaps(bufio.NewScanner(f))
	if err != nil {
		return nil, fmt.Errorf("read mappings of process %d: %w", l.pid, err)
	}
	if len(maps) == 0 && !l.alive() {
		return nil, ExitedError{Pid: l.pid}
	}
	return maps, nil
}

// deletedSuffix is what the kernel appends to the path of a mapped file
// that was removed (or replaced) since.
const deletedSuffix = " (deleted)"

// ParseMaps parses the lines of a /proc/PID/maps file.
func ParseMaps(sc *bufio.Scanner) ([]Mapping, error) {
	var out []Mapping
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		rng := strings.SplitN(fields[0], "-", 2)
		if len(rng) != 2 {
			return nil, fmt.Errorf("bad maps line %q", line)
		}
		start, err1 := strconv.ParseUint(rng[0], 16, 64)
		end, err2 := strconv.ParseUint(rng[1], 16, 64)
		off, err3 := strconv.ParseUint(fields[2], 16, 64)
		inode, err4 := strconv.ParseUint(fields[4], 10, 64)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("bad maps line %q: %w", line, err)
		}
		m := Mapping{Start: start, End: end, Offset: off, Perms: fields[1], Inode: inode}
		if len(fields) >= 6 {
			// Paths may contain spaces: take everything after the inode column.
			idx := strings.Index(line, fields[5])
			m.Path = line[idx:]
			if inode != 0 && strings.HasSuffix(m.Path, deletedSuffix) {
				m.Path, m.Deleted = strings.TrimSuffix(m.Path, deletedSuffix), true
			}
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

func (l *live) Threads() ([]Thread, error) {
	dir := fmt.Sprintf("/proc/%d/task", l.pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ExitedError{Pid: l.pid}
		}
		return nil, fmt.Errorf("list threads of process %d: %w", l.pid, err)
	}
	var out []Thread
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		th := Thread{TID: tid}
		if b, err := os.ReadFile(filepath.Join(dir, e.Name(), "comm")); err == nil {
			th.Name = strings.TrimRight(string(b), "\n")
		}
		th.State = procfs.TaskState(l.pid, tid)
		out = append(out, th)
	}
	return out, nil
}

type osFile struct{ *os.File }

func (f osFile) Size() int64 {
	st, err := f.Stat()
	if err != nil {
		return 0
	}
	return st.Size()
}

// OpenFile opens the file the process mapped as path: the mapped object
// itself through /proc/PID/map_files when the kernel allows it (it needs
// CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), even when it was replaced or
// removed on disk since. Otherwise it opens path through /proc/PID/root
// (so that files in containers resolve; never the host's path instead)
// and checks that it is the mapped file: same inode as /proc/PID/maps
// says, same build id as the image in memory. A mapping marked
// (deleted), or a file that fails those checks, gives ReplacedError. A path
// the process does not map is opened through /proc/PID/root unchecked.
func (l *live) OpenFile(path string) (File, error) {
	maps, err := l.Mappings()
	if err != nil {
		return nil, fmt.Errorf("open %s of process %d: %w", path, l.pid, err)
	}
	m, mapped := headMapping(maps, path)
	var mfErr error
	if mapped {
		f, err := os.Open(MapFilesPath(l.pid, m))
		if err == nil {
			return osFile{f}, nil
		}
		mfErr = err
		if m.Deleted {
			return nil, ReplacedError{Pid: l.pid, Path: path, Why: "its mapping is marked (deleted)", Err: mfErr}
		}
	}
	p := HostPath(l.pid, path)
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return nil, NewDeniedError(l.pid, "open files of", err)
		}
		if !l.alive() {
			return nil, ExitedError{Pid: l.pid}
		}
		if mapped && errors.Is(err, os.ErrNotExist) {
			return nil, ReplacedError{Pid: l.pid, Path: path, Why: "no file is at its path any more", Err: mfErr}
		}
		return nil, fmt.Errorf("open %s of process %d as %s: %w", path, l.pid, p, err)
	}
	if mapped {
		if err := l.checkMapped(f, m, path, mfErr); err != nil {
			f.Close()
			return nil, err
		}
	}
	return osFile{f}, nil
}

// checkMapped checks that f, opened by path, is the file mapped at m: its
// inode is the one /proc/PID/maps gives (the device is not compared: on
// overlay file systems the mapping names the lower layer's), and its build
// id, when it has one, is the one in the image's memory.
func (l *live) checkMapped(f *os.File, m Mapping, path string, mfErr error) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s of process %d: %w", path, l.pid, err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && m.Inode != 0 && sys.Ino != m.Inode {
		return ReplacedError{Pid: l.pid, Path: path, Err: mfErr,
			Why: fmt.Sprintf("the process mapped inode %d, the path now holds inode %d", m.Inode, sys.Ino)}
	}
	if m.Offset != 0 {
		return nil
	}
	mem, err := elfx.ReadMemoryBuildID(l, m.Start)
	if err != nil || mem == "" {
		return nil // not an ELF image, or no build id to compare
	}
	disk, err := elfx.FileBuildID(f)
	if err != nil {
		return ReplacedError{Pid: l.pid, Path: path, Err: mfErr,
			Why: fmt.Sprintf("the process mapped an ELF file with build id %s, the file now at the path is not ELF (%v)", mem, err)}
	}
	if disk != mem {
		return ReplacedError{Pid: l.pid, Path: path, Err: mfErr,
			Why: fmt.Sprintf("build id %s in the process's memory, %s on disk", mem, orNone(disk))}
	}
	return nil
}

func orNone(id string) string {
	if id == "" {
		return "none"
	}
	return id
}

// headMapping returns the mapping of path that holds the lowest file
// offset (its ELF header, for a binary).
func headMapping(maps []Mapping, path string) (Mapping, bool) {
	var best Mapping
	found := false
	for _, m := range maps {
		if m.Path == path && m.Inode != 0 && (!found || m.Offset < best.Offset) {
			best, found = m, true
		}
	}
	return best, found
}

// MapFilesPath is /proc/PID/map_files/START-END for mapping m of live
// process pid: the mapped object itself, even when replaced or removed
// on disk (opening it needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE).
func MapFilesPath(pid int, m Mapping) string {
	return fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, m.Start, m.End)
}

// FileRoot returns /proc/PID/root when the process's root directory is
// not rbscope's (see Target.FileRoot), else "".
func (l *live) FileRoot() string {
	root := fmt.Sprintf("/proc/%d/root", l.pid)
	theirs, err1 := os.Stat(root)
	ours, err2 := os.Stat("/")
	if err1 != nil || err2 != nil || os.SameFile(theirs, ours) {
		return ""
	}
	return root
}

// HostPath returns the path under which this host can open path of live
// process pid (through /proc/PID/root).
func HostPath(pid int, path string) string {
	return filepath.Join(fmt.Sprintf("/proc/%d/root", pid), path)
}
