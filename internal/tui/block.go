package tui

import (
	"fmt"
	"io"
	"strings"

	"golang.org/x/term"
)

// Block is a live view drawn in place below the shell prompt (no
// alternate screen, no raw mode): each Draw moves the cursor up over the
// previous block and overwrites it. When the writer is not a terminal,
// Draw writes only the block's summary line, so that logs get one line per
// refresh. rbscope alloc draws its live view with it.
type Block struct {
	w     io.Writer
	tty   bool
	lines int // lines drawn last time
}

// NewBlock returns a Block writing to w; tty says whether w is a terminal.
func NewBlock(w io.Writer, tty bool) *Block { return &Block{w: w, tty: tty} }

// Draw replaces the block with lines on a terminal, or writes summary
// elsewhere.
func (b *Block) Draw(summary string, lines []string) {
	if !b.tty {
		fmt.Fprintln(b.w, summary)
		return
	}
	var s strings.Builder
	if b.lines > 0 {
		fmt.Fprintf(&s, "\033[%dA%s", b.lines, clearBelow)
	}
	for _, l := range lines {
		s.WriteString(l)
		s.WriteString(clearLine)
		s.WriteByte('\n')
	}
	b.lines = len(lines)
	io.WriteString(b.w, s.String())
}

// Finish leaves the last block on screen.
func (b *Block) Finish() {
	if b.tty && b.lines > 0 {
		fmt.Fprintln(b.w)
	}
}

// WriterIsTerminal reports whether w is a terminal (a Block's tty
// argument).
func WriterIsTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}
