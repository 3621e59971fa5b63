package main

import (
	"bytes"
	"os/exec"
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
