package ruby

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

type manifest struct {
	Dumps []struct {
		File     string `json:"file"`
		Version  string `json:"ruby_version"`
		ThPtr    string `json:"current_thread_ptr_addr"`
		VMPtr    string `json:"ruby_current_vm_ptr_addr"`
		Symbols  string `json:"ruby_global_symbols_addr"`
		Expected []struct {
			Name    string  `json:"name"`
			AbsPath *string `json:"absolute_path"`
			Line    *int    `json:"lineno"`
		} `json:"expected_stack_innermost_first"`
	} `json:"dumps"`
}

func hexAddr(t *testing.T, s string) uint64 {
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
	if err != nil {
		t.Fatalf("bad address %q", s)
	}
	return v
}

// gunzip decompresses a shared dump into dir (read in place, never copied
// into the project).
func gunzip(t testing.TB, src, dir string) string {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	zr, err := gzip.NewReader(in)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, strings.TrimSuffix(filepath.Base(src), ".gz"))
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, zr); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// ownerRe strips our owner qualification ("Object#", "B::Ab#", "Foo.")
// so names compare with rbspy's unqualified ones.
var ownerRe = regexp.MustCompile(`(^|in )[A-Z][A-Za-z0-9_:]*[#.]`)

func unqualify(s string) string { return ownerRe.ReplaceAllString(s, "$1") }

// TestCoreDumps reads every shared core dump twice: from the manifest's
// hint addresses and by finding the VM from the dump alone (NT_FILE, the
// in-memory dynamic symbols), and compares the innermost frames.
func TestCoreDumps(t *testing.T) {
	shared := testutil.SharedDir(t)
	dir := filepath.Join(shared, "testdata", "coredumps")
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Dumps) == 0 {
		t.Fatal("manifest lists no dumps")
	}
	tmp := t.TempDir()
	for _, d := range m.Dumps {
		d := d
		t.Run(d.Version, func(t *testing.T) {
			core := gunzip(t, filepath.Join(dir, d.File), tmp)
			defer os.Remove(core)
			for _, mode := range []string{"hints", "discover"} {
				t.Run(mode, func(t *testing.T) {
					tg, err := target.OpenCore(core, target.CoreOptions{})
					if err != nil {
						t.Fatalf("open core: %v", err)
					}
					defer tg.Close()
					opts := Options{}
					if mode == "hints" {
						opts.Version = d.Version
						opts.Hints = map[string]uint64{}
						if d.VMPtr != "" {
							opts.Hints["ruby_current_vm_ptr"] = hexAddr(t, d.VMPtr)
						}
						if d.ThPtr != "" {
							opts.Hints["ruby_current_thread"] = hexAddr(t, d.ThPtr)
						}
						if d.Symbols != "" {
							opts.Hints["ruby_global_symbols"] = hexAddr(t, d.Symbols)
						}
					}
					p, err := Open(context.Background(), Spec{Target: tg, Consistency: Stopped, Options: opts})
					if err != nil {
						t.Fatalf("open Ruby: %v", err)
					}
					if mode == "discover" && !strings.HasPrefix(p.Version(), d.Version[:3]) {
						t.Errorf("discovered version %s (%s), manifest says %s", p.Version(), p.Info().VersionSource, d.Version)
					}
					if mode == "hints" {
						srcs := p.Info().AddressSources
						hinted := 0
						for name, src := range srcs {
							if strings.HasPrefix(name, "ruby_current") && src == "hint" {
								hinted++
							}
						}
						if hinted == 0 {
							t.Errorf("no VM or thread address came from the hints: %v", srcs)
						}
					}
					running := onlyThread(t, p)
					// The same walk with rbspy's line convention (see
					// Options.nextInsnLines) for comparing with its manifest.
					opts.nextInsnLines = true
					p2, err := Open(context.Background(), Spec{Target: tg, Consistency: Stopped, Options: opts})
					if err != nil {
						t.Fatalf("open Ruby again: %v", err)
					}
					compareExpected(t, running.Frames, onlyThread(t, p2).Frames, d.Expected)
				})
			}
		})
	}
}

func onlyThread(t *testing.T, p *Process) stack.Thread {
	t.Helper()
	ths, err := p.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	// Every dump holds one thread, the main one, in Kernel#sleep (rbspy's
	// infinite.rb) or, before 2.2, the only thread rbscope can list.
	if len(ths) != 1 || !ths[0].Main {
		t.Fatalf("%d threads in the dump, want the main one alone", len(ths))
	}
	th := ths[0]
	if len(th.Frames) > 0 && th.Frames[0].Name == "Kernel#sleep" && p.act.owner.ok && (th.GVL || th.Activity != stack.ActivityBlocked) {
		// Read from the lock: a sleeping thread never owns the GVL.
		t.Errorf("thread in Kernel#sleep: gvl %v, activity %s (%s)", th.GVL, th.Activity, p.Info().GVLSource)
	}
	return th
}

// compareExpected checks our frames against rbspy's. Lines: rbspy reports
// the next instruction's line on 2.6+; ours (Ruby's semantics) must equal
// rbspy's when read in its convention (rbspyLines), and where that
// convention yields nothing (line 0) or for Ruby's own <internal:> files,
// our line must be the executing line at most one line before rbspy's.
func compareExpected(t *testing.T, got, rbspyLines []stack.Frame, want []struct {
	Name    string  `json:"name"`
	AbsPath *string `json:"absolute_path"`
	Line    *int    `json:"lineno"`
}) {
	t.Helper()
	if len(got) < len(want) {
		t.Fatalf("%d frames, want at least %d:\n%s", len(got), len(want), dump(got))
	}
	for i, w := range want {
		g := got[i]
		name, isC := strings.CutSuffix(w.Name, " [c function]")
		if isC {
			if g.Kind != stack.KindCFunc {
				t.Errorf("frame %d: %s is %s, want a C function", i, g.Name, g.Kind)
			}
			if name != "(unknown)" && unqualify(g.Name) != unqualify(name) {
				t.Errorf("frame %d: C function %s, want %s", i, g.Name, name)
			}
			continue
		}
		if unqualify(g.Name) != unqualify(name) {
			t.Errorf("frame %d: %s, want %s", i, g.Name, name)
		}
		if g.InternalPath != "" {
			// A method defined inside Ruby is shown at its caller's
			// place; rbspy reports its own.
			if i+1 < len(got) && (g.Path != got[i+1].Path || g.Line != got[i+1].Line) && got[i+1].InternalPath == "" {
				t.Errorf("frame %d (%s): at %s:%d, not at its caller's place %s:%d", i, g.Name, g.Path, g.Line, got[i+1].Path, got[i+1].Line)
			}
			g.Path, g.Line = g.InternalPath, g.InternalLine
		}
		if w.AbsPath != nil && *w.AbsPath != "unknown" && g.Path != *w.AbsPath {
			t.Errorf("frame %d (%s): path %s, want %s", i, g.Name, g.Path, *w.AbsPath)
		}
		if w.Line == nil {
			continue
		}
		rl := 0
		if i < len(rbspyLines) {
			rl = rbspyLines[i].Line
		}
		switch {
		case rl == *w.Line:
		case (rl == 0 || strings.HasPrefix(g.Path, "<internal:")) && g.Line > 0 && g.Line <= *w.Line && *w.Line-g.Line <= 5:
		default:
			t.Errorf("frame %d (%s): line %d (rbspy convention %d), manifest %d", i, g.Name, g.Line, rl, *w.Line)
		}
	}
}
