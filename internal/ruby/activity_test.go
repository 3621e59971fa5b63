package ruby

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rbscope/rbscope/internal/target"
	"github.com/rbscope/rbscope/internal/testutil"
)

// dontGCBit is rb_objspace.flags.dont_gc in gc.c 3.0-3.3 (mode:2,
// immediate_sweep:1, dont_gc:1).
const dontGCBit = 3

// TestActivitySources proves the GC flags word rbscope reads,
// whichever way it was found (DWARF, or the shape scan that table-only
// builds such as Debian's stripped Ruby rely on): its dont_gc bit follows
// GC.disable / GC.enable in the script, and on builds with DWARF the scan
// finds the very offsets DWARF gives.
func TestActivitySources(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.EachRuby(t, func(t *testing.T, rb testutil.RubyUnderTest) {
		rb.SetProfilerEnv(t)
		for _, disabled := range []bool{true, false} {
			code := `GC.enable; puts "ready"; $stdout.flush; sleep`
			if disabled {
				code = `GC.disable; puts "ready"; $stdout.flush; sleep`
			}
			script := t.TempDir() + "/gc.rb"
			if err := os.WriteFile(script, []byte(code), 0o644); err != nil {
				t.Fatal(err)
			}
			proc := rb.Start(t, script)
			for _, noDWARF := range []bool{false, true} {
				tg, err := target.OpenLive(proc.Pid)
				if err != nil {
					t.Fatal(err)
				}
				p, err := Open(context.Background(), Spec{Target: tg, Consistency: Running, Options: Options{NoDWARF: noDWARF}})
				if err != nil {
					tg.Close()
					t.Fatalf("open: %v", err)
				}
				src := p.Info().GCSource
				t.Logf("GC.disable=%v NoDWARF=%v: %s; GVL: %s", disabled, noDWARF, src, p.Info().GVLSource)
				if p.act.objspace == 0 {
					t.Fatalf("no GC flags: %s", src)
				}
				if !p.act.owner.ok || !p.act.waitq.ok {
					t.Errorf("no GVL owner or wait list: %s", p.Info().GVLSource)
				}
				// Where DWARF names the wait list, it is where the tables'
				// derivation puts it (rb_thread_sched: running, three
				// bools, readyq from 3.3; the GVL's waitq after owner and
				// a mutex before).
				derived := p.act.owner.off + 8 + 40
				if p.rt.schedFlags {
					derived = p.act.owner.off + 8 + 8
				}
				if p.act.waitq.off != derived {
					t.Errorf("GVL wait list at +%d, the derivation says +%d (%s)", p.act.waitq.off, derived, p.Info().GVLSource)
				}
				wantSrc := "scan:"
				if rb.HasDWARF && !noDWARF {
					wantSrc = "dwarf:"
				}
				if !strings.HasPrefix(src, wantSrc) {
					t.Errorf("GC source %q, want %s", src, wantSrc)
				}
				word, err := p.r.u32(p.act.objspace + p.act.flagsOff)
				if err != nil {
					t.Fatal(err)
				}
				dontGC := word>>dontGCBit&1 == 1
				if dwarfBit, err := p.rt.lay.Field("rb_objspace", "flags.dont_gc"); err == nil && dwarfBit.Bitfield != nil {
					if dwarfBit.Offset != p.act.flagsOff || dwarfBit.Bitfield.BitOffset != dontGCBit {
						t.Errorf("DWARF puts dont_gc at +%d bit %d", dwarfBit.Offset, dwarfBit.Bitfield.BitOffset)
					}
				}
				if dontGC != disabled {
					t.Errorf("flags word 0x%x: dont_gc %v, the script ran GC.disable: %v", word, dontGC, disabled)
				}
				if g := p.w.readGC(); !g.known || g.duringGC {
					t.Errorf("GC state %+v of a sleeping process", g)
				}
				if rb.HasDWARF && !noDWARF {
					// The scan must find what DWARF says.
					dwarfOS := p.act.objspace
					shape := objspaceShapeOf(p.rt.ver)
					if shape.flagsOff != p.act.flagsOff {
						t.Errorf("the scan reads the flags at +%d (%s); DWARF puts them at +%d", shape.flagsOff, shape.source, p.act.flagsOff)
					}
					off, os, err := (&opener{p}).scanObjspace(p.vmAddr, shape)
					if err != nil {
						t.Errorf("scan for rb_objspace: %v", err)
					} else if os != dwarfOS || !strings.Contains(src, "objspace at +"+strconv.FormatUint(off, 10)+",") {
						t.Errorf("scan finds objspace 0x%x at +%d; DWARF: 0x%x (%s)", os, off, dwarfOS, src)
					}
				}
				tg.Close()
			}
		}
	})
}
