package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
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
		"max_minute_hedge_rate", "control_groups", "control_samples", "kept_baselines", "primary_shares",
		"hedge_shares", "end_p99_ms", "end_p999_ms"}
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

// exportRecords writes the records of a short hedged run to a file.
func exportRecords(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "records.jsonl")
	out, err := runRoot(t, "simulate", "--workload", "gpt4o", "--stream", "--requests", "2000", "--seed", "5",
		"--strategy", "hedgerow", "--export-records", path, "--quiet")
	if err != nil {
		t.Fatalf("simulate --export-records: %v\n%s", err, out)
	}
	return path
}

// The what-if JSON carries the frontier rows the issue names, one per
// setting, and the plot is drawn.
func TestSimulateRecordsSweepJSONHasTheDocumentedShape(t *testing.T) {
	dir := t.TempDir()
	records := exportRecords(t, dir)
	plotPath := filepath.Join(dir, "frontier.png")
	out, err := runRoot(t, "simulate", "--records", records, "--sweep", "--quantiles", "0.9,0.95", "--ceilings", "0.05,0.08",
		"--json", "--quiet", "--plot", plotPath)
	if err != nil {
		t.Fatalf("simulate --records --sweep: %v\n%s", err, out)
	}
	var f struct {
		Frontier    []map[string]any `json:"frontier"`
		Ceilings    map[string]any   `json:"ceilings"`
		Recommended map[string]any   `json:"recommended"`
		Cohorts     []map[string]any `json:"cohorts"`
	}
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	if len(f.Frontier) != 4 {
		t.Fatalf("%d frontier rows, want 2 quantiles × 2 ceilings", len(f.Frontier))
	}
	want := []string{"quantile", "duplicate_ceiling", "delay_ms", "p99_ms", "p999_ms", "duplicate_rate", "extra_cost_ratio"}
	slices.Sort(want)
	for _, row := range f.Frontier {
		got := slices.Sorted(maps.Keys(row))
		if !slices.Equal(got, want) {
			t.Fatalf("frontier row fields %v, want %v", got, want)
		}
		if row["p999_ms"].(float64) < row["p99_ms"].(float64) || row["p99_ms"].(float64) <= 0 {
			t.Fatalf("row %v: want 0 < P99 ≤ P99.9", row)
		}
	}
	if f.Ceilings["duplicate_rate"] != 0.08 || len(f.Cohorts) != 1 || f.Cohorts[0]["groups"] != 2000.0 {
		t.Fatalf("ceilings %v, cohorts %v: want the default 0.08 ceiling and one cohort of 2000 groups", f.Ceilings, f.Cohorts)
	}
	if f.Recommended == nil || f.Recommended["duplicate_rate"].(float64) > 0.08 {
		t.Fatalf("recommended %v, want a setting inside the 0.08 ceiling", f.Recommended)
	}
	if st, err := os.Stat(plotPath); err != nil || st.Size() == 0 {
		t.Fatalf("plot: %v", err)
	}
}

// A configuration file's class policy sets the ceilings a recommendation
// must keep, and a replay without --sweep runs its configured quantile.
func TestSimulateRecordsTakesTheConfiguredPolicy(t *testing.T) {
	dir := t.TempDir()
	records := exportRecords(t, dir)
	out, err := runRoot(t, "simulate", "--records", records, "--config", "../../deploy/examples/local.yaml", "--json", "--quiet")
	if err != nil {
		t.Fatalf("simulate --records --config: %v\n%s", err, out)
	}
	var f struct {
		Frontier []struct {
			Quantile float64 `json:"quantile"`
		} `json:"frontier"`
		Ceilings struct {
			DuplicateRate float64 `json:"duplicate_rate"`
		} `json:"ceilings"`
	}
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// The simulated records' operation class is chat, which the example
	// configures at q 0.9 under a 0.1 ceiling (its default class: 0.95, 0.08).
	if len(f.Frontier) != 1 || f.Frontier[0].Quantile != 0.9 || f.Ceilings.DuplicateRate != 0.1 {
		t.Fatalf("frontier %+v, ceilings %+v: want the example chat class's q 0.9 alone and its 0.1 ceiling", f.Frontier, f.Ceilings)
	}
}

func TestSimulateRecordsRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	records := exportRecords(t, dir)
	data, err := os.ReadFile(records)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	malformed := write("malformed.jsonl", first+"\n{\"event\": \"hedge_group_complete\", \"route\": \"secretish\n")
	var groupsOnly strings.Builder
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, `"event":"hedge_group_complete"`) {
			groupsOnly.WriteString(l + "\n")
		}
	}
	noPrimaries := write("groups.jsonl", groupsOnly.String())
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"a missing file", []string{"--records", filepath.Join(dir, "absent.jsonl")}, "absent.jsonl"},
		{"a malformed line", []string{"--records", malformed}, "malformed.jsonl:2: malformed JSON"},
		{"no primaries", []string{"--records", noPrimaries}, "no primary attempt records"},
		{"a quantile outside (0, 1)", []string{"--records", records, "--sweep", "--quantiles", "0.9,1.5"}, "--quantiles"},
		{"export with a replay", []string{"--records", records, "--export-records", filepath.Join(dir, "x.jsonl")}, "--export-records"},
		{"export of several strategies", []string{"--requests", "10", "--strategy", "none,hedgerow", "--export-records", filepath.Join(dir, "y.jsonl")}, "exactly one strategy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runRoot(t, append([]string{"simulate", "--quiet"}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v (output %q), want an error naming %q", err, out, tt.want)
			}
			if strings.Contains(err.Error(), "secretish") {
				t.Fatalf("the error quotes a record: %v", err)
			}
		})
	}
}

// simulate --regions --json prints one object with the figures issue 29
// asks for, per ceiling.
func TestSimulateRegionsJSONHasTheDocumentedShape(t *testing.T) {
	out, err := runRoot(t, "simulate", "--regions", "2", "--requests", "110000", "--seed", "1", "--json", "--quiet")
	if err != nil {
		t.Fatalf("simulate --regions: %v\n%s", err, out)
	}
	var rep struct {
		Regions   []string                     `json:"regions"`
		Seed      uint64                       `json:"seed"`
		Scenario  map[string]json.RawMessage   `json:"scenario"`
		Authority map[string]json.RawMessage   `json:"authority"`
		Ceilings  []map[string]json.RawMessage `json:"ceilings"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	if len(rep.Regions) != 2 || rep.Seed != 1 || len(rep.Ceilings) < 2 {
		t.Fatalf("regions %v, seed %d, %d ceilings: want 2 regions, seed 1, at least 2 ceilings", rep.Regions, rep.Seed, len(rep.Ceilings))
	}
	for _, key := range []string{"demand_before", "demand_after", "shift_s", "cut_off", "partition_s", "heal_s", "forget_s"} {
		if _, ok := rep.Scenario[key]; !ok {
			t.Errorf("scenario misses %q", key)
		}
	}
	for _, key := range []string{"reads", "writes", "conflicts", "lost_replies", "cut", "renewers"} {
		if _, ok := rep.Authority[key]; !ok {
			t.Errorf("authority misses %q", key)
		}
	}
	for _, key := range []string{"name", "limit_per_s", "max_window_use", "max_spent_share", "rebalance_s", "converge_s",
		"regions", "cut_off", "windows", "shares"} {
		if _, ok := rep.Ceilings[0][key]; !ok {
			t.Errorf("a ceiling misses %q", key)
		}
	}
}

func TestSimulateRegionsRefusesOneRegionAndFlagsThatDoNotApply(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string // in the error
	}{
		{[]string{"--regions", "1"}, []string{"--regions 1", "at least 2"}},
		{[]string{"--regions", "-2"}, []string{"--regions -2", "at least 2"}},
		{[]string{"--regions", "0"}, []string{"at least 2"}},
		{[]string{"--regions", "2", "--workload", "sonnet"}, []string{"--workload", "not used with --regions"}},
		{[]string{"--regions", "3", "--sweep", "--plot", "out.png"}, []string{"--plot", "--sweep"}},
		{[]string{"--regions", "2", "--requests", "1000"}, []string{"at least 108000 requests"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := runRoot(t, append([]string{"simulate", "--quiet"}, tc.args...)...)
			if err == nil {
				t.Fatalf("simulate %v ran:\n%s", tc.args, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
