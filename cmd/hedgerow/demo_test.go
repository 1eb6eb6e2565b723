package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// The --json object is simulate's, with none and hedgerow, plus the live
// system's three figures; the run leaves nothing behind.
func TestDemoJSONIsTheSimulateShapePlusTheLiveFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the live system")
	}
	noLeaks(t)
	out, err := runRoot(t, "demo", "--requests", "80", "--warmup", "20", "--rate", "50", "--time-scale", "0.1", "--json", "--quiet")
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	var rep struct {
		Strategies []struct {
			Name string  `json:"name"`
			P99  float64 `json:"p99_ms"`
		} `json:"strategies"`
		Conditions    map[string]any `json:"conditions"`
		CancelP99     *float64       `json:"cancel_latency_p99_ms"`
		LoserTokens   *int64         `json:"loser_output_tokens"`
		DoubleCommits *int           `json:"double_commits"`
		TimeScale     float64        `json:"time_scale"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	if len(rep.Strategies) != 2 || rep.Strategies[0].Name != "none" || rep.Strategies[1].Name != "hedgerow" {
		t.Fatalf("strategies %+v, want none then hedgerow", rep.Strategies)
	}
	switch {
	case rep.CancelP99 == nil || rep.LoserTokens == nil || rep.DoubleCommits == nil:
		t.Errorf("missing a live figure:\n%s", out)
	case *rep.DoubleCommits != 0:
		t.Errorf("double_commits = %d, want 0", *rep.DoubleCommits)
	case rep.TimeScale != 0.1 || rep.Conditions["deadline_ms"] != 30000.0:
		t.Errorf("time scale %v, conditions %v; want 0.1 and the model deadline", rep.TimeScale, rep.Conditions)
	}
}

func TestDemoRejectsBadOptions(t *testing.T) {
	out, err := runRoot(t, "demo", "--requests", "0", "--quiet")
	if err == nil || !strings.Contains(err.Error(), "requests") {
		t.Fatalf("demo --requests 0: err %v, output %q", err, out)
	}
}
