package ruby

import (
	"path/filepath"
	"regexp"
	"strings"

	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/target"
)

// The one answer to "is this Ruby?", for Open and for the core handler.

var rubyLibRe = regexp.MustCompile(`(^|/)libruby[-.]`)

// rubySymbols are symbols only a Ruby VM exports.
var rubySymbols = []string{"ruby_version", "ruby_api_version", "ruby_current_vm_ptr", "ruby_current_thread", "ruby_init", "rb_vm_exec"}

// IsLibRuby reports whether path names a libruby (libruby.so.3.1,
// libruby-static.a's shared cousins).
func IsLibRuby(path string) bool { return rubyLibRe.MatchString(path) }

// LooksLikeRuby tells a statically linked ruby executable from any other
// program: by its Ruby symbols, or by its name when it has no symbols at
// all (syms nil).
func LooksLikeRuby(path string, syms elfx.Symbols) bool {
	if syms == nil {
		return strings.HasPrefix(filepath.Base(path), "ruby")
	}
	for _, n := range rubySymbols {
		if _, ok := syms.Lookup(n); ok {
			return true
		}
	}
	return false
}

// IsRubyProcess reports whether a process with mappings maps and
// executable exe runs Ruby: it maps a libruby, or its executable looks
// like Ruby (exeSyms are the executable's symbols, nil when unknown).
func IsRubyProcess(maps []target.Mapping, exe string, exeSyms elfx.Symbols) bool {
	for _, m := range maps {
		if IsLibRuby(m.Path) {
			return true
		}
	}
	return exe != "" && LooksLikeRuby(exe, exeSyms)
}
