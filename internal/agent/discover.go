package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/sampler"
	"github.com/rbscope/rbscope/internal/target"
)

// seenState is what discovery decided about one process image.
type seenState int

const (
	// pending: a Ruby process that passed the filters, not open yet
	// (starting, or over MaxProcesses).
	pending seenState = iota
	// tracked: handed to the clock.
	tracked
	// ignored: not Ruby, filtered out, denied, gone or given up on; never
	// looked at again while the image lasts.
	ignored
)

// seen is one process image discovery knows.
type seen struct {
	ident  procfs.Identity
	state  seenState
	first  time.Time
	cmd    []string
	warned bool // the MaxProcesses refusal was logged
	// opening: an open of this image is under way on a worker.
	opening bool
}

// discovery finds the Ruby processes and hands them to the clock.
type discovery struct {
	a       *Agent
	self    int
	seen    map[int]*seen
	alive   map[int]bool
	tracked int
	// Opening a process (its first snapshot resolves every name on its
	// stacks: 15 ms on an idle machine, up to a second on a busy one)
	// is done by openWorkers goroutines, so that a scan never waits for
	// one: serial opens let short processes come and go unseen. The
	// processes waiting for a worker are queued; every other open takes
	// the newest: when processes start faster than they can be opened
	// (a loaded host, short jobs), a first-come queue only grew while the
	// processes in it died before their turn (TestAgentChurn: 80 of 200
	// opened). The others take the oldest, so that a long-lived process
	// is never starved by a stream of short ones; those that exited
	// while queued leave the queue at the next scan (prune).
	requests chan openRequest // unbuffered: a ready worker takes the one offered
	queue    []openRequest    // waiting for a worker, newest last
	oldest   bool             // the next open takes the oldest queued
	results  chan openResult
	inflight int // queued or being opened
}

// maxQueued bounds the processes waiting for a worker: past it the oldest
// is dropped (asked for again at the next scan if still there).
const maxQueued = 4096

// openWorkers is how many processes are opened at once.
const openWorkers = 4

type openRequest struct {
	pid   int
	ident procfs.Identity
}

type openResult struct {
	openRequest
	p   *ruby.Process
	err error
}

func newDiscovery(a *Agent) *discovery {
	return &discovery{a: a, self: os.Getpid(), seen: map[int]*seen{}, alive: map[int]bool{},
		requests: make(chan openRequest), results: make(chan openResult, 64)}
}

// run scans /proc every Rescan, and takes the workers' opens as they
// finish, until ctx is done.
func (d *discovery) run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := 0; i < openWorkers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for req := range d.requests {
				p, err := ruby.Open(ctx, ruby.Spec{Pid: req.pid, Once: true, Options: ruby.Options{Runtimes: d.a.runtimes}})
				d.results <- openResult{req, p, err}
			}
		}()
	}
	defer func() {
		// Close what the workers opened that the clock will not take.
		close(d.requests)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		for {
			select {
			case r := <-d.results:
				if r.p != nil {
					_ = r.p.Target().Close()
				}
			case <-done:
				for {
					select {
					case r := <-d.results:
						if r.p != nil {
							_ = r.p.Target().Close()
						}
					default:
						return
					}
				}
			}
		}
	}()
	t := time.NewTicker(d.a.cfg.Rescan)
	defer t.Stop()
	d.scan(ctx)
	for {
		var out chan openRequest // nil (never ready) when nothing waits
		at := d.next()
		var next openRequest
		if at >= 0 {
			out, next = d.requests, d.queue[at]
		}
		select {
		case <-ctx.Done():
			return
		case out <- next:
			d.take(at)
		case r := <-d.results:
			d.opened(ctx, r)
		case <-t.C:
			d.scan(ctx)
		}
	}
}

// next is the index in the queue of the process to open next (-1: none
// waits): the newest and the oldest in turn.
func (d *discovery) next() int {
	at := len(d.queue) - 1
	if d.oldest && at > 0 {
		at = 0
	}
	return at
}

// take removes the queue's process at index at, handed to a worker.
func (d *discovery) take(at int) {
	d.queue = slices.Delete(d.queue, at, at+1)
	d.oldest = !d.oldest
}

// prune drops from the queue the processes that exited or exec'd since
// they were queued.
func (d *discovery) prune() {
	kept := d.queue[:0]
	for _, r := range d.queue {
		if s := d.seen[r.pid]; s != nil && s.ident == r.ident {
			kept = append(kept, r)
			continue
		}
		d.inflight--
	}
	clear(d.queue[len(kept):])
	d.queue = kept
}

// scan lists /proc once: new process images are examined, images gone
// or replaced (exec) are dropped, pending Ruby processes are opened.
func (d *discovery) scan(ctx context.Context) {
	t0 := time.Now()
	st := &d.a.stats
	defer func() {
		st.scans.Add(1)
		st.scanNanos.Add(int64(time.Since(t0)))
	}()
	for _, g := range d.a.takeDropped() {
		if s := d.seen[g.pid]; s != nil && s.ident == g.ident && s.state == tracked {
			// Exited while the clock read it; a pid reused by a new
			// image is looked at anew.
			s.state = ignored
			d.tracked--
		}
	}
	pids, err := procfs.Pids()
	if err != nil {
		d.a.log.Error("cannot list processes", "err", err)
		return
	}
	st.lastScanPids.Store(int64(len(pids)))
	clear(d.alive)
	for _, pid := range pids {
		if pid == d.self {
			continue
		}
		ps, err := procfs.ReadStat(pid)
		if err != nil || ps.Gone() || ps.KernelThread() {
			continue
		}
		d.alive[pid] = true
		id := ps.Identity()
		s := d.seen[pid]
		if s != nil && s.ident != id {
			// The process exec'd (or its pid was reused).
			if s.state == tracked {
				st.reexecs.Add(1)
				d.untrack(ctx, pid, s)
				d.a.log.Info("process exec'd: looking at it anew", "pid", pid)
			}
			s = nil
		}
		if s == nil {
			s = &seen{ident: id, first: t0}
			d.seen[pid] = s
			d.examine(pid, s)
		}
		if s.state == pending && !s.opening {
			d.request(pid, s)
		}
	}
	for pid, s := range d.seen {
		if !d.alive[pid] {
			if s.state == tracked {
				d.untrack(ctx, pid, s)
			}
			delete(d.seen, pid)
		}
	}
	d.prune()
}

// untrack tells the clock to drop process pid.
func (d *discovery) untrack(ctx context.Context, pid int, s *seen) {
	select {
	case d.a.events <- event{pid: pid, ident: s.ident}:
	case <-ctx.Done():
		// Run closes every target once the clock stops.
	}
	d.tracked--
	s.state = ignored
}

// examine decides whether a new process image is a Ruby process to
// profile: cheaply first (its executable's name, else whether it maps a
// libruby), then the filters.
func (d *discovery) examine(pid int, s *seen) {
	st := &d.a.stats
	st.rubyChecks.Add(1)
	s.state = ignored
	if !looksLikeRuby(pid) {
		st.notRuby.Add(1)
		if d.a.log.Enabled(context.Background(), slog.LevelDebug) {
			exe, _ := procfs.Exe(pid)
			d.a.log.Debug("not Ruby", "pid", pid, "exe", exe)
		}
		return
	}
	cmd, err := procfs.Cmdline(pid)
	if err != nil || len(cmd) == 0 {
		return // gone, or a zombie
	}
	s.cmd = cmd
	if why := d.filteredOut(pid, cmd); why != "" {
		st.filtered.Add(1)
		d.a.log.Debug("not profiled", "pid", pid, "why", why, "command", strings.Join(cmd, " "))
		return
	}
	st.discovered.Add(1)
	s.state = pending
}

// looksLikeRuby reports whether process pid runs Ruby as far as a cheap
// look tells: its executable is named ruby-something, or it maps a
// libruby. ruby.Open decides for good. When the kernel refuses both
// looks (another user's process, to an agent without CAP_SYS_PTRACE), the
// command line, which anyone may read, stands in: a process that says
// it is Ruby is then tried, so that the refusal is logged with its cause
// rather than the process passed over in silence.
func looksLikeRuby(pid int) bool {
	exe, err := procfs.Exe(pid)
	if err == nil && strings.Contains(filepath.Base(exe), "ruby") {
		return true
	}
	refused := errors.Is(err, os.ErrPermission)
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		if refused && errors.Is(err, os.ErrPermission) {
			cmd, _ := procfs.Cmdline(pid)
			return len(cmd) > 0 && strings.Contains(filepath.Base(strings.Fields(cmd[0] + " ")[0]), "ruby")
		}
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if i := bytes.LastIndexByte(line, '/'); i >= 0 && ruby.IsLibRuby(string(line[i:])) {
			return true
		}
	}
	return false
}

// filteredOut says why the filters leave process pid out ("" when they
// do not).
func (d *discovery) filteredOut(pid int, cmd []string) string {
	c := d.a.cfg
	if len(c.Users) > 0 {
		ps, err := procfs.ReadStatus(pid)
		if err != nil || !slices.Contains(c.Users, ps.UID) {
			return "user not in --user"
		}
	}
	line := strings.Join(cmd, " ")
	if c.Include != nil && !c.Include.MatchString(line) {
		return "command does not match --include"
	}
	if c.Exclude != nil && c.Exclude.MatchString(line) {
		return "command matches --exclude"
	}
	if c.Cgroup != nil {
		cg, err := procfs.CgroupPath(pid)
		if err != nil || !c.Cgroup.MatchString(cg) {
			return "cgroup does not match --cgroup"
		}
	}
	return ""
}

// request queues a pending Ruby process for a worker to open, unless
// MaxProcesses processes are profiled, queued or being opened.
func (d *discovery) request(pid int, s *seen) {
	if max := d.a.cfg.MaxProcesses; max > 0 && d.tracked+d.inflight >= max {
		d.a.stats.overLimit.Add(1)
		if !s.warned {
			s.warned = true
			d.a.log.Warn("not profiled: --max-processes reached", "pid", pid, "max_processes", max,
				"command", strings.Join(s.cmd, " "))
		}
		return
	}
	if len(d.queue) >= maxQueued {
		// Thousands waiting: the oldest is asked for again at the next
		// scan, if it is still there.
		old := d.queue[0]
		d.queue = slices.Delete(d.queue, 0, 1)
		d.inflight--
		if o := d.seen[old.pid]; o != nil && o.ident == old.ident {
			o.opening = false
		}
	}
	d.queue = append(d.queue, openRequest{pid: pid, ident: s.ident})
	s.opening = true
	d.inflight++
}

// opened takes a worker's open: hands the process to the clock, or
// decides from the error whether to try again at the next scan.
func (d *discovery) opened(ctx context.Context, r openResult) {
	d.inflight--
	st := &d.a.stats
	log := d.a.log
	pid, p, err := r.pid, r.p, r.err
	s := d.seen[pid]
	if s == nil || s.ident != r.ident || s.state != pending {
		// Gone or exec'd meanwhile.
		if p != nil {
			_ = p.Target().Close()
		}
		return
	}
	s.opening = false
	now := time.Now()
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, target.ErrExited):
			s.state = ignored
		case errors.Is(err, target.ErrDenied):
			s.state = ignored
			st.denied.Add(1)
			attrs := []any{"pid", pid, "command", strings.Join(s.cmd, " "), "err", err}
			if why := procfs.Refusal(pid); why != "" && !strings.Contains(err.Error(), why) {
				attrs = append(attrs, "cause", why)
			}
			log.Warn("cannot profile: access refused", attrs...)
		case errors.Is(err, ruby.ErrNotRuby) && now.Sub(s.first) > d.a.cfg.OpenTimeout:
			// Not Ruby after all (a process caught while the dynamic
			// loader maps its libraries, libruby not yet among them,
			// looks the same at first: hence the wait).
			s.state = ignored
			st.notRuby.Add(1)
			log.Debug("not a Ruby process", "pid", pid, "err", err)
		case now.Sub(s.first) > d.a.cfg.OpenTimeout:
			s.state = ignored
			st.gaveUp.Add(1)
			log.Warn("cannot profile: the Ruby process did not become readable", "pid", pid,
				"command", strings.Join(s.cmd, " "), "after", d.a.cfg.OpenTimeout.String(), "err", err)
		default:
			log.Debug("not readable yet: trying again at the next scan", "pid", pid, "err", err)
		}
		return
	}
	if max := d.a.cfg.MaxProcesses; max > 0 && d.tracked >= max {
		_ = p.Target().Close()
		return
	}
	l := labelsFor(pid, s.cmd)
	t := &proc{
		pid:     pid,
		ident:   s.ident,
		src:     sampler.NewRubySource(p, sampler.RubyOptions{}),
		service: l.Service,
		labels:  processLabels(l, pid, p.Version()),
	}
	select {
	case d.a.events <- event{add: t}:
	case <-ctx.Done():
		t.close()
		return
	}
	s.state = tracked
	d.tracked++
	st.opened.Add(1)
	log.Info("profiling", "pid", pid, "service_name", l.Service, "ruby_version", p.Version(),
		"layout", p.LayoutSource(), "command", strings.Join(s.cmd, " "))
}
