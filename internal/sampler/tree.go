package sampler

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/proctree"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// TreeOptions tunes a TreeSource.
type TreeOptions struct {
	Ruby RubyOptions
	Open ruby.Options
	// Rescan is how often the process tree is re-read (100 ms when 0).
	Rescan time.Duration
	// OpenTimeout is how long a new process may take to become a Ruby
	// process rbscope can read before it is ignored (3 s when 0). A
	// process that execs gets another chance.
	OpenTimeout time.Duration
	// OnNewProcess, when set, is called when a process is first sampled
	// (and again for a process that exec'd a new Ruby).
	OnNewProcess func(pid int, p *ruby.Process)
	// NoChildren samples the root only (still following it across exec,
	// as `bundle exec` does).
	NoChildren bool
}

// TreeSource samples a root process and every Ruby process descending
// from it, discovered as they appear (or the root alone, with
// NoChildren). A process that execs is opened anew. Each sample carries its pid. Non-Ruby
// processes are skipped (after OpenTimeout of attempts at each rescan).
// Sampling ends (with target.ExitedError) when the root exits;
// children that exit are dropped silently.
type TreeSource struct {
	root     int
	opts     TreeOptions
	procs    map[int]*treeProc
	order    []int
	lastScan time.Time
	out      []stack.Sample
	// rootStat is the root's stat file, open from the first rescan on.
	rootStat *procfs.StatFile
}

type treeProc struct {
	pid       int
	ident     procfs.Identity
	firstSeen time.Time
	src       *RubySource
	gaveUp    bool
	lastErr   error
}

// NewTreeSource samples root and its descendants. root may be given
// already opened (rootProc, from launch mode) or nil.
func NewTreeSource(root int, rootProc *ruby.Process, opts TreeOptions) *TreeSource {
	if opts.Rescan <= 0 {
		opts.Rescan = 100 * time.Millisecond
	}
	if opts.OpenTimeout <= 0 {
		opts.OpenTimeout = 3 * time.Second
	}
	ts := &TreeSource{root: root, opts: opts, procs: map[int]*treeProc{}}
	tp := &treeProc{pid: root, firstSeen: time.Now()}
	if st, err := procfs.ReadStat(root); err == nil {
		tp.ident = st.Identity()
	}
	if rootProc != nil {
		tp.src = NewRubySource(rootProc, opts.Ruby)
		if opts.OnNewProcess != nil {
			opts.OnNewProcess(root, rootProc)
		}
	}
	ts.procs[root] = tp
	ts.order = []int{root}
	return ts
}

// Pids lists the processes being sampled (the Ruby ones), root first.
func (ts *TreeSource) Pids() []int {
	var out []int
	for _, pid := range ts.order {
		if tp := ts.procs[pid]; tp != nil && tp.src != nil {
			out = append(out, pid)
		}
	}
	return out
}

// Sample samples every known Ruby process; every Rescan it also looks for
// new descendants and opens them.
func (ts *TreeSource) Sample(ctx context.Context) ([]stack.Sample, error) {
	now := time.Now()
	if now.Sub(ts.lastScan) >= ts.opts.Rescan {
		ts.lastScan = now
		if err := ts.rescan(now); err != nil {
			return nil, err
		}
	}
	ts.out = ts.out[:0]
	var errs []error
	for _, pid := range ts.order {
		tp := ts.procs[pid]
		if tp == nil || tp.src == nil {
			continue
		}
		samples, err := tp.src.Sample(ctx)
		if err != nil {
			if pid == ts.root && target.IsExited(err) {
				return ts.out, err
			}
			if target.IsExited(err) {
				ts.drop(pid)
				continue
			}
			errs = append(errs, fmt.Errorf("process %d: %w", pid, err))
		}
		// With some threads unreadable, the others' samples still count.
		ts.out = append(ts.out, samples...)
	}
	return ts.out, errors.Join(errs...)
}

func (ts *TreeSource) rescan(now time.Time) error {
	// The root: still there? exec'd? (Its stat file stays open: a rescan
	// every 100 ms that opened it each time cost about 6 % of all
	// rbscope's CPU at 100 Hz, under perf.)
	if ts.rootStat == nil {
		f, err := procfs.OpenStat(ts.root)
		if err != nil {
			return target.ExitedError{Pid: ts.root}
		}
		ts.rootStat = f
	}
	st, err := ts.rootStat.Read()
	if err != nil {
		return target.ExitedError{Pid: ts.root}
	}
	if st.State == 'Z' || st.State == 'X' {
		return target.ExitedError{Pid: ts.root}
	}
	ts.check(ts.root, st.Identity(), now)
	var kids []int
	if !ts.opts.NoChildren {
		kids, err = proctree.Descendants(ts.root)
		if err != nil {
			return err
		}
	}
	alive := map[int]bool{ts.root: true}
	for _, pid := range kids {
		cst, err := procfs.ReadStat(pid)
		if err != nil || cst.State == 'Z' || cst.State == 'X' {
			continue
		}
		alive[pid] = true
		if ts.procs[pid] == nil {
			ts.procs[pid] = &treeProc{pid: pid, ident: cst.Identity(), firstSeen: now}
			ts.order = append(ts.order, pid)
		} else {
			ts.check(pid, cst.Identity(), now)
		}
	}
	for pid := range ts.procs {
		if !alive[pid] {
			ts.drop(pid)
		}
	}
	// Open the processes not yet open.
	for _, pid := range ts.order {
		tp := ts.procs[pid]
		if tp.src != nil || tp.gaveUp {
			continue
		}
		p, err := ruby.Open(context.Background(), ruby.Spec{Pid: pid, Once: true, Options: ts.opts.Open})
		if err != nil {
			tp.lastErr = err
			if now.Sub(tp.firstSeen) > ts.opts.OpenTimeout {
				tp.gaveUp = true
			}
			continue
		}
		tp.src = NewRubySource(p, ts.opts.Ruby)
		if ts.opts.OnNewProcess != nil {
			ts.opts.OnNewProcess(pid, p)
		}
	}
	return nil
}

// check resets a process whose image changed (it exec'd): it gets a fresh
// chance to be opened as Ruby.
func (ts *TreeSource) check(pid int, id procfs.Identity, now time.Time) {
	tp := ts.procs[pid]
	if tp == nil || tp.ident == id {
		return
	}
	if tp.src != nil {
		tp.src.Close()
		_ = tp.src.Process().Target().Close()
	}
	*tp = treeProc{pid: pid, ident: id, firstSeen: now}
}

func (ts *TreeSource) drop(pid int) {
	if pid == ts.root {
		return
	}
	tp := ts.procs[pid]
	if tp == nil {
		return
	}
	if tp.src != nil {
		tp.src.Close()
		_ = tp.src.Process().Target().Close()
	}
	delete(ts.procs, pid)
	for i, p := range ts.order {
		if p == pid {
			ts.order = append(ts.order[:i], ts.order[i+1:]...)
			break
		}
	}
}

// Skipped lists the descendants that were never readable as Ruby, with
// the last error for each.
func (ts *TreeSource) Skipped() map[int]error {
	out := map[int]error{}
	for pid, tp := range ts.procs {
		if tp.gaveUp {
			out[pid] = tp.lastErr
		}
	}
	return out
}

// Close releases every process.
func (ts *TreeSource) Close() error {
	if ts.rootStat != nil {
		_ = ts.rootStat.Close()
		ts.rootStat = nil
	}
	pids := make([]int, 0, len(ts.procs))
	for pid := range ts.procs {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	for _, pid := range pids {
		if tp := ts.procs[pid]; tp.src != nil {
			tp.src.Close()
			_ = tp.src.Process().Target().Close()
		}
	}
	return nil
}
