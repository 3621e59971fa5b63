package postmortem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// chainProgram returns the program of a core_pattern pipe.
func chainProgram(pattern string) string {
	f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(pattern), "|"))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// ExpandPattern expands a core_pattern pipe ("|/prog %P %s") the way the
// kernel would for crash c: the template is split at spaces first, then
// each word's specifiers are replaced. exe is the executable's path (for
// %E), "" when unknown. Specifiers the handler was not given (%u without
// u=%u in its arguments, say) expand to nothing; they are listed in
// missing.
func ExpandPattern(pattern string, c Crash, exe string) (argv []string, missing []string, err error) {
	p := strings.TrimSpace(pattern)
	if !strings.HasPrefix(p, "|") {
		return nil, nil, fmt.Errorf("chained handler %q is not a pipe (it must start with |)", pattern)
	}
	words := strings.Fields(p[1:])
	if len(words) == 0 {
		return nil, nil, fmt.Errorf("chained handler %q names no program", pattern)
	}
	if !strings.HasPrefix(words[0], "/") {
		return nil, nil, fmt.Errorf("chained handler %q: the program must be an absolute path", pattern)
	}
	host, _ := os.Hostname()
	for _, w := range words {
		var b strings.Builder
		for i := 0; i < len(w); i++ {
			if w[i] != '%' || i+1 == len(w) {
				b.WriteByte(w[i])
				continue
			}
			i++
			switch s := w[i]; s {
			case '%':
				b.WriteByte('%')
			case 'p', 'P':
				b.WriteString(strconv.Itoa(c.Pid))
			case 'i', 'I':
				b.WriteString(strconv.Itoa(c.TID))
			case 's':
				b.WriteString(strconv.Itoa(c.Signal))
			case 't':
				b.WriteString(strconv.FormatInt(c.Time.Unix(), 10))
			case 'e':
				b.WriteString(c.Comm)
			case 'E':
				b.WriteString(strings.ReplaceAll(exe, "/", "!"))
			case 'h':
				if v, ok := c.Extra["h"]; ok {
					b.WriteString(v)
				} else {
					b.WriteString(host)
				}
			default:
				if v, ok := c.Extra[string(s)]; ok {
					b.WriteString(v)
				} else {
					missing = append(missing, "%"+string(s))
				}
			}
		}
		argv = append(argv, b.String())
	}
	return argv, missing, nil
}

// runChain runs the chained handler with the core on its standard input,
// killing it at ctx's deadline. It returns the bytes it passed on.
func runChain(ctx context.Context, pattern string, c Crash, exe string, core io.Reader) (int64, error) {
	argv, missing, err := ExpandPattern(pattern, c, exe)
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.WaitDelay = time.Second
	w, err := cmd.StdinPipe()
	if err != nil {
		return 0, fmt.Errorf("run %s: %w", argv[0], err)
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("run %s: %w", argv[0], err)
	}
	n, cerr := io.Copy(w, &ctxReader{ctx: ctx, r: core})
	w.Close()
	werr := cmd.Wait()
	if errors.Is(cerr, os.ErrClosed) || errors.Is(cerr, syscall.EPIPE) {
		cerr = nil // the handler stopped reading: its choice
	}
	if err := errors.Join(werr, cerr); err != nil {
		return n, fmt.Errorf("%s: %w", argv[0], err)
	}
	if len(missing) > 0 {
		return n, fmt.Errorf("%s ran, but without %s (pass them to rbscope core-handler as u=%%u style arguments)",
			argv[0], strings.Join(missing, " "))
	}
	return n, nil
}
