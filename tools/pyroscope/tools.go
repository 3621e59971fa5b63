//go:build tools

// Package tools pins Pyroscope's server command in this module's build
// list; scripts/pyroscope.sh builds it with
// `go build github.com/grafana/pyroscope/cmd/pyroscope`.
package tools

import _ "github.com/grafana/pyroscope/cmd/pyroscope"
