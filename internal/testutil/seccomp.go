package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccompExecEnv, in a test binary's environment, makes it install a
// seccomp filter and exec its arguments instead of running tests (see
// UnderSeccomp).
const seccompExecEnv = "RBSCOPE_TEST_SECCOMP_EXEC"

// DenyTracing are the system calls that read or trace another process,
// which a seccomp profile may refuse (Docker's default refuses
// process_vm_readv and process_vm_writev to a container without
// CAP_SYS_PTRACE, and ptrace too on kernels before 4.8).
var DenyTracing = []uintptr{unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_PTRACE}

// UnderSeccomp returns a command that runs name with args under a seccomp
// filter that refuses the system calls deny (numbers, such as
// unix.SYS_PTRACE, or DenyTracing) with EPERM. The test binary itself
// installs the filter, then execs name (the filter is inherited across
// exec).
func UnderSeccomp(deny []uintptr, name string, args ...string) *exec.Cmd {
	nrs := make([]string, len(deny))
	for i, nr := range deny {
		nrs[i] = strconv.FormatUint(uint64(nr), 10)
	}
	cmd := exec.Command(os.Args[0], append([]string{name}, args...)...)
	cmd.Env = append(os.Environ(), seccompExecEnv+"="+strings.Join(nrs, ","))
	return cmd
}

func init() {
	if os.Getenv(seccompExecEnv) == "" {
		return
	}
	err := execUnderSeccomp(os.Getenv(seccompExecEnv), os.Args[1:])
	fmt.Fprintf(os.Stderr, "testutil: exec under seccomp: %v\n", err)
	os.Exit(125)
}

// execUnderSeccomp installs a filter refusing the system calls deny
// (comma-separated numbers) on every thread of the process, then execs
// argv; it returns only on failure.
func execUnderSeccomp(deny string, argv []string) error {
	if len(argv) == 0 {
		return fmt.Errorf("no command")
	}
	var nrs []uintptr
	for _, f := range strings.Split(deny, ",") {
		nr, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return fmt.Errorf("system call number %q: %w", f, err)
		}
		nrs = append(nrs, uintptr(nr))
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	filter := seccompDenyFilter(nrs...)
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("PR_SET_NO_NEW_PRIVS: %w", err)
	}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog))); errno != 0 {
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER): %w", errno)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, seccompExecEnv+"=") {
			env = append(env, kv)
		}
	}
	return syscall.Exec(path, argv, env)
}

// seccompDenyFilter is a classic BPF program for x86-64 that returns
// EPERM for the system calls nrs and allows every other one.
func seccompDenyFilter(nrs ...uintptr) []unix.SockFilter {
	const (
		ld  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret = unix.BPF_RET | unix.BPF_K
	)
	n := uint8(len(nrs))
	f := []unix.SockFilter{
		{Code: ld, K: 4}, // seccomp_data.arch
		{Code: jeq, K: unix.AUDIT_ARCH_X86_64, Jt: 1},
		{Code: ret, K: unix.SECCOMP_RET_KILL_PROCESS},
		{Code: ld, K: 0}, // seccomp_data.nr
	}
	for i, nr := range nrs {
		// Jump to the EPERM return past the remaining tests and the allow.
		f = append(f, unix.SockFilter{Code: jeq, K: uint32(nr), Jt: n - uint8(i)})
	}
	return append(f,
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
	)
}
