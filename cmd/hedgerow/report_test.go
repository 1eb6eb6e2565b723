package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/adapters/records/recordstest"
	"github.com/hedgerow/hedgerow/internal/natstest"
	hreport "github.com/hedgerow/hedgerow/report"
	"github.com/hedgerow/hedgerow/report/reporttest"
)

// Records kept in a real JetStream stream through internal/adapters/records, read
// back by `hedgerow report --nats`: its JSON is the report of the records
// kept, the export holds them, the plot is drawn.
func TestReportReadsTheStreamExportsItsRecordsAndPlotsTheirTails(t *testing.T) {
	lines, err := reporttest.Records(31, 1200, time.Now().Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv := keptInStream(t, lines)

	dir := t.TempDir()
	export, plot := filepath.Join(dir, "records.jsonl"), filepath.Join(dir, "tail.png")
	out, err := runRoot(t, "report", "--nats", srv.ClientURL(), "--json", "--export", export, "--plot", plot)
	if err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	kept, err := hreport.ReadJSONL(bytes.NewReader(bytes.Join(lines, []byte("\n"))), "lines")
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.MarshalIndent(hreport.Compute(kept, hreport.Options{}), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != string(want) {
		t.Errorf("report --json:\n%s\nwant the report of the records kept:\n%s", out, want)
	}
	f, err := os.Open(export)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	exported, err := hreport.ReadJSONL(f, export)
	if err != nil || exported.Len() != kept.Len() {
		t.Errorf("export: %v, %d records, want %d", err, exported.Len(), kept.Len())
	}
	if st, err := os.Stat(plot); err != nil || st.Size() < 1000 {
		t.Errorf("plot: %v", err)
	}

	// The table, of the last hour only: no group is that recent.
	out, err = runRoot(t, "report", "--nats", srv.ClientURL(), "--since", "1h")
	if err != nil || !strings.Contains(out, "total") || !strings.Contains(out, "below the sample floor") {
		t.Errorf("report --since 1h: %v\n%s", err, out)
	}
}

func TestReportNeedsExactlyOneSource(t *testing.T) {
	for _, args := range [][]string{{"report"}, {"report", "--url", "http://127.0.0.1:1", "--nats", "nats://127.0.0.1:1"}} {
		if _, err := runRoot(t, args...); err == nil || !strings.Contains(err.Error(), "exactly one of --url and --nats") {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// Records of two regions kept in a real JetStream stream: `report --nats
// --json` gives each region's figures beside the totals over both, and
// the table leads with the region; a report read back from its JSON (what
// --url gets from a gateway) prints the same table.
func TestReportOfTwoRegionsReadsEachRegionAndTheTotalsFromTheStream(t *testing.T) {
	lines, err := reporttest.RegionRecords(32, 800, time.Now().Add(-2*time.Hour), "east", "west")
	if err != nil {
		t.Fatal(err)
	}
	srv := keptInStream(t, lines)

	out, err := runRoot(t, "report", "--nats", srv.ClientURL(), "--json")
	if err != nil {
		t.Fatalf("report --json: %v\n%s", err, out)
	}
	var rep hreport.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report --json: %v\n%s", err, out)
	}
	east, west := rep.Regions["east"].Total, rep.Regions["west"].Total
	if len(rep.Regions) != 2 || east.Groups != 400 || west.Groups != 400 || rep.Total.Groups != 800 {
		t.Errorf("regions %d: east %d groups, west %d, total %d; want 2: 400, 400, 800",
			len(rep.Regions), east.Groups, west.Groups, rep.Total.Groups)
	}

	table, err := runRoot(t, "report", "--nats", srv.ClientURL())
	if err != nil {
		t.Fatalf("report: %v\n%s", err, table)
	}
	words := strings.Join(strings.Fields(table), " ") // the table's cells, one space apart
	for _, want := range []string{"region cohort groups", "east total 400", "west total 400", "all total 800", "east total: tail gain"} {
		if !strings.Contains(words, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	var again bytes.Buffer
	if err := rep.WriteTable(&again); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(again.String()) != strings.TrimSpace(table) {
		t.Errorf("the table of the report read back from its JSON:\n%s\nwant the command's:\n%s", again.String(), table)
	}
}

// keptInStream keeps lines in the records stream of a real JetStream server
// through internal/adapters/records, and returns the server.
func keptInStream(t *testing.T, lines [][]byte) *server.Server {
	t.Helper()
	srv := natstest.Start(t, natstest.JetStream(t.TempDir()))
	p, err := records.Open(context.Background(), natstest.Connect(t, srv), records.Options{Stream: records.DefaultStream, MaxAge: time.Hour,
		MaxBytes: 64 << 20, Replicas: 1, Duplicates: time.Minute, MaxPending: 4096, CommitTimeout: 5 * time.Second},
		prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	recordstest.Keep(t, p, lines)
	return srv
}

// keepGroups keeps the group records keep accepts (as generic JSON) and
// the attempt records of those groups.
func keepGroups(t *testing.T, lines [][]byte, keep func(group map[string]any) bool) [][]byte {
	t.Helper()
	kept := map[string]bool{}
	var groups, attempts [][]byte
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatal(err)
		}
		id, _ := m["hedge_group_id"].(string)
		if m["event"] == "hedge_group_complete" {
			if keep(m) {
				kept[id] = true
				groups = append(groups, l)
			}
			continue
		}
		attempts = append(attempts, l)
	}
	out := groups
	for _, l := range attempts {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatal(err)
		}
		if kept[m["hedge_group_id"].(string)] {
			out = append(out, l)
		}
	}
	return out
}

// The report's plot draws every cohort's two arms, the control dashed; a
// total only for an arm more than one cohort has latencies in — the total
// of one cohort is that cohort's curve again, drawn over it — and then as
// a band beneath the cohorts' lines.
func TestTheReportPlotDrawsATotalOnlyWhereCohortsMakeItUpAndBeneathThem(t *testing.T) {
	lines, err := reporttest.Records(8, 1500, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	stream := func(g map[string]any) bool { return g["stream"] == true }
	tests := []struct {
		name    string
		lines   [][]byte
		cohorts int
		bands   []string
	}{
		{"one cohort: no total", keepGroups(t, lines, stream), 1, nil},
		{"two cohorts with both arms: both totals", lines, 2, []string{"total hedged", "total control"}},
		{"a second cohort without a control arm: the hedged total alone", keepGroups(t, lines, func(g map[string]any) bool {
			return stream(g) || g["guardrail_decision"] != "control"
		}), 2, []string{"total hedged"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := hreport.ReadJSONL(bytes.NewReader(bytes.Join(tc.lines, []byte("\n"))), "lines")
			if err != nil {
				t.Fatal(err)
			}
			rep := hreport.Compute(recs, hreport.Options{})
			var bands []string
			cohortSeries := 0
			for _, s := range reportSeries(rep) {
				switch {
				case s.Band:
					bands = append(bands, s.Name)
					want := rep.Total.HedgedLatencies()
					if s.Name == "total control" {
						want = rep.Total.ControlLatencies()
					}
					if !slices.Equal(s.Latencies, want) {
						t.Errorf("%s: not the total's latencies", s.Name)
					}
				case strings.HasSuffix(s.Name, " control"):
					cohortSeries++
					if !s.Dashed || s.Emphasis {
						t.Errorf("%s: want a thin dashed line", s.Name)
					}
				case strings.HasSuffix(s.Name, " hedged"):
					cohortSeries++
					if s.Dashed || !s.Emphasis {
						t.Errorf("%s: want a thick solid line", s.Name)
					}
				default:
					t.Errorf("series %q is neither a cohort's arm nor a total", s.Name)
				}
			}
			if len(rep.Cohorts) != tc.cohorts || cohortSeries != 2*tc.cohorts || !slices.Equal(bands, tc.bands) {
				t.Fatalf("%d cohort series and bands %q for %d cohorts, want two a cohort and bands %q",
					cohortSeries, bands, len(rep.Cohorts), tc.bands)
			}
			if err := plotReport(filepath.Join(t.TempDir(), "tail.png"), rep, 0); err != nil {
				t.Fatal(err)
			}
		})
	}
}
