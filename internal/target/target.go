// Package target gives read-only access to a process image: a live process
// (memory through process_vm_readv, mappings and threads from /proc) or an
// ELF core file (PT_LOAD segments, NT_FILE mapped files, NT_PRSTATUS
// threads). Both sit behind the Target interface so that everything above
// this package works the same on either.
//
// This is the only package that calls golang.org/x/sys/unix for process
// access.
package target

import (
	"errors"
	"fmt"
	"io"

	"path/filepath"

	"github.com/rbscope/rbscope/internal/procfs"
)

// Mapping is one memory mapping of the target.
type Mapping struct {
	Start, End uint64 // [Start, End)
	Offset     uint64 // file offset of Start
	Perms      string // "r-xp" as in /proc/PID/maps ("r--p" style for cores)
	Path       string // mapped file, or "" / "[heap]" style names
	Inode      uint64
	// Deleted is true when the mapped file is no longer at Path (the
	// kernel's " (deleted)" suffix, stripped from Path): it was removed
	// or replaced on disk after the process mapped it.
	Deleted bool
}

// Contains reports whether addr lies in the mapping.
func (m Mapping) Contains(addr uint64) bool { return addr >= m.Start && addr < m.End }

// Thread is one OS thread of the target.
type Thread struct {
	TID  int    // Linux thread id, as in /proc/PID/task
	Name string // /proc/PID/task/TID/comm, or the core's prpsinfo name
	// State is the kernel's one-letter state ('R', 'S', 'D', ...) for live
	// processes, 0 when unknown.
	State byte
}

// Read is one request of a batched read: fill Buf from Addr.
type Read struct {
	Addr uint64
	Buf  []byte
}

// Target is a process image rbscope can read.
type Target interface {
	// Pid is the process id (for a core, the pid recorded in it).
	Pid() int
	// ReadAt fills p from address addr. A short read is an error.
	ReadAt(p []byte, addr uint64) error
	// ReadBatch performs several reads, in as few system calls as the
	// backend allows. It fails if any read fails.
	ReadBatch(reqs []Read) error
	// Mappings lists the memory mappings.
	Mappings() ([]Mapping, error)
	// Threads lists the OS threads.
	Threads() ([]Thread, error)
	// Executable is the path of the main executable (as the target saw it).
	Executable() string
	// OpenFile opens a file the target mapped, as the target sees it
	// (through /proc/PID/root for live processes).
	OpenFile(path string) (File, error)
	// HostTID returns the id rbscope knows the target's thread tid by,
	// tid being the id the target itself knows (the one Ruby keeps in
	// its memory), 0 when the target has no such thread. They are the
	// same but for a live process in another PID namespace (a
	// container), whose ids name other processes on this host: HostTID
	// maps them through /proc and never returns such an id unchanged.
	HostTID(tid int) int
	// FileRoot is the directory under which this host sees the files of
	// a live process whose root is not rbscope's (a container's, a
	// chroot's): its /proc/PID/root; "" when the process sees the host's
	// tree, and for cores (whose files OpenFile finds under --sysroot).
	// Files that are not mapped, such as separate debug files, are looked
	// for under it.
	FileRoot() string
	// Close releases the target's resources.
	Close() error
}

// File is a mapped file opened for reading.
type File interface {
	io.ReaderAt
	io.Closer
	Size() int64
}

// The kinds of failure a reader of a target tells apart. The typed errors
// below carry the details and match these with errors.Is.
var (
	// ErrExited: the process no longer exists (ExitedError).
	ErrExited = errors.New("the process exited")
	// ErrDenied: the kernel refused access to the process (DeniedError).
	ErrDenied = errors.New("access to the process refused")
	// ErrUnmapped: an address the target does not map, or whose bytes a
	// core does not hold (UnmappedError).
	ErrUnmapped = errors.New("address not mapped")
	// ErrReplaced: a file the process mapped is not the file now at its
	// path (ReplacedError).
	ErrReplaced = errors.New("mapped file replaced on disk")
)

// ExitedError is returned when the live process no longer exists.
type ExitedError struct{ Pid int }

// Is matches ErrExited.
func (e ExitedError) Is(target error) bool { return target == ErrExited }

func (e ExitedError) Error() string {
	return fmt.Sprintf("process %d does not exist (or has exited)", e.Pid)
}

// DeniedError is returned when the kernel refuses access to the process.
// Why names what refused, when rbscope could tell (see NewDeniedError).
type DeniedError struct {
	Pid int
	Op  string
	Err error
	Why string
}

// NewDeniedError is the error for operation op on process pid refused
// with err, saying what refused: a missing capability, Yama's
// ptrace_scope, a seccomp filter or a foreign namespace.
func NewDeniedError(pid int, op string, err error) DeniedError {
	return DeniedError{Pid: pid, Op: op, Err: err, Why: procfs.Refusal(pid)}
}

func (e DeniedError) Error() string {
	if e.Why != "" {
		return fmt.Sprintf("%s process %d: %v: %s", e.Op, e.Pid, e.Err, e.Why)
	}
	return fmt.Sprintf("%s process %d: %v: rbscope needs CAP_SYS_PTRACE "+
		"(run as root, or add --cap-add=SYS_PTRACE in a container; check /proc/sys/kernel/yama/ptrace_scope)",
		e.Op, e.Pid, e.Err)
}

// NotUserProcessError is returned for a process that exists but cannot run
// Ruby: a kernel thread, or a process without a memory map.
type NotUserProcessError struct {
	Pid int
	Why string
}

func (e NotUserProcessError) Error() string {
	return fmt.Sprintf("process %d %s, so it cannot be a Ruby process", e.Pid, e.Why)
}

func (e DeniedError) Unwrap() error { return e.Err }

// Is matches ErrDenied.
func (e DeniedError) Is(target error) bool { return target == ErrDenied }

// UnmappedError is returned for a read of an address the target does not map
// (or, for a core file, whose bytes the core does not hold).
type UnmappedError struct {
	Addr uint64
	Len  int
}

// Is matches ErrUnmapped.
func (e UnmappedError) Is(target error) bool { return target == ErrUnmapped }

func (e UnmappedError) Error() string {
	return fmt.Sprintf("address 0x%x (%d bytes) is not mapped", e.Addr, e.Len)
}

// ReplacedError says that a file the process mapped is not the file now at
// its path: it was replaced (or removed) on disk after the process mapped
// it, as a package upgrade does to a running program's libraries. Reading
// the file at the path would describe another binary than the one the
// process runs.
type ReplacedError struct {
	Pid  int    // the live process, 0 for a core file
	Path string // the path the process mapped
	// Why says how the difference was seen ("the mapping is marked
	// (deleted)", "build id ... in memory, ... on disk").
	Why string
	// Err is why the mapped object itself could not be read instead
	// (nil when nothing else was tried).
	Err error
}

func (e ReplacedError) Error() string {
	if e.Pid <= 0 {
		return fmt.Sprintf("%s on this machine is not the file the process mapped (%s): it was replaced on disk, "+
			"or the core comes from another machine; pass the binary the process ran with --exe, or a copy of its files with --sysroot",
			e.Path, e.Why)
	}
	msg := fmt.Sprintf("%s was replaced on disk after process %d started (%s)", filepath.Base(e.Path), e.Pid, e.Why)
	if e.Err != nil {
		msg += fmt.Sprintf(" and the file it mapped cannot be opened through /proc/%d/map_files (%v)", e.Pid, e.Err)
	}
	return msg + fmt.Sprintf("; the file now at %s is another binary, so rbscope will not read it: "+
		"run rbscope as root (CAP_SYS_ADMIN opens the mapped file itself) or restart the process", e.Path)
}

func (e ReplacedError) Unwrap() error { return e.Err }

// Is matches ErrReplaced.
func (e ReplacedError) Is(target error) bool { return target == ErrReplaced }

// IsReplaced reports whether err says a mapped file was replaced on disk.
func IsReplaced(err error) bool { return errors.Is(err, ErrReplaced) }

// IsExited reports whether err says the process exited.
func IsExited(err error) bool { return errors.Is(err, ErrExited) }
