package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/klauspost/compress/zstd"

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
	owners := 0
	for _, th := range threads {
		m := th.(map[string]any)
		for _, k := range []string{"tid", "name", "main", "gvl", "state", "activity", "frames"} {
			if _, ok := m[k]; !ok {
				t.Errorf("thread lacks %q: %v", k, m)
			}
		}
		switch m["activity"] {
		case "running", "gvl_wait", "blocked", "gc":
		default:
			t.Errorf("thread %v: activity %v", m["name"], m["activity"])
		}
		if m["gvl"] == true {
			owners++
			if fr := m["frames"].([]any); len(fr) > 0 && fr[0].(map[string]any)["name"] == "Kernel#sleep" {
				t.Errorf("thread %v in Kernel#sleep has the GVL", m["name"])
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
	if owners > 1 {
		t.Errorf("%d threads have the GVL", owners)
	}
	text, _, code := run(t, "snapshot", "--pid", strconv.Itoa(proc.Pid))
	if code != 0 || !strings.Contains(text, `"alpha-worker"`) || !strings.Contains(text, "Outer::Inner#level3 (") || !strings.Contains(text, "activity blocked") {
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
	text := filepath.Join(dir, "six.txt")
	os.WriteFile(text, []byte("hello\n"), 0o644)
	// 64 MiB of zeros, zstd-compressed (systemd-coredump's format) and
	// gzip'd: refused once their first bytes are decompressed.
	zeros := make([]byte, 64<<20)
	zst := filepath.Join(dir, "zeros.zst")
	zw, _ := zstd.NewWriter(nil)
	os.WriteFile(zst, zw.EncodeAll(zeros, nil), 0o644)
	zw.Close()
	var gz bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(zeros)
	gw.Close()
	gzPath := filepath.Join(dir, "zeros.gz")
	os.WriteFile(gzPath, gz.Bytes(), 0o644)
	randZst := filepath.Join(dir, "random.zst")
	os.WriteFile(randZst, append([]byte{0x28, 0xb5, 0x2f, 0xfd}, bytes.Repeat([]byte{0x9c, 0x41, 0xe7, 0x03}, 1000)...), 0o644)
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
		{"zstd of zeros", []string{"snapshot", "--core", zst}, zst + " is zstd-compressed, but what it holds is not an ELF core file"},
		{"gzip of zeros", []string{"snapshot", "--core", gzPath}, gzPath + " is gzip-compressed, but what it holds is not an ELF core file"},
		{"random zstd", []string{"snapshot", "--core", randZst}, "the zstd-compressed core " + randZst + " is corrupt"},
		{"alloc not ruby", []string{"alloc", "--pid", strconv.Itoa(sleeper.Process.Pid), "--duration", "1s"}, "not a Ruby process"},
		{"rate 0", []string{"record", "--pid", "1", "--rate", "0"}, "--rate 0: give a rate above 0 and at most 20000 samples per second"},
		{"rate 1e6", []string{"record", "--pid", "1", "--rate", "1000000"}, "--rate 1000000: give a rate above 0"},
		{"rate NaN", []string{"record", "--pid", "1", "--rate", "NaN"}, "--rate NaN: give a rate above 0"},
		{"duration 0", []string{"record", "--pid", "1", "--duration", "0s"}, "--duration 0s: give a positive duration"},
		{"alloc duration 0", []string{"alloc", "--pid", "1", "--duration", "0"}, "--duration 0s: give a positive duration"},
		{"report of a text file", []string{"report", "--input", text}, "not an rbscope recording"},
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
			GVLSource      string            `json:"gvl_source"`
			GCSource       string            `json:"gc_source"`
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
	// Every Ruby under test has the GVL owner and GC flags: from DWARF, or
	// derived / found by shape for table-only builds.
	if !strings.Contains(doc.Ruby.GVLSource, "rb_ractor_struct.threads.") || !strings.Contains(doc.Ruby.GVLSource, "waiting threads") {
		t.Errorf("gvl_source %q", doc.Ruby.GVLSource)
	}
	wantGC := "scan:"
	if rb.HasDWARF {
		wantGC = "dwarf:"
	}
	if !strings.HasPrefix(doc.Ruby.GCSource, wantGC) {
		t.Errorf("gc_source %q, want %s...", doc.Ruby.GCSource, wantGC)
	}
	text, _, _ := run(t, "inspect", "--pid", strconv.Itoa(proc.Pid))
	if !strings.Contains(text, "GVL owner:     "+doc.Ruby.GVLSource) || !strings.Contains(text, "GC state:      "+doc.Ruby.GCSource) {
		t.Errorf("text inspect lacks the GVL and GC sources:\n%s", text)
	}
	if doc.Ruby.AddressSources["ruby_current_vm_ptr"] == "" || doc.Ruby.AddressSources["ruby_global_symbols"] == "" {
		t.Errorf("address sources: %v", doc.Ruby.AddressSources)
	}
}

// TestRecordActivity: record's modes and activity outputs on a process
// with threads in every activity (contention.rb): wall mode keeps every
// thread with (waiting for GVL) frames on the spinners; --mode gvl keeps
// only the GVL's owner (never the sleeper or the reader, never a GVL wait);
// --threads roots each collapsed stack at its thread; pprof samples carry
// the thread_name and activity labels.
func TestRecordActivity(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		proc := rb.Start(t, "contention.rb")
		pid := strconv.Itoa(proc.Pid)
		dir := t.TempDir()
		rec := func(args ...string) string {
			t.Helper()
			out := filepath.Join(dir, strings.Join(args, "_")+".out")
			_, stderr, code := run(t, append([]string{"record", "--pid", pid, "--duration", "2s", "--silent", "-o", out}, args...)...)
			if code != 0 {
				t.Fatalf("record %v: exit %d: %s", args, code, stderr)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		threadsOf := func(collapsed string) map[string]int {
			got := map[string]int{}
			for _, l := range strings.Split(strings.TrimSpace(collapsed), "\n") {
				if !strings.HasPrefix(l, "thread ") {
					t.Fatalf("line not rooted at its thread: %q", l)
				}
				name := strings.SplitN(strings.TrimPrefix(l, "thread "), " (", 2)[0]
				n, _ := strconv.Atoi(l[strings.LastIndex(l, " ")+1:])
				got[name] += n
				if strings.Contains(l, "(waiting for GVL)") {
					got[name+" waiting"] += n
				}
			}
			return got
		}
		wall := threadsOf(rec("--format", "collapsed", "--threads"))
		for _, name := range []string{"spin-0", "spin-1", "reader", "sleeper"} {
			if wall[name] == 0 {
				t.Errorf("wall mode: no samples of %s (%v)", name, wall)
			}
		}
		if wall["spin-0 waiting"]+wall["spin-1 waiting"] == 0 || wall["sleeper waiting"] != 0 {
			t.Errorf("wall mode: GVL waits %v", wall)
		}
		gvl := threadsOf(rec("--format", "collapsed", "--threads", "--mode", "gvl"))
		if gvl["spin-0"]+gvl["spin-1"] == 0 || gvl["reader"] != 0 || gvl["sleeper"] != 0 || gvl["spin-0 waiting"]+gvl["spin-1 waiting"] != 0 {
			t.Errorf("gvl mode keeps %v, want the spinners' owned samples only", gvl)
		}
		p, err := profile.ParseData([]byte(rec("--format", "pprof")))
		if err != nil {
			t.Fatal(err)
		}
		acts := map[string]int64{}
		for _, s := range p.Sample {
			if len(s.Label["thread_name"]) != 1 || len(s.Label["activity"]) != 1 {
				t.Fatalf("pprof sample labels %v", s.Label)
			}
			acts[s.Label["thread_name"][0]+" "+s.Label["activity"][0]] += s.Value[0]
		}
		// Which spinner holds the GVL over two seconds is up to Ruby's
		// scheduler: between them, both activities appear.
		running := acts["spin-0 running"] + acts["spin-1 running"]
		waiting := acts["spin-0 gvl_wait"] + acts["spin-1 gvl_wait"]
		if acts["reader blocked"] == 0 || running == 0 || waiting == 0 || acts["sleeper running"] != 0 {
			t.Errorf("pprof activity labels %v", acts)
		}
	})
}

// TestRecordNoGC: --no-gc leaves out the GC frames, while the summary's
// per-thread shares still count the GC samples.
func TestRecordNoGC(t *testing.T) {
	testutil.NeedRoot(t)
	rb := testutil.SystemRuby(t)
	rb.SetProfilerEnv(t)
	res := filepath.Join(t.TempDir(), "gc.json")
	proc := rb.Start(t, "gcshare.rb", res, "3")
	for _, noGC := range []bool{false, true} {
		out := filepath.Join(t.TempDir(), "summary.txt")
		args := []string{"record", "--pid", strconv.Itoa(proc.Pid), "--duration", "1s", "--silent", "--format", "summary", "-o", out}
		if noGC {
			args = append(args, "--no-gc")
		}
		_, stderr, code := run(t, args...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		b, _ := os.ReadFile(out)
		s := string(b)
		hasFrames := strings.Contains(s, "(garbage collection)")
		row := regexp.MustCompile(`(?m)^\s+\d+\s+[\d.]+%\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)%\s+ruby \(pid`).FindStringSubmatch(s)
		if row == nil {
			t.Fatalf("no activity row for the main thread:\n%s", s)
		}
		gc, _ := strconv.ParseFloat(row[1], 64)
		if gc == 0 || hasFrames == noGC {
			t.Errorf("--no-gc=%v: GC share %.1f%%, GC frames shown %v:\n%s", noGC, gc, hasFrames, s)
		}
	}
}
