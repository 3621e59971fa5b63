package layout

import (
	"embed"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// The tables are a verbatim copy of ../shared/ruby-layouts/x86_64; a test
// checks that the copy is identical to the shared files.
//
//go:embed tables/x86_64/*.json
var tables embed.FS

// tableFile is the on-disk schema of one table.
type tableFile struct {
	RubyVersion string          `json:"ruby_version"`
	Patchlevel  json.RawMessage `json:"patchlevel"`
	Arch        string          `json:"arch"`
	Structs     map[string]struct {
		Size   uint64 `json:"size"`
		Align  uint64 `json:"align"`
		Fields map[string]struct {
			Offset   uint64    `json:"offset"`
			Size     uint64    `json:"size"`
			Type     string    `json:"type"`
			Bitfield *Bitfield `json:"bitfield"`
		} `json:"fields"`
	} `json:"structs"`
}

// BuiltinVersions lists the releases that have a built-in table, as their
// file names say ("1.9.3-p0", "3.1.2"), oldest first.
func BuiltinVersions() []string {
	builtinVersions.once.Do(func() {
		ents, err := tables.ReadDir("tables/x86_64")
		if err != nil {
			return
		}
		type ver struct {
			name string
			num  []int
			pl   int
		}
		vs := make([]ver, 0, len(ents))
		for _, e := range ents {
			n := strings.TrimSuffix(e.Name(), ".json")
			vs = append(vs, ver{n, parseVersion(n), patchlevel(n)})
		}
		// Parse each name once: sorting hundreds of names with
		// CompareVersions would parse them again at every comparison.
		sort.Slice(vs, func(i, j int) bool {
			a, b := vs[i], vs[j]
			for k := 0; k < len(a.num) || k < len(b.num); k++ {
				var x, y int
				if k < len(a.num) {
					x = a.num[k]
				}
				if k < len(b.num) {
					y = b.num[k]
				}
				if x != y {
					return x < y
				}
			}
			return a.pl < b.pl
		})
		for _, v := range vs {
			builtinVersions.list = append(builtinVersions.list, v.name)
		}
	})
	return append([]string(nil), builtinVersions.list...)
}

var builtinVersions struct {
	once sync.Once
	list []string
}

// Builtin returns the built-in layout for Ruby version v ("3.1.2"). When the
// tables lack that exact release it takes the nearest release of the same
// minor series (the highest not above v, else the lowest above it) and says
// so in Source: "builtin:3.1.7 (nearest to 3.1.9)". It fails when no release
// of that minor series is known.
func Builtin(v string) (*Layout, error) {
	name, exact, err := nearest(v)
	if err != nil {
		return nil, err
	}
	l, err := loadTable(name)
	if err != nil {
		return nil, err
	}
	l.Source = "builtin:" + l.RubyVersion
	if !exact {
		l.Source += " " + NearestMarker + " " + v + ")"
	}
	return l, nil
}

// NearestMarker is in the Source of a built-in layout that Builtin took
// from another release of the series ("builtin:3.1.7 (nearest to 3.1.9)").
const NearestMarker = "(nearest to"

// BuiltinSeries returns the built-in releases of v's major.minor series,
// newest first: the candidates for a release the tables lack.
func BuiltinSeries(v string) ([]string, error) {
	want := parseVersion(v)
	if len(want) < 2 {
		return nil, fmt.Errorf("ruby version %q is not of the form X.Y.Z", v)
	}
	var out []string
	all := BuiltinVersions()
	for i := len(all) - 1; i >= 0; i-- {
		p := parseVersion(all[i])
		if len(p) >= 2 && p[0] == want[0] && p[1] == want[1] {
			out = append(out, all[i])
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no built-in layout for Ruby %s's series %d.%d", v, want[0], want[1])
	}
	return out, nil
}

// BuiltinRelease returns the built-in table of one release, by the name
// BuiltinVersions or BuiltinSeries gives it.
func BuiltinRelease(name string) (*Layout, error) {
	l, err := loadTable(name)
	if err != nil {
		return nil, err
	}
	l.Source = "builtin:" + l.RubyVersion
	return l, nil
}

func loadTable(name string) (*Layout, error) {
	data, err := tables.ReadFile(path.Join("tables/x86_64", name+".json"))
	if err != nil {
		return nil, fmt.Errorf("read built-in layout %s: %w", name, err)
	}
	var tf tableFile
	if err := json.Unmarshal(data, &tf); err != nil {
		return nil, fmt.Errorf("parse built-in layout %s: %w", name, err)
	}
	l := &Layout{RubyVersion: tf.RubyVersion, Arch: tf.Arch, Structs: map[string]Struct{}}
	for sn, s := range tf.Structs {
		st := Struct{Size: s.Size, Align: s.Align, Fields: map[string]Field{}}
		for fn, f := range s.Fields {
			st.Fields[fn] = Field{Offset: f.Offset, Size: f.Size, Type: f.Type, Bitfield: f.Bitfield}
		}
		l.Structs[sn] = st
	}
	return l, nil
}

// nearest picks the table for v: the exact release when present, else the
// closest release of the same major.minor series.
func nearest(v string) (name string, exact bool, err error) {
	all := BuiltinVersions()
	want := parseVersion(v)
	if len(want) < 2 {
		return "", false, fmt.Errorf("ruby version %q is not of the form X.Y.Z", v)
	}
	var below, above string
	for _, n := range all {
		base := strings.SplitN(n, "-", 2)[0]
		if base == v || n == v {
			// 1.9.x and 2.0.0 files carry a patchlevel; rbspy uses -p0 for all.
			if name == "" || strings.HasSuffix(n, "-p0") {
				name = n
			}
			continue
		}
		p := parseVersion(base)
		if len(p) < 2 || p[0] != want[0] || p[1] != want[1] {
			continue
		}
		if CompareVersions(base, v) < 0 {
			below = n
		} else if above == "" {
			above = n
		}
	}
	if name != "" {
		return name, true, nil
	}
	if below != "" {
		return below, false, nil
	}
	if above != "" {
		return above, false, nil
	}
	return "", false, fmt.Errorf("no built-in layout for Ruby %s (known: %s to %s): "+
		"give rbscope a Ruby binary with DWARF or its debug file", v, all[0], all[len(all)-1])
}

func parseVersion(v string) []int {
	v = strings.SplitN(v, "-", 2)[0]
	var out []int
	for _, p := range strings.Split(v, ".") {
		n, err := strconv.Atoi(p)
		if err != nil {
			return out
		}
		out = append(out, n)
	}
	return out
}

// CompareVersions compares two Ruby versions ("2.7.2", "1.9.3-p551") by
// their numeric parts, then by patchlevel; it returns -1, 0 or 1.
func CompareVersions(a, b string) int {
	pa, pb := parseVersion(a), parseVersion(b)
	for i := 0; i < len(pa) || i < len(pb); i++ {
		var x, y int
		if i < len(pa) {
			x = pa[i]
		}
		if i < len(pb) {
			y = pb[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	la, lb := patchlevel(a), patchlevel(b)
	switch {
	case la < lb:
		return -1
	case la > lb:
		return 1
	}
	return 0
}

func patchlevel(v string) int {
	parts := strings.SplitN(v, "-p", 2)
	if len(parts) != 2 {
		return 0
	}
	n, _ := strconv.Atoi(parts[1])
	return n
}
