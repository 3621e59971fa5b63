package layout

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// maxDebuginfodSize caps a downloaded debug file.
const maxDebuginfodSize = 2 << 30

// DebuginfodURLs returns the servers listed in DEBUGINFOD_URLS
// (space-separated, as elfutils reads it); none when it is unset, which
// turns debuginfod off.
func DebuginfodURLs() []string {
	return strings.Fields(os.Getenv("DEBUGINFOD_URLS"))
}

// debuginfodTimeout bounds one download: DEBUGINFOD_TIMEOUT seconds, else
// 10 s.
func debuginfodTimeout() time.Duration {
	if s, err := strconv.Atoi(os.Getenv("DEBUGINFOD_TIMEOUT")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 10 * time.Second
}

// FetchDebuginfod downloads the debug file of build id from the first of
// urls that has it, into dir/<build-id>.debug (reused when already
// there), and returns its path. Each server gets at most timeout.
func FetchDebuginfod(buildID string, urls []string, dir string, timeout time.Duration) (string, error) {
	if len(urls) == 0 {
		return "", errors.New("debuginfod: no servers (DEBUGINFOD_URLS is unset)")
	}
	if len(buildID) < 2 || !isHex(buildID) {
		return "", fmt.Errorf("debuginfod: no usable build id %q", buildID)
	}
	dest := filepath.Join(dir, buildID+".debug")
	if ok, _ := usableDebugFile(dest, buildIDCheck(buildID)); ok {
		return dest, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("debuginfod cache: %w", err)
	}
	var errs []string
	for _, u := range urls {
		err := fetchOne(strings.TrimSuffix(u, "/")+"/buildid/"+buildID+"/debuginfo", dest, timeout)
		if err == nil {
			if ok, why := usableDebugFile(dest, buildIDCheck(buildID)); ok {
				return dest, nil
			} else {
				os.Remove(dest)
				err = fmt.Errorf("unusable download%s", why)
			}
		}
		errs = append(errs, fmt.Sprintf("%s: %v", u, err))
	}
	return "", fmt.Errorf("debuginfod: %s", strings.Join(errs, "; "))
}

func buildIDCheck(id string) func(*elf.File, *os.File) string {
	return func(f *elf.File, _ *os.File) string {
		if got := elfBuildID(f); got != "" && got != id {
			return "build id " + got
		}
		return ""
	}
}

// fetchOne downloads url to dest atomically, within timeout.
func fetchOne(url, dest string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "rbscope")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %s", resp.Status)
	}
	if resp.ContentLength > maxDebuginfodSize {
		return fmt.Errorf("debug file of %d bytes exceeds the %d-byte cap", resp.ContentLength, maxDebuginfodSize)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dest), filepath.Base(dest)+".*.tmp")
	if err != nil {
		return err
	}
	n, err := io.Copy(tmp, io.LimitReader(resp.Body, maxDebuginfodSize+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > maxDebuginfodSize {
		err = fmt.Errorf("debug file exceeds the %d-byte cap", maxDebuginfodSize)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dest)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
