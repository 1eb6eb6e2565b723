package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func runRoot(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// The --json object carries exactly the fields the simulate issue names.
func TestSimulateJSONHasTheDocumentedShape(t *testing.T) {
	out, err := runRoot(t, "simulate", "--workload", "sonnet", "--requests", "800", "--seed", "4", "--stream", "--strategy", "none,hedgerow", "--json", "--quiet")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	var rep map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	for _, key := range []string{"workload", "requests", "seed", "stream", "conditions", "strategies"} {
		if _, ok := rep[key]; !ok {
			t.Errorf("missing top-level %q", key)
		}
	}
	var strategies []map[string]any
	if err := json.Unmarshal(rep["strategies"], &strategies); err != nil {
		t.Fatal(err)
	}
	if len(strategies) != 2 || strategies[0]["name"] != "none" || strategies[1]["name"] != "hedgerow" {
		t.Fatalf("strategies = %v, want none then hedgerow", strategies)
	}
	want := []string{"name", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "mean_ms", "duplicate_rate", "extra_tokens_ratio",
		"extra_cost_ratio", "deadline_miss_rate", "error_rate", "max_window_duplicate_rate", "max_window_hedge_rate",
		"max_minute_hedge_rate"}
	for _, s := range strategies {
		var got []string
		for k := range s {
			got = append(got, k)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("strategy fields %v, want %v", got, want)
		}
	}
}

func TestSimulateRejectsAnUnknownStrategy(t *testing.T) {
	out, err := runRoot(t, "simulate", "--requests", "10", "--strategy", "none,telepathy", "--quiet")
	if err == nil || !strings.Contains(err.Error(), "telepathy") {
		t.Fatalf("simulate with an unknown strategy: err %v, output %q", err, out)
	}
}
