package sampler

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// churnLines are the lines of each method of testdata/churn.rb's BODY.
var churnLines = map[string][2]int{
	"outer": {1, 3},
	"inner": {4, 8},
	"dm":    {9, 11},
	"cm":    {12, 14},
}

const churnFileLines = 14

var (
	churnNameID = regexp.MustCompile(`\b(?:Gen_|outer_|inner_|dm_|cm_)(\d+)_(\d+)\b`)
	churnMethod = regexp.MustCompile(`(?:^|[#. ])(outer|inner|dm|cm)_\d+_\d+$`)
	churnPathID = regexp.MustCompile(`(?:^|/)gen_(\d+)_(\d+)\.rb$`)
)

// churnCheck returns why a sample of churn.rb cannot be true, or "": every
// class T_I lives in gen_T_I.rb and holds only methods named *_T_I at
// known lines, thread churn-T only defines classes T_*, and it runs one
// class at a time.
func churnCheck(s stack.Sample) string {
	thread := 0
	if n, ok := strings.CutPrefix(s.ThreadName, "churn-"); ok {
		thread, _ = strconv.Atoi(n)
	}
	sampleID := ""
	for i, f := range s.Frames {
		where := fmt.Sprintf("frame %d %q (%s:%d)", i, f.Name, f.Path, f.Line)
		if f.Name == "<cfunc>" || f.Name == "" {
			return where + ": unnamed frame"
		}
		if f.Kind == stack.KindRuby && f.Line == 0 {
			return where + ": line 0"
		}
		ids := map[string]bool{}
		for _, m := range churnNameID.FindAllStringSubmatch(f.Name, -1) {
			ids[m[1]+"_"+m[2]] = true
		}
		pathID := ""
		if m := churnPathID.FindStringSubmatch(f.Path); m != nil {
			pathID = m[1] + "_" + m[2]
		}
		if len(ids) > 1 {
			return where + ": names two classes"
		}
		nameID := ""
		for id := range ids {
			nameID = id
		}
		if nameID != "" && f.Kind == stack.KindRuby && pathID != nameID {
			return where + ": method of class " + nameID + " in another file"
		}
		if pathID != "" && nameID != "" && pathID != nameID {
			return where + ": C method of class " + nameID + " called from another class's file"
		}
		for _, id := range []string{nameID, pathID} {
			if id == "" {
				continue
			}
			if !strings.HasPrefix(id, strconv.Itoa(thread)+"_") {
				return where + fmt.Sprintf(": class %s belongs to another thread than %q", id, s.ThreadName)
			}
			if sampleID != "" && id != sampleID {
				return where + fmt.Sprintf(": class %s while the stack also runs class %s", id, sampleID)
			}
			sampleID = id
		}
		if pathID != "" && f.Kind == stack.KindRuby {
			lo, hi := 1, churnFileLines
			if m := churnMethod.FindStringSubmatch(f.Name); m != nil {
				lo, hi = churnLines[m[1]][0], churnLines[m[1]][1]
			}
			if f.Line < lo || f.Line > hi {
				return where + fmt.Sprintf(": line outside %d..%d", lo, hi)
			}
		}
	}
	return ""
}

func vmRSS(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// TestNamesNeverStale records, at 1 kHz for 60 s (10 s with -short), a
// process whose threads keep defining, calling and dropping classes, with
// GC.start every 100 classes, so that the VM reuses the addresses of
// collected iseqs, method entries, classes and strings all the time. No
// frame may name a method, file, class or line that was not on that
// thread's stack (see churnCheck).
func TestNamesNeverStale(t *testing.T) {
	testutil.NeedRoot(t)
	dur := 60 * time.Second
	if testing.Short() {
		dur = 10 * time.Second
	}
	if s := os.Getenv("RBSCOPE_CHURN_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("RBSCOPE_CHURN_SECONDS=%q: %v", s, err)
		}
		dur = time.Duration(n) * time.Second
	}
	script, err := filepath.Abs(filepath.Join("testdata", "churn.rb"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, script, "2")
		ctx := context.Background()
		p, err := ruby.Open(ctx, ruby.Spec{Pid: proc.Pid, Wait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Target().Close()
		pz := target.NewThreadPauser()
		defer pz.Close()
		src := NewRubySource(p, RubyOptions{Pauser: pz})
		defer src.Close()

		rssStart := vmRSS(t)
		total, bad, churnSamples := 0, 0, 0
		var examples []string
		st, err := Run(ctx, src, Config{Rate: 1000, Duration: dur}, func(ss []stack.Sample) {
			for _, s := range ss {
				total++
				if strings.HasPrefix(s.ThreadName, "churn-") {
					churnSamples++
				}
				if why := churnCheck(s); why != "" {
					bad++
					if len(examples) < 10 {
						examples = append(examples, fmt.Sprintf("%s: %s\n%s", s.ThreadName, why, formatFrames(s.Frames)))
					}
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		rssEnd := vmRSS(t)
		t.Logf("%s: %d samples (%d of churn threads) in %d ticks (%d late, %d missed; errors: %s); %d stale (%.3f%%); rbscope RSS %s at start, %s at end",
			rb.Name, total, churnSamples, st.Ticks, st.Late, st.Missed, st.ErrorSummary(), bad, 100*float64(bad)/float64(max(total, 1)), rssStart, rssEnd)
		if churnSamples < total/3 {
			t.Errorf("only %d of %d samples are of the churn threads", churnSamples, total)
		}
		if bad > 0 {
			t.Errorf("%d of %d samples name what was not on the thread's stack; first ones:\n%s", bad, total, strings.Join(examples, "\n"))
		}
	})
}

func formatFrames(fs []stack.Frame) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "    %s (%s:%d) %s\n", f.Name, f.Path, f.Line, f.Kind)
	}
	return b.String()
}
