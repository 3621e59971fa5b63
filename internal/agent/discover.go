package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
}

// discovery finds the Ruby processes and hands them to the clock.
type discovery struct {
	a       *Agent
	self    int
	seen    map[int]*seen
	alive   map[int]bool
	tracked int
}

func newDiscovery(a *Agent) *discovery {
	return &discovery{a: a, self: os.Getpid(), seen: map[int]*seen{}, alive: map[int]bool{}}
}

// run scans /proc every Rescan until ctx is done.
func (d *discovery) run(ctx context.Context) {
	t := time.NewTicker(d.a.cfg.Rescan)
	defer t.Stop()
	for {
		d.scan(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
		if s.state == pending {
			d.open(ctx, pid, s, t0)
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

// open tries to open a pending Ruby process and hand it to the clock.
func (d *discovery) open(ctx context.Context, pid int, s *seen, now time.Time) {
	st := &d.a.stats
	log := d.a.log
	if max := d.a.cfg.MaxProcesses; max > 0 && d.tracked >= max {
		st.overLimit.Add(1)
		if !s.warned {
			s.warned = true
			log.Warn("not profiled: --max-processes reached", "pid", pid, "max_processes", max,
				"command", strings.Join(s.cmd, " "))
		}
		return
	}
	p, err := sampler.OpenRuby(ctx, pid, ruby.Options{Runtimes: d.a.runtimes}, 0)
	if err != nil {
		var perm target.ErrPermission
		switch {
		case ctx.Err() != nil:
			return
		case target.IsExited(err):
			s.state = ignored
		case errors.As(err, &perm):
			s.state = ignored
			st.denied.Add(1)
			attrs := []any{"pid", pid, "command", strings.Join(s.cmd, " "), "err", err}
			if why := procfs.Refusal(pid); why != "" && !strings.Contains(err.Error(), why) {
				attrs = append(attrs, "cause", why)
			}
			log.Warn("cannot profile: access refused", attrs...)
		case errors.Is(err, ruby.ErrNotRuby):
			s.state = ignored
			st.notRuby.Add(1)
			log.Debug("not a Ruby process", "pid", pid, "err", err)
		case now.Sub(s.first) > d.a.cfg.OpenTimeout:
			s.state = ignored
			st.gaveUp.Add(1)
			log.Warn("cannot profile: the Ruby process did not become readable", "pid", pid,
				"command", strings.Join(s.cmd, " "), "after", d.a.cfg.OpenTimeout.String(), "err", err)
		}
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
