package alloc

import (
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
)

// TestIntervalsSumToReport cuts three cumulative reports, in which a
// class first has no stack, then gets one, then another, and checks that
// the intervals' profiles add up, class by class, to the last report, and
// that each interval's stacks hold exactly its class growth.
func TestIntervalsSumToReport(t *testing.T) {
	fr := func(name string) []stack.Frame { return []stack.Frame{{Name: name, Path: "a.rb", Line: 1}} }
	reports := []*Report{
		{Duration: time.Second, ByClass: []ClassCount{{Class: "W", Count: 100, Bytes: 0}, {Class: "S", Count: 10, Bytes: 50}}},
		{Duration: 2 * time.Second, ByClass: []ClassCount{{Class: "W", Count: 250}, {Class: "S", Count: 10, Bytes: 50}},
			Stacks: []StackCount{{Class: "W", Count: 250, Frames: fr("a"), Samples: 3}}},
		{Duration: 3 * time.Second, ByClass: []ClassCount{{Class: "W", Count: 400}, {Class: "S", Count: 31, Bytes: 80}},
			Stacks: []StackCount{{Class: "W", Count: 200, Frames: fr("a"), Samples: 3}, {Class: "W", Count: 200, Frames: fr("b"), Samples: 3},
				{Class: "S", Count: 31, Bytes: 80, Frames: fr("c"), Samples: 1}}},
	}
	for _, r := range reports {
		for _, c := range r.ByClass {
			r.BySite = append(r.BySite, SiteCount{Class: c.Class, Path: "a.rb", Line: 1, Count: c.Count, Bytes: c.Bytes})
		}
	}
	iv := NewIntervals()
	sum := map[string]int64{}
	var total int64
	for i, r := range reports {
		d := iv.Next(r)
		if d.Duration != time.Second {
			t.Errorf("interval %d lasts %v", i, d.Duration)
		}
		p, err := d.Profile()
		if err != nil {
			t.Fatal(err)
		}
		var pt int64
		for _, s := range p.Sample {
			pt += s.Value[0]
			sum[s.Location[0].Line[0].Function.Name] += s.Value[0]
		}
		if pt != int64(d.Total()) {
			t.Errorf("interval %d: profile holds %d allocations, the interval %d", i, pt, d.Total())
		}
		total += pt
		if i == 2 {
			// W grew by 150, all sampled in the new stack b.
			for _, s := range d.Stacks {
				if s.Class == "W" && s.Frames[0].Name != "b" {
					t.Errorf("interval 2 gave W's growth to stack %s, which sampled nothing new", s.Frames[0].Name)
				}
			}
		}
	}
	last := reports[len(reports)-1]
	if total != int64(last.Total()) {
		t.Errorf("intervals hold %d allocations, the last report %d", total, last.Total())
	}
	for _, c := range last.ByClass {
		if sum[c.Class] != int64(c.Count) {
			t.Errorf("%s: intervals hold %d, the last report %d", c.Class, sum[c.Class], c.Count)
		}
	}
}
