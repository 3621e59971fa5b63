package record

import (
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/recording"
	"github.com/rbscope/rbscope/internal/stack"
)

// TestUnreadOptions: a recording's unread samples (in its trailer, after
// the samples) reach the outputs once the samples are read, filtered by
// the report's mode.
func TestUnreadOptions(t *testing.T) {
	path := t.TempDir() + "/r.raw.gz"
	w, err := recording.Create(path, recording.Header{RateHz: 100, Start: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(stack.Sample{Time: time.Now(), Pid: 1, TID: 2, Activity: stack.ActivityRunning, Frames: []stack.Frame{{Name: "a"}}}); err != nil {
		t.Fatal(err)
	}
	by := map[stack.Activity]int{stack.ActivityRunning: 7, stack.ActivityGC: 2, stack.ActivityBlocked: 1}
	if err := w.Close(recording.Stats{End: time.Now(), Unread: []recording.UnreadThread{{Pid: 1, TID: 2, Name: "main", ByActivity: by}}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mode stack.Mode
		want map[stack.Activity]int
	}{
		{stack.ModeWall, by},
		{stack.ModeCPU, map[stack.Activity]int{stack.ActivityRunning: 7, stack.ActivityGC: 2}},
	} {
		rd, err := recording.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		unread := UnreadOptions(rd, c.mode)
		if u := unread(); u != nil {
			t.Errorf("unread before the samples are read: %v", u)
		}
		n := 0
		for {
			if _, err := rd.Next(); err != nil {
				break
			}
			n++
		}
		u := unread()
		if n != 1 || len(u) != 1 || u[0].Pid != 1 || u[0].TID != 2 || u[0].Name != "main" || len(u[0].ByActivity) != len(c.want) {
			t.Fatalf("%s: %d samples, unread %+v, want %v", c.mode, n, u, c.want)
		}
		for act, k := range c.want {
			if u[0].ByActivity[act] != k {
				t.Errorf("%s: unread %s %d, want %d", c.mode, act, u[0].ByActivity[act], k)
			}
		}
		rd.Close()
	}
}
