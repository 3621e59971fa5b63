package alloc

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/arch/x86/x86asm"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/heap"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// leakyTruth is what testdata/leaky.rb says about itself at the end of its
// run: the nodes it keeps, what ObjectSpace.trace_object_allocations says
// of the live Leaky::Node created while it ran (at the leak's line, and
// elsewhere), and ObjectSpace.memsize_of of a kept node and its string.
type leakyTruth struct {
	Kept           uint64 `json:"kept"`
	LeakTraced     uint64 `json:"leak_traced"`
	OtherTraced    uint64 `json:"other_traced"`
	LeakFile       string `json:"leak_file"`
	LeakLine       int    `json:"leak_line"`
	NodeMemsize    uint64 `json:"node_memsize"`
	PayloadMemsize uint64 `json:"payload_memsize"`
}

// runLeaky runs leaky.rb for secs seconds under a retained tracker with
// opts (attached before the script starts its loop, stopped after the
// script's final GC, before it takes its truth: what the truth allocates
// is not in the window) and returns the report and the truth.
func runLeaky(t *testing.T, rb testutil.RubyUnderTest, secs float64, opts Options) (*Report, leakyTruth) {
	t.Helper()
	p := startRuby(t, rb, script(t, "leaky.rb"), strconv.FormatFloat(secs, 'f', -1, 64))
	p.expectPrefix(t, "ready ")
	opts.Retained = true
	tr := attachOrMissing(t, p.cmd.Process.Pid, opts)
	p.send(t)
	p.expectPrefix(t, "stopped")
	tr.Stop()
	r, err := tr.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	p.send(t)
	var truth leakyTruth
	line := p.expectPrefix(t, "{")
	if err := json.Unmarshal([]byte(line), &truth); err != nil {
		t.Fatalf("truth %q: %v", line, err)
	}
	p.send(t)
	return r, truth
}

// leakySplit sums r's retained Leaky::Node (count, bytes) at the leak's
// file:line and elsewhere, and the 1 KiB strings' at the leak's line.
type leakySplit struct {
	leak, leakBytes, other, otherBytes, str, strBytes uint64
}

func splitLeaky(r *Report, truth leakyTruth) leakySplit {
	var s leakySplit
	for _, b := range r.BySite {
		at := b.Path == truth.LeakFile && b.Line == truth.LeakLine
		switch {
		case b.Class == "Leaky::Node" && at:
			s.leak += b.Count
			s.leakBytes += b.Bytes
		case b.Class == "Leaky::Node":
			s.other += b.Count
			s.otherBytes += b.Bytes
		case b.Class == "String" && at:
			s.str += b.Count
			s.strBytes += b.Bytes
		}
	}
	return s
}

// stackSplit sums r's retained Leaky::Node stacks by chain: the leak's
// (C#leak called by B#middle called by A#outer) and the churn's
// (Churn#make).
func stackSplit(r *Report) (leak, churn, other uint64) {
	for _, st := range r.Stacks {
		if st.Class != "Leaky::Node" {
			continue
		}
		var names []string
		for _, f := range st.Frames {
			names = append(names, f.Name)
		}
		chain := strings.Join(names, ";")
		switch {
		case strings.Contains(chain, "C#leak;B#middle;A#outer"):
			leak += st.Count
		case strings.Contains(chain, "Churn#make"):
			churn += st.Count
		default:
			other += st.Count
		}
	}
	return
}

func logRetained(t *testing.T, r *Report) {
	t.Helper()
	var b bytes.Buffer
	r.WriteText(&b, "line", 12)
	t.Logf("%s", b.String())
}

// TestRetainedBySite profiles leaky.rb (a leak of 1000 Leaky::Node a
// second, each holding a 1 KiB string, from A#outer;B#middle;C#leak at a
// known line, among a ten times larger churn of short-lived Leaky::Node
// from Churn#spin;Churn#make) with --retained, on every Ruby under test,
// and checks it against the script's own truth (the nodes it keeps, and
// ObjectSpace.trace_object_allocations' sites of the live nodes at the
// end):
//   - exact: the leak's site has exactly the nodes the script keeps, and
//     as many as ObjectSpace traces there; nothing else lives; each node
//     has memsize_of's bytes, each kept string too;
//   - sampled (the default): at least 90 % of the retained nodes and
//     bytes are at the leak's line, within 10 % of the truth, almost none
//     (2 % of the truth) elsewhere; by stack, at least 90 % under the
//     leak's chain, almost none under the churn's.
//
// The sampled window is 8 s (the issue asks 30 s): at the default duty
// cycle it tracks about 1,600 of the 8,000 leaked nodes, a standard error
// of 2.5 %, four of them inside the 10 % bound; 30 s on five Rubies would
// take the suite's time past its budget for no stronger check.
func TestRetainedBySite(t *testing.T) {
	needBPF(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		t.Run("exact", func(t *testing.T) {
			r, truth := runLeaky(t, rb, 3, Options{Exact: true})
			s := splitLeaky(r, truth)
			ri := r.RetainedInfo
			t.Logf("%s exact: leak %d (%d B), elsewhere %d, strings %d (%d B); truth %+v; info %+v", rb.Name, s.leak, s.leakBytes, s.other, s.str, s.strBytes, truth, ri)
			if truth.Kept == 0 || truth.LeakTraced != truth.Kept || truth.OtherTraced != 0 {
				t.Fatalf("the script's own truth is off: %+v", truth)
			}
			if r.Estimated || ri == nil || ri.CutShort {
				t.Errorf("estimated %v, info %+v: want an exact, whole window", r.Estimated, ri)
			}
			if s.leak != truth.Kept || s.leak != truth.LeakTraced {
				logRetained(t, r)
				t.Errorf("%d Leaky::Node retained at %s:%d, the script keeps %d (ObjectSpace traces %d there)", s.leak, truth.LeakFile, truth.LeakLine, truth.Kept, truth.LeakTraced)
			}
			if s.other != truth.OtherTraced {
				logRetained(t, r)
				t.Errorf("%d Leaky::Node retained elsewhere, ObjectSpace traces %d", s.other, truth.OtherTraced)
			}
			if s.leakBytes != s.leak*truth.NodeMemsize {
				t.Errorf("leaked nodes take %d bytes, memsize_of says %d each: %d", s.leakBytes, truth.NodeMemsize, s.leak*truth.NodeMemsize)
			}
			if s.str != truth.Kept || s.strBytes != s.str*truth.PayloadMemsize {
				t.Errorf("%d strings of %d bytes retained at the leak's line, want %d of memsize_of %d", s.str, s.strBytes, truth.Kept, truth.PayloadMemsize)
			}
			leak, churn, _ := stackSplit(r)
			if leak < truth.Kept*9/10 || churn > 0 {
				logRetained(t, r)
				t.Errorf("by stack: %d nodes under A#outer;B#middle;C#leak, %d under Churn#make; want ~%d and 0", leak, churn, truth.Kept)
			}
		})
		t.Run("sampled", func(t *testing.T) {
			r, truth := runLeaky(t, rb, 8, Options{})
			s := splitLeaky(r, truth)
			ri := r.RetainedInfo
			t.Logf("%s sampled: leak %d (%d B), elsewhere %d (%d B); truth %+v; scale %.3g (%s), attached %.1f%%; info %+v",
				rb.Name, s.leak, s.leakBytes, s.other, s.otherBytes, truth, r.Scale, r.Scaling, 100*r.Attached, ri)
			// With DWARF, or on a Ruby whose heaps' layout rbscope knows
			// (3.3, 3.4), the counter's place is known and the estimate
			// is scaled by it. Otherwise the counter is found by
			// calibrating against the windows' events, which an 8 s
			// window on a busy machine may not finish (seen on CI beside
			// other tests): then the estimate is scaled by time, and held
			// to the same 10 %.
			known := rb.HasDWARF || heapsLayoutFor(rb.Version) != nil
			if !r.Estimated || (r.Scaling != "counter" && (known || r.Scaling != "time")) {
				t.Errorf("estimated %v scaling %q (%s): want estimates scaled by Ruby's counter (or by time where its place is unknown)", r.Estimated, r.Scaling, r.CounterSource)
			}
			if d := float64(s.leak)/float64(truth.Kept) - 1; math.Abs(d) > 0.10 {
				logRetained(t, r)
				t.Errorf("%d Leaky::Node retained at the leak's line, the script keeps %d (%+.1f%%)", s.leak, truth.Kept, 100*d)
			}
			if total := s.leak + s.other; float64(s.leak) < 0.9*float64(total) || float64(s.leakBytes) < 0.9*float64(s.leakBytes+s.otherBytes) {
				t.Errorf("%d of %d retained nodes (%d of %d bytes) at the leak's line: want 90%%", s.leak, total, s.leakBytes, s.leakBytes+s.otherBytes)
			}
			if float64(s.other) > 0.02*float64(truth.Kept) {
				logRetained(t, r)
				t.Errorf("%d nodes retained elsewhere (the churn), want almost none (ObjectSpace: %d)", s.other, truth.OtherTraced)
			}
			leak, churn, other := stackSplit(r)
			if total := leak + churn + other; total == 0 || float64(leak) < 0.9*float64(total) || float64(churn) > 0.02*float64(truth.Kept) {
				logRetained(t, r)
				t.Errorf("by stack: %d nodes under A#outer;B#middle;C#leak, %d under Churn#make, %d elsewhere", leak, churn, other)
			}
		})
	})
}

// TestRetainedTargetExits: a target that exits mid-window (leaky.rb with
// EXIT=1, a 2 s run, under a 60 s window) still gets its report: what was
// retained when its Ruby began to tear down (the exit probe's copy of the
// tracked slots), exactly the nodes it kept, and the report says that the
// window was cut short.
func TestRetainedTargetExits(t *testing.T) {
	needBPF(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := startRubyEnv(t, rb, []string{"EXIT=1"}, script(t, "leaky.rb"), "2")
		p.expectPrefix(t, "ready ")
		pid := p.cmd.Process.Pid
		type result struct {
			r   *Report
			err error
		}
		done := make(chan result, 1)
		var log bytes.Buffer
		attached := make(chan struct{})
		go func() {
			r, err := Run(context.Background(), RunConfig{
				Pid: pid, Options: Options{Retained: true, Exact: true}, Duration: 60 * time.Second,
				Log: writerFunc(func(b []byte) (int, error) {
					if bytes.Contains(b, []byte("attached to")) {
						close(attached)
					}
					return log.Write(b)
				}),
			})
			done <- result{r, err}
		}()
		select {
		case <-attached:
		case res := <-done:
			if errorsMissing(t, res.err) {
				return
			}
			t.Fatalf("Run: %v", res.err)
		case <-time.After(60 * time.Second):
			t.Fatal("not attached after 60 s")
		}
		p.send(t)
		var truth leakyTruth
		if err := json.Unmarshal([]byte(p.expectPrefix(t, "{")), &truth); err != nil {
			t.Fatal(err)
		}
		var res result
		select {
		case res = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not end after the target exited")
		}
		if res.err != nil {
			t.Fatalf("Run: %v", res.err)
		}
		r := res.r
		s := splitLeaky(r, truth)
		t.Logf("%s: leak %d, elsewhere %d; truth %+v; info %+v", rb.Name, s.leak, s.other, truth, r.RetainedInfo)
		if r.RetainedInfo == nil || !r.RetainedInfo.CutShort {
			t.Errorf("the report does not say the window was cut short: %+v", r.RetainedInfo)
		}
		if s.leak != truth.Kept || s.other != 0 {
			logRetained(t, r)
			t.Errorf("%d nodes retained at the leak's line, %d elsewhere; the script kept %d", s.leak, s.other, truth.Kept)
		}
		var b bytes.Buffer
		if err := r.WriteText(&b, "line", 0); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), "cut short") {
			t.Errorf("the text report does not say the window was cut short:\n%s", b.String())
		}
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// errorsMissing stops the test as a missing need when err says the kernel
// refused the probes; it reports whether it did.
func errorsMissing(t *testing.T, err error) bool {
	t.Helper()
	if errors.Is(err, ErrBPFDenied) || errors.Is(err, ErrNoBPF) || errors.Is(err, ErrNoUprobes) {
		testutil.Missing(t, "a kernel that lets rbscope attach uprobes: %v", err)
		return true
	}
	return false
}

// TestRetainedReturnSites: on every Ruby under test, every create probe
// (object, string, array, hash) has return sites, and object__create's
// follow an indirect call (the allocator, through rb_alloc_func_t).
func TestRetainedReturnSites(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := startRuby(t, rb, "-e", "$stdout.sync = true; puts 'ready'; STDIN.gets")
		p.expect(t, "ready")
		tg, err := target.OpenLive(p.cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		plan, err := PlanFor(tg, false)
		if err != nil {
			t.Fatal(err)
		}
		r, err := tg.OpenFile(plan.Binary)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		b, err := elfx.Open(r)
		if err != nil {
			t.Fatal(err)
		}
		n := len(plan.Sites)
		addReturnSites(plan, b.ELF())
		if len(plan.RetSkipped) > 0 {
			t.Errorf("probes without return sites: %v", plan.RetSkipped)
		}
		rets := map[int]int{}
		for _, s := range plan.Sites[n:] {
			if s.Kind != KindReturn || len(s.Origins) == 0 {
				t.Errorf("site %+v", s)
			}
			for _, o := range s.Origins {
				rets[o]++
				if plan.Sites[o].Kind == KindObject && !afterIndirectCall(t, b.ELF(), s.Offset) {
					t.Errorf("object__create's return site 0x%x does not follow an indirect call", s.Offset)
				}
			}
		}
		for i, s := range plan.Sites[:n] {
			switch s.Kind {
			case KindObject, KindString, KindArray, KindHash:
				if rets[i] == 0 {
					t.Errorf("%s at 0x%x has no return site", s.Name, s.Offset)
				}
			}
		}
		t.Logf("%s: %d probe sites, %d return sites", rb.Name, n, len(plan.Sites)-n)
		p.send(t)
	})
}

// afterIndirectCall reports whether the instruction that ends at file
// offset off is an indirect call.
func afterIndirectCall(t *testing.T, f *elf.File, off uint64) bool {
	vaddr, sec, err := offsetToVaddr(f, off)
	if err != nil {
		t.Fatal(err)
	}
	code := make([]byte, 16)
	if _, err := sec.ReadAt(code, int64(vaddr-sec.Addr-8)); err != nil {
		t.Fatal(err)
	}
	for k := 2; k <= 7; k++ {
		inst, err := x86asm.Decode(code[8-k:], 64)
		if err == nil && inst.Len == k && inst.Op == x86asm.CALL {
			if _, rel := inst.Args[0].(x86asm.Rel); !rel {
				return true
			}
		}
	}
	return false
}

// TestRetainedReturnSitesCode follows hand-made code: the probe's block
// jumps back to the hot path, past a helper call to the allocation; a
// branch to an error path ends in a noreturn trap. A helper that returns
// an int (its caller tests eax) is no return site: the rest of rax is
// stale, and may be a live object's address; one whose whole rax is used
// is.
func TestRetainedReturnSitesCode(t *testing.T) {
	code := []byte{
		0xe8, 0x00, 0x00, 0x00, 0x00, // 0x1000: call helper (0x1005): returns an int, path goes on
		0x85, 0xc0, // 0x1005: test eax, eax
		0x74, 0x05, // 0x1007: je 0x100e (error path)
		0xff, 0xd5, // 0x1009: call *rbp: the allocation, path stops
		0x48, 0x89, 0xc7, // 0x100b: mov rdi, rax
		0x0f, 0x0b, // 0x100e: ud2
		0x90,       // 0x1010: the probe's nop
		0xeb, 0xed, // 0x1011: jmp 0x1000
	}
	got, err := returnSites(code, 0x1000, 0x1010, func(uint64) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint64{0x100b}; !slices.Equal(got, want) {
		t.Errorf("return sites %#x, want %#x", got, want)
	}
	word := []byte{
		0xe8, 0x00, 0x00, 0x00, 0x00, // 0x1000: call helper (0x1005): returns a word, path goes on
		0x48, 0x85, 0xc0, // 0x1005: test rax, rax
		0x74, 0x05, // 0x1008: je 0x100f (error path)
		0xff, 0xd5, // 0x100a: call *rbp: the allocation, path stops
		0x48, 0x89, 0xc7, // 0x100c: mov rdi, rax
		0x0f, 0x0b, // 0x100f: ud2
		0x90,       // 0x1011: the probe's nop
		0xeb, 0xec, // 0x1012: jmp 0x1000
	}
	got, err = returnSites(word, 0x1000, 0x1011, func(uint64) string { return "" })
	if want := []uint64{0x1005, 0x100c}; err != nil || !slices.Equal(got, want) {
		t.Errorf("helper returning a word: return sites %#x (%v), want %#x", got, err, want)
	}
	// A call to gc.c's allocator stops the path at once, whatever follows.
	got, err = returnSites(code, 0x1000, 0x1010, func(a uint64) string {
		if a == 0x1005 {
			return "rb_wb_protected_newobj_of"
		}
		return ""
	})
	if err != nil || !slices.Equal(got, []uint64{0x1005}) {
		t.Errorf("return sites %#x (%v), want [0x1005]", got, err)
	}
	// A path that returns without calling anything has nothing to pair.
	if _, err := returnSites([]byte{0x90, 0xc3}, 0, 0, func(uint64) string { return "" }); !errors.Is(err, errNoCall) {
		t.Errorf("err %v, want errNoCall", err)
	}
}

// TestReturnsWord: the code after a call says whether its result may be a
// whole word (an object's address).
func TestReturnsWord(t *testing.T) {
	for _, c := range []struct {
		name string
		code []byte
		want bool
	}{
		{"test al, al (a bool)", []byte{0x84, 0xc0}, false},
		{"test eax, eax (an int)", []byte{0x85, 0xc0}, false},
		{"movzx eax, al", []byte{0x0f, 0xb6, 0xc0}, false},
		{"xor eax, eax (dropped)", []byte{0x31, 0xc0}, false},
		{"mov eax, 1 (dropped)", []byte{0xb8, 0x01, 0x00, 0x00, 0x00}, false},
		{"mov r15, rax", []byte{0x49, 0x89, 0xc7}, true},
		{"mov rsi, [rsp+8]; mov rdi, [rax]", []byte{0x48, 0x8b, 0x74, 0x24, 0x08, 0x48, 0x8b, 0x38}, true},
		{"mov [rax+0x20], rbx", []byte{0x48, 0x89, 0x58, 0x20}, true},
		{"test rax, rax", []byte{0x48, 0x85, 0xc0}, true},
		{"ret (returned on)", []byte{0xc3}, true},
		{"add rsp, 8; ret", []byte{0x48, 0x83, 0xc4, 0x08, 0xc3}, true},
		{"end of the code read", nil, true},
	} {
		if got := returnsWord(c.code, 0x1000, 0x1000); got != c.want {
			t.Errorf("%s: returnsWord %v, want %v", c.name, got, c.want)
		}
	}
}

// TestRetainedMarkBits: where DWARF says where heap_page.mark_bits is,
// gc.c's layout (what stripped Rubies use) says the same.
func TestRetainedMarkBits(t *testing.T) {
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		p := startRuby(t, rb, "-e", "$stdout.sync = true; GC.start; puts 'ready'; STDIN.gets")
		p.expect(t, "ready")
		tg, err := target.OpenLive(p.cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		rp, err := ruby.Open(context.Background(), ruby.Spec{Target: tg, Consistency: ruby.Running})
		if err != nil {
			t.Fatal(err)
		}
		h, err := heap.Open(rp)
		if err != nil {
			t.Fatal(err)
		}
		m, err := h.MarkBits()
		if err != nil {
			t.Fatal(err)
		}
		tab, err := h.MarkBitsTable()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s; table: %s", rb.Name, m.Source, tab.Source)
		if m.Offset != tab.Offset || m.Align != tab.Align {
			t.Errorf("mark bits at +%d (align %d), gc.c's layout says +%d (%d)", m.Offset, m.Align, tab.Offset, tab.Align)
		}
		if rb.HasDWARF && !strings.HasPrefix(m.Source, "dwarf") {
			t.Errorf("%s has DWARF, mark bits from %s", rb.Name, m.Source)
		}
		p.send(t)
	})
}
