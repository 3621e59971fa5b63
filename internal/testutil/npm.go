package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// NPMModules returns the node_modules directory where
// scripts/install-deps.sh installs the npm packages the tests use (the
// speedscope app, puppeteer-core): $RBSCOPE_NPM_DIR/node_modules, by
// default under the user's cache directory (rbscope/npm), stopping the
// test (see Missing) when pkg is not there.
func NPMModules(t testing.TB, pkg string) string {
	t.Helper()
	dir := os.Getenv("RBSCOPE_NPM_DIR")
	if dir == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(c, "rbscope", "npm")
	}
	mods := filepath.Join(dir, "node_modules")
	if _, err := os.Stat(filepath.Join(mods, pkg, "package.json")); err != nil {
		Missing(t, "the npm package %s in %s (scripts/install-deps.sh installs it): %v", pkg, dir, err)
	}
	return mods
}
