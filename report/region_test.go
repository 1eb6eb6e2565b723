package report

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/report/reporttest"
)

// regionRecords is reporttest.RegionRecords, failing t on an error.
func regionRecords(t testing.TB, seed uint64, groups int, regions ...string) [][]byte {
	t.Helper()
	lines, err := reporttest.RegionRecords(seed, groups, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), regions...)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// ofRegion keeps the lines of records that name region ("" for none).
func ofRegion(t *testing.T, lines [][]byte, region string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, l := range lines {
		var m struct {
			Region   string `json:"region"`
			Reporter string `json:"reporter"`
		}
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatal(err)
		}
		if m.Region == region && m.Reporter != "worker" {
			out = append(out, l)
		}
	}
	return out
}

// withoutRegion is lines with every record's region removed: named from a
// group id past every other.
func withoutRegion(t *testing.T, lines [][]byte) [][]byte {
	t.Helper()
	return namedFrom(t, lines, "\uffff")
}

// namedFrom is lines with the region removed from the records of the
// groups before group id first, as kept before the region was named.
func namedFrom(t *testing.T, lines [][]byte, first string) [][]byte {
	t.Helper()
	out := make([][]byte, 0, len(lines))
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatal(err)
		}
		if id, _ := m["hedge_group_id"].(string); id < first {
			delete(m, "region")
			l = mustJSON(t, m)
		}
		out = append(out, l)
	}
	return out
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Records of two regions: each region's figures are those of its own
// records, counted independently from the raw lines, and the figures over
// all regions are those of the same records with no region at all.
func TestAReportOfTwoRegionsGivesEachRegionsFiguresAndTheTotalsOverBoth(t *testing.T) {
	lines := regionRecords(t, 11, 1500, "east", "west")
	rep := Compute(readLines(t, lines), Options{})
	if got := slices.Sorted(maps.Keys(rep.Regions)); !slices.Equal(got, []string{"east", "west"}) {
		t.Fatalf("regions %v, want east and west", got)
	}
	for name, r := range rep.Regions {
		want := countIndependently(t, ofRegion(t, lines, name))
		tot := r.Total
		if tot.Groups != want.groups || tot.ControlGroups != want.control || tot.LateCompletions != want.late ||
			tot.Usage.Winners != want.winners || tot.Usage.Losers != want.losers || tot.CancellationsSent != want.sent ||
			!mapsEqual(tot.Suppressed, want.suppressed) || !mapsEqual(tot.Guardrail, want.guardrail) {
			t.Errorf("region %s: %+v\nwant the independent count %+v", name, tot, want)
		}
		if len(r.Cohorts) != 2 {
			t.Errorf("region %s: %d cohorts, want 2", name, len(r.Cohorts))
		}
		if tot.Gain == nil {
			t.Errorf("region %s: gain withheld (%s) over %d groups", name, tot.GainWithheld, tot.Groups)
		}
	}
	if e, w := rep.Regions["east"].Total, rep.Regions["west"].Total; e.Hedged.P50 >= w.Hedged.P50 {
		t.Errorf("east's hedged P50 %v not below west's %v: the regions' figures are not their own", e.Hedged.P50, w.Hedged.P50)
	}
	whole := Compute(readLines(t, withoutRegion(t, lines)), Options{})
	if whole.Regions != nil {
		t.Fatalf("records without a region broke down by region: %v", slices.Collect(maps.Keys(whole.Regions)))
	}
	all := *rep
	all.Regions = nil
	if got, want := mustJSON(t, &all), mustJSON(t, whole); !bytes.Equal(got, want) {
		t.Errorf("the figures over both regions differ from those of the same records without regions:\n%s\nwant\n%s", got, want)
	}
}

// A report breaks down by region only when its records hold more than
// one: a deployment of one region, named or not, reads as it did before
// regions, and records kept before a region was named count under
// NoRegion beside those after.
func TestAReportBreaksDownByRegionOnlyWhenItsRecordsHoldMoreThanOne(t *testing.T) {
	plain := regionRecords(t, 12, 300)
	tests := []struct {
		name    string
		lines   [][]byte
		regions []string
	}{
		{"records of no region", plain, nil},
		{"records of one named region", regionRecords(t, 12, 300, "east"), nil},
		{"records from before a region was named and after", namedFrom(t, regionRecords(t, 13, 600, "east"), "hg_00300"),
			[]string{NoRegion, "east"}},
		{"records of three regions", regionRecords(t, 12, 300, "east", "west", "north"), []string{"east", "north", "west"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := Compute(readLines(t, tt.lines), Options{})
			got := slices.Sorted(maps.Keys(rep.Regions))
			slices.Sort(tt.regions)
			if !slices.Equal(got, tt.regions) {
				t.Fatalf("regions %v, want %v", got, tt.regions)
			}
			groups := 0
			for _, r := range rep.Regions {
				groups += r.Total.Groups
			}
			if tt.regions != nil && groups != rep.Total.Groups {
				t.Errorf("the regions hold %d groups, the total %d", groups, rep.Total.Groups)
			}
			var doc map[string]json.RawMessage
			if err := json.Unmarshal(mustJSON(t, rep), &doc); err != nil {
				t.Fatal(err)
			}
			if _, ok := doc["regions"]; ok != (tt.regions != nil) {
				t.Errorf("JSON has regions %v, want %v", ok, tt.regions != nil)
			}
		})
	}
	// One named region: the table and the JSON are those of no region.
	named := Compute(readLines(t, regionRecords(t, 12, 300, "east")), Options{})
	unnamed := Compute(readLines(t, plain), Options{})
	var a, b bytes.Buffer
	if err := named.WriteTable(&a); err != nil {
		t.Fatal(err)
	}
	if err := unnamed.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if a.String() != b.String() || !bytes.Equal(mustJSON(t, named), mustJSON(t, unnamed)) {
		t.Errorf("the report of one named region differs from that of no region:\n%s\nwant\n%s", a.String(), b.String())
	}
}

// The table of two regions leads with a region column: each region's
// cohorts and total, then all regions', and each note names its region.
func TestTheTableOfTwoRegionsShowsEachRegionThenAllOfThem(t *testing.T) {
	rep := Compute(readLines(t, regionRecords(t, 14, 600, "east", "west")), Options{})
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(strings.TrimSpace(lines[0]), "region") {
		t.Errorf("header %q does not lead with the region", lines[0])
	}
	// The rows, in order: east's two cohorts and total, west's, all's.
	var rows []string
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < 3 {
			break
		}
		rows = append(rows, f[0]+" "+f[1])
	}
	want := []string{"east chat/gpt4o/complete", "east chat/gpt4o/stream", "east total",
		"west chat/gpt4o/complete", "west chat/gpt4o/stream", "west total",
		"all chat/gpt4o/complete", "all chat/gpt4o/stream", "all total"}
	if !slices.Equal(rows, want) {
		t.Errorf("rows %q, want %q\n%s", rows, want, out)
	}
	for _, note := range []string{"\neast total:\n", "\nwest chat/gpt4o/stream:\n", "\ntotal:\n", "; 2 regions\n"} {
		if !strings.Contains(out, note) {
			t.Errorf("table lacks %q:\n%s", note, out)
		}
	}
}
