// Command promparse reads a Prometheus text exposition from standard input with Prometheus's
// own parser (github.com/prometheus/common/expfmt) and prints each metric family's type and help
// text as JSON, keyed by the family's name. Input the parser rejects ends
// it with the parser's error and exit code 1. The tests use it to hold nodelet's /metrics to the
// format Prometheus reads, and to compare its families with the kubelet's.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

type family struct {
	Type string `json:"type"`
	Help string `json:"help"`
}

func main() {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := map[string]family{}
	for name, f := range families {
		out[name] = family{Type: f.GetType().String(), Help: f.GetHelp()}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
