package record

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/testutil"
)

// TestValidate: every bad configuration is a usage error naming the flag;
// a good one passes.
func TestValidate(t *testing.T) {
	good := Config{Target: Target{Pid: 1, Rate: 100}, Format: "flamegraph"}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Pid = 0 }, "nothing to record"},
		{func(c *Config) { c.Command = []string{"ruby"} }, "not both"},
		{func(c *Config) { c.Pid = -3 }, "invalid pid"},
		{func(c *Config) { c.Rate = 0 }, "--rate"},
		{func(c *Config) { c.Rate = 1e6 }, "--rate"},
		{func(c *Config) { c.Duration = -time.Second }, "--duration"},
		{func(c *Config) { c.Format = "svg" }, "unknown format"},
	} {
		c := good
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !IsUsage(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want a usage error saying %q", c, err, tc.want)
		}
	}
	// Run validates first: nothing starts.
	if err := Run(context.Background(), Config{}); !IsUsage(err) {
		t.Errorf("Run(empty config) = %v, want a usage error", err)
	}
	if IsUsage(errors.New("x")) {
		t.Error("a plain error is a usage error")
	}
}

// TestOpenKernelThread: a kernel thread is not "gone": the error says it
// is a kernel thread.
func TestOpenKernelThread(t *testing.T) {
	testutil.NeedRoot(t)
	st, err := procfs.ReadStat(2)
	if err != nil || !st.KernelThread() {
		testutil.Missing(t, "kthreadd at pid 2 (the initial PID namespace)")
	}
	_, err = OpenLive(context.Background(), Target{Pid: 2, Rate: 100})
	if err == nil || !strings.Contains(err.Error(), "kernel thread") || strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("OpenLive(kthreadd) = %v", err)
	}
}
