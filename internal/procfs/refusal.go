package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// capSysPtrace is CAP_SYS_PTRACE's bit in a capability mask.
const capSysPtrace = 19

// Refusal explains why this process may not read or trace process pid,
// naming what refused: missing CAP_SYS_PTRACE, Yama's ptrace_scope, a
// seccomp filter (a container's default profile), or a user or PID
// namespace that is not ours. It returns "" when it finds nothing to
// blame. Call it after the kernel said EPERM.
func Refusal(pid int) string {
	var why []string
	self, err := ReadStatus(os.Getpid())
	hasCap := err == nil && self.CapEff&(1<<capSysPtrace) != 0
	if err == nil && !hasCap {
		if os.Geteuid() == 0 {
			why = append(why, "rbscope runs as root but without CAP_SYS_PTRACE (a container drops it: add --cap-add=SYS_PTRACE)")
		} else {
			why = append(why, "rbscope lacks CAP_SYS_PTRACE: run it as root (sudo), or as the process's user")
		}
	}
	if scope, ok := yamaScope(); ok {
		if y := yamaRefusal(scope, hasCap); y != "" {
			why = append(why, y)
		}
	}
	if err == nil && self.Seccomp == 2 {
		why = append(why, "rbscope runs under a seccomp filter that may refuse process_vm_readv and ptrace "+
			"(a container's default profile: run it with --cap-add=SYS_PTRACE, or --security-opt seccomp=unconfined)")
	}
	if ns := foreignNamespaces(pid, hasCap || err != nil); ns != "" {
		why = append(why, ns)
	}
	return strings.Join(why, "; ")
}

// yamaRefusal says how Yama's ptrace_scope refuses a tracer with or
// without CAP_SYS_PTRACE (hasCap), or "" when it lets it trace.
func yamaRefusal(scope int, hasCap bool) string {
	switch {
	case scope >= 3:
		return "Yama's kernel.yama.ptrace_scope is 3: no process may trace another, not even root, until reboot"
	case scope == 2 && !hasCap:
		return "Yama's kernel.yama.ptrace_scope is 2: only CAP_SYS_PTRACE may trace"
	case scope == 1 && !hasCap:
		return "Yama's kernel.yama.ptrace_scope is 1: only a parent may trace its child (lower it with sysctl kernel.yama.ptrace_scope=0, or run as root)"
	}
	return ""
}

// yamaScope reads kernel.yama.ptrace_scope; false without Yama.
func yamaScope() (int, bool) {
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return n, err == nil
}

// foreignNamespaces says how pid's user and PID namespaces differ from
// rbscope's, or "" when they are the same (or cannot be told). Reading
// another process's namespace links needs the same access as tracing it:
// unreadable links point at a foreign user namespace only when rbscope
// has CAP_SYS_PTRACE (hasCap); without it, they say nothing.
func foreignNamespaces(pid int, hasCap bool) string {
	var diff []string
	unreadable := false
	for _, ns := range []string{"user", "pid"} {
		mine, err1 := os.Readlink("/proc/self/ns/" + ns)
		theirs, err2 := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/" + ns)
		switch {
		case err1 != nil:
		case err2 != nil && os.IsPermission(err2):
			unreadable = true
		case err2 == nil && mine != theirs:
			diff = append(diff, fmt.Sprintf("another %s namespace (%s, rbscope's is %s)", ns, theirs, mine))
		}
	}
	where := ""
	switch {
	case unreadable && !hasCap && len(diff) == 0:
		return ""
	case unreadable && !initialUserNS():
		where = "outside the user namespace rbscope runs in (its namespaces cannot even be read from here)"
	case unreadable:
		where = "in namespaces rbscope cannot read"
	case len(diff) > 0:
		where = "in " + strings.Join(diff, " and ")
	default:
		return ""
	}
	return "process " + strconv.Itoa(pid) + " lives " + where +
		": root inside a container or user namespace has no power over processes outside it; run rbscope in the process's namespace or on the host"
}

// initialUserNS reports whether rbscope runs in the initial user
// namespace (its uid_map maps the whole range from 0).
func initialUserNS() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return true
	}
	f := strings.Fields(string(b))
	return len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295"
}
