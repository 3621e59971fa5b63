package tui

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/term"
)

// Screen is a full-screen live view on a terminal: raw mode (keys arrive
// at once; Ctrl-C is a key, not a signal), the alternate screen, no
// cursor. Close restores the terminal; it is safe to call more than once.
type Screen struct {
	in, out *os.File
	old     *term.State
	keys    chan byte
}

// ErrNoTerminal is returned by OpenScreen when in or out is not a terminal.
var ErrNoTerminal = errors.New("not a terminal")

// IsTerminal reports whether both in and out are terminals.
func IsTerminal(in, out *os.File) bool {
	return term.IsTerminal(int(in.Fd())) && term.IsTerminal(int(out.Fd()))
}

// OpenScreen takes over the terminal on in and out.
func OpenScreen(in, out *os.File) (*Screen, error) {
	if !IsTerminal(in, out) {
		return nil, ErrNoTerminal
	}
	old, err := term.MakeRaw(int(in.Fd()))
	if err != nil {
		return nil, fmt.Errorf("set terminal to raw mode: %w", err)
	}
	s := &Screen{in: in, out: out, old: old, keys: make(chan byte, 16)}
	_, _ = io.WriteString(out, EnterAltScreen+HideCursor)
	go s.readKeys()
	return s, nil
}

// readKeys passes every byte typed on to Keys, which is closed when the
// terminal is gone.
func (s *Screen) readKeys() {
	buf := make([]byte, 64)
	for {
		n, err := s.in.Read(buf)
		for _, c := range buf[:n] {
			s.keys <- c
		}
		if err != nil {
			close(s.keys)
			return
		}
	}
}

// Keys delivers the bytes typed; it is closed at end of input.
func (s *Screen) Keys() <-chan byte { return s.keys }

// Size returns the terminal's width and height (80x24 when unknown).
func (s *Screen) Size() (width, height int) {
	w, h, err := term.GetSize(int(s.out.Fd()))
	if err != nil {
		return 80, 24
	}
	return w, h
}

// Draw writes a frame rendered for the current size.
func (s *Screen) Draw(render func(width, height int) string) {
	w, h := s.Size()
	_, _ = io.WriteString(s.out, render(w, h))
}

// Close restores the terminal.
func (s *Screen) Close() {
	if s.old == nil {
		return
	}
	_ = term.Restore(int(s.in.Fd()), s.old)
	s.old = nil
	_, _ = io.WriteString(s.out, ShowCursor+ExitAltScreen)
}
