package testutil

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// RubyUnderTest is one Ruby the live tests run against: Debian's own, and
// the builds scripts/rubies.sh makes (3.3.8 static with its DWARF in a
// separate debug file or none at all; 3.4.5 shared with DWARF, run with
// and without YJIT, and a copy of it with its libruby stripped as
// distributions ship it). 3.3.8 shared with DWARF (and -yjit) joins only
// when RBSCOPE_TEST_RUBIES names it, outside CI.
type RubyUnderTest struct {
	// Name identifies the configuration in subtest names:
	// "system", "3.3.8", "3.3.8-yjit", "3.3.8-static", "3.3.8-static-nodebug",
	// "3.4.5", "3.4.5-yjit", "3.4.5-stripped".
	Name string
	// Exe is the ruby executable.
	Exe string
	// Args go before the script (e.g. "--yjit").
	Args []string
	// Version is RUBY_VERSION as the executable reports it.
	Version string
	// Build is the scripts/rubies.sh build name ("" for Debian's Ruby).
	Build string
	// YJIT is true when the process runs with --yjit.
	YJIT bool
	// Shared is true when the VM lives in libruby.so, false when it is
	// inside the executable.
	Shared bool
	// DebugRoot is the debug-file root that holds this build's separate
	// DWARF, to give rbscope as RBSCOPE_DEBUG_ROOT ("" for none).
	DebugRoot string
	// HasDWARF is true when rbscope can find DWARF for the VM (in the
	// binary or through DebugRoot).
	HasDWARF bool
}

// String returns the configuration's name.
func (r RubyUnderTest) String() string { return r.Name }

// IsSystem reports whether this is the distribution's Ruby, the only one
// with the reference gems (ruby-stackprof, ruby-memory-profiler) installed.
func (r RubyUnderTest) IsSystem() bool { return r.Build == "" }

// Command returns an exec.Cmd running this Ruby with its Args, then args.
func (r RubyUnderTest) Command(args ...string) *exec.Cmd {
	return exec.Command(r.Exe, append(append([]string{}, r.Args...), args...)...)
}

// Argv returns the command line that runs this Ruby with args, for
// launch-mode tests (`rbscope record -- ARGV...`).
func (r RubyUnderTest) Argv(args ...string) []string {
	return append(append([]string{r.Exe}, r.Args...), args...)
}

// ProfilerEnv returns the environment rbscope needs for this Ruby
// (RBSCOPE_DEBUG_ROOT, and a private layout cache so that one
// configuration's DWARF layout never serves another), for running the CLI.
func (r RubyUnderTest) ProfilerEnv(t testing.TB) []string {
	t.Helper()
	return append(os.Environ(), "RBSCOPE_DEBUG_ROOT="+r.DebugRoot, "RBSCOPE_CACHE_DIR="+t.TempDir())
}

// SetProfilerEnv sets ProfilerEnv's variables in this test's own process,
// for tests that call the library directly. Not for parallel tests.
func (r RubyUnderTest) SetProfilerEnv(t *testing.T) {
	t.Helper()
	t.Setenv("RBSCOPE_DEBUG_ROOT", r.DebugRoot)
	t.Setenv("RBSCOPE_CACHE_DIR", t.TempDir())
}

var rubies struct {
	once sync.Once
	list []RubyUnderTest
	errs []string
}

// Rubies lists every Ruby under test that is there. Debian's Ruby must be
// installed (scripts/install-deps.sh); the builds come from
// scripts/rubies.sh, which scripts/test.sh runs first. When one is missing,
// Rubies stops the test (see Missing) unless the others can go on: under
// CI every one must be there, elsewhere the missing ones are skipped.
func Rubies(t testing.TB) []RubyUnderTest {
	t.Helper()
	rubies.once.Do(loadRubies)
	if len(rubies.errs) > 0 && (InCI() || len(rubies.list) == 0) {
		Missing(t, "%s", strings.Join(rubies.errs, "; "))
	}
	return rubies.list
}

// SystemRuby returns Debian's Ruby (stopping the test when it is missing).
func SystemRuby(t testing.TB) RubyUnderTest {
	t.Helper()
	rubies.once.Do(loadRubies)
	for _, r := range rubies.list {
		if r.IsSystem() {
			return r
		}
	}
	Missing(t, "Debian's ruby (scripts/install-deps.sh installs it)")
	return RubyUnderTest{}
}

// EachRuby runs f as a subtest for every Ruby under test; a Ruby that is
// missing is a subtest of its own that fails under CI and skips elsewhere.
// Outside CI, RBSCOPE_TEST_RUBIES (names, comma-separated: "3.4.5,system")
// narrows the run to those Rubies, for working on one (and brings in the
// 3.3.8 shared build, not in CI's list); CI ignores it.
func EachRuby(t *testing.T, f func(t *testing.T, rb RubyUnderTest)) {
	t.Helper()
	rubies.once.Do(loadRubies)
	for _, e := range rubies.errs {
		e := e
		t.Run("missing", func(t *testing.T) { Missing(t, "%s", e) })
	}
	only := map[string]bool{}
	if v := os.Getenv("RBSCOPE_TEST_RUBIES"); v != "" && !InCI() {
		for _, n := range strings.Split(v, ",") {
			only[strings.TrimSpace(n)] = true
		}
	}
	for _, rb := range rubies.list {
		rb := rb
		if len(only) > 0 && !only[rb.Name] {
			continue
		}
		t.Run(rb.Name, func(t *testing.T) { f(t, rb) })
	}
}

func loadRubies() {
	if p, err := exec.LookPath("ruby"); err == nil {
		if v, err := rubyVersion(p); err == nil {
			rubies.list = append(rubies.list, RubyUnderTest{Name: "system", Exe: p, Version: v, Shared: true})
		} else {
			rubies.errs = append(rubies.errs, fmt.Sprintf("Debian's ruby at %s does not run: %v", p, err))
		}
	} else {
		rubies.errs = append(rubies.errs, "Debian's ruby (scripts/install-deps.sh installs it)")
	}
	root, err := repoRoot()
	if err != nil {
		rubies.errs = append(rubies.errs, err.Error())
		return
	}
	script := filepath.Join(root, "scripts", "rubies.sh")
	// CI's list is the script's (what `build` makes by default).
	out, err := exec.Command(script, "list").Output()
	if err != nil {
		rubies.errs = append(rubies.errs, fmt.Sprintf("list the suite's Rubies (%s list): %v", script, err))
		return
	}
	builds := strings.Fields(string(out))
	named := strings.Split(os.Getenv("RBSCOPE_TEST_RUBIES"), ",")
	// Not in CI's list: named by hand to work on them.
	if !InCI() && slices.ContainsFunc(named, func(n string) bool { return n == "3.3.8" || n == "3.3.8-yjit" }) {
		builds = append([]string{"3.3.8"}, builds...)
	}
	for _, build := range builds {
		prefix, err := builtPrefix(script, build)
		if err != nil {
			rubies.errs = append(rubies.errs, fmt.Sprintf("Ruby %s from scripts/rubies.sh (run `scripts/rubies.sh build %s`): %v", build, build, err))
			continue
		}
		exe := filepath.Join(prefix, "bin", "ruby")
		v, err := rubyVersion(exe)
		if err != nil {
			rubies.errs = append(rubies.errs, fmt.Sprintf("Ruby %s at %s does not run: %v", build, exe, err))
			continue
		}
		base := RubyUnderTest{Exe: exe, Version: v, Build: build}
		if build == "3.3.8-static" {
			out, err := exec.Command(script, "debugroot", build).Output()
			if err != nil {
				rubies.errs = append(rubies.errs, fmt.Sprintf("debug root of %s: %v", build, err))
				continue
			}
			withDebug := base
			withDebug.Name, withDebug.DebugRoot, withDebug.HasDWARF = build, strings.TrimSpace(string(out)), true
			noDebug := base
			noDebug.Name = build + "-nodebug"
			rubies.list = append(rubies.list, withDebug, noDebug)
			continue
		}
		if strings.HasSuffix(build, "-stripped") {
			// libruby stripped as distributions ship it, no debug file.
			base.Name, base.Shared = build, true
			rubies.list = append(rubies.list, base)
			continue
		}
		base.Shared, base.HasDWARF = true, true
		plain := base
		plain.Name = build
		yjit := base
		yjit.Name, yjit.Args, yjit.YJIT = build+"-yjit", []string{"--yjit"}, true
		rubies.list = append(rubies.list, plain, yjit)
	}
}

// builtPrefix returns the prefix of a finished scripts/rubies.sh build,
// without building: tests never start an 8-minute build themselves.
func builtPrefix(script, build string) (string, error) {
	dir := os.Getenv("RBSCOPE_RUBIES_DIR")
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(cache, "rbscope", "rubies")
	}
	prefix := filepath.Join(dir, build)
	if _, err := os.Stat(filepath.Join(prefix, ".rbscope-built")); err != nil {
		return "", fmt.Errorf("not built in %s", prefix)
	}
	return prefix, nil
}

func rubyVersion(exe string) (string, error) {
	out, err := exec.Command(exe, "-e", "print RUBY_VERSION").Output()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above %s", dir)
		}
		dir = parent
	}
}

// Start runs this Ruby on script (relative to testdata/ruby unless
// absolute) with args, waits until it prints a line "ready" (up to 30 s),
// and kills its process group when the test ends.
func (r RubyUnderTest) Start(t testing.TB, script string, args ...string) *Proc {
	t.Helper()
	if !filepath.IsAbs(script) {
		script = filepath.Join(RepoRoot(t), "testdata", "ruby", script)
	}
	return r.StartCmd(t, r.Command(append([]string{script}, args...)...))
}

// StartSource runs this Ruby, as Start does, on the Ruby source src
// written to a file named name in a directory of the test's
// (WriteScript): the name shows in the frames' paths.
func (r RubyUnderTest) StartSource(t testing.TB, name, src string, args ...string) *Proc {
	t.Helper()
	return r.Start(t, WriteScript(t, name, src), args...)
}

// WriteScript writes the Ruby source src to a file named name in a new
// directory of the test's and returns its path.
func WriteScript(t testing.TB, name, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// StartCmd starts cmd (built by Command), waits for its "ready" line (up
// to 30 s) and kills its process group when the test ends. cmd's Stdout
// must be unset; its Stderr goes to the test's stderr unless set.
func (r RubyUnderTest) StartCmd(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	stdout := startGroup(t, cmd, r.Name)
	p := &Proc{Cmd: cmd, Pid: cmd.Process.Pid, out: bufio.NewReader(stdout)}
	done := make(chan error, 1)
	go func() {
		for {
			line, err := p.out.ReadString('\n')
			if err != nil {
				done <- err
				return
			}
			line = strings.TrimRight(line, "\n")
			if line == "ready" {
				done <- nil
				return
			}
			p.Lines = append(p.Lines, line)
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v exited before it was ready: %v", r.Name, cmd.Args, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: %v did not print ready within 30s", r.Name, cmd.Args)
	}
	go io.Copy(io.Discard, p.out)
	return p
}

// LibRuby returns the path of this Ruby's shared library, as the running
// Ruby maps it (stopping the test when this Ruby has none or it is missing).
func (r RubyUnderTest) LibRuby(t testing.TB) string {
	t.Helper()
	if !r.Shared {
		t.Fatalf("%s has no libruby: the VM is inside the executable", r.Name)
	}
	// The file the running Ruby mapped: RbConfig's libdir is /usr/lib on
	// Debian, where the library is in /usr/lib/x86_64-linux-gnu.
	out, err := exec.Command(r.Exe, "-e", `print File.read("/proc/self/maps")[%r{/\S*/libruby[-.]\S*}]`).Output()
	if err != nil {
		t.Fatalf("%s: find the libruby it maps: %v", r.Name, err)
	}
	p := string(out)
	if _, err := os.Stat(p); err != nil {
		Missing(t, "%s's libruby at %s: %v", r.Name, p, err)
	}
	return p
}
