package postmortem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// CorePatternFile is the kernel's core_pattern setting.
const CorePatternFile = "/proc/sys/kernel/core_pattern"

// Files in the report directory that install and uninstall use.
const (
	// PreviousPatternName holds core_pattern as it was before install.
	PreviousPatternName = "previous_core_pattern"
	// ChainName holds the pipe the handler passes non-Ruby cores to.
	ChainName = "chain"
)

// maxPattern is the longest core_pattern the kernel keeps (CORENAME_MAX_SIZE
// is 128 bytes with the terminating NUL); longer writes are cut silently.
const maxPattern = 127

// handlerMarker identifies a core_pattern of ours.
const handlerMarker = " core-handler "

// chainSpecs are passed to the handler as key=value when a chained handler
// may need them (the specifiers rbscope itself does not use).
const chainSpecs = " u=%u g=%g c=%c d=%d h=%h"

// HandlerPattern returns the core_pattern line that runs bin (an absolute
// path) as the handler with flags (e.g. "--dir", DIR), ending in the
// specifiers the handler parses: "%P %i %s %t %e", plus chainSpecs when
// chain is set.
func HandlerPattern(bin string, flags []string, chain bool) (string, error) {
	if !filepath.IsAbs(bin) {
		return "", fmt.Errorf("handler program %q is not an absolute path", bin)
	}
	for _, s := range append([]string{bin}, flags...) {
		if strings.ContainsAny(s, " \t\n%") {
			return "", fmt.Errorf("%q holds a space or %%, which core_pattern cannot carry: use another path", s)
		}
	}
	p := "|" + bin + handlerMarker + strings.Join(flags, " ") + " %P %i %s %t %e"
	if chain {
		p += chainSpecs
	}
	if len(p) > maxPattern {
		return "", fmt.Errorf("the core_pattern line would be %d bytes, over the kernel's %d (%s): "+
			"use shorter paths (install rbscope as /usr/local/bin/rbscope, a short --dir) or fewer options",
			len(p), maxPattern, p)
	}
	return p, nil
}

// IsHandlerPattern reports whether pattern runs rbscope's handler.
func IsHandlerPattern(pattern string) bool {
	return strings.HasPrefix(pattern, "|") && strings.Contains(pattern, handlerMarker)
}

// ReadPattern returns the current core_pattern of file (CorePatternFile).
func ReadPattern(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", file, err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// WritePattern sets file (CorePatternFile) to pattern and checks the
// kernel kept it whole.
func WritePattern(file, pattern string) error {
	if err := os.WriteFile(file, []byte(pattern+"\n"), 0o644); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("set %s: %w (run as root)", file, err)
		}
		return fmt.Errorf("set %s: %w", file, err)
	}
	got, err := ReadPattern(file)
	if err != nil {
		return err
	}
	if got != pattern {
		return fmt.Errorf("set %s: the kernel kept %q, not %q", file, got, pattern)
	}
	return nil
}

// InstallOptions configures Install.
type InstallOptions struct {
	// Bin is the absolute path of the rbscope binary.
	Bin string
	// Dir is the absolute path of the report directory.
	Dir string
	// Flags are the handler's flags besides --dir ("--keep", "5", ...).
	Flags []string
	// Chain is the pipe to pass non-Ruby cores to: "" for the previous
	// core_pattern when it is a pipe, "none" for no chaining.
	Chain string
	// PatternFile is CorePatternFile unless set (tests).
	PatternFile string
}

// Install points the kernel's core_pattern at the handler, saving the
// previous value in DIR/previous_core_pattern (once: reinstalling keeps the
// original). It returns the line it set.
func Install(o InstallOptions) (string, error) {
	if o.PatternFile == "" {
		o.PatternFile = CorePatternFile
	}
	if !filepath.IsAbs(o.Dir) {
		return "", fmt.Errorf("report directory %q is not an absolute path (the kernel runs the handler in /)", o.Dir)
	}
	cur, err := ReadPattern(o.PatternFile)
	if err != nil {
		return "", err
	}
	prevFile := filepath.Join(o.Dir, PreviousPatternName)
	prev := cur
	if IsHandlerPattern(cur) {
		b, err := os.ReadFile(prevFile)
		if err != nil {
			return "", fmt.Errorf("core_pattern runs rbscope's handler already (%s) but %s is unreadable (%w): "+
				"uninstall it from its own directory first", cur, prevFile, err)
		}
		prev = strings.TrimRight(string(b), "\n")
	}
	chain := o.Chain
	switch {
	case chain == "none":
		chain = ""
	case chain == "" && strings.HasPrefix(prev, "|"):
		chain = prev
	}
	if chain != "" {
		if _, _, err := ExpandPattern(chain, Crash{}, ""); err != nil {
			return "", err
		}
	}
	line, err := HandlerPattern(o.Bin, append([]string{"--dir", o.Dir}, o.Flags...), chain != "")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return "", fmt.Errorf("create report directory: %w", err)
	}
	if err := writeAtomic(prevFile, []byte(prev+"\n")); err != nil {
		return "", err
	}
	chainFile := filepath.Join(o.Dir, ChainName)
	if chain != "" {
		if err := writeAtomic(chainFile, []byte(chain+"\n")); err != nil {
			return "", err
		}
	} else if err := os.Remove(chainFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("remove %s: %w", chainFile, err)
	}
	if err := WritePattern(o.PatternFile, line); err != nil {
		return "", err
	}
	return line, nil
}

// Uninstall restores the core_pattern saved by Install in dir and returns
// it. patternFile is CorePatternFile unless set.
func Uninstall(dir, patternFile string) (string, error) {
	if patternFile == "" {
		patternFile = CorePatternFile
	}
	prevFile := filepath.Join(dir, PreviousPatternName)
	b, err := os.ReadFile(prevFile)
	if err != nil {
		return "", fmt.Errorf("read the saved core_pattern: %w (was the handler installed with this --dir?)", err)
	}
	prev := strings.TrimRight(string(b), "\n")
	if IsHandlerPattern(prev) {
		return "", fmt.Errorf("%s holds rbscope's own handler (%s): set %s yourself", prevFile, prev, patternFile)
	}
	if err := WritePattern(patternFile, prev); err != nil {
		return "", err
	}
	os.Remove(filepath.Join(dir, ChainName))
	if err := os.Remove(prevFile); err != nil {
		return prev, fmt.Errorf("remove %s: %w", prevFile, err)
	}
	return prev, nil
}

// ReadChain returns the chained handler Install saved in dir, "" for none.
func ReadChain(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, ChainName))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
