package layout

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// cacheFormat changes whenever extraction changes what it produces, so
// that layouts cached by an older rbscope are extracted again.
const cacheFormat = 1

// cacheFile is the JSON stored per build id.
type cacheFile struct {
	Format  int     `json:"format"`
	Want    string  `json:"want"`
	BuildID string  `json:"build_id"`
	Layout  *Layout `json:"layout"`
}

// DefaultCacheDir returns where extracted layouts are cached:
// RBSCOPE_CACHE_DIR when set, else ~/.cache/rbscope/layouts ("" when no
// home directory is known).
func DefaultCacheDir() string {
	if d := os.Getenv("RBSCOPE_CACHE_DIR"); d != "" {
		return d
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "rbscope", "layouts")
}

func wantKey(want []string) string {
	h := sha256.Sum256([]byte(strings.Join(want, "\x00")))
	return hex.EncodeToString(h[:8])
}

func cachePath(dir, buildID string) (string, bool) {
	if dir == "" || len(buildID) < 2 || !isHex(buildID) {
		return "", false
	}
	return filepath.Join(dir, buildID+".json"), true
}

// cacheLoad returns the layout cached for buildID, or nil when there is
// none or it is unreadable, stale or corrupt (it will be rewritten).
func cacheLoad(dir, buildID string, want []string) *Layout {
	p, ok := cachePath(dir, buildID)
	if !ok {
		return nil
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil
	}
	var cf cacheFile
	if err := json.Unmarshal(data, &cf); err != nil {
		return nil
	}
	if cf.Format != cacheFormat || cf.Want != wantKey(want) || cf.BuildID != buildID ||
		cf.Layout == nil || len(cf.Layout.Structs) == 0 || !strings.HasPrefix(cf.Layout.Source, "dwarf:") {
		return nil
	}
	for _, s := range cf.Layout.Structs {
		if s.Fields == nil {
			return nil
		}
	}
	return cf.Layout
}

// cacheStore writes l for buildID atomically (a reader never sees half a
// file).
func cacheStore(dir, buildID string, want []string, l *Layout) error {
	p, ok := cachePath(dir, buildID)
	if !ok {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create layout cache: %w", err)
	}
	data, err := json.Marshal(cacheFile{Format: cacheFormat, Want: wantKey(want), BuildID: buildID, Layout: l})
	if err != nil {
		return fmt.Errorf("encode cached layout: %w", err)
	}
	tmp, err := os.CreateTemp(dir, buildID+".*.tmp")
	if err != nil {
		return fmt.Errorf("write layout cache: %w", err)
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), p)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write layout cache: %w", werr)
	}
	return nil
}
