package postmortem

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// Defaults of Config.
const (
	DefaultMaxCoreSize = 1 << 30
	DefaultKeep        = 10
	DefaultMinFree     = 512 << 20
	DefaultTimeout     = 60 * time.Second
)

// LogName is the handler's log file in the report directory.
const LogName = "handler.log"

// maxLogSize caps handler.log: past it, the log is renamed handler.log.1
// (replacing the previous one) before the next line.
const maxLogSize = 1 << 20

// Config is how the handler treats a crash.
type Config struct {
	// Dir is the absolute path of the report directory.
	Dir string
	// MaxCoreSize caps the bytes of the core saved and read (a longer core
	// is truncated; the ELF reader reads what there is).
	MaxCoreSize int64
	// KeepCore keeps the core, gzip-compressed, beside the report.
	KeepCore bool
	// Keep is how many reports to keep (the newest).
	Keep int
	// MinFree is the free space (bytes) the handler leaves on Dir's file
	// system: it writes nothing that would go below it.
	MinFree int64
	// Chain is a core_pattern pipe ("|/path/prog %P %s ...") that gets the
	// core of non-Ruby processes, "" for none.
	Chain string
	// Timeout bounds the whole handling (DefaultTimeout when 0).
	Timeout time.Duration
	// Proc is the proc file system's mount point ("/proc" when empty).
	Proc string
}

func (c Config) withDefaults() Config {
	if c.MaxCoreSize <= 0 {
		c.MaxCoreSize = DefaultMaxCoreSize
	}
	if c.Keep <= 0 {
		c.Keep = DefaultKeep
	}
	if c.MinFree < 0 {
		c.MinFree = 0
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Proc == "" {
		c.Proc = "/proc"
	}
	return c
}

// Crash is what the kernel says about the dumping process: the
// core_pattern specifiers.
type Crash struct {
	Pid    int       // %P: pid in the initial pid namespace (0: unknown)
	TID    int       // %i: the thread that got the signal
	Signal int       // %s
	Time   time.Time // %t
	Comm   string    // %e: the thread's name
	// Extra are further specifiers passed as key=value ("u" for %u, "g",
	// "c", "d", "h", ...), for a chained handler.
	Extra map[string]string
}

// ParseArgs parses the handler's arguments as core_pattern expands them:
// "%P %i %s %t %e", then optional key=value pairs ("u=%u g=%g c=%c").
func ParseArgs(args []string) (Crash, error) {
	if len(args) < 4 {
		return Crash{}, fmt.Errorf("got %d arguments (%q), want %%P %%i %%s %%t [%%e] [key=value...]", len(args), args)
	}
	var c Crash
	nums := make([]int64, 4)
	for i, name := range []string{"pid (%P)", "thread id (%i)", "signal (%s)", "time (%t)"} {
		n, err := strconv.ParseInt(args[i], 10, 64)
		if err != nil || n < 0 {
			return Crash{}, fmt.Errorf("parse %s %q: not a number", name, args[i])
		}
		nums[i] = n
	}
	c.Pid, c.TID, c.Signal, c.Time = int(nums[0]), int(nums[1]), int(nums[2]), time.Unix(nums[3], 0).UTC()
	rest := args[4:]
	if len(rest) > 0 && !strings.Contains(rest[0], "=") {
		c.Comm = rest[0]
		rest = rest[1:]
	}
	for _, kv := range rest {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			// %e of an old kernel, split at a space in the thread's name.
			c.Comm += " " + kv
			continue
		}
		if c.Extra == nil {
			c.Extra = map[string]string{}
		}
		c.Extra[k] = v
	}
	return c, nil
}

// Result says what Handle did.
type Result struct {
	// ID is the report written, "" when none was.
	ID string
	// Ruby is whether the process was a Ruby process.
	Ruby bool
	// Chained is whether the core went to the chained handler.
	Chained bool
	// Log is the line written to handler.log.
	Log string
}

// Handle deals with one crash: core is the core file as the kernel pipes
// it. It logs one line to DIR/handler.log whatever happens (and returns
// the error it logged, if any). It returns within cfg.Timeout, except for
// a read of core that blocks (the caller must bound the process's life:
// rbscope core-handler exits at the deadline).
func Handle(ctx context.Context, cfg Config, c Crash, core io.Reader) (Result, error) {
	cfg = cfg.withDefaults()
	if !filepath.IsAbs(cfg.Dir) {
		return Result{}, fmt.Errorf("report directory %q is not an absolute path", cfg.Dir)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return Result{}, fmt.Errorf("create report directory: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	h := &handling{cfg: cfg, crash: c, in: core}
	res, err := h.run(ctx)
	line := fmt.Sprintf("%s pid=%d tid=%d comm=%q signal=%s(%d): ",
		time.Now().UTC().Format(time.RFC3339), c.Pid, c.TID, c.Comm, SignalName(c.Signal), c.Signal)
	switch {
	case err != nil && res.ID != "":
		line += fmt.Sprintf("report %s written, with an error: %v", res.ID, err)
	case err != nil:
		line += "error: " + err.Error()
	case res.ID != "":
		line += "report " + res.ID
	default:
		line += res.Log
	}
	for _, n := range h.notes {
		line += "; " + n
	}
	res.Log = line
	if lerr := appendLog(cfg.Dir, line); lerr != nil {
		err = errors.Join(err, lerr)
	}
	return res, err
}

// appendLog appends one line to DIR/handler.log, rotating it past
// maxLogSize.
func appendLog(dir, line string) error {
	p := filepath.Join(dir, LogName)
	if st, err := os.Stat(p); err == nil && st.Size() > maxLogSize {
		os.Rename(p, p+".1")
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", LogName, err)
	}
	line = strings.ReplaceAll(line, "\n", " ")
	_, err = f.WriteString(line + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", LogName, err)
	}
	return nil
}

// handling is one run of Handle.
type handling struct {
	cfg   Config
	crash Crash
	in    io.Reader
	notes []string // extra facts for the log line

	live     *liveInfo
	corePath string // the saved core, removed at the end
}

// liveInfo is what /proc says about the dying process while the kernel
// writes its core.
type liveInfo struct {
	exe     string
	cmdline []string
	maps    []target.Mapping
	root    *os.File // its root directory, opened (stays usable after exit)
}

func (l *liveInfo) sysRoot() string {
	if l == nil || l.root == nil {
		return ""
	}
	return fmt.Sprintf("/proc/self/fd/%d", l.root.Fd())
}

// readLive reads /proc/PID; nil when the process is not there.
func (h *handling) readLive() *liveInfo {
	if h.crash.Pid <= 0 {
		return nil
	}
	dir := filepath.Join(h.cfg.Proc, strconv.Itoa(h.crash.Pid))
	f, err := os.Open(filepath.Join(dir, "maps"))
	if err != nil {
		h.notes = append(h.notes, fmt.Sprintf("no /proc entry (%v): working from the core alone", err))
		return nil
	}
	maps, err := target.ParseMaps(bufio.NewScanner(f))
	f.Close()
	if err != nil {
		h.notes = append(h.notes, "read maps: "+err.Error())
		return nil
	}
	l := &liveInfo{maps: maps}
	l.exe, _ = os.Readlink(filepath.Join(dir, "exe"))
	l.cmdline, _ = procfs.ReadCmdline(filepath.Join(dir, "cmdline"))
	if root, err := os.Open(filepath.Join(dir, "root")); err == nil {
		l.root = root
	} else {
		h.notes = append(h.notes, "open the process's root: "+err.Error())
	}
	return l
}

// isRuby says whether the live process is a Ruby process (ruby.IsRubyProcess):
// it maps libruby, or its executable exports Ruby's symbols (a static
// ruby). An executable that cannot be read is not taken for Ruby.
func (l *liveInfo) isRuby() bool {
	if ruby.IsRubyProcess(l.maps, "", nil) {
		return true
	}
	if l.root == nil || l.exe == "" {
		return false
	}
	f, err := os.Open(filepath.Join(l.sysRoot(), filepath.Clean("/"+l.exe)))
	if err != nil {
		return false
	}
	defer f.Close()
	b, err := elfx.Open(f)
	if err != nil {
		return false
	}
	return ruby.IsRubyProcess(l.maps, l.exe, b.Symbols)
}

func (h *handling) run(ctx context.Context) (res Result, err error) {
	h.live = h.readLive()
	defer func() {
		if h.live != nil && h.live.root != nil {
			h.live.root.Close()
		}
		if h.corePath != "" {
			os.Remove(h.corePath)
		}
	}()
	if h.live != nil && !h.live.isRuby() {
		return h.notRuby(ctx, h.in)
	}
	id, err := h.newID()
	if err != nil {
		return Result{}, err
	}
	limit, err := h.coreBudget()
	if err != nil {
		return Result{Ruby: h.live != nil}, err
	}
	saved, truncated, err := h.saveCore(ctx, id, limit)
	if err != nil {
		return Result{Ruby: h.live != nil}, err
	}
	r := &Report{
		ID: id, Time: h.crash.Time, Pid: h.crash.Pid, TID: h.crash.TID,
		Signal: h.crash.Signal, SignalName: SignalName(h.crash.Signal), Comm: h.crash.Comm,
		Core:    CoreFile{Bytes: saved, Truncated: truncated, Limit: limit},
		Threads: []stack.Thread{},
	}
	if h.live != nil {
		r.Executable, r.Cmdline, r.Mappings = h.live.exe, h.live.cmdline, mappingsJSON(h.live.maps)
	}
	notRuby, err := h.analyze(ctx, r)
	if notRuby && h.live == nil {
		f, ferr := os.Open(h.corePath)
		if ferr != nil {
			return Result{}, fmt.Errorf("reopen the saved core: %w", ferr)
		}
		defer f.Close()
		return h.notRuby(ctx, f)
	}
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
	}
	if truncated {
		h.notes = append(h.notes, fmt.Sprintf("core truncated at %d bytes", limit))
	}
	if h.cfg.KeepCore {
		if name, err := h.keepCore(ctx, id); err != nil {
			r.Errors = append(r.Errors, err.Error())
		} else {
			r.Core.Kept = name
		}
	}
	if err := h.writeReport(r); err != nil {
		return Result{Ruby: true}, err
	}
	res = Result{ID: id, Ruby: true}
	if err := prune(h.cfg.Dir, h.cfg.Keep); err != nil {
		return res, err
	}
	if len(r.Errors) > 0 {
		return res, errors.New(strings.Join(r.Errors, "; "))
	}
	return res, nil
}

// notRuby chains to the configured handler, or just says so.
func (h *handling) notRuby(ctx context.Context, core io.Reader) (Result, error) {
	what := h.crash.Comm
	if h.live != nil && h.live.exe != "" {
		what = h.live.exe
	}
	if h.cfg.Chain == "" {
		return Result{Log: fmt.Sprintf("not a Ruby process (%s): nothing saved", what)}, nil
	}
	var exe string
	if h.live != nil {
		exe = h.live.exe
	}
	n, err := runChain(ctx, h.cfg.Chain, h.crash, exe, core)
	if err != nil {
		return Result{Chained: true}, fmt.Errorf("not a Ruby process (%s): chained handler: %w", what, err)
	}
	return Result{Chained: true, Log: fmt.Sprintf("not a Ruby process (%s): %d bytes of core passed to %s", what, n, chainProgram(h.cfg.Chain))}, nil
}

// newID picks the report ID: UTC time of the crash and pid, with a counter
// when that report exists already.
func (h *handling) newID() (string, error) {
	t := h.crash.Time
	if t.IsZero() || t.Unix() == 0 {
		t = time.Now()
	}
	base := fmt.Sprintf("%s-%d", t.UTC().Format("20060102T150405Z"), h.crash.Pid)
	for i := 1; i < 1000; i++ {
		id := base
		if i > 1 {
			id = fmt.Sprintf("%s-%d", base, i)
		}
		if _, err := os.Lstat(filepath.Join(h.cfg.Dir, id+".json")); errors.Is(err, os.ErrNotExist) {
			return id, nil
		}
	}
	return "", fmt.Errorf("pick a report name: %s-1 to -999 exist", base)
}

// freeBytes is the space unprivileged users may still use on dir's file
// system (what df shows as available).
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("check free space: %w", err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// coreBudget is how many bytes of core may be saved: MaxCoreSize, less if
// the file system would go below MinFree.
func (h *handling) coreBudget() (int64, error) {
	free, err := freeBytes(h.cfg.Dir)
	if err != nil {
		return 0, err
	}
	room := free - h.cfg.MinFree - 1<<20 // and a MiB for the report
	if room <= 0 {
		return 0, fmt.Errorf("not saving anything: %s has %d MiB free, below --min-free (%d MiB)",
			h.cfg.Dir, free>>20, h.cfg.MinFree>>20)
	}
	if room < h.cfg.MaxCoreSize {
		h.notes = append(h.notes, fmt.Sprintf("core capped at %d MiB to keep --min-free", room>>20))
		return room, nil
	}
	return h.cfg.MaxCoreSize, nil
}

// saveCore streams the core into the report directory, at most limit
// bytes; truncated says the core was longer.
func (h *handling) saveCore(ctx context.Context, id string, limit int64) (n int64, truncated bool, err error) {
	f, err := os.OpenFile(filepath.Join(h.cfg.Dir, "."+id+".core"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, false, fmt.Errorf("create core file: %w", err)
	}
	h.corePath = f.Name()
	buf := make([]byte, 1<<20)
	for n < limit {
		if err := ctx.Err(); err != nil {
			f.Close()
			return n, false, fmt.Errorf("save core: stopped after %d bytes: %w", n, err)
		}
		chunk := buf
		if rest := limit - n; rest < int64(len(chunk)) {
			chunk = chunk[:rest]
		}
		got, rerr := h.in.Read(chunk)
		if got > 0 {
			if _, err := f.Write(chunk[:got]); err != nil {
				f.Close()
				return n, false, fmt.Errorf("save core: %w", err)
			}
			n += int64(got)
		}
		if errors.Is(rerr, io.EOF) {
			return n, false, f.Close()
		}
		if rerr != nil {
			f.Close()
			return n, false, fmt.Errorf("read core: %w", rerr)
		}
	}
	if err := f.Close(); err != nil {
		return n, false, fmt.Errorf("save core: %w", err)
	}
	// At the cap: is there more?
	var one [1]byte
	for {
		got, rerr := h.in.Read(one[:])
		if got > 0 {
			return n, true, nil
		}
		if rerr != nil {
			return n, false, nil
		}
	}
}

// analyze reads the Ruby threads' stacks from the saved core into r.
// notRuby says the core is not a Ruby process's. It gives up at the
// deadline (leaving the reading goroutine to the process's end).
func (h *handling) analyze(ctx context.Context, r *Report) (notRuby bool, err error) {
	type result struct {
		notRuby bool
		err     error
	}
	done := make(chan result, 1)
	out := *r
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- result{err: fmt.Errorf("read the core: internal error: %v", p)}
			}
		}()
		nr, err := readStacks(h.corePath, h.live.sysRoot(), h.cfg.MaxCoreSize, &out)
		done <- result{nr, err}
	}()
	select {
	case res := <-done:
		*r = out
		return res.notRuby, res.err
	case <-ctx.Done():
		return false, fmt.Errorf("read the stacks: %w", ctx.Err())
	}
}

// readStacks fills r from the core at path, reading files missing from it
// under sysRoot. A gzip-compressed core (which the kernel never sends)
// decompresses to maxCore bytes at most.
func readStacks(path, sysRoot string, maxCore int64, r *Report) (notRuby bool, err error) {
	t, err := target.OpenCore(path, target.CoreOptions{SysRoot: sysRoot, MaxDecompressed: maxCore})
	if err != nil {
		return false, fmt.Errorf("open the core: %w", err)
	}
	defer t.Close()
	if r.Executable == "" {
		r.Executable = t.Executable()
	}
	if len(r.Cmdline) == 0 {
		if ci, ok := t.(target.CoreInfo); ok && ci.Args() != "" {
			r.Cmdline = strings.Fields(ci.Args())
		}
	}
	if len(r.Mappings) == 0 {
		if ms, err := t.Mappings(); err == nil {
			r.Mappings = mappingsJSON(ms)
		}
	}
	p, err := ruby.Open(context.Background(), ruby.Spec{Target: t, Consistency: ruby.Stopped})
	if err != nil {
		if errors.Is(err, ruby.ErrNotRuby) {
			return true, err
		}
		return false, err // worded by ruby.Open: the process, and what failed
	}
	r.RubyVersion, r.LayoutSource = p.Version(), p.LayoutSource()
	threads, err := p.Snapshot()
	for i := range threads {
		if threads[i].Frames == nil {
			threads[i].Frames = []stack.Frame{}
		}
	}
	if threads != nil {
		r.Threads = threads
	}
	if err != nil {
		return false, fmt.Errorf("read the stacks: %w", err)
	}
	return false, nil
}

// writeReport writes DIR/<ID>.json and DIR/<ID>.txt, each through a
// temporary file renamed into place.
func (h *handling) writeReport(r *Report) error {
	js, err := jsonIndent(r)
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	var txt bytes.Buffer
	if err := WriteText(&txt, r); err != nil {
		return fmt.Errorf("render report: %w", err)
	}
	free, err := freeBytes(h.cfg.Dir)
	if err != nil {
		return err
	}
	if free-int64(len(js)+txt.Len()) < h.cfg.MinFree {
		return fmt.Errorf("not writing the report: %s has %d MiB free, below --min-free (%d MiB)",
			h.cfg.Dir, free>>20, h.cfg.MinFree>>20)
	}
	// The text first: a listing shows reports by their JSON.
	if err := writeAtomic(filepath.Join(h.cfg.Dir, r.ID+".txt"), txt.Bytes()); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(h.cfg.Dir, r.ID+".json"), js)
}

func writeAtomic(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// keepCore compresses the saved core to DIR/<ID>.core.gz, never taking
// the file system below MinFree.
func (h *handling) keepCore(ctx context.Context, id string) (string, error) {
	free, err := freeBytes(h.cfg.Dir)
	if err != nil {
		return "", err
	}
	room := free - h.cfg.MinFree - 1<<20
	if room <= 0 {
		return "", fmt.Errorf("not keeping the core: below --min-free")
	}
	in, err := os.Open(h.corePath)
	if err != nil {
		return "", fmt.Errorf("keep the core: %w", err)
	}
	defer in.Close()
	name := id + ".core.gz"
	tmp := filepath.Join(h.cfg.Dir, "."+name+".tmp")
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("keep the core: %w", err)
	}
	fail := func(err error) (string, error) {
		out.Close()
		os.Remove(tmp)
		return "", fmt.Errorf("keep the core: %w", err)
	}
	zw, _ := gzip.NewWriterLevel(&capWriter{w: out, left: room}, gzip.BestSpeed)
	if _, err := io.Copy(zw, &ctxReader{ctx: ctx, r: in}); err != nil {
		return fail(err)
	}
	if err := zw.Close(); err != nil {
		return fail(err)
	}
	if err := out.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, filepath.Join(h.cfg.Dir, name)); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("keep the core: %w", err)
	}
	return name, nil
}

// capWriter fails once more than left bytes are written.
type capWriter struct {
	w    io.Writer
	left int64
}

func (c *capWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		return 0, errors.New("it would take the file system below --min-free")
	}
	c.left -= int64(len(p))
	return c.w.Write(p)
}

// ctxReader stops reading once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
