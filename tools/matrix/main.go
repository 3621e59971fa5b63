// Command matrix reads `go test -json` output on stdin and prints, for
// every test that runs on the Rubies under test (testutil.EachRuby), a row
// with the result of each Ruby: the test × Ruby matrix of the live tests.
//
//	go test -json ./... | go run ./tools/matrix
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// rubies are the subtest names testutil.EachRuby gives, in column order.
var rubies = []string{"system", "3.3.8", "3.3.8-yjit", "3.3.8-static", "3.3.8-static-nodebug", "3.4.5", "3.4.5-yjit", "3.4.5-stripped"}

type event struct {
	Action  string
	Package string
	Test    string
}

func main() {
	cells := map[string]map[string]string{} // "pkg.Test" -> ruby -> result
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		if e.Action != "pass" && e.Action != "fail" && e.Action != "skip" {
			continue
		}
		parts := strings.Split(e.Test, "/")
		for i := 1; i < len(parts); i++ {
			if !isRuby(parts[i]) {
				continue
			}
			// The cell is the Ruby's own subtest, not its children.
			if i != len(parts)-1 {
				break
			}
			row := shortPkg(e.Package) + "." + strings.Join(parts[:i], "/")
			if cells[row] == nil {
				cells[row] = map[string]string{}
			}
			cells[row][parts[i]] = e.Action
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "matrix: read go test -json:", err)
		os.Exit(1)
	}
	rows := make([]string, 0, len(cells))
	for r := range cells {
		rows = append(rows, r)
	}
	sort.Strings(rows)
	fmt.Printf("| test | %s |\n|---|%s\n", strings.Join(rubies, " | "), strings.Repeat("---|", len(rubies)))
	fail := 0
	for _, r := range rows {
		var cols []string
		for _, rb := range rubies {
			c := cells[r][rb]
			if c == "" {
				c = "—"
			}
			if c == "fail" {
				fail++
			}
			cols = append(cols, c)
		}
		fmt.Printf("| %s | %s |\n", r, strings.Join(cols, " | "))
	}
	fmt.Printf("\n%d tests × %d Rubies, %d failed cells\n", len(rows), len(rubies), fail)
}

func isRuby(s string) bool {
	for _, r := range rubies {
		if s == r {
			return true
		}
	}
	return false
}

func shortPkg(p string) string {
	if i := strings.Index(p, "/internal/"); i >= 0 {
		return p[i+1:]
	}
	if i := strings.Index(p, "/cmd/"); i >= 0 {
		return p[i+1:]
	}
	return p
}
