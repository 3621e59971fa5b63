package target

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

// TestHostTIDContainer: the thread ids a Ruby in a container knows (its
// script reads them from its own /proc) map to the host's threads of the
// same names; an id no thread has maps to 0, never to itself; a process
// in rbscope's namespace keeps its ids.
func TestHostTIDContainer(t *testing.T) {
	c := testutil.StartContainerRuby(t, "container.rb", testutil.ContainerOptions{})
	tg, err := OpenLive(c.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if got := tg.HostTID(1); got != c.Pid {
		t.Errorf("HostTID(1) = %d, want the main thread %d", got, c.Pid)
	}
	for _, l := range c.Lines {
		var r struct {
			Thread string `json:"thread"`
			TID    int    `json:"tid"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		h := tg.HostTID(r.TID)
		comm, err := os.ReadFile("/proc/" + strconv.Itoa(c.Pid) + "/task/" + strconv.Itoa(h) + "/comm")
		if h == 0 || h == r.TID || err != nil || (r.Thread != "main" && strings.TrimSpace(string(comm)) != r.Thread) {
			t.Errorf("%s: HostTID(%d) = %d (%q, %v)", r.Thread, r.TID, h, comm, err)
		}
	}
	if got := tg.HostTID(4000000); got != 0 {
		t.Errorf("HostTID of no thread = %d, want 0", got)
	}
	self, err := OpenLive(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := self.HostTID(os.Getpid()); got != os.Getpid() {
		t.Errorf("own HostTID(%d) = %d", os.Getpid(), got)
	}
}

// BenchmarkHostTID is the steady cost of translating a container's
// thread id (the map read, the task list compared once a second).
func BenchmarkHostTID(b *testing.B) {
	c := testutil.StartContainerRuby(b, "container.rb", testutil.ContainerOptions{})
	tg, err := OpenLive(c.Pid)
	if err != nil {
		b.Fatal(err)
	}
	defer tg.Close()
	pid := c.Pid
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if tg.HostTID(1) != pid {
			b.Fatal("HostTID(1) is not the main thread")
		}
	}
}

// BenchmarkHostTIDSameNamespace is its cost for a process in rbscope's
// own namespace.
func BenchmarkHostTIDSameNamespace(b *testing.B) {
	pid := os.Getpid()
	tg, err := OpenLive(pid)
	if err != nil {
		b.Fatal(err)
	}
	defer tg.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if tg.HostTID(pid) != pid {
			b.Fatal("HostTID changed an id of this namespace")
		}
	}
}
