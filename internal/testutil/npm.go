package testutil

import (
	"os"
	"os/exec"
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

// RunNodeScript runs node on script with args, the npm modules in mods
// (see NPMModules) on its NODE_PATH and a fresh PROFILE_DIR for the
// browser it drives, and returns what it printed; the test fails with
// the script's standard error when it fails.
func RunNodeScript(t testing.TB, node, mods, script string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(node, append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods, "PROFILE_DIR="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s: %v\n%s", filepath.Base(script), err, stderr)
	}
	return out
}
