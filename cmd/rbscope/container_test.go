package main

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/testutil"
)

// containerReport is one line of testdata/ruby/container.rb: Ruby's own
// view of a thread, inside its container.
type containerReport struct {
	Thread string `json:"thread"`
	TID    int    `json:"tid"` // in the container's PID namespace
	Pid    int    `json:"pid"`
	Frames []struct {
		Label string `json:"label"`
		Path  string `json:"path"`
		Line  int    `json:"line"`
	} `json:"frames"`
}

func containerReports(t *testing.T, c *testutil.Container) []containerReport {
	t.Helper()
	var out []containerReport
	for _, l := range c.Lines {
		var r containerReport
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("bad report line %q: %v", l, err)
		}
		out = append(out, r)
	}
	if len(out) != 2 {
		t.Fatalf("%d reports, want 2 (main and cart-worker): %q", len(out), c.Lines)
	}
	return out
}

// hostTIDs maps the container's thread ids to the host's, read from each
// thread's NSpid line (the truth the profiler's ids are checked against).
func hostTIDs(t *testing.T, pid int) map[int]int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[int]int{}
	for _, e := range ents {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
				f := strings.Fields(v)
				host, _ := strconv.Atoi(f[0])
				ns, _ := strconv.Atoi(f[len(f)-1])
				if len(f) < 2 || host == ns {
					t.Fatalf("thread %s of process %d: NSpid %q: not in a PID namespace of its own", e.Name(), pid, v)
				}
				m[ns] = host
			}
		}
	}
	return m
}

// wantContainerStack checks frames (innermost first, as rbscope gives
// them) against a report: Kernel#sleep innermost, then exactly the frames
// caller_locations gave, with the paths the container sees.
func wantContainerStack(t *testing.T, what string, frames []stack.Frame, r containerReport) {
	t.Helper()
	if len(frames) != len(r.Frames)+1 || frames[0].Name != "Kernel#sleep" {
		t.Errorf("%s: %d frames %v, want Kernel#sleep and the %d frames of caller_locations %+v", what, len(frames), frames, len(r.Frames), r.Frames)
		return
	}
	for i, w := range r.Frames {
		g := frames[i+1]
		// Ruby 3.4's labels are qualified (Shop::Cart#total), 3.3's
		// are not (total).
		if (g.Name != w.Label && unqualified(g.Name) != w.Label) || g.Path != w.Path || g.Line != w.Line {
			t.Errorf("%s: frame %d is %s (%s:%d), caller_locations has %s (%s:%d)", what, i+1, g.Name, g.Path, g.Line, w.Label, w.Path, w.Line)
		}
	}
}

// containerOptions runs rb in the container tests: Debian's Ruby is the
// rootfs's own (the same package, another build, at a path the host does
// not have); a build of scripts/rubies.sh runs with its prefix mounted at
// its own path (so its files are also at their paths on the host: the
// rootfs's Ruby is the one that tells them apart). The profiler's
// environment for rb is set.
func containerOptions(t *testing.T, rb testutil.RubyUnderTest) testutil.ContainerOptions {
	t.Helper()
	rb.SetProfilerEnv(t)
	if rb.IsSystem() {
		return testutil.ContainerOptions{}
	}
	mounts := []testutil.Mount{{Host: filepath.Dir(filepath.Dir(rb.Exe))}}
	// A copy of a build (3.4.5-stripped) keeps the original's prefix for
	// its standard library: mount that too.
	out, err := exec.Command(rb.Exe, "-e", `print RbConfig::CONFIG["prefix"]`).Output()
	if err != nil {
		t.Fatalf("%s: its prefix: %v", rb.Name, err)
	}
	if prefix := string(out); prefix != mounts[0].Host {
		mounts = append(mounts, testutil.Mount{Host: prefix})
	}
	return testutil.ContainerOptions{Exe: rb.Exe, Args: rb.Args, Mounts: mounts}
}

// TestSnapshotContainer runs snapshot from the host on a Ruby in a
// container (testutil.StartContainerRuby: its own PID and mount
// namespaces, a root file system whose Ruby binary and libruby are at
// paths the host does not have), on each Ruby under test: each thread's
// frames are the ones the script's caller_locations gave inside the
// container, with the paths it sees, its tid is the host's (not the
// container's, which names another process here), and the text names
// the container's interpreter. Debian's Ruby, the rootfs's own, must
// have been read from the container's files.
func TestSnapshotContainer(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		opts := containerOptions(t, rb)
		c := testutil.StartContainerRuby(t, "container.rb", opts)
		wantContainerSnapshot(t, c)
		exe := opts.Exe
		if exe == "" {
			exe = testutil.ContainerRuby
		}
		text, stderr, code := run(t, "snapshot", "--pid", strconv.Itoa(c.Pid))
		if code != 0 {
			t.Fatalf("text: exit %d: %s", code, stderr)
		}
		for _, want := range []string{"Process " + strconv.Itoa(c.Pid) + ": " + exe + "\n",
			"Shop::Cart#total (" + c.Script + ":", "block in Shop.checkout (" + c.Script + ":", "Shop.spin (" + c.Script + ":"} {
			if !strings.Contains(text, want) {
				t.Errorf("text lacks %q:\n%s", want, text)
			}
		}
		if rb.IsSystem() {
			wantContainerFiles(t, c)
		}
	})
}

// wantContainerFiles checks that rbscope read the rootfs Ruby's binaries
// in container c from the container's files.
func wantContainerFiles(t *testing.T, c *testutil.Container) {
	t.Helper()
	// inspect names the binaries by the container's paths, and read them
	// from the container's files (not from the image in memory, the
	// fallback when no file can be opened): the same build ids as the
	// rootfs's files.
	// As root rbscope opens them through /proc/PID/map_files; without
	// CAP_SYS_ADMIN (and CAP_CHECKPOINT_RESTORE) through /proc/PID/root,
	// checked against the mapping's inode and the image's build id.
	t.Run("map_files", func(t *testing.T) {
		wantContainerBinaries(t, c, binPath, "inspect", "--pid", strconv.Itoa(c.Pid), "--format", "json")
	})
	t.Run("proc_root", func(t *testing.T) {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			testutil.Missing(t, "setpriv (util-linux) to run rbscope without CAP_SYS_ADMIN")
		}
		const drop = "-sys_admin,-checkpoint_restore"
		wantContainerBinaries(t, c, setpriv, "--bounding-set", drop, "--inh-caps", drop, "--", binPath,
			"inspect", "--pid", strconv.Itoa(c.Pid), "--format", "json")
	})
}

// TestSnapshotContainerDebugFile runs, in a container, the stripped
// static Ruby of scripts/rubies.sh (3.3.8-static) whose DWARF is in a
// separate debug file that only the container has (in its
// /usr/lib/debug; rbscope is given no debug root): the layout comes from
// that file, found through /proc/PID/root, and the stacks are right.
func TestSnapshotContainerDebugFile(t *testing.T) {
	var rb testutil.RubyUnderTest
	for _, r := range testutil.Rubies(t) {
		if r.Build == "3.3.8-static" && r.DebugRoot != "" {
			rb = r
		}
	}
	if rb.Exe == "" {
		testutil.Missing(t, "Ruby 3.3.8-static with its debug file (scripts/rubies.sh build 3.3.8-static)")
	}
	prefix := filepath.Dir(filepath.Dir(rb.Exe))
	c := testutil.StartContainerRuby(t, "container.rb", testutil.ContainerOptions{
		Exe:    rb.Exe,
		Mounts: []testutil.Mount{{Host: prefix}, {Host: rb.DebugRoot, At: "/usr/lib/debug"}},
	})
	t.Setenv("RBSCOPE_CACHE_DIR", t.TempDir())
	t.Setenv("RBSCOPE_DEBUG_ROOT", "")
	out, stderr, code := run(t, "inspect", "--pid", strconv.Itoa(c.Pid), "--format", "json")
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	var doc struct {
		Ruby struct {
			LayoutSource string `json:"layout_source"`
			Binaries     []struct {
				BuildID string `json:"build_id"`
			} `json:"binaries"`
		} `json:"ruby"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Ruby.Binaries) == 0 {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	id := doc.Ruby.Binaries[0].BuildID
	if len(id) < 3 {
		t.Fatalf("no build id: %s", out)
	}
	rel := filepath.Join(".build-id", id[:2], id[2:]+".debug")
	if _, err := os.Stat(filepath.Join(rb.DebugRoot, rel)); err != nil {
		t.Fatalf("the debug root %s lacks %s: %v", rb.DebugRoot, rel, err)
	}
	if _, err := os.Stat(filepath.Join("/usr/lib/debug", rel)); err == nil {
		t.Fatalf("the host has /usr/lib/debug/%s: the test cannot tell where the debug file was found", rel)
	}
	if want := "dwarf:" + filepath.Join(fmt.Sprintf("/proc/%d/root/usr/lib/debug", c.Pid), rel); doc.Ruby.LayoutSource != want {
		t.Errorf("layout source %q, want %q", doc.Ruby.LayoutSource, want)
	}
	wantContainerSnapshot(t, c)
}

// wantContainerSnapshot checks snapshot --format json of container c
// against container.rb's reports: each reported thread under its host
// tid, its name, and its frames.
func wantContainerSnapshot(t *testing.T, c *testutil.Container) {
	t.Helper()
	reports := containerReports(t, c)
	tids := hostTIDs(t, c.Pid)
	out, stderr, code := run(t, "snapshot", "--pid", strconv.Itoa(c.Pid), "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var doc struct {
		Pid     int            `json:"pid"`
		Version string         `json:"ruby_version"`
		Threads []stack.Thread `json:"threads"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if doc.Pid != c.Pid || doc.Version == "" || len(doc.Threads) != 3 {
		t.Fatalf("pid %d, version %q, %d threads; want pid %d and 3 threads:\n%s", doc.Pid, doc.Version, len(doc.Threads), c.Pid, out)
	}
	byTID := map[int]stack.Thread{}
	for _, th := range doc.Threads {
		byTID[th.TID] = th
	}
	for _, r := range reports {
		if r.Pid != 1 {
			t.Errorf("%s: the script's pid is %d in its container, want 1", r.Thread, r.Pid)
		}
		host, ok := tids[r.TID]
		if !ok {
			t.Fatalf("%s: no thread of process %d has container tid %d", r.Thread, c.Pid, r.TID)
		}
		th, ok := byTID[host]
		if !ok {
			t.Errorf("%s: no thread with host tid %d (container tid %d) in the snapshot:\n%s", r.Thread, host, r.TID, out)
			continue
		}
		if (r.Thread == "main") != th.Main || (r.Thread != "main" && th.Name != r.Thread) {
			t.Errorf("thread %d: name %q main %v, want %q", host, th.Name, th.Main, r.Thread)
		}
		if th.KernelState == "" {
			t.Errorf("%s: no kernel state: the host's /proc was not read for tid %d", r.Thread, host)
		}
		wantContainerStack(t, r.Thread, th.Frames, r)
	}
}

// wantContainerBinaries runs inspect (the command prog args) and checks
// that it read the container's Ruby binaries from the container's files.
func wantContainerBinaries(t *testing.T, c *testutil.Container, prog string, args ...string) {
	t.Helper()
	cmd := exec.Command(prog, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %v: %s", args, err, stderr.String())
	}
	insp := string(out)
	var idoc struct {
		Ruby struct {
			Binaries []struct {
				Path      string `json:"path"`
				BuildID   string `json:"build_id"`
				SymSource string `json:"symbol_source"`
				FileError string `json:"file_error"`
			} `json:"binaries"`
		} `json:"ruby"`
	}
	if err := json.Unmarshal([]byte(insp), &idoc); err != nil {
		t.Fatalf("inspect: not JSON: %v\n%s", err, insp)
	}
	paths := map[string]bool{}
	for _, b := range idoc.Ruby.Binaries {
		paths[b.Path] = true
		if _, err := os.Stat(b.Path); err == nil {
			t.Errorf("binary %s: the host has a file at the container's path, the test cannot tell them apart", b.Path)
		}
		want := elfBuildID(t, filepath.Join(c.Rootfs, b.Path))
		if !strings.HasPrefix(b.SymSource, "file ") || b.FileError != "" || b.BuildID != want {
			t.Errorf("binary %s: symbols from %q (%s), build id %s; want the container's file, build id %s", b.Path, b.SymSource, b.FileError, b.BuildID, want)
		}
	}
	if !paths[testutil.ContainerRuby] || len(paths) != 2 {
		t.Errorf("inspect names binaries %v, want %s and the container's libruby", paths, testutil.ContainerRuby)
	}
}

// elfBuildID is the GNU build id of the ELF file at path.
func elfBuildID(t *testing.T, path string) string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sec := f.Section(".note.gnu.build-id")
	if sec == nil {
		t.Fatalf("%s has no build id note", path)
	}
	b, err := sec.Data()
	// namesz, descsz, type, "GNU\x00", then the id.
	if err != nil || len(b) < 16 {
		t.Fatalf("%s: build id note: %v", path, err)
	}
	return hex.EncodeToString(b[16 : 16+binary.LittleEndian.Uint32(b[4:])])
}

// TestRecordContainer records the containerised Ruby from the host, on
// each Ruby under test, in blocking mode (the holder of the GVL is paused
// by its host tid) and nonblocking: every sample of the sleeping threads
// is exactly its caller_locations stack, the spinner's samples are in
// Shop.spin, all under the host's tids.
func TestRecordContainer(t *testing.T) {
	testutil.EachRuby(t, testRecordContainer)
}

func testRecordContainer(t *testing.T, rb testutil.RubyUnderTest) {
	c := testutil.StartContainerRuby(t, "container.rb", containerOptions(t, rb))
	reports := containerReports(t, c)
	tids := hostTIDs(t, c.Pid)
	byHost := map[int]containerReport{}
	for _, r := range reports {
		byHost[tids[r.TID]] = r
	}
	for _, mode := range []string{"blocking", "nonblocking"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			raw := filepath.Join(dir, "rec.raw.gz")
			args := []string{"record", "--pid", strconv.Itoa(c.Pid), "--duration", "1s", "--raw", raw, "-f", "summary", "-o", filepath.Join(dir, "summary.txt")}
			if mode == "nonblocking" {
				args = append(args, "--nonblocking")
			}
			if _, stderr, code := run(t, args...); code != 0 {
				t.Fatalf("record: exit %d: %s", code, stderr)
			}
			folded, stderr, code := run(t, "report", "--input", raw, "--format", "collapsed", "--lines", "--threads", "-o", "-")
			if code != 0 {
				t.Fatalf("report: exit %d: %s", code, stderr)
			}
			spins, samples := 0, 0
			for _, line := range strings.Split(strings.TrimSpace(folded), "\n") {
				i := strings.LastIndexByte(line, ' ')
				n, err := strconv.Atoi(line[i+1:])
				if i < 0 || err != nil {
					t.Fatalf("bad collapsed line %q", line)
				}
				samples += n
				frames := strings.Split(line[:i], ";")
				var tid int
				if _, err := fmt.Sscanf(frames[0][strings.LastIndexByte(frames[0], '(')+1:], "%d)", &tid); err != nil {
					t.Fatalf("no tid in %q", frames[0])
				}
				if r, ok := byHost[tid]; ok {
					// Outermost first, after the thread; C functions
					// (Array#each) have no place of their own.
					got := frames[1:]
					ok := len(got) == len(r.Frames)+1 && got[len(got)-1] == "Kernel#sleep"
					for j := 0; ok && j < len(r.Frames); j++ {
						// Ruby 3.4's labels are qualified, 3.3's not.
						w, g := r.Frames[len(r.Frames)-1-j], got[j]
						want := fmt.Sprintf("%s (%s:%d)", w.Label, w.Path, w.Line)
						ok = g == want || unqualified(g) == want ||
							!strings.HasSuffix(g, ")") && (g == w.Label || unqualified(g) == w.Label)
					}
					if !ok {
						t.Errorf("%s (host tid %d): %d samples of\n  %s\nwant Kernel#sleep under %+v", r.Thread, tid, n, strings.Join(got, ";"), r.Frames)
					}
					continue
				}
				if _, ok := hostThread(tids, tid); !ok {
					t.Errorf("samples under tid %d, which is no host tid of process %d (%v): %q", tid, c.Pid, tids, line)
					continue
				}
				if strings.Contains(line, "Shop.spin ("+c.Script+":") {
					spins += n
				}
			}
			if samples < 50 || spins < samples/10 {
				t.Errorf("%d samples, %d in Shop.spin (%s); want at least 50 and a tenth:\n%s", samples, spins, c.Script, folded)
			}
		})
	}
}

// hostThread reports whether host is one of the host tids in tids.
func hostThread(tids map[int]int, host int) (int, bool) {
	for ns, h := range tids {
		if h == host {
			return ns, true
		}
	}
	return 0, false
}

// TestAllocContainer counts, from the host in exact mode, the allocations
// of internal/alloc's workload run by a Ruby in a container: the eBPF
// probes attach to the container's libruby (a path the host does not
// have), every Widget and Gadget the workload makes is counted, at the
// line of the workload's file as the container names it.
func TestAllocContainer(t *testing.T) {
	allocNeedRoot(t)
	const n = 3000
	c := testutil.StartContainerRuby(t, filepath.Join(testutil.RepoRoot(t), "internal", "alloc", "testdata", "alloc.rb"),
		testutil.ContainerOptions{}, strconv.Itoa(n))
	t.Setenv("RBSCOPE_CACHE_DIR", t.TempDir())
	out := filepath.Join(t.TempDir(), "alloc.json")
	cmd := exec.Command(binPath, "alloc", "--pid", strconv.Itoa(c.Pid), "--exact", "--format", "json", "-o", out)
	errb := newAttachedWriter()
	cmd.Stderr = errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	errb.wait(t, 30*time.Second)
	if _, err := io.WriteString(c.Stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	c.Expect(t, "done")
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("rbscope alloc: %v\n%s", err, errb.String())
	}
	if !strings.Contains(errb.String(), "/opt/ct/lib/libruby") {
		t.Errorf("rbscope alloc did not say it attached to the container's libruby:\n%s", errb.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		ByClass []struct {
			Class string `json:"class"`
			Count int64  `json:"count"`
		} `json:"by_class"`
		BySite []struct {
			Class string `json:"class"`
			Path  string `json:"path"`
			Line  int    `json:"line"`
			Count int64  `json:"count"`
		} `json:"by_site"`
		TopStacks []struct {
			Class  string        `json:"class"`
			Frames []stack.Frame `json:"frames"`
		} `json:"top_stacks"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	// The sampled stacks are named by the walker, matched to the
	// kernel's (host) thread id of each allocation: one in the workload
	// is its block, Integer#times and work at one line of work.rb, under
	// the script's main.
	inWork := regexp.MustCompile(`block in Object#work \(/app/work\.rb:(\d+)\);Integer#times \(/app/work\.rb:(\d+)\);Object#work \(/app/work\.rb:(\d+)\);<main> \(/app/alloc\.rb:\d+\)$`)
	named := 0
	for _, st := range doc.TopStacks {
		var fs []string
		for _, f := range st.Frames {
			fs = append(fs, fmt.Sprintf("%s (%s:%d)", f.Name, f.Path, f.Line))
		}
		if m := inWork.FindStringSubmatch(strings.Join(fs, ";")); m != nil && m[1] == m[2] && m[2] == m[3] {
			named++
		}
	}
	if named == 0 {
		t.Errorf("no sampled stack names work.rb's frames as the container sees them: %+v", doc.TopStacks)
	}
	classes := map[string]int64{}
	for _, cc := range doc.ByClass {
		classes[cc.Class] = cc.Count
	}
	sites := map[string]int64{}
	for _, s := range doc.BySite {
		sites[fmt.Sprintf("%s:%d:%s", s.Path, s.Line, s.Class)] = s.Count
	}
	// The lines of internal/alloc/testdata/work.rb.
	for _, w := range []struct {
		class string
		line  int
		want  int64
	}{{"Widget", 9, n}, {"Gadget", 10, 2 * n}, {"Outer::Inner", 11, n / 2}} {
		if classes[w.class] != w.want {
			t.Errorf("class %s: %d allocations, want %d", w.class, classes[w.class], w.want)
		}
		if site := fmt.Sprintf("/app/work.rb:%d:%s", w.line, w.class); sites[site] != w.want {
			t.Errorf("site %s: %d allocations, want %d (sites %v)", site, sites[site], w.want, sites)
		}
	}
}
