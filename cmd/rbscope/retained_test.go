package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/pyroscopetest"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestRetainedFormats runs `rbscope alloc --retained --exact` on
// internal/alloc's leaky.rb (Debian's Ruby: the library's tests run every
// Ruby under test) in the formats the retained view adds to: pprof
// (inuse_objects/inuse_space by stack), collapsed and flame graph, and
// text (memprof's `count file:line:Class` lines). The leak's nodes are
// under A#outer;B#middle;C#leak at the leak's line, as many as the script
// keeps, with their bytes (ObjectSpace.memsize_of's).
func TestRetainedFormats(t *testing.T) {
	allocNeedRoot(t)
	rb := testutil.SystemRuby(t)
	for _, format := range []string{"pprof", "collapsed", "flamegraph", "text"} {
		t.Run(format, func(t *testing.T) {
			p := startAllocRuby(t, rb, nil, "leaky.rb", "1")
			var where string
			select {
			case l := <-p.Lines:
				where = strings.TrimPrefix(l, "ready ")
			case <-time.After(60 * time.Second):
				t.Fatal("no ready line")
			}
			out := filepath.Join(t.TempDir(), "out")
			cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(p.Pid), "--retained", "--exact", "--format", format, "-o", out)
			cmd.Env = rb.ProfilerEnv(t)
			errb := newAttachedWriter()
			cmd.Stderr = errb
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			errb.wait(t, 30*time.Second)
			p.Send(t, "go")
			p.Expect(t, "stopped")
			// Ctrl-C ends the window after the script's last GC.
			cmd.Process.Signal(syscall.SIGINT)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("rbscope alloc --retained: %v\n%s", err, errb.String())
			}
			p.Send(t, "go")
			var truth struct {
				Kept        int64 `json:"kept"`
				NodeMemsize int64 `json:"node_memsize"`
			}
			select {
			case l := <-p.Lines:
				if err := json.Unmarshal([]byte(l), &truth); err != nil {
					t.Fatalf("truth %q: %v", l, err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("no truth line")
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			checkRetainedOutput(t, format, b, where, truth.Kept, truth.NodeMemsize)
		})
	}
}

func checkRetainedOutput(t *testing.T, format string, b []byte, where string, kept, memsize int64) {
	t.Helper()
	chain := "A#outer;B#middle;C#leak;Class#new;Leaky::Node"
	switch format {
	case "pprof":
		p, err := profile.Parse(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if len(p.SampleType) != 2 || p.SampleType[0].Type != "inuse_objects" || p.SampleType[1].Type != "inuse_space" {
			t.Fatalf("sample types %v, want inuse_objects, inuse_space", p.SampleType)
		}
		var n, space int64
		for _, s := range p.Sample {
			var names []string
			for i := len(s.Location) - 1; i >= 0; i-- {
				names = append(names, s.Location[i].Line[0].Function.Name)
			}
			if strings.HasSuffix(strings.Join(names, ";"), chain) {
				n += s.Value[0]
				space += s.Value[1]
			}
		}
		if n != kept || space != kept*memsize {
			t.Errorf("%d nodes (%d bytes) under %s, the script keeps %d (%d bytes)\n%s", n, space, chain, kept, kept*memsize, p)
		}
	case "collapsed":
		var n int64
		for _, l := range strings.Split(string(b), "\n") {
			i := strings.LastIndexByte(l, ' ')
			if i < 0 || !strings.HasSuffix(l[:i], chain) {
				continue
			}
			v, _ := strconv.ParseInt(l[i+1:], 10, 64)
			n += v
		}
		// Collapsed counts are the retained objects whose stack was
		// copied (one in 64 with --exact): some, and most of the
		// nodes'.
		if n == 0 {
			t.Errorf("no retained node under %s:\n%s", chain, b)
		}
	case "flamegraph":
		if !bytes.Contains(b, []byte("C#leak")) || !bytes.Contains(b, []byte("Leaky::Node")) {
			t.Errorf("the flame graph has no Leaky::Node under C#leak (%d bytes)", len(b))
		}
	case "text":
		want := strconv.FormatInt(kept, 10) + " " + where + ":Leaky::Node  (" + strconv.FormatInt(kept*memsize, 10) + " bytes)"
		if !strings.Contains(string(b), want) || !strings.Contains(string(b), "created in it and still alive at its end") {
			t.Errorf("no line %q in:\n%s", want, b)
		}
	}
}

// TestRetainedUpload: `alloc --retained --upload` pushes the window's
// retained objects as one memory profile (inuse_objects, inuse_space):
// the server holds what the local report says, the leak's nodes under
// A#outer;B#middle;C#leak.
func TestRetainedUpload(t *testing.T) {
	allocNeedRoot(t)
	srv := pyroscopetest.Start(t)
	rb := testutil.SystemRuby(t)
	p := startAllocRuby(t, rb, nil, "leaky.rb", "1")
	select {
	case <-p.Lines:
	case <-time.After(60 * time.Second):
		t.Fatal("no ready line")
	}
	app := "ci-retained"
	local := filepath.Join(t.TempDir(), "retained.json")
	start := time.Now()
	cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(p.Pid), "--retained", "--exact",
		"--format", "json", "-o", local, "--upload", srv.URL(), "--app-name", app)
	cmd.Env = rb.ProfilerEnv(t)
	errb := newAttachedWriter()
	cmd.Stderr = errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	errb.wait(t, 30*time.Second)
	p.Send(t, "go")
	p.Expect(t, "stopped")
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("rbscope alloc --retained --upload: %v\n%s", err, errb.String())
	}
	if !strings.Contains(errb.String(), "pushed 1 retained-object profiles") {
		t.Errorf("stderr does not say one retained profile was pushed:\n%s", errb.String())
	}
	b, err := os.ReadFile(local)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		ByClass []struct {
			Class string `json:"class"`
			Count int64  `json:"count"`
		} `json:"by_class"`
		Retained *struct {
			Alive int64 `json:"alive"`
		} `json:"retained"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || doc.Retained == nil {
		t.Fatalf("local report (%v):\n%s", err, b)
	}
	var total, nodes int64
	for _, c := range doc.ByClass {
		total += c.Count
		if c.Class == "Leaky::Node" {
			nodes = c.Count
		}
	}
	ctx := context.Background()
	from, until := start.Add(-time.Minute), time.Now().Add(time.Minute)
	var typeID string
	var got pyroscopetest.Counts
	deadline := time.Now().Add(30 * time.Second)
	for {
		types, err := srv.ProfileTypes(ctx, from, until)
		for _, id := range types {
			if strings.Contains(id, "inuse_objects") {
				typeID = id
			}
		}
		if typeID != "" {
			got, err = srv.QueryType(ctx, typeID, pyroscopetest.AppSelector(app), from, until)
			if err == nil && got.Total >= total {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server: types %v, %q total %d (err %v), want %d", types, typeID, got.Total, err, total)
		}
		time.Sleep(500 * time.Millisecond)
	}
	var chained int64
	for st, v := range got.Stacks {
		if strings.Contains(st, "A#outer;B#middle;C#leak;Class#new;Leaky::Node") {
			chained += v
		}
	}
	t.Logf("server %s: %d objects, %d nodes under the leak's chain; local %d objects, %d nodes", typeID, got.Total, chained, total, nodes)
	if got.Total != total || nodes == 0 || chained != nodes {
		t.Errorf("server holds %d objects (%d nodes under the leak's chain), the local report %d (%d nodes)", got.Total, chained, total, nodes)
	}
}
