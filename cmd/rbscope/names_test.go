package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

// TestRecordThreadNames records names.rb (long, equal and no names) and
// renders it as collapsed --threads and speedscope, the outputs that
// show threads by name: every thread is there by its whole name (an
// unnamed one by the file:line it started at, the main one by the
// kernel's name) with its tid, the two threads named "worker" apart.
func TestRecordThreadNames(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := rb.Start(t, "names.rb")
		reports := namesReports(t, p)
		dir := t.TempDir()
		raw, collapsed, ss := filepath.Join(dir, "r.raw.gz"), filepath.Join(dir, "c.txt"), filepath.Join(dir, "s.json")
		res := recRun(t, rb, "record", "--pid", strconv.Itoa(p.Pid), "--duration", "1s", "-f", "collapsed", "--threads", "-o", collapsed, "--raw", raw)
		if res.err != nil {
			t.Fatalf("record: %v\n%s", res.err, res.stderr)
		}
		if res := recRun(t, rb, "report", raw, "-f", "speedscope", "-o", ss); res.err != nil {
			t.Fatalf("report: %v\n%s", res.err, res.stderr)
		}
		c, err := os.ReadFile(collapsed)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(ss)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Profiles []struct {
				Name string `json:"name"`
			} `json:"profiles"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		profiles := map[string]bool{}
		for _, pr := range doc.Profiles {
			profiles[pr.Name] = true
		}
		for _, r := range reports {
			name := r.Comm // the main thread: the kernel's name
			switch {
			case r.Name != nil:
				name = *r.Name
			case !r.Main:
				name = *r.Start
			}
			if want := fmt.Sprintf("thread %s (%d);", name, r.TID); !strings.Contains(string(c), want) {
				t.Errorf("collapsed --threads lacks %q:\n%.2000s", want, c)
			}
			if want := fmt.Sprintf("%d %s", r.TID, name); !profiles[want] {
				t.Errorf("no speedscope profile %q: %v", want, profiles)
			}
		}
	})
}
