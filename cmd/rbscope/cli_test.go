package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/testutil"
)

var binPath string

// TestMain builds the rbscope binary once, so the CLI is tested as users
// run it: exit codes, stdout, one-line errors on stderr.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rbscope-cli")
	if err != nil {
		panic(err)
	}
	binPath = filepath.Join(dir, "rbscope")
	out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
	if err != nil {
		os.Stderr.Write(out)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// oneLineError asserts a failed run printed exactly one line on stderr
// that contains want.
func oneLineError(t *testing.T, stderr string, code int, want string) {
	t.Helper()
	if code == 0 {
		t.Errorf("exit code 0, want non-zero")
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) != 1 || !strings.Contains(stderr, want) || strings.Contains(stderr, "panic") {
		t.Errorf("stderr %q, want one line containing %q", stderr, want)
	}
}

// wantLayoutSource says where rb's struct offsets must come from: its
// DWARF when it has some, else the built-in table of its version.
func wantLayoutSource(t *testing.T, rb testutil.RubyUnderTest, got string) {
	t.Helper()
	if rb.HasDWARF {
		if !strings.HasPrefix(got, "dwarf:") {
			t.Errorf("layout source %q, want dwarf:<file> (%s has DWARF)", got, rb.Name)
		}
		return
	}
	if got != "builtin:"+rb.Version {
		t.Errorf("layout source %q, want builtin:%s", got, rb.Version)
	}
}

func TestSnapshotJSONContract(t *testing.T) {
	testutil.EachRuby(t, testSnapshotJSONContract)
}

func testSnapshotJSONContract(t *testing.T, rb testutil.RubyUnderTest) {
	rb.SetProfilerEnv(t)
	proc := rb.Start(t, "stacks.rb", "threads")
	out, stderr, code := run(t, "snapshot", "--pid", strconv.Itoa(proc.Pid), "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if int(doc["pid"].(float64)) != proc.Pid || doc["ruby_version"] != rb.Version {
		t.Errorf("header: pid %v version %v, want %d %s", doc["pid"], doc["ruby_version"], proc.Pid, rb.Version)
	}
	src, _ := doc["layout_source"].(string)
	wantLayoutSource(t, rb, src)
	threads := doc["threads"].([]any)
	if len(threads) != 4 {
		t.Fatalf("%d threads", len(threads))
	}
	for _, th := range threads {
		m := th.(map[string]any)
		for _, k := range []string{"tid", "name", "main", "gvl", "state", "frames"} {
			if _, ok := m[k]; !ok {
				t.Errorf("thread lacks %q: %v", k, m)
			}
		}
		for _, f := range m["frames"].([]any) {
			fm := f.(map[string]any)
			for _, k := range []string{"name", "path", "line", "kind"} {
				if _, ok := fm[k]; !ok {
					t.Errorf("frame lacks %q: %v", k, fm)
				}
			}
		}
	}
	text, _, code := run(t, "snapshot", "--pid", strconv.Itoa(proc.Pid))
	if code != 0 || !strings.Contains(text, `"alpha-worker"`) || !strings.Contains(text, "Outer::Inner#level3 (") {
		t.Errorf("text snapshot:\n%s", text)
	}
}

func TestBadInput(t *testing.T) {
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	dir := t.TempDir()
	trunc := filepath.Join(dir, "trunc.core")
	os.WriteFile(trunc, []byte("\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00>\x00"), 0o644)
	junk := filepath.Join(dir, "junk.core")
	os.WriteFile(junk, bytes.Repeat([]byte{0xAB}, 4096), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no target", []string{"snapshot"}, "give --pid PID or --core FILE"},
		{"no such pid", []string{"snapshot", "--pid", "999999"}, "does not exist"},
		{"not ruby", []string{"snapshot", "--pid", strconv.Itoa(sleeper.Process.Pid)}, "not a Ruby process"},
		{"truncated core", []string{"snapshot", "--core", trunc}, trunc},
		{"junk core", []string{"snapshot", "--core", junk}, "not an ELF core file"},
		{"missing core", []string{"snapshot", "--core", filepath.Join(dir, "nope")}, "nope"},
		{"bad format", []string{"snapshot", "--pid", "1", "--format", "xml"}, "unknown format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := run(t, tc.args...)
			oneLineError(t, stderr, code, tc.want)
		})
	}
}

func TestSnapshotCore(t *testing.T) {
	shared := testutil.SharedDir(t)
	out, stderr, code := run(t, "snapshot", "--core", filepath.Join(shared, "testdata", "coredumps", "ruby-coredump-2.4.0.gz"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"Ruby 2.4.0", "Kernel#sleep", "Object#aaa (/home/bork/work/rbspy/ci/ruby-programs/infinite.rb:2)", "block in <main>"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestInspect(t *testing.T) {
	testutil.EachRuby(t, testInspect)
}

func testInspect(t *testing.T, rb testutil.RubyUnderTest) {
	rb.SetProfilerEnv(t)
	proc := rb.Start(t, "stacks.rb", "nested")
	out, stderr, code := run(t, "inspect", "--pid", strconv.Itoa(proc.Pid), "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var doc struct {
		Ruby struct {
			Version        string            `json:"ruby_version"`
			LayoutSource   string            `json:"layout_source"`
			AddressSources map[string]string `json:"address_sources"`
			Binaries       []struct {
				Path    string `json:"path"`
				BuildID string `json:"build_id"`
			} `json:"binaries"`
		} `json:"ruby"`
		Threads int `json:"threads"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Ruby.Version != rb.Version || doc.Threads != 2 || len(doc.Ruby.Binaries) == 0 || doc.Ruby.Binaries[0].BuildID == "" {
		t.Errorf("inspect: %+v", doc)
	}
	wantLayoutSource(t, rb, doc.Ruby.LayoutSource)
	if doc.Ruby.AddressSources["ruby_current_vm_ptr"] == "" || doc.Ruby.AddressSources["ruby_global_symbols"] == "" {
		t.Errorf("address sources: %v", doc.Ruby.AddressSources)
	}
}
