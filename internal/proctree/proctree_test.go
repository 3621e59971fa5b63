package proctree

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
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
				st, err := procfs.ReadStat(p)
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

// TestCommandAsSudoUser: under sudo, the launched command runs as the
// invoking user.
func TestCommandAsSudoUser(t *testing.T) {
	testutil.NeedRoot(t) // to switch user
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
