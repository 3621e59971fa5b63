package heap_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/rbscope/rbscope/internal/heap"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

type dumpLine struct {
	Address    string   `json:"address"`
	Type       string   `json:"type"`
	Class      string   `json:"class"`
	Length     *int64   `json:"length"`
	Size       *int64   `json:"size"`
	Bytesize   *int64   `json:"bytesize"`
	Memsize    uint64   `json:"memsize"`
	References []string `json:"references"`
	Name       string   `json:"name"`
}

func readDump(t *testing.T, r *bufio.Scanner) map[string]dumpLine {
	t.Helper()
	out := map[string]dumpLine{}
	for r.Scan() {
		var l dumpLine
		if err := json.Unmarshal(r.Bytes(), &l); err != nil {
			t.Fatalf("dump line %q: %v", r.Text(), err)
		}
		if l.Address != "" {
			out[l.Address] = l
		}
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDumpMatchesDumpAll compares rbscope's heap dump with the one Ruby
// wrote of the same heap (ObjectSpace.dump_all, just before the script
// measured its truth): the same objects at the same addresses, with the
// same types, classes, lengths and (arrays, objects) references.
func TestDumpMatchesDumpAll(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		rubyDump := filepath.Join(t.TempDir(), "dump_all.json")
		proc := rb.Start(t, "heap_census.rb", rubyDump)
		f, err := os.Open(rubyDump)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 64<<20)
		theirs := readDump(t, sc)

		tg, err := target.OpenLive(proc.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		_, h := openHeap(t, tg, ruby.Running)
		var buf bytes.Buffer
		c, err := h.Census(context.Background(), heap.Options{Stop: true, Dump: &buf})
		if err != nil {
			t.Fatal(err)
		}
		sc = bufio.NewScanner(&buf)
		sc.Buffer(nil, 64<<20)
		ours := readDump(t, sc)
		if uint64(len(ours)) != c.Dumped {
			t.Errorf("%d lines, census says %d dumped", len(ours), c.Dumped)
		}
		compared, missing, differ, refsDiffer := map[string]int{}, map[string]int{}, 0, 0
		for addr, th := range theirs {
			switch th.Type {
			case "OBJECT", "STRING", "ARRAY", "HASH", "CLASS":
			default:
				continue
			}
			compared[th.Type]++
			o, ok := ours[addr]
			if !ok {
				missing[th.Type]++
				continue
			}
			same := o.Type == th.Type && o.Class == th.Class && eqp(o.Length, th.Length) && eqp(o.Bytesize, th.Bytesize) && (o.Size == nil || eqp(o.Size, th.Size))
			if th.Type == "CLASS" && th.Name != "" {
				same = same && o.Name == th.Name
			}
			if !same {
				if differ < 5 {
					t.Logf("differ: ours %+v, Ruby's %+v", o, th)
				}
				differ++
			}
			if th.Type == "ARRAY" || th.Type == "STRING" || (th.Type == "OBJECT" && o.References != nil) {
				if !sameRefs(o.References, th.References) {
					if refsDiffer < 5 {
						t.Logf("references differ at %s (%s): ours %d, Ruby's %d", addr, th.Type, len(o.References), len(th.References))
					}
					refsDiffer++
				}
			}
		}
		total := 0
		for _, n := range compared {
			total += n
		}
		t.Logf("compared %v, missing %v, %d differ, %d references differ", compared, missing, differ, refsDiffer)
		for typ, n := range missing {
			if float64(n) > 0.005*float64(compared[typ]) {
				t.Errorf("%d of Ruby's %d %s objects are not in rbscope's dump", n, compared[typ], typ)
			}
		}
		if float64(differ) > 0.005*float64(total) || float64(refsDiffer) > 0.005*float64(total) {
			t.Errorf("%d objects differ, %d references lists differ, of %d", differ, refsDiffer, total)
		}
	})
}

func eqp(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// sameRefs: Ruby lists an array's or object's references (heap objects)
// in order, without repeats of the same object in a row... it lists each
// reference once per slot; rbscope too.
func sameRefs(a, b []string) bool {
	set := map[string]int{}
	for _, x := range a {
		set[x]++
	}
	for _, x := range b {
		set[x]--
	}
	for _, n := range set {
		if n != 0 {
			return false
		}
	}
	return true
}
