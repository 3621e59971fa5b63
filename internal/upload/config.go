package upload

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"
)

// Defaults for the zero values of Config.
const (
	DefaultInterval       = 10 * time.Second
	DefaultSampleRate     = 100
	DefaultMaxMemoryBytes = 16 << 20
	DefaultMaxQueueBytes  = 256 << 20
	DefaultTimeout        = 30 * time.Second
	// DefaultMaxIntervalSamples caps the samples one interval holds before
	// it is cut early (100 Hz x 1000 threads x 10s).
	DefaultMaxIntervalSamples = 1 << 20
)

// Environment variables holding credentials (never flags: flags show in ps).
const (
	EnvBasicAuthUser     = "PYROSCOPE_BASIC_AUTH_USER"
	EnvBasicAuthPassword = "PYROSCOPE_BASIC_AUTH_PASSWORD"
	EnvAuthToken         = "PYROSCOPE_AUTH_TOKEN"
	EnvTenantID          = "PYROSCOPE_TENANT_ID"
)

// Config says where and how to push.
type Config struct {
	// URL is the Pyroscope server's base URL ("http://pyroscope:4040").
	URL string
	// AppName is the application name; it becomes the service_name label.
	// Letters, digits and "_.-/" only.
	AppName string
	// Tags are added to every profile. Keys: letters, digits, "_" and ".";
	// values must not contain ",{}=". "hostname" defaults to this host.
	Tags map[string]string
	// Interval is the length of one pushed profile (default 10s).
	Interval time.Duration
	// SampleRate is the sampler's rate in Hz; it sets the profile's period
	// (default 100).
	SampleRate int
	// QueueDir, when set, is where profiles wait once the in-memory queue
	// is full, and where undelivered profiles are kept at Close. A later
	// Uploader with the same QueueDir sends them.
	QueueDir string
	// MaxQueueBytes caps QueueDir's profiles (default 256 MiB).
	MaxQueueBytes int64
	// MaxMemoryBytes caps the in-memory queue (default 16 MiB).
	MaxMemoryBytes int64
	// MaxIntervalSamples cuts an interval early when it holds this many
	// samples (default 1<<20), which bounds memory at high rates.
	MaxIntervalSamples int
	// Timeout bounds one push request (default 30s).
	Timeout time.Duration
	// Logf receives warnings, one line each (default: stderr, prefixed
	// "rbscope: upload: ").
	Logf func(format string, args ...any)
	// HTTPClient sends the pushes (default: a client with Timeout).
	HTTPClient *http.Client
	// Replay says samples carry past times (a recording being pushed):
	// intervals are cut only by sample times, never by the wall clock.
	Replay bool

	auth         auth
	backpressure bool // PushRecording: the encoder waits for queue room
}

type auth struct {
	user, password, token, tenant string
}

func (a auth) apply(req *http.Request) {
	switch {
	case a.token != "":
		req.Header.Set("Authorization", "Bearer "+a.token)
	case a.user != "" || a.password != "":
		req.SetBasicAuth(a.user, a.password)
	}
	if a.tenant != "" {
		req.Header.Set("X-Scope-OrgID", a.tenant)
	}
}

func authFromEnv() (auth, error) {
	a := auth{
		user:     os.Getenv(EnvBasicAuthUser),
		password: os.Getenv(EnvBasicAuthPassword),
		token:    os.Getenv(EnvAuthToken),
		tenant:   os.Getenv(EnvTenantID),
	}
	if a.token != "" && (a.user != "" || a.password != "") {
		return auth{}, fmt.Errorf("both %s and %s/%s are set: use one", EnvAuthToken, EnvBasicAuthUser, EnvBasicAuthPassword)
	}
	return a, nil
}

// withDefaults validates c and fills its zero values.
func (c Config) withDefaults() (Config, error) {
	if c.URL == "" {
		return c, errors.New("no server URL")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return c, fmt.Errorf("parse server URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return c, fmt.Errorf("server URL %q: want http:// or https://", c.URL)
	}
	if u.User != nil {
		return c, fmt.Errorf("server URL has credentials: put them in %s/%s or %s instead, so they do not show in ps",
			EnvBasicAuthUser, EnvBasicAuthPassword, EnvAuthToken)
	}
	c.URL = strings.TrimRight(c.URL, "/")
	if err := validateAppName(c.AppName); err != nil {
		return c, err
	}
	tags := make(map[string]string, len(c.Tags)+1)
	for k, v := range c.Tags {
		if err := validateTag(k, v); err != nil {
			return c, err
		}
		tags[k] = v
	}
	if _, ok := tags["hostname"]; !ok {
		if h, err := os.Hostname(); err == nil && validateTag("hostname", h) == nil {
			tags["hostname"] = h
		}
	}
	c.Tags = tags
	orDefault(&c.Interval, DefaultInterval)
	orDefault(&c.SampleRate, DefaultSampleRate)
	orDefault(&c.MaxQueueBytes, DefaultMaxQueueBytes)
	orDefault(&c.MaxMemoryBytes, DefaultMaxMemoryBytes)
	orDefault(&c.MaxIntervalSamples, DefaultMaxIntervalSamples)
	orDefault(&c.Timeout, DefaultTimeout)
	if c.Logf == nil {
		c.Logf = func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "rbscope: upload: "+format+"\n", args...)
		}
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: c.Timeout}
	}
	c.auth, err = authFromEnv()
	if err != nil {
		return c, err
	}
	return c, nil
}

func validateAppName(n string) error {
	if n == "" {
		return errors.New("no app name")
	}
	for _, r := range n {
		if !tagKeyRune(r) && r != '-' && r != '/' {
			return fmt.Errorf("app name %q: %q not allowed (letters, digits and _.-/ only)", n, r)
		}
	}
	return nil
}

func tagKeyRune(r rune) bool {
	return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') || r == '_' || r == '.'
}

func validateTag(k, v string) error {
	if k == "" {
		return errors.New("empty tag name")
	}
	for _, r := range k {
		if !tagKeyRune(r) {
			return fmt.Errorf("tag name %q: %q not allowed (letters, digits, _ and . only)", k, r)
		}
	}
	switch k {
	case "__name__", "service_name", "pid", "thread_name", "activity":
		return fmt.Errorf("tag name %q is reserved", k)
	}
	if v == "" {
		return fmt.Errorf("tag %q: empty value", k)
	}
	if strings.ContainsAny(v, ",{}=") {
		return fmt.Errorf("tag %s=%q: value must not contain , { } or =", k, v)
	}
	return nil
}

// ParseTag parses a "key=value" tag as given to --tag.
func ParseTag(s string) (key, value string, err error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return "", "", fmt.Errorf("tag %q: want key=value", s)
	}
	if err := validateTag(k, v); err != nil {
		return "", "", err
	}
	return k, v, nil
}

// seriesName is the ingest API's name parameter: "app{k=v,...}", keys
// sorted.
func seriesName(app string, tags map[string]string) string {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(app)
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(tags[k])
	}
	b.WriteByte('}')
	return b.String()
}

// orDefault sets *v to def when it is zero or negative (unset).
func orDefault[T int | int64 | float64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
