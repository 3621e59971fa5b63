package proctree

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/testutil"
)

// TestDescendants starts sh, which starts two children, one of which
// starts a grandchild; both discovery methods find all three.
func TestDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", `sleep 60 & sh -c 'sleep 61 & echo $!; wait' & echo $!; echo $!; wait`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pids, _ := descendantsByScan(cmd.Process.Pid)
		for _, p := range pids {
			if pr, err := os.FindProcess(p); err == nil {
				_ = pr.Kill()
			}
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// The inner sh prints its child (sleep 61); the outer prints $! (the
	// inner sh) twice. Read the three lines.
	sc := bufio.NewScanner(out)
	var want []int
	for i := 0; i < 3 && sc.Scan(); i++ {
		p, err := strconv.Atoi(sc.Text())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(want, p) {
			want = append(want, p)
		}
	}
	// Plus the first sleep: the outer sh's other child.
	deadline := time.Now().Add(2 * time.Second)
	for {
		got, err := Descendants(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		scan, err := descendantsByScan(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		slices.Sort(scan)
		if len(got) == 3 && slices.Equal(got, scan) {
			for _, w := range want {
				if !slices.Contains(got, w) {
					t.Fatalf("descendants %v lack %d", got, w)
				}
			}
			comms := map[string]int{}
			for _, p := range got {
				st, err := ReadStat(p)
				if err != nil {
					t.Fatal(err)
				}
				comms[st.Comm]++
			}
			if comms["sleep"] == 2 && comms["sh"] == 1 {
				return
			}
			// A forked sh that has not exec'd sleep yet: look again.
			if time.Now().After(deadline) {
				t.Fatalf("descendants' commands %v, want 2 sleep and 1 sh", comms)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("descendants %v, by scan %v, want 3 (%v and a sleep)", got, scan, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestParseStat(t *testing.T) {
	line := "4242 (a) b (c)) R 1 4242 4242 0 -1 4194560 100 0 0 0 17 3 0 0 20 0 1 0 123456 1000 100 " +
		"18446744073709551615 94000000000000 94000000100000 140730000000000 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
	st, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{Pid: 4242, Comm: "a) b (c)", State: 'R', PPid: 1, UTime: 17, STime: 3, StartTime: 123456,
		StartCode: 94000000000000, StartStack: 140730000000000}
	if st != want {
		t.Fatalf("got %+v\nwant %+v", st, want)
	}
	self, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if self.Pid != os.Getpid() || self.PPid != os.Getppid() || self.StartStack == 0 {
		t.Errorf("own stat %+v", self)
	}
	for _, bad := range []string{"", "12 (x", "12 (x) R 1", "x (y) R 1 " + strings.Repeat("0 ", 30)} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) accepted", bad)
		}
	}
}

// TestIdentityChangesOnExec: a process that execs keeps its pid and start
// time but gets new code and stack addresses.
func TestIdentityChangesOnExec(t *testing.T) {
	cmd := exec.Command("sh", "-c", "read x; exec sleep 60")
	in, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	before, err := ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	in.Write([]byte("go\n"))
	deadline := time.Now().Add(2 * time.Second)
	for {
		after, err := ReadStat(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if after.Comm == "sleep" {
			if after.StartTime != before.StartTime {
				t.Errorf("start time changed on exec")
			}
			if after.Identity() == before.Identity() {
				t.Errorf("identity %+v unchanged by exec", after.Identity())
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("sh never exec'd sleep")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCommandAsSudoUser: under sudo, the launched command runs as the
// invoking user.
func TestCommandAsSudoUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.Missing(t, "needs root to switch user")
	}
	t.Setenv("SUDO_UID", "65534")
	t.Setenv("SUDO_GID", "65534")
	for _, c := range [][]string{{"id", "-u"}, {"id", "-g"}} {
		cmd, err := Command(c)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		cmd.Stdout = &buf
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		if got := buf.String(); got != "65534\n" {
			t.Fatalf("%v printed %q, want 65534", c, got)
		}
	}
	t.Setenv("SUDO_UID", "")
	cmd, err := Command([]string{"id", "-u"})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	cmd.Stdout = &buf
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if buf.String() != "0\n" {
		t.Fatalf("without sudo the command ran as %q, want 0", buf.String())
	}
	if _, err := Command([]string{"no-such-command-rbscope"}); err == nil {
		t.Error("missing command accepted")
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
