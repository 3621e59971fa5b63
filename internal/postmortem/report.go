package postmortem

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/target"
)

// Report is what the handler saves about one crashed Ruby process, as
// DIR/<ID>.json (this struct) and DIR/<ID>.txt (WriteText).
type Report struct {
	ID         string    `json:"id"`          // "20261121T083625Z-1234"
	Time       time.Time `json:"time"`        // when the kernel saw the signal (%t)
	Pid        int       `json:"pid"`         // in the initial pid namespace (%P)
	TID        int       `json:"tid"`         // the thread that got the signal (%i)
	Signal     int       `json:"signal"`      // %s
	SignalName string    `json:"signal_name"` // "SIGABRT"
	Comm       string    `json:"comm"`        // the thread's name (%e)
	Executable string    `json:"executable"`
	Cmdline    []string  `json:"cmdline"` // /proc/PID/cmdline, else the core's (80 bytes)

	RubyVersion  string         `json:"ruby_version,omitempty"`
	LayoutSource string         `json:"layout_source,omitempty"`
	Threads      []stack.Thread `json:"threads"`

	Core     CoreFile  `json:"core"`
	Mappings []Mapping `json:"mappings"`
	// Errors say what could not be found out (the stacks are then partial
	// or missing).
	Errors []string `json:"errors,omitempty"`
}

// CoreFile says how much of the core the handler received and kept.
type CoreFile struct {
	Bytes     int64 `json:"bytes"`     // bytes saved and read
	Truncated bool  `json:"truncated"` // the core was longer than Limit
	Limit     int64 `json:"limit"`     // the cap in force (--max-core-size, or free space)
	// Kept is the file name (in the report directory) of the gzip-compressed
	// core, "" when it was not kept.
	Kept string `json:"kept,omitempty"`
}

// Mapping is one memory mapping of the crashed process. Addresses are hex
// strings ("0x7f..."): they do not fit a JSON number exactly.
type Mapping struct {
	Start  string `json:"start"`
	End    string `json:"end"`
	Offset string `json:"offset"`
	Perms  string `json:"perms"`
	Path   string `json:"path,omitempty"`
}

func mappingsJSON(ms []target.Mapping) []Mapping {
	out := make([]Mapping, 0, len(ms))
	for _, m := range ms {
		out = append(out, Mapping{
			Start:  fmt.Sprintf("0x%x", m.Start),
			End:    fmt.Sprintf("0x%x", m.End),
			Offset: fmt.Sprintf("0x%x", m.Offset),
			Perms:  m.Perms,
			Path:   m.Path,
		})
	}
	return out
}

// SignalName returns "SIGABRT" for 6, "signal 99" for an unknown number.
func SignalName(sig int) string {
	if n := unix.SignalName(unix.Signal(sig)); n != "" {
		return n
	}
	return fmt.Sprintf("signal %d", sig)
}

// CrashThread returns the thread that most likely crashed: the one the
// kernel named (TID), else the one holding the GVL, else the first one
// with frames. It returns nil when there is no thread.
func (r *Report) CrashThread() *stack.Thread {
	for i := range r.Threads {
		if r.Threads[i].TID == r.TID && r.TID != 0 && len(r.Threads[i].Frames) > 0 {
			return &r.Threads[i]
		}
	}
	for i := range r.Threads {
		if r.Threads[i].GVL {
			return &r.Threads[i]
		}
	}
	for i := range r.Threads {
		if len(r.Threads[i].Frames) > 0 {
			return &r.Threads[i]
		}
	}
	return nil
}

// TopFrame returns the innermost frame of CrashThread as "name (path:line)",
// "" when there is none.
func (r *Report) TopFrame() string {
	th := r.CrashThread()
	if th == nil || len(th.Frames) == 0 {
		return ""
	}
	return frameString(th.Frames[0])
}

func frameString(f stack.Frame) string {
	loc := f.Path
	if f.Line > 0 {
		loc = fmt.Sprintf("%s:%d", f.Path, f.Line)
	}
	if loc == "" {
		loc = "(unknown)"
	}
	return fmt.Sprintf("%s (%s)", f.Name, loc)
}

// WriteText writes the report for people: the crash, then every Ruby
// thread's stack in the layout of `rbscope snapshot`, then the mappings.
func WriteText(w io.Writer, r *Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Crash %s\n", r.ID)
	fmt.Fprintf(&b, "Time:       %s\n", r.Time.UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "Process:    %d (thread %d, %q)\n", r.Pid, r.TID, r.Comm)
	fmt.Fprintf(&b, "Signal:     %s (%d)\n", r.SignalName, r.Signal)
	fmt.Fprintf(&b, "Executable: %s\n", r.Executable)
	fmt.Fprintf(&b, "Command:    %s\n", strings.Join(r.Cmdline, " "))
	core := fmt.Sprintf("%d bytes", r.Core.Bytes)
	if r.Core.Truncated {
		core += fmt.Sprintf(", TRUNCATED at the %d-byte cap: stacks may be incomplete", r.Core.Limit)
	}
	if r.Core.Kept != "" {
		core += ", kept as " + r.Core.Kept
	}
	fmt.Fprintf(&b, "Core:       %s\n", core)
	if r.RubyVersion != "" {
		fmt.Fprintf(&b, "Ruby %s (layout %s)\n", r.RubyVersion, r.LayoutSource)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(&b, "Error:      %s\n", e)
	}
	for _, th := range r.Threads {
		var tags []string
		if th.Main {
			tags = append(tags, "main")
		}
		if th.GVL {
			tags = append(tags, "has GVL")
		}
		if th.TID != 0 && th.TID == r.TID {
			tags = append(tags, "got the signal")
		}
		tags = append(tags, th.State)
		fmt.Fprintf(&b, "\nThread %d %q (%s)\n", th.TID, th.Name, strings.Join(tags, ", "))
		if len(th.Frames) == 0 {
			b.WriteString("    (no Ruby frames)\n")
		}
		for _, f := range th.Frames {
			fmt.Fprintf(&b, "    %s\n", frameString(f))
		}
		if th.Error != "" {
			fmt.Fprintf(&b, "    (stack cut short: %s)\n", th.Error)
		}
	}
	if len(r.Mappings) > 0 {
		b.WriteString("\nMappings:\n")
		for _, m := range r.Mappings {
			fmt.Fprintf(&b, "    %s-%s %s %s %s\n", m.Start, m.End, m.Perms, m.Offset, m.Path)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// idRe is the form of a report ID: UTC time, pid, optional counter.
var idRe = regexp.MustCompile(`^[0-9]{8}T[0-9]{6}Z-[0-9]+(-[0-9]+)?$`)

// ValidID reports whether id has the form of a report ID (and so names no
// file outside the report directory).
func ValidID(id string) bool { return idRe.MatchString(id) }

// ErrNoReport is returned by Load when there is no report with that ID.
var ErrNoReport = errors.New("no such crash report")

// Load reads the report id from dir.
func Load(dir, id string) (*Report, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("%q is not a crash report ID (like 20261121T083625Z-1234): %w", id, ErrNoReport)
	}
	b, err := os.ReadFile(filepath.Join(dir, id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s in %s: %w", id, dir, ErrNoReport)
	}
	if err != nil {
		return nil, fmt.Errorf("read report %s: %w", id, err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("parse report %s: %w", id, err)
	}
	return &r, nil
}

// reportIDs lists the IDs of the reports in dir, oldest first.
func reportIDs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list reports: %w", err)
	}
	var ids []string
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if ok && ValidID(id) && e.Type().IsRegular() {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return idLess(ids[i], ids[j]) })
	return ids, nil
}

// idLess orders IDs by time, then pid order of arrival (counter).
func idLess(a, b string) bool {
	if a[:16] != b[:16] {
		return a[:16] < b[:16]
	}
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// List reads every report in dir, newest first. Reports that cannot be
// read are skipped and their errors joined in the returned error (with the
// reports that could be read).
func List(dir string) ([]*Report, error) {
	ids, err := reportIDs(dir)
	if err != nil {
		return nil, err
	}
	var out []*Report
	var errs []error
	for i := len(ids) - 1; i >= 0; i-- {
		r, err := Load(dir, ids[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

// prune deletes the oldest reports (and their text and kept cores) so
// that at most keep remain.
func prune(dir string, keep int) error {
	ids, err := reportIDs(dir)
	if err != nil {
		return err
	}
	var errs []error
	for len(ids) > keep {
		id := ids[0]
		ids = ids[1:]
		for _, suffix := range []string{".json", ".txt", ".core.gz"} {
			if err := os.Remove(filepath.Join(dir, id+suffix)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete old reports: %w", err)
	}
	return nil
}

func jsonIndent(r *Report) ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
