package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// namesReport is one line of testdata/ruby/names.rb: Ruby's own view of a
// thread.
type namesReport struct {
	TID    int     `json:"tid"`
	Name   *string `json:"name"`
	Status any     `json:"status"`
	Main   bool    `json:"main"`
	Comm   string  `json:"comm"`
	Start  *string `json:"start"`
}

func namesReports(t *testing.T, p *testutil.Proc) []namesReport {
	t.Helper()
	var out []namesReport
	for _, l := range p.Lines {
		var r namesReport
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("bad report line %q: %v", l, err)
		}
		out = append(out, r)
	}
	return out
}

// TestSnapshotNamesStatesAndStacks runs snapshot on names.rb, whose
// threads have long, equal and no names, two of them busy (one in an
// ensure clause, killed): every thread's stack is read (a busy one that
// changed while read is read again), its state is Thread#status's word
// and its kernel state has a field of its own, its name is whole and says
// where it comes from; the text says the same, and exits 0.
func TestSnapshotNamesStatesAndStacks(t *testing.T) {
	testutil.NeedRoot(t) // rbscope reads a process that is not its child
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, "names.rb")
		want := namesReports(t, proc)
		pid := strconv.Itoa(proc.Pid)
		out, stderr, code := run(t, "snapshot", "--pid", pid, "--format", "json")
		if code != 0 {
			t.Fatalf("json: exit %d: %s", code, stderr)
		}
		var doc struct {
			Threads []stack.Thread `json:"threads"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		byTID := map[int]stack.Thread{}
		for _, th := range doc.Threads {
			byTID[th.TID] = th
		}
		for _, r := range want {
			th, ok := byTID[r.TID]
			if !ok {
				t.Errorf("thread %d (%v) missing", r.TID, r.Name)
				continue
			}
			if status, _ := r.Status.(string); th.State != status {
				t.Errorf("thread %d %q: state %q, Thread#status %v", r.TID, th.Name, th.State, r.Status)
			}
			if th.Error != "" || len(th.Frames) == 0 {
				t.Errorf("thread %d %q: stack not read: %q", r.TID, th.Name, th.Error)
			}
			if th.KernelState == "" || !strings.Contains("RSDTtZXI", th.KernelState) {
				t.Errorf("thread %d %q: kernel state %q", r.TID, th.Name, th.KernelState)
			}
			wantName, wantSource := r.Comm, stack.NameKernel
			switch {
			case r.Name != nil:
				wantName, wantSource = *r.Name, stack.NameRuby
			case !r.Main && r.Start != nil:
				wantName, wantSource = *r.Start, stack.NameStart
			}
			if th.Name != wantName || th.NameSource != wantSource {
				t.Errorf("thread %d: name %q from %q, want %q from %q", r.TID, th.Name, th.NameSource, wantName, wantSource)
			}
		}
		for i := 0; i < 5; i++ {
			text, stderr, code := run(t, "snapshot", "--pid", pid)
			if code != 0 || stderr != "" {
				t.Fatalf("text: exit %d: %s\n%s", code, stderr, text)
			}
			if strings.Contains(text, "(no Ruby frames)") || strings.Contains(text, "(stack ") {
				t.Fatalf("a thread without its stack:\n%s", text)
			}
			for _, r := range want {
				status, _ := r.Status.(string)
				re := regexp.MustCompile(fmt.Sprintf(`(?m)^Thread %d "([^"]*)"( \[[^]]*\])? \([^)]*status %s, `, r.TID, regexp.QuoteMeta(status)))
				m := re.FindStringSubmatch(text)
				switch {
				case m == nil:
					t.Fatalf("no line for thread %d with status %s:\n%s", r.TID, status, text)
				case r.Name != nil && (m[1] != *r.Name || m[2] != ""):
					t.Errorf("thread %d: %q%s, want Thread#name %q alone", r.TID, m[1], m[2], *r.Name)
				case r.Name == nil && m[2] == "":
					t.Errorf("thread %d %q: the text does not say where its name comes from", r.TID, m[1])
				}
			}
		}
	})
}

// TestSnapshotTextShowsUnreadStack: a thread whose stack could not be
// read says so and why in the text, one read in part says where it stops,
// and the snapshot's error carries exit status 3 and names the thread.
func TestSnapshotTextShowsUnreadStack(t *testing.T) {
	var b strings.Builder
	unread := stack.Thread{TID: 12, Name: "connection_poo*", NameSource: stack.NameKernel, State: "run", Activity: stack.ActivityRunning,
		Error: "read thread 0x1: inconsistent Ruby VM data: the stack changed while it was read"}
	part := stack.Thread{TID: 13, Name: "w", NameSource: stack.NameRuby, State: "sleep", Activity: stack.ActivityBlocked,
		Frames: []stack.Frame{{Name: "Kernel#sleep", Kind: stack.KindCFunc, Path: "/a.rb", Line: 2}}, Error: "frame 1: read iseq: unmapped"}
	fine := stack.Thread{TID: 14, Name: "ok", NameSource: stack.NameRuby, State: "sleep", Activity: stack.ActivityBlocked}
	for _, th := range []stack.Thread{unread, part, fine} {
		writeThread(&b, th)
	}
	text := b.String()
	for _, want := range []string{
		`Thread 12 "connection_poo*" [kernel's name, cut to 15 bytes if longer] (status run, activity running)`,
		"    (stack not read: read thread 0x1: inconsistent Ruby VM data: the stack changed while it was read)",
		"    Kernel#sleep (/a.rb:2)\n    (stack cut short: frame 1: read iseq: unmapped)",
		`Thread 14 "ok" (status sleep, activity blocked)` + "\n    (no Ruby frames)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	err := unreadError([]stack.Thread{fine, unread, part})
	if err == nil || exitCode(err) != exitUnread || !strings.Contains(err.Error(), `2 of 3 threads, first thread 12 "connection_poo*…"`) {
		t.Errorf("error %v (exit %d)", err, exitCode(err))
	}
	if err := unreadError([]stack.Thread{fine}); err != nil {
		t.Errorf("every stack read: %v", err)
	}
}
