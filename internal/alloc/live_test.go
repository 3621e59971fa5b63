package alloc

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/tui"
)

// TestLiveView draws the terminal view twice: the second draw moves the
// cursor back over the first, and rates are per second since the last
// draw. Off a terminal, one plain line per draw.
func TestLiveView(t *testing.T) {
	var b bytes.Buffer
	blk := tui.NewBlock(&b, true)
	r1 := &Report{Pid: 7, Duration: time.Second,
		ByClass: []ClassCount{{Class: "Widget", Count: 100}},
		BySite:  []SiteCount{{Class: "Widget", Path: "/app.rb", Line: 3, Count: 100}}}
	r2 := &Report{Pid: 7, Duration: 3 * time.Second,
		ByClass: []ClassCount{{Class: "Widget", Count: 500}, {Class: "String", Count: 40}},
		BySite:  []SiteCount{{Class: "Widget", Path: "/app.rb", Line: 3, Count: 500}, {Class: "String", Path: "", Line: 0, Count: 40}}}
	draw := func(r, prev *Report) {
		v := Live(r, prev)
		blk.Draw(v.Summary(r), v.Lines(r, 10))
	}
	draw(r1, nil)
	first := b.String()
	if strings.Contains(first, "\x1b[1A") || strings.Contains(first, "\x1b[5A") {
		t.Errorf("first draw moves the cursor: %q", first)
	}
	if !strings.Contains(first, "         100        100  Widget\x1b[K\n") || !strings.Contains(first, "/app.rb:3:Widget") {
		t.Errorf("first draw:\n%q", first)
	}
	b.Reset()
	draw(r2, r1)
	second := b.String()
	// 5 lines drawn before: header, class header, 1 class, site header, 1 site.
	if !strings.HasPrefix(second, "\x1b[5A\x1b[J") {
		t.Errorf("second draw does not redraw in place: %q", second)
	}
	// Widget: 400 more in 2 s = 200/s; String: 40 new = 20/s.
	for _, want := range []string{"         500        200  Widget", "          40         20  String", "(unknown):0:String", "540 allocations", "220/s"} {
		if !strings.Contains(second, want) {
			t.Errorf("second draw lacks %q:\n%s", want, second)
		}
	}
	b.Reset()
	plain := tui.NewBlock(&b, false)
	v := Live(r2, r1)
	plain.Draw(v.Summary(r2), v.Lines(r2, 10))
	if got := b.String(); got != "rbscope alloc: 3s 540 allocations, 220/s; top: Widget 500, String 40\n" {
		t.Errorf("plain line %q", got)
	}
}
