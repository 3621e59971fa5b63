package procfs

import (
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/testutil"
)

func TestParseStatOddName(t *testing.T) {
	// A command name may hold spaces and parentheses: the last ')' ends it.
	line := "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 2 0 12345 1000 200 18446744073709551615 94000 95000 140000 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0\n"
	st, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{Pid: 4242, Comm: "a) b (c)", State: 'S', PPid: 1, Flags: 4194560, UTime: 7, STime: 3,
		StartTime: 12345, StartCode: 94000, StartStack: 140000}
	if st != want {
		t.Fatalf("got %+v\nwant %+v", st, want)
	}
	if StateLetter([]byte(line)) != 'S' {
		t.Errorf("StateLetter = %q", StateLetter([]byte(line)))
	}
	for _, bad := range []string{"", "12 (x", "12 (x) S 1", "x (y) S " + strings.Repeat("1 ", 30)} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) = nil error", bad)
		}
	}
	if StateLetter([]byte("1 (x)")) != 0 {
		t.Error("StateLetter of a cut line is not 0")
	}
}

func TestReadStatSelfAndKernelThread(t *testing.T) {
	st, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pid != os.Getpid() || st.PPid != os.Getppid() || st.KernelThread() || st.Gone() {
		t.Fatalf("own stat: %+v", st)
	}
	// kthreadd is pid 2 in the initial PID namespace; in a container pid 2
	// is an ordinary process or absent.
	k, err := ReadStat(2)
	if err != nil || k.Comm != "kthreadd" {
		testutil.Missing(t, "kthreadd at pid 2 (the initial PID namespace): %v", err)
	}
	if !k.KernelThread() {
		t.Errorf("kthreadd not seen as a kernel thread: flags %#x", k.Flags)
	}
	if args, err := Cmdline(2); err != nil || args != nil {
		t.Errorf("Cmdline(kthreadd) = %q, %v; want nil, nil", args, err)
	}
}

func TestCmdlineAndStatus(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	cmd.Args[0] = "my sleep" // an argument with a space
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// The child may not have exec'd sleep yet: look again until it has.
	var args []string
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if args, err = Cmdline(cmd.Process.Pid); err != nil || (len(args) > 0 && args[0] == "my sleep") {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(args, []string{"my sleep", "30"}) {
		t.Errorf("Cmdline = %q", args)
	}
	tids, err := Tasks(cmd.Process.Pid)
	if err != nil || len(tids) != 1 || tids[0] != cmd.Process.Pid {
		t.Fatalf("Tasks = %v, %v", tids, err)
	}
	st, err := ReadTaskStatus(cmd.Process.Pid, tids[0])
	if err != nil {
		t.Fatal(err)
	}
	if st.TracerPid != 0 || (st.State != 'S' && st.State != 'R') {
		t.Errorf("status of a sleeping child: %+v", st)
	}
	if got := SplitCmdline([]byte("a\x00\x00b\x00")); !reflect.DeepEqual(got, []string{"a", "", "b"}) {
		t.Errorf("SplitCmdline = %q", got)
	}
}

func TestParseStatusBad(t *testing.T) {
	if _, err := ParseStatus([]byte("TracerPid:\tx\n")); err == nil {
		t.Error("bad TracerPid accepted")
	}
	st, err := ParseStatus([]byte("Name:\tx\nState:\tt (tracing stop)\nTracerPid:\t77\nSeccomp:\t2\nCapEff:\t000001ffffffffff\n"))
	if err != nil || st.State != 't' || st.TracerPid != 77 || st.Seccomp != 2 || st.CapEff != 0x1ffffffffff {
		t.Errorf("ParseStatus = %+v, %v", st, err)
	}
}

func TestRefusalNamesNothingForOurOwnChild(t *testing.T) {
	testutil.NeedRoot(t) // as another user, Refusal rightly names the missing CAP_SYS_PTRACE
	if s, _ := ReadStatus(os.Getpid()); s.Seccomp == 2 {
		testutil.Missing(t, "no seccomp filter on the test (Refusal rightly names one)")
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if r := Refusal(cmd.Process.Pid); r != "" && !strings.Contains(r, "ptrace_scope is 3") {
		t.Errorf("Refusal(own child) = %q", r)
	}
}

// TestYamaRefusal: each ptrace_scope refuses whom Yama's documentation
// says (Documentation/admin-guide/LSM/Yama.rst): 0 nobody, 1 a
// non-parent without CAP_SYS_PTRACE, 2 anyone without it, 3 everyone.
// (This machine may have no Yama, and 3 cannot be undone: the values are
// not set for real.)
func TestYamaRefusal(t *testing.T) {
	for _, c := range []struct {
		scope  int
		hasCap bool
		want   string
	}{
		{0, false, ""}, {0, true, ""},
		{1, false, "ptrace_scope is 1"}, {1, true, ""},
		{2, false, "ptrace_scope is 2"}, {2, true, ""},
		{3, false, "ptrace_scope is 3"}, {3, true, "ptrace_scope is 3"},
	} {
		got := yamaRefusal(c.scope, c.hasCap)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("yamaRefusal(%d, cap %v) = %q, want %q", c.scope, c.hasCap, got, c.want)
		}
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 0 0 0 1 2 0 0 20 0 1 0 5 100 10 1 2 3 4 5 6 7 8 9 0 0 0 17 1 0 0 0 0 0\n"))
	f.Add([]byte("4242 (a) b (c)) R 1 4242 4242 0 -1 0 0 0 0 0 17 3 0 0 20 0 1 0 1 1 1 1 1 1 1 1 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseStat(b)
		if err == nil && !strings.Contains(string(b), "("+st.Comm+")") {
			t.Fatalf("comm %q not in input", st.Comm)
		}
	})
}

// startExecer starts sh that execs sleep when told to (the returned
// function).
func startExecer(t *testing.T) (*exec.Cmd, func()) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "read x; exec sleep 60")
	in, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, func() { in.Write([]byte("go\n")) }
}

// waitComm reads the stat with read until its command is comm.
func waitComm(t *testing.T, read func() (Stat, error), comm string) Stat {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, err := read()
		if err != nil {
			t.Fatal(err)
		}
		if st.Comm == comm {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d is %q, never %q", st.Pid, st.Comm, comm)
		}
	}
}

// TestIdentityChangesOnExec: a process that execs keeps its pid and start
// time but gets new code and stack addresses.
func TestIdentityChangesOnExec(t *testing.T) {
	cmd, execNow := startExecer(t)
	readStat := func() (Stat, error) { return ReadStat(cmd.Process.Pid) }
	before := waitComm(t, readStat, "sh")
	execNow()
	after := waitComm(t, readStat, "sleep")
	if after.StartTime != before.StartTime {
		t.Errorf("start time changed on exec")
	}
	if after.Identity() == before.Identity() {
		t.Errorf("identity %+v unchanged by exec", after.Identity())
	}
}

// TestStatFileFollowsExecAndExit: a stat file kept open reads the same as
// ReadStat, sees the process exec (new identity, same file) and reads as
// an error once the process has exited and been reaped.
func TestStatFileFollowsExecAndExit(t *testing.T) {
	cmd, execNow := startExecer(t)
	pid := cmd.Process.Pid
	f, err := OpenStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Until sh waits on its input, it may still be starting (exec'ing).
	var fresh Stat
	for deadline := time.Now().Add(2 * time.Second); fresh.Comm != "sh" || fresh.State != 'S'; time.Sleep(5 * time.Millisecond) {
		if fresh, err = ReadStat(pid); err != nil || time.Now().After(deadline) {
			t.Fatalf("sh not waiting on its input: %+v, %v", fresh, err)
		}
	}
	before, err := f.Read()
	if err != nil {
		t.Fatal(err)
	}
	if before.Pid != pid || before.Identity() != fresh.Identity() || before.Comm != fresh.Comm {
		t.Fatalf("open file read %+v, ReadStat %+v", before, fresh)
	}
	execNow()
	if after := waitComm(t, f.Read, "sleep"); after.Identity() == before.Identity() {
		t.Errorf("identity %+v unchanged by exec", after.Identity())
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if st, err := f.Read(); err == nil {
		t.Errorf("stat of reaped process %d read %+v, want an error", pid, st)
	}
}

func TestParseLoadAvg(t *testing.T) {
	if v, err := ParseLoadAvg([]byte("2.50 1.20 0.90 3/512 4242\n")); err != nil || v != 2.5 {
		t.Errorf("ParseLoadAvg = %v, %v; want 2.5", v, err)
	}
	for _, bad := range []string{"", "x 1 2"} {
		if _, err := ParseLoadAvg([]byte(bad)); err == nil {
			t.Errorf("ParseLoadAvg(%q): no error", bad)
		}
	}
	// The machine's own, read the way the kernel writes it.
	if v, err := LoadAvg(); err != nil || v < 0 {
		t.Errorf("LoadAvg = %v, %v", v, err)
	}
}
