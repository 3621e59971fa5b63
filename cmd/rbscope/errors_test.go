package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

// TestPermissionErrorNamesNamespace: root inside a user namespace (as in
// a rootless container) cannot read a process outside it; the error says
// so instead of asking for CAP_SYS_PTRACE it already has.
func TestPermissionErrorNamesNamespace(t *testing.T) {
	bin := recBinary(t)
	if err := exec.Command("unshare", "-Ur", "true").Run(); err != nil {
		testutil.Missing(t, "unshare -Ur (util-linux, user namespaces enabled): %v", err)
	}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := rb.Start(t, recScript(t, sigScript))
		cmd := exec.Command("unshare", "-Ur", bin, "snapshot", "--pid", strconv.Itoa(p.Pid))
		cmd.Env = rb.ProfilerEnv(t)
		var se bytes.Buffer
		cmd.Stderr = &se
		err := cmd.Run()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 1 {
			t.Fatalf("snapshot from a user namespace: %v, want exit 1\n%s", err, se.String())
		}
		msg := se.String()
		if !strings.Contains(msg, "outside the user namespace rbscope runs in") || strings.Count(msg, "\n") != 1 {
			t.Errorf("error does not name the namespace (in one line):\n%s", msg)
		}
	})
}

// TestKernelThreadError: a kernel thread exists but cannot be Ruby; the
// error says so (it used to say "does not exist").
func TestKernelThreadError(t *testing.T) {
	bin := recBinary(t)
	out, err := exec.Command(bin, "snapshot", "--pid", "2").CombinedOutput()
	if !strings.Contains(string(out), "(kthreadd) is a kernel thread") {
		if _, serr := exec.Command("grep", "-q", "kthreadd", "/proc/2/comm").CombinedOutput(); serr != nil {
			testutil.Missing(t, "kthreadd at pid 2 (the initial PID namespace)")
		}
		t.Fatalf("snapshot --pid 2: %v\n%s", err, out)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Errorf("exit %v, want 1", err)
	}
}

// permissionRefused runs cmd (rbscope against a live Ruby process, from
// which something takes the right to read it) and returns its one-line
// error, failing the test unless it exits 1.
func permissionRefused(t *testing.T, cmd *exec.Cmd, env []string) string {
	t.Helper()
	cmd.Env = append(env, cmd.Env...)
	var se bytes.Buffer
	cmd.Stderr = &se
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("%s: %v, want exit 1\n%s", strings.Join(cmd.Args, " "), err, se.String())
	}
	msg := se.String()
	if strings.Count(msg, "\n") != 1 {
		t.Errorf("error is not one line:\n%s", msg)
	}
	return msg
}

// TestPermissionErrorNamesCapability: root without CAP_SYS_PTRACE (a
// container that was not given it) cannot read a root process; the error
// names the missing capability and blames no namespace (the process is in
// rbscope's own).
func TestPermissionErrorNamesCapability(t *testing.T) {
	bin := recBinary(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testutil.Missing(t, "setpriv (util-linux) to drop CAP_SYS_PTRACE: %v", err)
	}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := rb.Start(t, recScript(t, sigScript))
		pid := strconv.Itoa(p.Pid)
		for _, args := range [][]string{
			{"snapshot", "--pid", pid},
			{"record", "--pid", pid, "--duration", "1s", "-o", filepath.Join(t.TempDir(), "p.html")},
		} {
			cmd := exec.Command(setpriv, append([]string{"--bounding-set=-sys_ptrace", "--inh-caps=-all", bin}, args...)...)
			msg := permissionRefused(t, cmd, rb.ProfilerEnv(t))
			t.Logf("%s: %s", args[0], msg)
			if !strings.Contains(msg, "permission denied") || !strings.Contains(msg, "runs as root but without CAP_SYS_PTRACE") {
				t.Errorf("%s: error does not name the missing CAP_SYS_PTRACE:\n%s", args[0], msg)
			}
			if strings.Contains(msg, "namespace") {
				t.Errorf("%s: error blames a namespace; the process is in rbscope's own:\n%s", args[0], msg)
			}
		}
	})
}

// TestPermissionErrorNamesSeccomp: root with every capability, under a
// seccomp filter that refuses process_vm_readv and ptrace (a container
// runtime's default profile), is refused reading the process; the error
// names the filter, not a capability or a namespace.
func TestPermissionErrorNamesSeccomp(t *testing.T) {
	bin := recBinary(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := rb.Start(t, recScript(t, sigScript))
		pid := strconv.Itoa(p.Pid)
		for _, args := range [][]string{
			{"snapshot", "--pid", pid},
			{"record", "--pid", pid, "--duration", "1s", "-o", filepath.Join(t.TempDir(), "p.html")},
			{"record", "--nonblocking", "--pid", pid, "--duration", "1s", "-o", filepath.Join(t.TempDir(), "p.html")},
		} {
			msg := permissionRefused(t, testutil.UnderSeccomp(bin, args...), rb.ProfilerEnv(t))
			t.Logf("%s: %s", strings.Join(args[:2], " "), msg)
			if !strings.Contains(msg, "operation not permitted") || !strings.Contains(msg, "runs under a seccomp filter") {
				t.Errorf("%s: error does not name the seccomp filter:\n%s", args[0], msg)
			}
			if strings.Contains(msg, "without CAP_SYS_PTRACE") || strings.Contains(msg, "namespace") {
				t.Errorf("%s: error blames a capability or namespace rbscope has:\n%s", args[0], msg)
			}
		}
	})
}
