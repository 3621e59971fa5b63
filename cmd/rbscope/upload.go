package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rbscope/rbscope/internal/recording"
	"github.com/rbscope/rbscope/internal/stack"
	"github.com/rbscope/rbscope/internal/upload"
)

// uploadOpts are the flags that push profiles to a Pyroscope server, shared
// by report and record. Credentials come from the
// environment only (see upload's package comment), never from flags.
type uploadOpts struct {
	url      string
	app      string
	tags     []string
	queueDir string
	interval time.Duration
	timeout  time.Duration
}

// register adds the flags to f.
func (o *uploadOpts) register(f *pflag.FlagSet) {
	f.StringVar(&o.url, "upload", "", "push profiles to the Pyroscope server at this URL (credentials: $"+
		upload.EnvBasicAuthUser+"/$"+upload.EnvBasicAuthPassword+" or $"+upload.EnvAuthToken+")")
	f.StringVar(&o.app, "app-name", "", "--upload: application name, Pyroscope's service_name (default: the Ruby script's name)")
	f.StringArrayVar(&o.tags, "tag", nil, "--upload: tag every profile with key=value (repeatable)")
	f.StringVar(&o.queueDir, "upload-queue", "", "--upload: directory where profiles wait while the server is unreachable (default: memory only)")
	f.DurationVar(&o.interval, "upload-interval", upload.DefaultInterval, "--upload: length of one pushed profile")
	f.DurationVar(&o.timeout, "upload-timeout", 30*time.Second, "--upload: how long to keep pushing once sampling ends")
}

// config is the uploader configuration for a recording at rate Hz of
// command (for the default app name) on host (empty: this machine).
func (o *uploadOpts) config(rate float64, command []string, host string) (upload.Config, error) {
	tags := map[string]string{}
	for _, t := range o.tags {
		k, v, err := upload.ParseTag(t)
		if err != nil {
			return upload.Config{}, usage("--tag: %w", err)
		}
		tags[k] = v
	}
	if _, ok := tags["hostname"]; !ok && host != "" {
		tags["hostname"] = host
	}
	app := o.app
	if app == "" {
		app = upload.DefaultAppName(command)
	}
	return upload.Config{
		URL:        o.url,
		AppName:    app,
		Tags:       tags,
		Interval:   o.interval,
		SampleRate: int(math.Round(rate)),
		QueueDir:   o.queueDir,
	}, nil
}

// start starts pushing a live recording at rate Hz of command (for the
// default app name); it returns nil without --upload. Give the uploader
// every sample (Add never blocks) and call finish when sampling ends.
func (o *uploadOpts) start(stderr io.Writer, rate float64, command []string) (*upload.Uploader, error) {
	if o.url == "" {
		return nil, nil
	}
	cfg, err := o.config(rate, command, "")
	if err != nil {
		return nil, err
	}
	cfg.Logf = func(format string, args ...any) {
		fmt.Fprintf(stderr, "rbscope: upload: "+format+"\n", args...)
	}
	up, err := upload.New(cfg)
	if err != nil {
		return nil, usage("--upload: %w", err)
	}
	fmt.Fprintf(stderr, "rbscope: pushing profiles every %v to %s as %s\n", cfg.Interval, o.url, up.SeriesName())
	return up, nil
}

// finish pushes what up still holds, for at most --upload-timeout, and
// says what it pushed. A nil up does nothing.
func (o *uploadOpts) finish(stderr io.Writer, up *upload.Uploader) error {
	if up == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	err := up.Close(ctx)
	st := up.Stats()
	fmt.Fprintf(stderr, "rbscope: pushed %d samples in %d profiles to %s", st.PushedSamples, st.Pushed, o.url)
	if st.DroppedSamples > 0 {
		fmt.Fprintf(stderr, "; %d samples dropped", st.DroppedSamples)
	}
	fmt.Fprintln(stderr)
	if err != nil {
		return fmt.Errorf("upload to %s: %w", o.url, err)
	}
	return nil
}

// uploadRecording pushes the raw recording at path to o.url.
func (o *uploadOpts) uploadRecording(stderr io.Writer, path string) error {
	rd, err := recording.Open(path)
	if err != nil {
		return fmt.Errorf("read recording: %w", err)
	}
	defer rd.Close()
	h := rd.Header()
	cfg, err := o.config(h.RateHz, h.Command, h.Hostname)
	if err != nil {
		return err
	}
	cfg.Logf = func(format string, args ...any) {
		fmt.Fprintf(stderr, "rbscope: upload: "+format+"\n", args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	st, err := upload.PushRecording(ctx, cfg, rd.Samples())
	if d := rd.Damage(); d != nil {
		fmt.Fprintf(stderr, "rbscope: warning: %s is damaged after its first %d samples (%v); pushed those\n", path, st.Samples, d)
	}
	if err != nil {
		if st.Rejected > 0 {
			err = fmt.Errorf("%w (Pyroscope refuses profiles older than its -validation.reject-older-than, 1h by default)", err)
		}
		return fmt.Errorf("upload to %s: %w", o.url, err)
	}
	if st.Samples == 0 {
		return fmt.Errorf("%s holds no samples; nothing to upload", path)
	}
	fmt.Fprintf(stderr, "pushed %d samples in %d profiles to %s as %s\n", st.PushedSamples, st.Pushed, o.url, cfg.AppName)
	return nil
}

// uploadSink feeds a live recording's samples to an uploader.
type uploadSink struct {
	o      *uploadOpts
	up     *upload.Uploader
	stderr io.Writer
}

func (s uploadSink) Add(x stack.Sample) { s.up.Add(x) }
func (s uploadSink) Finish() error      { return s.o.finish(s.stderr, s.up) }

// renderFlags are report's flags that --upload cannot go with.
var renderFlags = []string{"format", "output", "title", "lines", "top"}

// checkUploadReport refuses report flags that make no sense with --upload.
func checkUploadReport(cmd *cobra.Command) error {
	for _, f := range renderFlags {
		if fl := cmd.Flags().Lookup(f); fl != nil && fl.Changed {
			return usage("--upload pushes the recording instead of rendering it: drop --%s", f)
		}
	}
	return nil
}
