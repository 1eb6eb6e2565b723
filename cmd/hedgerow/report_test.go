package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
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
