package record

import (
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/term"

	"github.com/rbscope/rbscope/internal/sampler"
)

// console prints a recording's messages and, on a terminal, a progress
// line that each message replaces.
type console struct {
	w      io.Writer
	silent bool
	tty    bool

	mu       sync.Mutex
	progress bool // a progress line is on screen
}

func newConsole(w io.Writer, silent bool) *console {
	if w == nil {
		w = os.Stderr
	}
	c := &console{w: w, silent: silent}
	if f, ok := w.(*os.File); ok {
		c.tty = term.IsTerminal(int(f.Fd()))
	}
	return c
}

// clearLocked erases the progress line; c.mu is held.
func (c *console) clearLocked() {
	if c.progress {
		fmt.Fprint(c.w, "\r\033[K")
		c.progress = false
	}
}

// say prints one message ("rbscope: ..."). Write errors (a terminal that
// hung up) are ignored.
func (c *console) say(format string, args ...any) {
	if c.silent {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
	fmt.Fprintf(c.w, "rbscope: "+format+"\n", args...)
}

// show draws the progress line (terminals only).
func (c *console) show(st sampler.Stats) {
	if c.silent || !c.tty {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintf(c.w, "\r\033[K%6.1fs  %d samples  %d errors  %d late",
		st.End.Sub(st.Start).Seconds(), st.Samples, st.ErrorCount(), st.Late+st.Missed)
	c.progress = true
}

// clear erases the progress line.
func (c *console) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
}
