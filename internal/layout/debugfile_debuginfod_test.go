package layout_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/layout"
)

func TestDebuginfod(t *testing.T) {
	dir := t.TempDir()
	_, stripped, debug := fakeRuby(t, dir, table(t, "3.2.0"))
	id := buildID(t, stripped)
	data, err := os.ReadFile(debug)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(debug) // only the server has it now
	var hits atomic.Int64
	var slow atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if slow.Load() {
			select {
			case <-time.After(5 * time.Second):
			case <-r.Context().Done():
				return
			}
		}
		if r.URL.Path != "/buildid/"+id+"/debuginfo" {
			http.NotFound(w, r)
			return
		}
		w.Write(data)
	}))
	defer srv.Close()
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") {
		t.Fatalf("server not on 127.0.0.1: %s", srv.URL)
	}
	bins := []layout.BinaryInfo{{Path: "/usr/lib/libruby.so.3.2", HostPath: stripped}}
	cache := filepath.Join(dir, "cache")
	opts := layout.ResolveOptions{DebugRoots: []string{}, CacheDir: cache}

	// Off when DEBUGINFOD_URLS is unset.
	t.Setenv("DEBUGINFOD_URLS", "")
	l, err := layout.Resolve(bins, "3.2.0", opts)
	if err != nil || l.Source != "builtin:3.2.0" || hits.Load() != 0 {
		t.Fatalf("unset: source %v err %v hits %d", l, err, hits.Load())
	}

	// A server without the file, then one with it.
	t.Setenv("DEBUGINFOD_URLS", srv.URL+"/nothing-here "+srv.URL)
	l, err = layout.Resolve(bins, "3.2.0", opts)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(cache, "debuginfod", id+".debug")
	if l.Source != "dwarf:"+want || hits.Load() != 2 {
		t.Errorf("source %q (want dwarf:%s), %d requests (want 2)", l.Source, want, hits.Load())
	}
	if f, err := l.Field("rb_thread_struct", "status"); err != nil || f.Bitfield == nil || f.Source != "" {
		t.Errorf("status from debuginfod DWARF: %+v %v", f, err)
	}
	// The download is kept: no new request even with the layout cache
	// off.
	before := hits.Load()
	l, err = layout.Resolve(bins, "3.2.0", layout.ResolveOptions{DebugRoots: []string{}, CacheDir: cache, NoCache: true})
	if err != nil || !strings.HasPrefix(l.Source, "dwarf:") || hits.Load() != before {
		t.Errorf("cached download: %v %v, %d new requests", l.Source, err, hits.Load()-before)
	}

	// A slow server is given up on after the timeout (both servers).
	slow.Store(true)
	start := time.Now()
	_, err = layout.FetchDebuginfod(id, layout.DebuginfodURLs(), t.TempDir(), 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "deadline exceeded") || time.Since(start) > 1200*time.Millisecond {
		t.Errorf("slow server: err %v after %v", err, time.Since(start))
	}
}
