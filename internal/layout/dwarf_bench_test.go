package layout_test

import (
	"debug/dwarf"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/layout"
	"github.com/rbscope/rbscope/internal/layout/layoutgen"
)

// The benchmark library imitates libruby's DWARF: benchUnits compilation
// units built with -O2 -g, each holding a header of benchStructs
// generic structs (all emitted), functions using them, and, in the unit
// in the middle, the Ruby VM structs of 3.4.1.
const (
	benchUnits   = 60
	benchStructs = 400
	benchRuby    = "3.4.1"
)

// TestMain removes the benchmark library when it was built in a temporary
// directory (RBSCOPE_BENCH_DIR unset).
func TestMain(m *testing.M) {
	code := m.Run()
	if benchTmp != "" {
		os.RemoveAll(benchTmp)
	}
	os.Exit(code)
}

var (
	benchTmp   string
	benchOnce  sync.Once
	benchFiles map[string]string // variant -> library path
	benchErr   error
)

func bigHeader() string {
	var b strings.Builder
	b.WriteString("#include <stdint.h>\n")
	for i := 0; i < benchStructs; i++ {
		fmt.Fprintf(&b, "struct big_%d {\n\tlong a0;\n\tint a1;\n\tunsigned flag_a : 3, flag_b : 5;\n", i)
		if i > 0 {
			fmt.Fprintf(&b, "\tstruct big_%d *prev;\n\tstruct big_%d inner_%d;\n", i-1, i-1, i)
		}
		b.WriteString("\tunion { double d; char c[24]; struct { short s0, s1; }; } u;\n")
		for j := 0; j < 12; j++ {
			fmt.Fprintf(&b, "\tuint%d_t m%d;\n", 8<<(j%4), j)
		}
		b.WriteString("\tconst char *name;\n};\n")
		// Keep the chain of inline structs from growing without end.
		if i%8 == 7 {
			fmt.Fprintf(&b, "typedef struct big_%d big_t%d;\n", i, i)
		}
	}
	return b.String()
}

func bigUnit(u int, ruby string) string {
	var b strings.Builder
	b.WriteString("#include \"big.h\"\n")
	b.WriteString(ruby)
	for i := 0; i < 40; i++ {
		s := (u*37 + i*11) % benchStructs
		fmt.Fprintf(&b, `long fn_%d_%d(struct big_%d *p, int n) {
	long acc = 0;
	for (int i = 0; i < n; i++) { acc += p[i].a0 * p[i].m%d + p[i].flag_b; if (p[i].name) acc ^= p[i].name[0]; }
	return acc;
}
`, u, i, s, i%12)
	}
	return b.String()
}

// buildBenchLibs builds the benchmark library and its compressed variants.
func buildBenchLibs() (map[string]string, error) {
	for _, tool := range []string{"gcc", "objcopy"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not installed", tool)
		}
	}
	dir := os.Getenv("RBSCOPE_BENCH_DIR")
	if dir == "" {
		d, err := os.MkdirTemp("", "rbscope-layout-bench-")
		if err != nil {
			return nil, err
		}
		dir, benchTmp = d, d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	tab, err := layout.Builtin(benchRuby)
	if err != nil {
		return nil, err
	}
	ruby := layoutgen.CSource(tab, nil)
	if err := os.WriteFile(filepath.Join(dir, "big.h"), []byte(bigHeader()), 0o644); err != nil {
		return nil, err
	}
	objs := make([]string, benchUnits)
	errs := make(chan error, benchUnits)
	sem := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	for u := 0; u < benchUnits; u++ {
		src := filepath.Join(dir, fmt.Sprintf("u%02d.c", u))
		objs[u] = strings.TrimSuffix(src, ".c") + ".o"
		body := bigUnit(u, "")
		if u == benchUnits/2 {
			body = bigUnit(u, ruby)
		}
		if err := os.WriteFile(src, []byte(body), 0o644); err != nil {
			return nil, err
		}
		wg.Add(1)
		go func(src, obj string) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out, err := exec.Command("gcc", "-O2", "-g", "-fno-eliminate-unused-debug-types", "-fPIC", "-c", "-o", obj, src).CombinedOutput()
			if err != nil {
				errs <- fmt.Errorf("gcc %s: %v\n%s", src, err, out)
			}
		}(src, objs[u])
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	files := map[string]string{"plain": filepath.Join(dir, "libbig.so")}
	if out, err := exec.Command("gcc", append([]string{"-shared", "-Wl,--build-id", "-o", files["plain"]}, objs...)...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("link: %v\n%s", err, out)
	}
	for _, z := range []string{"zlib", "zstd"} {
		p := filepath.Join(dir, "libbig-"+z+".so")
		if out, err := exec.Command("objcopy", "--compress-debug-sections="+z, files["plain"], p).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("objcopy %s: %v\n%s", z, err, out)
		}
		files[z] = p
	}
	return files, nil
}

func benchLibs(b *testing.B) map[string]string {
	benchOnce.Do(func() { benchFiles, benchErr = buildBenchLibs() })
	if benchErr != nil {
		b.Skip(benchErr)
	}
	return benchFiles
}

// stdlibExtract is the baseline: debug/elf's DWARF() (every section read
// and decompressed whole) and debug/dwarf's Type for each wanted struct.
func stdlibExtract(path string, want []string) (int, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	d, err := f.DWARF()
	if err != nil {
		return 0, err
	}
	wantSet := map[string]bool{}
	for _, w := range want {
		wantSet[w] = true
	}
	found := map[string]bool{}
	r := d.Reader()
	for len(found) < len(wantSet) {
		e, err := r.Next()
		if err != nil {
			return 0, err
		}
		if e == nil {
			break
		}
		if e.Tag == dwarf.TagStructType {
			if name, _ := e.Val(dwarf.AttrName).(string); wantSet[name] && !found[name] {
				if decl, _ := e.Val(dwarf.AttrDeclaration).(bool); !decl {
					if _, err := d.Type(e.Offset); err != nil {
						return 0, err
					}
					found[name] = true
				}
			}
		}
		if e.Tag != dwarf.TagCompileUnit {
			r.SkipChildren()
		}
	}
	return len(found), nil
}

// rubyStructs are the structs of the benchmark's Ruby table: all present,
// so a run can stop at the unit that holds them.
func rubyStructs(b *testing.B) []string {
	tab, err := layout.Builtin(benchRuby)
	if err != nil {
		b.Fatal(err)
	}
	return tab.StructNames()
}

// BenchmarkExtract times extraction in-process: ours (rbscope) against
// the stdlib baseline, on plain, zlib and zstd DWARF, for the structs of
// a table (found halfway: early stop) and for WantedStructs (some absent:
// a full walk).
func BenchmarkExtract(b *testing.B) {
	files := benchLibs(b)
	for _, v := range []string{"plain", "zlib", "zstd"} {
		for _, w := range []struct {
			name string
			list []string
		}{{"table", rubyStructs(b)}, {"wanted", layout.WantedStructs}} {
			b.Run(v+"/"+w.name+"/rbscope", func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if _, err := layout.FromDWARFFile(files[v], w.list); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(v+"/"+w.name+"/stdlib", func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if _, err := stdlibExtract(files[v], w.list); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkProcess runs each way of getting the layout in a fresh process
// (this test binary, re-executed) and reports its peak RSS (VmHWM) and CPU
// time,
// the costs the OpenTelemetry proposal measured. "floor" only opens the
// ELF file: the cost of the process itself.
func BenchmarkProcess(b *testing.B) {
	files := benchLibs(b)
	cache := b.TempDir()
	modes := []struct{ name, mode, file string }{
		{"floor", "floor", files["plain"]},
	}
	for _, v := range []string{"plain", "zlib", "zstd"} {
		modes = append(modes,
			struct{ name, mode, file string }{v + "/rbscope-cold", "resolve-nocache", files[v]},
			struct{ name, mode, file string }{v + "/stdlib", "stdlib", files[v]})
	}
	modes = append(modes,
		struct{ name, mode, file string }{"zlib/rbscope-cached", "resolve-cached", files["zlib"]},
		// The least any reader of compressed DWARF pays: inflating
		// .debug_info and nothing else.
		struct{ name, mode, file string }{"zlib/inflate-only", "inflate", files["zlib"]})
	// Warm the cache once.
	if out, err := child(files["zlib"], "resolve-cached", cache); err != nil {
		b.Fatalf("warm cache: %v\n%s", err, out)
	}
	// A real -ggdb3 libruby (scripts/bench-layout.sh names 3.3.8's from
	// scripts/rubies.sh): every struct sought (the old walk to the last
	// unit, some being absent) against the structs its version needs.
	if real := os.Getenv("RBSCOPE_BENCH_REAL_LIB"); real != "" {
		realCache := b.TempDir()
		modes = append(modes,
			struct{ name, mode, file string }{"real/floor", "floor", real},
			struct{ name, mode, file string }{"real/rbscope-cold", "real-needed", real},
			struct{ name, mode, file string }{"real/rbscope-all-structs", "real-all", real},
			struct{ name, mode, file string }{"real/stdlib", "stdlib", real})
		if out, err := child(real, "real-cached", realCache); err != nil {
			b.Fatalf("warm cache: %v\n%s", err, out)
		}
		b.Run("real/rbscope-cached", func(b *testing.B) { runChild(b, real, "real-cached", realCache) })
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) { runChild(b, m.file, m.mode, cache) })
	}
}

// runChild runs one mode b.N times in fresh processes and reports their
// mean peak RSS and CPU time.
func runChild(b *testing.B, file, mode, cache string) {
	var rss, cpu float64
	for i := 0; i < b.N; i++ {
		st, err := childStats(file, mode, cache)
		if err != nil {
			b.Fatal(err)
		}
		rss += st.rssKB
		cpu += st.cpuMS
	}
	b.ReportMetric(rss/float64(b.N), "peak-RSS-KB")
	b.ReportMetric(cpu/float64(b.N), "cpu-ms")
}

type procStats struct{ rssKB, cpuMS float64 }

func child(file, mode, cache string) ([]byte, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchChild$")
	cmd.Env = append(os.Environ(), "RBSCOPE_BENCH_CHILD="+mode, "RBSCOPE_BENCH_FILE="+file, "RBSCOPE_BENCH_CACHE="+cache)
	return cmd.CombinedOutput()
}

func childStats(file, mode, cache string) (procStats, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchChild$")
	cmd.Env = append(os.Environ(), "RBSCOPE_BENCH_CHILD="+mode, "RBSCOPE_BENCH_FILE="+file, "RBSCOPE_BENCH_CACHE="+cache)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return procStats{}, fmt.Errorf("%s: %v\n%s", mode, err, out)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	// The child's own high-water mark: rusage's ru_maxrss may carry the
	// parent's from before exec.
	m := regexp.MustCompile(`VMHWM (\d+)`).FindSubmatch(out)
	if m == nil {
		return procStats{}, fmt.Errorf("%s: child did not report VmHWM:\n%s", mode, out)
	}
	hwm, _ := strconv.ParseFloat(string(m[1]), 64)
	return procStats{rssKB: hwm, cpuMS: float64(cpu) / 1e6}, nil
}

// vmHWM returns this process's peak resident set in KiB.
func vmHWM() string {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "0"
	}
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(data)
	if m == nil {
		return "0"
	}
	return string(m[1])
}

// TestBenchChild is the child process of BenchmarkProcess; it does
// nothing in a normal test run.
func TestBenchChild(t *testing.T) {
	mode, file := os.Getenv("RBSCOPE_BENCH_CHILD"), os.Getenv("RBSCOPE_BENCH_FILE")
	if mode == "" {
		t.Skip("only run as BenchmarkProcess's child")
	}
	bins := []layout.BinaryInfo{{Path: file}}
	var err error
	switch mode {
	case "floor":
		var f *elf.File
		if f, err = elf.Open(file); err == nil {
			f.Close()
		}
	case "resolve-nocache":
		var l *layout.Layout
		l, err = layout.Resolve(bins, benchRuby, layout.ResolveOptions{DebugRoots: []string{}, NoCache: true})
		if err == nil && !strings.HasPrefix(l.Source, "dwarf:") {
			err = fmt.Errorf("source %s", l.Source)
		}
	case "resolve-cached":
		var l *layout.Layout
		l, err = layout.Resolve(bins, benchRuby, layout.ResolveOptions{DebugRoots: []string{}, CacheDir: os.Getenv("RBSCOPE_BENCH_CACHE")})
		if err == nil && !strings.HasPrefix(l.Source, "dwarf:") {
			err = fmt.Errorf("source %s", l.Source)
		}
	case "real-needed", "real-cached":
		// As the profiler resolves a process's layout: the version from
		// the file, the structs it needs, cold or from a warm cache.
		f, ferr := os.Open(file)
		if ferr != nil {
			t.Fatal(ferr)
		}
		v := layout.FileRubyVersion(f)
		f.Close()
		opts := layout.ResolveOptions{DebugRoots: []string{}, NoCache: true}
		if mode == "real-cached" {
			opts = layout.ResolveOptions{DebugRoots: []string{}, CacheDir: os.Getenv("RBSCOPE_BENCH_CACHE")}
		}
		var l *layout.Layout
		l, err = layout.Resolve(bins, v, opts)
		if err == nil && !strings.HasPrefix(l.Source, "dwarf:") {
			err = fmt.Errorf("source %s", l.Source)
		}
	case "real-all":
		_, err = layout.FromBinaryFile(file, layout.WantedStructs, []string{})
	case "stdlib":
		_, err = stdlibExtract(file, layout.WantedStructs)
	case "inflate":
		var f *elf.File
		if f, err = elf.Open(file); err == nil {
			_, err = io.Copy(io.Discard, f.Section(".debug_info").Open())
			f.Close()
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("VMHWM %s\n", vmHWM())
}
