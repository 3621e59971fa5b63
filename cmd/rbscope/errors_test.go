package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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
// which something takes the right to read it) and returns its standard
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
	return se.String()
}

// TestPermissionErrorNamesWhatRefused: rbscope run as root but refused
// reading a root Ruby process names what refused, and blames nothing it
// has:
//   - without CAP_SYS_PTRACE (a container not given it; setpriv drops it),
//     the missing capability, and no namespace (the process is in
//     rbscope's own: its namespace links are unreadable only for want of
//     the capability);
//   - under a seccomp filter that refuses process_vm_readv and ptrace
//     (as a container's profile may), the filter, not a capability or a
//     namespace;
//   - under one that refuses ptrace only, a blocking record, every pause
//     of which is refused, stops by itself and its last error names the
//     filter.
func TestPermissionErrorNamesWhatRefused(t *testing.T) {
	bin := recBinary(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testutil.Missing(t, "setpriv (util-linux) to drop CAP_SYS_PTRACE: %v", err)
	}
	notCapOrNS := []string{"without CAP_SYS_PTRACE", "needs CAP_SYS_PTRACE", "namespace"}
	for _, c := range []struct {
		name      string
		command   func(args ...string) *exec.Cmd
		runs      []string // "snapshot", "record", "record-nonblocking"
		want, not []string
		// The error ends a recording's report (the pauses are refused,
		// the reads were not): the recording stops by itself, long before
		// its --duration, saying so.
		report bool
	}{
		{
			name: "no CAP_SYS_PTRACE",
			command: func(args ...string) *exec.Cmd {
				return exec.Command(setpriv, append([]string{"--bounding-set=-sys_ptrace", "--inh-caps=-all", bin}, args...)...)
			},
			runs: []string{"snapshot", "record"},
			want: []string{"permission denied", "runs as root but without CAP_SYS_PTRACE"},
			not:  []string{"namespace"},
		},
		{
			name:    "seccomp",
			command: func(args ...string) *exec.Cmd { return testutil.UnderSeccomp(testutil.DenyTracing, bin, args...) },
			runs:    []string{"snapshot", "record", "record-nonblocking"},
			want:    []string{"operation not permitted", "runs under a seccomp filter"},
			not:     notCapOrNS,
		},
		{
			// Memory reads allowed: blocking record is refused the pause.
			name:    "seccomp ptrace",
			command: func(args ...string) *exec.Cmd { return testutil.UnderSeccomp([]uintptr{unix.SYS_PTRACE}, bin, args...) },
			runs:    []string{"record"},
			want:    []string{"the kernel refused all", "pause (ptrace)", "operation not permitted", "runs under a seccomp filter"},
			not:     notCapOrNS,
			report:  true,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
				p := rb.Start(t, recScript(t, sigScript))
				pid := strconv.Itoa(p.Pid)
				dir := t.TempDir()
				out, raw := filepath.Join(dir, "p.html"), filepath.Join(dir, "p.raw.gz")
				for _, run := range c.runs {
					args := map[string][]string{
						"snapshot":           {"snapshot", "--pid", pid},
						"record":             {"record", "--pid", pid, "--duration", "20s", "-o", out, "--raw", raw},
						"record-nonblocking": {"record", "--nonblocking", "--pid", pid, "--duration", "20s", "-o", out, "--raw", raw},
					}[run]
					msg := permissionRefused(t, c.command(args...), rb.ProfilerEnv(t))
					if !c.report && strings.Count(msg, "\n") != 1 {
						t.Errorf("%s: error is not one line:\n%s", args[0], msg)
					}
					t.Logf("%s: %s", strings.Join(args[:2], " "), msg)
					for _, w := range c.want {
						if !strings.Contains(msg, w) {
							t.Errorf("%s: error does not say %q:\n%s", args[0], w, msg)
						}
					}
					for _, n := range c.not {
						if strings.Contains(msg, n) {
							t.Errorf("%s: error says %q, which did not refuse:\n%s", args[0], n, msg)
						}
					}
				}
			})
		})
	}
}
