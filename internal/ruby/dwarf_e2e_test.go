package ruby

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/layout/layoutgen"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

const debianLibruby = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"

// debugFileFor compiles C declarations reproducing l into a separate debug
// file named by build id under a fresh debug root, as distributions ship
// them (/usr/lib/debug/.build-id/xx/yyyy.debug).
func debugFileFor(t *testing.T, l *layout.Layout, buildID string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		testutil.Missing(t, "gcc (scripts/install-deps.sh installs it)")
	}
	root := t.TempDir()
	src := filepath.Join(t.TempDir(), "ruby_structs.c")
	if err := os.WriteFile(src, []byte(layoutgen.CSource(l, nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, ".build-id", buildID[:2])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, buildID[2:]+".debug")
	if b, err := exec.Command("gcc", "-g", "-c", "-o", out, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return root
}

func libRubyBuildID(t *testing.T) string {
	f, err := os.Open(debianLibruby)
	if err != nil {
		testutil.Missing(t, "Debian's libruby (scripts/install-deps.sh installs ruby): %v", err)
	}
	defer f.Close()
	b, err := elfx.Open(f)
	if err != nil || b.BuildID == "" {
		t.Fatalf("libruby build id: %v", err)
	}
	return b.BuildID
}

func snapshotWith(t *testing.T, pid int, opts Options) ([]stack.Thread, *Process) {
	t.Helper()
	tg, err := target.OpenLive(pid)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running, Options: opts})
	if err != nil {
		return nil, nil
	}
	// Wait until every thread sits in Kernel#sleep, so that two snapshots
	// of the same process compare equal.
	var ths []stack.Thread
	for i := 0; i < 100; i++ {
		if ths, err = p.Snapshot(); err != nil {
			return nil, p
		}
		if allSleeping(ths) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range ths {
		ths[i].Stack = 0 // each Process gives its own (TestStackIDs)
	}
	return ths, p
}

// TestDWARFDebugFileDrivesWalker gives the system's libruby (which has no
// DWARF) a separate debug file for its build id, generated from the Ruby
// layout of its own version, and checks that the walker takes its offsets from it: the
// same frames as the built-in table, then different ones when one offset
// in the debug file is moved.
func TestDWARFDebugFileDrivesWalker(t *testing.T) {
	id := libRubyBuildID(t)
	rb := testutil.SystemRuby(t)
	proc := rb.Start(t, "stacks.rb", "nested")
	builtin, err := layout.Builtin(rb.Version)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := snapshotWith(t, proc.Pid, Options{NoDWARF: true})
	if len(want) == 0 {
		t.Fatal("no threads with the built-in layout")
	}

	t.Setenv("RBSCOPE_CACHE_DIR", t.TempDir()) // never touch the user's cache
	root := debugFileFor(t, builtin, id)
	got, p := snapshotWith(t, proc.Pid, Options{DebugRoots: []string{root}})
	if p == nil {
		t.Fatal("open with the DWARF layout failed")
	}
	if src := p.LayoutSource(); !strings.HasPrefix(src, "dwarf:") || !strings.Contains(src, id[2:]) {
		t.Fatalf("layout source %q, want dwarf:<debug file>", src)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("DWARF layout gives other stacks than the built-in table:\n%v\n%v", got, want)
	}

	// Move iseq labels onto base labels: block frames lose their "block
	// in" prefix. The walker must follow DWARF, not the table.
	moved := *builtin
	moved.Structs = map[string]layout.Struct{}
	for k, v := range builtin.Structs {
		moved.Structs[k] = v
	}
	body := builtin.Structs["rb_iseq_constant_body"]
	fields := map[string]layout.Field{}
	for k, v := range body.Fields {
		fields[k] = v
	}
	fields["location.label"], fields["location.base_label"] = body.Fields["location.base_label"], body.Fields["location.label"]
	body.Fields = fields
	moved.Structs["rb_iseq_constant_body"] = body
	t.Setenv("RBSCOPE_CACHE_DIR", t.TempDir())
	root2 := debugFileFor(t, &moved, id)
	got2, p2 := snapshotWith(t, proc.Pid, Options{DebugRoots: []string{root2}})
	if p2 == nil || !strings.HasPrefix(p2.LayoutSource(), "dwarf:") {
		t.Fatal("perturbed DWARF layout not used")
	}
	if reflect.DeepEqual(got2, want) {
		t.Fatal("frames did not change when DWARF moved iseq labels: the walker ignores DWARF")
	}
	blocks := 0
	for _, th := range got2 {
		for _, f := range th.Frames {
			if strings.HasPrefix(f.Name, "block in") {
				blocks++
			}
		}
	}
	if blocks != 0 {
		t.Errorf("with labels and base labels swapped, %d frames still say 'block in'", blocks)
	}
}
