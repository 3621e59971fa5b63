package output

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/rbscope/rbscope/internal/stack"
)

// fuzzSamples turns arbitrary bytes into samples: frame names, paths and
// kinds come from the input, so they hold separators, newlines, markup and
// invalid UTF-8.
func fuzzSamples(in []byte) []stack.Sample {
	parts := strings.Split(string(in), "|")
	kinds := []stack.Kind{stack.KindRuby, stack.KindCFunc, stack.KindGC, ""}
	var out []stack.Sample
	var cur stack.Sample
	for i, p := range parts {
		if p == "" || len(cur.Frames) > 20 {
			out = append(out, cur)
			cur = stack.Sample{Time: time.Unix(0, int64(i)*1e7), Pid: i % 3, TID: i % 5, ThreadName: p}
			continue
		}
		name, path, _ := strings.Cut(p, "@")
		cur.Frames = append(cur.Frames, stack.Frame{Name: name, Path: path, Line: len(p) - 3, Kind: kinds[len(p)%4]})
	}
	return append(out, cur)
}

// FuzzWriters feeds every format odd samples: no format may panic, and
// each output must still parse as its format, with the sample counts
// intact.
func FuzzWriters(f *testing.F) {
	f.Add([]byte("a@/x.rb|b;c@/y.rb||<main>@/m.rb|Array#each"))
	f.Add([]byte("</script>|x\ny@z:1|\xff\xfe||;;;| 12|"))
	f.Add([]byte("|||"))
	f.Fuzz(func(t *testing.T, in []byte) {
		samples := fuzzSamples(in)
		nonEmpty := 0
		for _, s := range samples {
			if len(s.Frames) > 0 {
				nonEmpty++
			}
		}
		for _, format := range Formats() {
			for _, rate := range []float64{0, 97} {
				w, err := New(format, Options{RateHz: rate})
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range samples {
					w.Add(s)
				}
				var b bytes.Buffer
				if _, err := w.WriteTo(&b); err != nil {
					t.Fatalf("%s: %v", format, err)
				}
				check(t, format, b.Bytes(), nonEmpty)
			}
		}
	})
}

func check(t *testing.T, format string, out []byte, samples int) {
	switch format {
	case "collapsed":
		total := 0
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			l := sc.Text()
			i := strings.LastIndexByte(l, ' ')
			n, err := strconv.Atoi(l[i+1:])
			if i < 0 || err != nil || n <= 0 {
				t.Fatalf("collapsed line %q", l)
			}
			total += n
		}
		if total != samples {
			t.Fatalf("collapsed counts %d samples, want %d", total, samples)
		}
	case "pprof":
		p, err := profile.ParseData(out)
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, s := range p.Sample {
			total += s.Value[0]
		}
		if total != int64(samples) {
			t.Fatalf("pprof counts %d samples, want %d", total, samples)
		}
	case "speedscope":
		var f struct {
			Profiles []ssProfile `json:"profiles"`
		}
		if err := json.Unmarshal(out, &f); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range f.Profiles {
			if len(p.Samples) != len(p.Weights) {
				t.Fatalf("speedscope profile %q: %d samples, %d weights", p.Name, len(p.Samples), len(p.Weights))
			}
			n += len(p.Samples)
		}
		if n > samples {
			t.Fatalf("speedscope has %d stacks for %d samples", n, samples)
		}
	case "flamegraph":
		if !bytes.Contains(out, []byte(`<script id="data" type="application/json">{"strings":`)) {
			t.Fatal("flame graph has no data")
		}
		// Only the page's own two scripts close.
		if c := bytes.Count(out, []byte("</script>")); c != 2 {
			t.Fatalf("flame graph has %d </script>", c)
		}
	case "callgrind":
		for _, l := range strings.Split(string(out), "\n") {
			if l == "" || l[0] == '#' || strings.Contains(l, "=") || strings.Contains(l, ": ") {
				continue
			}
			if f := strings.Fields(l); len(f) != 2 {
				t.Fatalf("callgrind cost line %q", l)
			}
		}
	}
}
