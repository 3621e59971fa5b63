package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/pyroscopetest"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestHeapCLI runs rbscope heap on a process that leaks 1,000
// Leaky::Node a second: the JSON contract, two pprof profiles whose
// difference (what go tool pprof -diff_base shows) is the leak, and
// --interval's growth report.
func TestHeapCLI(t *testing.T) {
	testutil.NeedRoot(t)
	rb := testutil.SystemRuby(t)
	leakLog := filepath.Join(t.TempDir(), "leak.log")
	proc := rb.Start(t, "heap_leak.rb", "1000", leakLog)
	pid := strconv.Itoa(proc.Pid)

	t.Run("json", func(t *testing.T) {
		out, stderr, code := run(t, "heap", "--pid", pid, "--stop", "--format", "json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		var c struct {
			Pid     int               `json:"pid"`
			Stopped bool              `json:"stopped"`
			Pause   int64             `json:"pause_ns"`
			Slots   uint64            `json:"slots"`
			Types   map[string]uint64 `json:"types"`
			Entries []struct {
				Type, Class string
				Count       uint64
				Bytes       uint64
			} `json:"entries"`
		}
		if err := json.Unmarshal([]byte(out), &c); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		if c.Pid != proc.Pid || !c.Stopped || c.Pause <= 0 || c.Slots == 0 || len(c.Entries) == 0 || c.Types["T_STRING"] == 0 {
			t.Errorf("json census: pid %d stopped %v pause %d slots %d, %d entries", c.Pid, c.Stopped, c.Pause, c.Slots, len(c.Entries))
		}
	})

	t.Run("pprof diff", func(t *testing.T) {
		dir := t.TempDir()
		a, b := filepath.Join(dir, "a.pb.gz"), filepath.Join(dir, "b.pb.gz")
		for i, p := range []string{a, b} {
			if i == 1 {
				time.Sleep(3 * time.Second)
			}
			if _, stderr, code := run(t, "heap", "--pid", pid, "--stop", "-f", "pprof", "-o", p); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
		}
		pa, pb := readProfile(t, a), readProfile(t, b)
		// The script's log: how many nodes it held when each census began.
		want := float64(leakCount(t, leakLog, pb.TimeNanos)) - float64(leakCount(t, leakLog, pa.TimeNanos))
		pa.Scale(-1) // what -diff_base does
		diff, err := profile.Merge([]*profile.Profile{pb, pa})
		if err != nil {
			t.Fatal(err)
		}
		var grew int64
		for _, s := range diff.Sample {
			if s.Location[0].Line[0].Function.Name == "Leaky::Node" {
				grew += s.Value[0]
			}
		}
		if math.Abs(float64(grew)-want) > 0.1*want {
			t.Errorf("Leaky::Node grew by %d objects between the profiles, the script made %.0f", grew, want)
		}
	})

	t.Run("dump", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "heap.json")
		_, stderr, code := run(t, "heap", "--pid", pid, "--stop", "--dump", path, "--format", "json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		nodes := 0
		for _, l := range lines {
			var o map[string]any
			if err := json.Unmarshal([]byte(l), &o); err != nil {
				t.Fatalf("dump line %q: %v", l, err)
			}
			if o["type"] == "OBJECT" {
				nodes++
			}
		}
		if !strings.Contains(stderr, "wrote "+strconv.Itoa(len(lines))+" objects to "+path) || nodes < 1000 {
			t.Errorf("%d lines, %d objects; stderr %q", len(lines), nodes, stderr)
		}
	})

	t.Run("interval", func(t *testing.T) {
		out, stderr, code := run(t, "heap", "--pid", pid, "--interval", "2s", "--count", "1")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		lines := strings.Split(out, "\n")
		var top string
		for i, l := range lines {
			if strings.HasPrefix(l, "step 1") && i+2 < len(lines) {
				top = lines[i+2]
			}
		}
		if !strings.Contains(top, "Leaky::Node") {
			t.Errorf("top grower line %q, want Leaky::Node:\n%s", top, out)
		}
	})
}

// leakCount is how many nodes heap_leak.rb's log says it held at ns (its
// last entry before).
func leakCount(t *testing.T, path string, ns int64) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var at int64
		var c uint64
		if _, err := fmt.Sscan(line, &at, &c); err == nil && at <= ns {
			n = c
		}
	}
	return n
}

func readProfile(t *testing.T, path string) *profile.Profile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return p
}

// TestHeapBadInput: usage errors, a process that is not Ruby, a core of a
// Ruby whose heap rbscope does not read: one clear line each.
func TestHeapBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"heap"}, "no target", 2},
		{[]string{"heap", "--pid", "1", "--format", "svg"}, "unknown format", 2},
		{[]string{"heap", "--pid", "1", "--count", "3"}, "--count goes with --interval", 2},
		{[]string{"heap", "--core", "/nonexistent", "--stop"}, "--stop needs a live process", 2},
		{[]string{"heap", "--pid", "1", "--interval", "1s", "--dump", "x"}, "--dump takes one census", 2},
	} {
		_, stderr, code := run(t, tc.args...)
		oneLineError(t, stderr, code, tc.want)
		if code != tc.code {
			t.Errorf("%v: exit %d, want %d", tc.args, code, tc.code)
		}
	}
	testutil.NeedRoot(t)
	_, stderr, code := run(t, "heap", "--pid", strconv.Itoa(os.Getpid()))
	oneLineError(t, stderr, code, "not a Ruby process")
	core := filepath.Join(testutil.SharedDir(t), "testdata", "coredumps", "ruby-coredump-2.7.2.gz")
	_, stderr, code = run(t, "heap", "--core", core)
	oneLineError(t, stderr, code, "rbscope reads the heaps of Ruby 3.0 to 3.4")
}

// TestHeapUpload pushes three censuses (--interval 1s --count 2) of a
// leaking process to a real Pyroscope server as memory profiles: the
// server has the inuse_objects type, and its Leaky::Node objects add up to
// at least the last census's (the three censuses together).
func TestHeapUpload(t *testing.T) {
	testutil.NeedRoot(t)
	srv := pyroscopetest.Start(t)
	rb := testutil.SystemRuby(t)
	proc := rb.Start(t, "heap_leak.rb", "1000")
	app := "ci-heap"
	local := filepath.Join(t.TempDir(), "heap.json")
	start := time.Now()
	_, stderr, code := run(t, "heap", "--pid", strconv.Itoa(proc.Pid), "--stop", "--interval", "1s", "--count", "2",
		"--format", "json", "-o", local, "--upload", srv.URL(), "--app-name", app)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "in 3 profiles") {
		t.Errorf("rbscope heap did not push 3 profiles:\n%s", stderr)
	}
	b, err := os.ReadFile(local)
	if err != nil {
		t.Fatal(err)
	}
	var last struct {
		Entries []struct {
			Class string
			Count int64
		} `json:"entries"`
	}
	if err := json.Unmarshal(b, &last); err != nil {
		t.Fatal(err)
	}
	var nodes int64
	for _, e := range last.Entries {
		if e.Class == "Leaky::Node" {
			nodes += e.Count
		}
	}
	ctx := context.Background()
	from, until := start.Add(-time.Minute), time.Now().Add(time.Minute)
	deadline := time.Now().Add(30 * time.Second)
	for {
		types, _ := srv.ProfileTypes(ctx, from, until)
		typeID := ""
		for _, id := range types {
			if strings.Contains(id, "inuse_objects") {
				typeID = id
			}
		}
		if typeID != "" {
			got, err := srv.QueryType(ctx, typeID, pyroscopetest.AppSelector(app), from, until)
			if err == nil && got.Self["Leaky::Node"] >= nodes && nodes > 0 {
				t.Logf("server %s: %d Leaky::Node over three censuses, the last one %d", typeID, got.Self["Leaky::Node"], nodes)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("server %s: %+v (err %v), want at least %d Leaky::Node", typeID, got.Self, err, nodes)
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("server has no inuse_objects profiles: %v", types)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
