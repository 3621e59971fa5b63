package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/testutil"
)

// TestRecordsStartedTogether: two recordings of one process started in
// the same second, one pausing it and one not, without --raw or -o (they
// used to share one raw file, then failed with "gzip: invalid checksum"
// or both rendered one run's samples): each writes a raw recording and a
// profile of its own, from its own samples (its count, its mode in the
// raw header). And a recording given the --raw file another one is
// writing is refused at once, leaving the other unharmed.
func TestRecordsStartedTogether(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := recStartRuby(t, rb, recBusyScript)
		pid := strconv.Itoa(p.Pid)
		for attempt := 1; ; attempt++ {
			if recordTogether(t, rb, pid) {
				return
			}
			if attempt == 3 {
				t.Fatal("the two recordings never started in the same second")
			}
		}
	})
}

// recordTogether runs the recordings of TestRecordsStartedTogether; false
// when the two did not start in the same second (the machine too busy),
// to be tried again.
func recordTogether(t *testing.T, rb testutil.RubyUnderTest, pid string) bool {
	cache, cwd := t.TempDir(), t.TempDir()
	env := append(rb.ProfilerEnv(t), "XDG_CACHE_HOME="+cache)
	type run struct {
		cmd    *exec.Cmd
		stderr bytes.Buffer
	}
	start := func(args ...string) *run {
		r := &run{cmd: exec.Command(recBinary(t), args...)}
		r.cmd.Env, r.cmd.Dir, r.cmd.Stderr = env, cwd, &r.stderr
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	rawC := filepath.Join(t.TempDir(), "c.raw.gz")
	c := start("record", "--pid", pid, "--duration", "4s", "-f", "summary", "-o", "c.txt", "--raw", rawC)
	// Just after a second begins: the two recordings start in it.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
	a := start("record", "--pid", pid, "--duration", "3s", "-f", "summary")
	b := start("record", "--pid", pid, "--duration", "3s", "--nonblocking", "-f", "summary")

	// c claimed its raw file before anything else (and wrote a header
	// once sampling began): a second recording to it is refused.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if st, err := os.Stat(rawC); err == nil && st.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never written", rawC)
		}
		time.Sleep(20 * time.Millisecond)
	}
	d := recRun(t, rb, "record", "--pid", pid, "--duration", "3s", "-f", "summary", "-o", filepath.Join(cwd, "d.txt"), "--raw", rawC)
	if d.err == nil || !strings.Contains(d.stderr, rawC+": another recording is writing it") || d.took > 3*time.Second {
		t.Errorf("a recording to a raw file being written: %v after %v\n%s", d.err, d.took, d.stderr)
	}

	headRe := regexp.MustCompile(`^rbscope summary: pid ` + pid + `, [0-9.]+ s, (\d+) samples at [0-9.]+ Hz(?:, (\d+) without Ruby frames skipped)?\n`)
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	wroteRe := regexp.MustCompile(`raw recording: (\S+)\n(?s:.*)wrote summary \((\d+) samples\) to (\S+)`)
	type result struct{ raw, out string }
	var results []result
	for _, r := range []struct {
		run      *run
		blocking string
	}{{a, "true"}, {b, "false"}, {c, "true"}} {
		if err := r.run.cmd.Wait(); err != nil {
			t.Fatalf("%v: %v\n%s", r.run.cmd.Args, err, r.run.stderr.String())
		}
		m := wroteRe.FindStringSubmatch(r.run.stderr.String())
		if m == nil {
			t.Fatalf("%v: no raw recording or profile:\n%s", r.run.cmd.Args, r.run.stderr.String())
		}
		raw, n, out := m[1], m[2], filepath.Join(cwd, m[3])
		h, samples := recReadRaw(t, raw)
		if strconv.Itoa(len(samples)) != n || h.Options["blocking"] != r.blocking {
			t.Errorf("%v: raw %s holds %d samples (blocking %s), the profile says %s (blocking %s)",
				r.run.cmd.Args, raw, len(samples), h.Options["blocking"], n, r.blocking)
		}
		prof, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		// "pid P, 3.00 s, N samples at 100 Hz[, K without Ruby frames skipped]"
		if m := headRe.FindStringSubmatch(string(prof)); m == nil || atoi(m[1])+atoi(m[2]) != len(samples) {
			t.Errorf("%s is not the profile of %s's %s samples:\n%.300s", out, raw, n, prof)
		}
		results = append(results, result{raw, out})
	}
	if results[0].raw == results[1].raw || results[0].out == results[1].out || results[2].raw != rawC {
		t.Errorf("two recordings share a file: %+v", results)
	}
	stamp := regexp.MustCompile(`rbscope-(\d{8}-\d{6})-` + pid)
	sa, sb := stamp.FindStringSubmatch(results[0].raw), stamp.FindStringSubmatch(results[1].raw)
	if sa == nil || sb == nil {
		t.Fatalf("raw recordings not named for their time and pid: %+v", results)
	}
	if sa[1] != sb[1] {
		t.Logf("started in seconds %s and %s: again", sa[1], sb[1])
		return false
	}
	return true
}
