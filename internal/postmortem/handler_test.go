package postmortem

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseArgs(t *testing.T) {
	c, err := ParseArgs([]string{"4242", "4243", "6", "1795250233", "worker", "u=0", "g=5", "c=18446744073709551615"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Pid != 4242 || c.TID != 4243 || c.Signal != 6 || c.Time.Unix() != 1795250233 || c.Comm != "worker" ||
		c.Extra["u"] != "0" || c.Extra["g"] != "5" || c.Extra["c"] != "18446744073709551615" {
		t.Errorf("%+v", c)
	}
	// An old kernel splits %e at its spaces.
	c, err = ParseArgs([]string{"1", "1", "11", "0", "Web", "Content", "u=0"})
	if err != nil || c.Comm != "Web Content" || c.Extra["u"] != "0" {
		t.Errorf("%+v %v", c, err)
	}
	for _, bad := range [][]string{{"1", "2", "3"}, {"x", "1", "6", "0"}, {"1", "1", "-6", "0"}} {
		if _, err := ParseArgs(bad); err == nil {
			t.Errorf("ParseArgs(%q) accepted", bad)
		}
	}
}

func TestExpandPattern(t *testing.T) {
	c := Crash{Pid: 42, TID: 43, Signal: 11, Time: time.Unix(1700000000, 0), Comm: "ruby",
		Extra: map[string]string{"u": "1000", "g": "100", "c": "0", "h": "box"}}
	argv, missing, err := ExpandPattern("|/usr/lib/systemd/systemd-coredump %P %u %g %s %t %c %h %d x%%y %E", c, "/usr/bin/ruby3.1")
	if err != nil {
		t.Fatal(err)
	}
	want := "/usr/lib/systemd/systemd-coredump 42 1000 100 11 1700000000 0 box  x%y !usr!bin!ruby3.1"
	if got := strings.Join(argv, " "); got != want {
		t.Errorf("argv %q\nwant %q", got, want)
	}
	if strings.Join(missing, " ") != "%d" {
		t.Errorf("missing %q, want %%d", missing)
	}
	for _, bad := range []string{"core", "|", "|relative/prog %P"} {
		if _, _, err := ExpandPattern(bad, c, ""); err == nil {
			t.Errorf("ExpandPattern(%q) accepted", bad)
		}
	}
}

func TestHandlerPattern(t *testing.T) {
	p, err := HandlerPattern("/usr/local/bin/rbscope", []string{"--dir", "/var/lib/rbscope"}, false)
	if err != nil || p != "|/usr/local/bin/rbscope core-handler --dir /var/lib/rbscope %P %i %s %t %e" || !IsHandlerPattern(p) {
		t.Errorf("%q %v", p, err)
	}
	if _, err := HandlerPattern("/usr/local/bin/rbscope", []string{"--dir", "/" + strings.Repeat("d", 80)}, true); err == nil ||
		!strings.Contains(err.Error(), "over the kernel's 127") {
		t.Errorf("a 150-byte line: %v", err)
	}
	if _, err := HandlerPattern("/opt/my app/rbscope", nil, false); err == nil {
		t.Error("a path with a space accepted")
	}
	if _, err := HandlerPattern("rbscope", nil, false); err == nil {
		t.Error("a relative path accepted")
	}
}

// TestInstallFile runs Install and Uninstall against an ordinary file
// standing in for core_pattern.
func TestInstallFile(t *testing.T) {
	pf := filepath.Join(t.TempDir(), "core_pattern")
	dir := filepath.Join(shortDir(t), "r")
	os.WriteFile(pf, []byte("|/usr/share/apport/apport -p%p -s%s -c%c\n"), 0o644)
	line, err := Install(InstallOptions{Bin: "/usr/bin/rbscope", Dir: dir, Flags: []string{"--keep=3"}, PatternFile: pf})
	if err != nil {
		t.Fatal(err)
	}
	if line != "|/usr/bin/rbscope core-handler --dir "+dir+" --keep=3 %P %i %s %t %e"+chainSpecs {
		t.Errorf("line %q", line)
	}
	if c := ReadChain(dir); c != "|/usr/share/apport/apport -p%p -s%s -c%c" {
		t.Errorf("chain %q", c)
	}
	// Reinstalling keeps the original, not our own line.
	if _, err := Install(InstallOptions{Bin: "/usr/bin/rbscope", Dir: dir, Chain: "none", PatternFile: pf}); err != nil {
		t.Fatal(err)
	}
	if c := ReadChain(dir); c != "" {
		t.Errorf("chain %q after --chain none", c)
	}
	prev, err := Uninstall(dir, pf)
	if err != nil || prev != "|/usr/share/apport/apport -p%p -s%s -c%c" {
		t.Errorf("uninstall: %q %v", prev, err)
	}
	if b, _ := os.ReadFile(pf); string(b) != prev+"\n" {
		t.Errorf("pattern file %q", b)
	}
	if _, err := Uninstall(dir, pf); err == nil {
		t.Error("a second uninstall succeeded")
	}
}

func handleBytes(t testing.TB, cfg Config, data []byte) (Result, error) {
	t.Helper()
	cfg.Dir = t.TempDir()
	return Handle(context.Background(), cfg, Crash{Signal: 11, Time: time.Unix(1795250233, 0), Comm: "ruby"}, bytes.NewReader(data))
}

func TestMinFreeRefuses(t *testing.T) {
	dir := t.TempDir()
	res, err := Handle(context.Background(), Config{Dir: dir, MinFree: 1 << 62}, Crash{Pid: 0, Signal: 6}, strings.NewReader("x"))
	if err == nil || !strings.Contains(err.Error(), "below --min-free") || res.ID != "" {
		t.Fatalf("%+v %v", res, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != LogName {
		t.Errorf("wrote %v", ents)
	}
	b, _ := os.ReadFile(filepath.Join(dir, LogName))
	if !strings.Contains(string(b), "signal=SIGABRT(6): error: not saving anything") {
		t.Errorf("log %q", b)
	}
}

// TestHandlerDeadline runs the handler with a core pipe that never ends:
// it gives up at its deadline and logs it.
func TestHandlerDeadline(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(binPath, "core-handler", "--dir", dir, "--timeout", "1s", "0", "0", "11", "0", "x")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Write([]byte("\x7fELF"))
	cmd.Stdin = r
	cmd.WaitDelay = 30 * time.Second
	start := time.Now()
	err = cmd.Run()
	r.Close()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Errorf("exit %v, want code 3", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("took %v", d)
	}
	b, _ := os.ReadFile(filepath.Join(dir, LogName))
	if !strings.Contains(string(b), "gave up at the deadline (1s)") {
		t.Errorf("log %q", b)
	}
}

func TestTruncatedGarbageStillReported(t *testing.T) {
	data := []byte(strings.Repeat("\x7fELF not a core", 100))
	res, err := handleBytes(t, Config{MaxCoreSize: 1000}, data)
	if res.ID == "" || err == nil || !strings.Contains(err.Error(), "open the core") {
		t.Fatalf("%+v %v", res, err)
	}
}

// FuzzHandleCore feeds truncated and corrupt cores through the handler:
// it must return (no hang, no panic), and any report it writes must say
// how much of the core it got.
func FuzzHandleCore(f *testing.F) {
	const limit = 64 << 10
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := Config{Dir: t.TempDir(), MaxCoreSize: limit, MinFree: 0, Timeout: 20 * time.Second, Keep: 1}
		start := time.Now()
		res, _ := Handle(context.Background(), cfg, Crash{Signal: 11, Time: time.Unix(1795250233, 0), Comm: "ruby"}, bytes.NewReader(data))
		if d := time.Since(start); d > 15*time.Second {
			t.Fatalf("took %v", d)
		}
		if res.ID != "" {
			r, err := Load(cfg.Dir, res.ID)
			if err != nil {
				t.Fatal(err)
			}
			if r.Core.Bytes != int64(min(len(data), limit)) || r.Core.Truncated != (len(data) > limit) {
				t.Errorf("core %+v for %d bytes", r.Core, len(data))
			}
		}
		if m, _ := filepath.Glob(filepath.Join(cfg.Dir, ".*")); len(m) != 0 {
			t.Errorf("left behind %v", m)
		}
	})
}
