package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/report/reporttest"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/tailplot"
)

// Generated is reporttest.Records, failing t on an error.
func Generated(t testing.TB, seed uint64, groups int, start time.Time) [][]byte {
	t.Helper()
	lines, err := reporttest.Records(seed, groups, start)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// independent counts, straight from the JSON lines (generic maps, not the
// package's types), what the report must show in total.
type independent struct {
	groups, control, extra, late, sent, observed int
	winners, losers                              int64
	suppressed, guardrail                        map[string]int
}

func countIndependently(t *testing.T, lines [][]byte) independent {
	t.Helper()
	c := independent{suppressed: map[string]int{}, guardrail: map[string]int{}}
	attemptsOf := map[string]int{}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatal(err)
		}
		switch m["event"] {
		case "hedge_group_complete":
			c.groups++
			if m["guardrail_decision"] == "control" {
				c.control++
			}
			if r, ok := m["hedge_suppressed_reason"].(string); ok && r != "" {
				c.suppressed[r]++
			}
			c.guardrail[m["guardrail_decision"].(string)]++
		case "hedge_attempt_complete":
			if m["reporter"] == "worker" {
				continue
			}
			attemptsOf[m["hedge_group_id"].(string)]++
			units := int64(m["usage_input_units"].(float64) + m["usage_output_units"].(float64))
			if m["outcome"] == "winner" {
				c.winners += units
			} else {
				c.losers += units
			}
			if m["outcome"] == "loser_late" {
				c.late++
			}
			if m["cancellation_sent"] == true {
				c.sent++
				if m["cancellation_observed"] == true {
					c.observed++
				}
			}
		}
	}
	for _, n := range attemptsOf {
		c.extra += n - 1
	}
	return c
}

func readLines(t *testing.T, lines [][]byte) *Records { return readLinesB(t, lines) }

func readLinesB(t testing.TB, lines [][]byte) *Records {
	t.Helper()
	recs, err := ReadJSONL(bytes.NewReader(bytes.Join(lines, []byte("\n"))), "generated")
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func TestReportFiguresEqualAnIndependentCountOfTheRawRecords(t *testing.T) {
	lines := Generated(t, 1, 1500, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	want := countIndependently(t, lines)
	rep := Compute(readLines(t, lines), Options{})
	tot := rep.Total
	if tot.Groups != want.groups || tot.ControlGroups != want.control {
		t.Errorf("groups %d control %d, want %d %d", tot.Groups, tot.ControlGroups, want.groups, want.control)
	}
	if got, w := tot.DuplicateRate, float64(want.extra)/float64(want.groups); got != w {
		t.Errorf("duplicate rate %v, want %v (%d extra attempts over %d groups)", got, w, want.extra, want.groups)
	}
	if tot.Usage.Winners != want.winners || tot.Usage.Losers != want.losers {
		t.Errorf("usage winners %d losers %d, want %d %d", tot.Usage.Winners, tot.Usage.Losers, want.winners, want.losers)
	}
	if tot.LateCompletions != want.late {
		t.Errorf("late completions %d, want %d", tot.LateCompletions, want.late)
	}
	if got, w := tot.CancellationObservedRatio, float64(want.observed)/float64(want.sent); got != w || tot.CancellationsSent != want.sent {
		t.Errorf("cancellation observed %v of %d, want %v of %d", got, tot.CancellationsSent, w, want.sent)
	}
	if !mapsEqual(tot.Suppressed, want.suppressed) || !mapsEqual(tot.Guardrail, want.guardrail) {
		t.Errorf("suppressed %v guardrail %v, want %v %v", tot.Suppressed, tot.Guardrail, want.suppressed, want.guardrail)
	}
	// The cohorts partition the total.
	var groups, attempts int
	var winners int64
	for _, c := range rep.Cohorts {
		groups, attempts, winners = groups+c.Groups, attempts+c.Attempts, winners+c.Usage.Winners
	}
	if len(rep.Cohorts) != 2 || groups != tot.Groups || attempts != tot.Attempts || winners != tot.Usage.Winners {
		t.Errorf("%d cohorts holding %d groups, %d attempts, %d winner units; total %d, %d, %d",
			len(rep.Cohorts), groups, attempts, winners, tot.Groups, tot.Attempts, tot.Usage.Winners)
	}
	if want.late == 0 || want.extra == 0 || len(want.suppressed) < 3 || want.observed == 0 {
		t.Fatalf("the generated records miss a case: %+v", want)
	}
}

func TestQuantilesAreNearestRankOfTheExactLatencies(t *testing.T) {
	var lat []float64
	for i := 1; i <= 1000; i++ {
		lat = append(lat, float64(i))
	}
	a := arm(lat)
	if a.P50 != 500 || a.P99 != 990 || a.P999 != 999 || a.Samples != 1000 {
		t.Errorf("arm %+v, want p50 500, p99 990, p999 999 of 1..1000", a)
	}
	if e := arm(nil); e != (Arm{}) {
		t.Errorf("empty arm %+v, want zeros", e)
	}
}

func TestGainIsWithheldBelowTheFloorAndBracketsTheRatioAbove(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	draw := func(n int, tail float64) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = 100 + rng.ExpFloat64()*tail
		}
		slices.Sort(out)
		return out
	}
	hedged, control := draw(2000, 100), draw(800, 400)
	if g, why := gain(hedged, control[:99], Options{}.withDefaults()); g != nil || !strings.Contains(why, "control 99") {
		t.Errorf("99 control groups: gain %+v (%q), want withheld naming the count", g, why)
	}
	g, why := gain(hedged, control, Options{}.withDefaults())
	if g == nil {
		t.Fatalf("gain withheld: %s", why)
	}
	if !(g.Lower <= g.Ratio && g.Ratio <= g.Upper) || g.Lower <= 1 || g.HedgedSamples != 2000 || g.ControlSamples != 800 {
		t.Errorf("gain %+v: want lower ≤ ratio ≤ upper, lower > 1 (control's tail is 4× longer)", g)
	}
	again, _ := gain(hedged, control, Options{}.withDefaults())
	if *again != *g {
		t.Errorf("same seed, another interval: %+v vs %+v", again, g)
	}
}

func TestAWithheldGainSaysHowManyMoreGroupsEachArmNeedsAtTheObservedAndTheEvaluationShare(t *testing.T) {
	tests := []struct {
		name            string
		hedged, control int
		share           float64
		want            SampleNeed
	}{
		// The first run: 6,337 hedged, 69 control groups of 6,406.
		{"control short at a 1% share", 6337, 69, 69.0 / 6406, SampleNeed{Floor: 100, ControlMore: 31,
			ControlShare: 69.0 / 6406, GroupsMore: 2879, EvaluationShare: 0.1, GroupsMoreAtEvaluation: 310}},
		{"both arms short: the arm that takes longer decides", 50, 2, 0.04, SampleNeed{Floor: 100, HedgedMore: 50,
			ControlMore: 98, ControlShare: 0.04, GroupsMore: 2450, EvaluationShare: 0.1, GroupsMoreAtEvaluation: 980}},
		{"no control group yet: no share to count from", 20, 0, 0, SampleNeed{Floor: 100, HedgedMore: 80,
			ControlMore: 100, EvaluationShare: 0.1, GroupsMoreAtEvaluation: 1000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sampleNeed(tt.hedged, tt.control, 100, tt.share); *got != tt.want {
				t.Errorf("got %+v, want %+v", *got, tt.want)
			}
		})
	}
}

func TestTheTableOfAWithheldGainSaysWhatEachArmNeedsAndHowToGetEvidenceSooner(t *testing.T) {
	lines := Generated(t, 5, 300, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rep := Compute(readLines(t, lines), Options{})
	n := rep.Total.GainNeeds
	if rep.Total.Gain != nil || n == nil || n.ControlMore == 0 {
		t.Fatalf("300 groups: gain %+v, needs %+v; want the gain withheld for want of control groups", rep.Total.Gain, n)
	}
	if want := sampleNeed(rep.Total.Hedged.Samples, rep.Total.Control.Samples, DefaultMinSamples,
		float64(rep.Total.ControlGroups)/float64(rep.Total.Groups)); *n != *want {
		t.Errorf("total needs %+v, want %+v", *n, *want)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	wants := []string{
		fmt.Sprintf("%d more control groups: about %d more groups at this control share (%.1f%%), about %d at a control share of 10%%",
			n.ControlMore, n.GroupsMore, 100*n.ControlShare, n.GroupsMoreAtEvaluation),
		"evidence sooner: for an evaluation period, raise ",
		"the cost is tokens: a control group whose hedge wins keeps its primary running",
	}
	for _, c := range rep.Cohorts {
		class, _, _ := strings.Cut(c.Cohort, "/")
		wants = append(wants, "policies."+class+".control_fraction")
	}
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("the table does not say %q:\n%s", w, out)
		}
	}
	js, err := json.Marshal(rep.Total)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(js, []byte(fmt.Sprintf(`"gain_needs":{"floor":100,"hedged_more":%d,"control_more":%d`, n.HedgedMore, n.ControlMore))) {
		t.Errorf("the JSON lacks gain_needs: %s", js)
	}
}

func TestJSONQuantilesAreAlwaysNumbers(t *testing.T) {
	// One control group only: the hedged arm of that cohort is empty.
	lines := Generated(t, 2, 40, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rep := Compute(readLines(t, lines), Options{})
	rep.Cohorts = append(rep.Cohorts, Compute(&Records{}, Options{}).Total)
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Total   map[string]any   `json:"total"`
		Cohorts []map[string]any `json:"cohorts"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Total == nil || len(doc.Cohorts) != 3 {
		t.Fatalf("shape: %s", data)
	}
	for _, s := range append(doc.Cohorts, doc.Total) {
		for _, armName := range []string{"hedged", "control"} {
			a, ok := s[armName].(map[string]any)
			if !ok {
				t.Fatalf("%s missing: %v", armName, s)
			}
			for _, q := range []string{"p50_ms", "p99_ms", "p999_ms"} {
				if _, ok := a[q].(float64); !ok {
					t.Errorf("%s.%s = %v, want a number", armName, q, a[q])
				}
			}
		}
		for _, k := range []string{"groups", "control_groups", "duplicate_rate", "extra_cost_ratio", "late_completions", "cancellation_observed_ratio"} {
			if _, ok := s[k].(float64); !ok {
				t.Errorf("%s = %v, want a number", k, s[k])
			}
		}
		u, _ := s["usage"].(map[string]any)
		if _, ok := u["winners"].(float64); !ok {
			t.Errorf("usage %v: want winners and losers numbers", s["usage"])
		}
		if _, ok := u["losers"].(float64); !ok {
			t.Errorf("usage %v: want winners and losers numbers", s["usage"])
		}
		for _, k := range []string{"suppressed", "guardrail"} {
			if _, ok := s[k].(map[string]any); !ok {
				t.Errorf("%s = %v, want an object", k, s[k])
			}
		}
	}
}

func TestSinceKeepsTheLaterGroupsWithTheirAttemptsAndExportWritesThemUnchanged(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lines := Generated(t, 4, 100, start)
	recs := readLines(t, lines).Since(start.Add(60 * time.Second))
	rep := Compute(recs, Options{})
	if rep.Total.Groups != 40 || rep.OrphanAttempts != 0 {
		t.Errorf("since the 60th second: %d groups, %d orphans; want 40, 0", rep.Total.Groups, rep.OrphanAttempts)
	}
	var buf bytes.Buffer
	if err := recs.WriteJSONL(&buf); err != nil {
		t.Fatal(err)
	}
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		if !slices.ContainsFunc(lines, func(o []byte) bool { return bytes.Equal(o, l) }) {
			t.Fatalf("exported line not among the records read: %s", l)
		}
	}
	back, err := ReadJSONL(&buf, "export")
	if err != nil || back.Len() != recs.Len() {
		t.Fatalf("export read back: %v, %d records of %d", err, back.Len(), recs.Len())
	}
}

func TestAMalformedLineIsNamedWithoutItsContent(t *testing.T) {
	valid := Generated(t, 7, 1, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))[0]
	_, err := ReadJSONL(strings.NewReader(string(valid)+"\n"+`{"event":"other","secret":"s3cr3t"}`), "f.jsonl")
	if err == nil || !strings.Contains(err.Error(), "f.jsonl:2") || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("error %v: want one naming f.jsonl:2 and not quoting the line", err)
	}
}

func TestTablePrintsEveryCohortTheGainAndItsSampleSizes(t *testing.T) {
	lines := Generated(t, 5, 1200, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rep := Compute(readLines(t, lines), Options{})
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, c := range rep.Cohorts {
		if !strings.Contains(out, c.Cohort) {
			t.Errorf("table misses cohort %s:\n%s", c.Cohort, out)
		}
	}
	g := rep.Total.Gain
	if g == nil || !strings.Contains(out, fmt.Sprintf("hedged n=%d, control n=%d", g.HedgedSamples, g.ControlSamples)) {
		t.Errorf("table lacks the total's gain with its sample sizes:\n%s", out)
	}
}

func TestPlotOfAReportIsWrittenAndNotEmpty(t *testing.T) {
	lines := Generated(t, 6, 1000, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rep := Compute(readLines(t, lines), Options{})
	path := filepath.Join(t.TempDir(), "tail.png")
	var series []tailplot.Series
	for i := range rep.Cohorts {
		c := &rep.Cohorts[i]
		series = append(series, tailplot.Series{Name: c.Cohort + " hedged", Latencies: c.HedgedLatencies()},
			tailplot.Series{Name: c.Cohort + " control", Latencies: c.ControlLatencies()})
	}
	if err := tailplot.Write(path, "test", series); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Size() < 1000 {
		t.Fatalf("plot %v, size %d", err, st.Size())
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// takeoverRecords is reporttest.TakeoverRecords, failing t on an error.
func takeoverRecords(t *testing.T, orphan schemas.GroupOutcome, marked, named bool) [][]byte {
	t.Helper()
	lines, err := reporttest.TakeoverRecords(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		reporttest.Takeover{Marked: marked, Named: named, OrphanFailed: orphan == schemas.GroupFailed})
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

func TestASupersededCommitIsCountedApartSoAUserActionCommitsOnce(t *testing.T) {
	for _, tc := range []struct {
		name                                 string
		orphan                               schemas.GroupOutcome
		marked, named                        bool
		committed, superseded, failed, twice int
		winners, supersededUsage, losers     int64
	}{
		{"marked by its superseded record and named by the takeover", schemas.GroupCommitted, true, true, 1, 1, 0, 0, 220, 110, 0},
		{"marked by its superseded record alone", schemas.GroupCommitted, true, false, 1, 1, 0, 0, 220, 110, 0},
		{"named by the takeover alone (its superseded record lost)", schemas.GroupCommitted, false, true, 1, 1, 0, 0, 220, 110, 0},
		{"with nothing linking them the user action committed twice", schemas.GroupCommitted, false, false, 2, 0, 0, 1, 330, 0, 0},
		{"a failed group named superseded stays failed", schemas.GroupFailed, true, true, 1, 0, 1, 0, 330, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Compute(readLines(t, takeoverRecords(t, tc.orphan, tc.marked, tc.named)), Options{})
			tot := rep.Total
			if tot.Groups != 2 || tot.CommittedGroups != tc.committed || tot.SupersededGroups != tc.superseded ||
				tot.FailedGroups != tc.failed {
				t.Errorf("groups %d: committed %d, superseded %d, failed %d; want 2: %d, %d, %d", tot.Groups,
					tot.CommittedGroups, tot.SupersededGroups, tot.FailedGroups, tc.committed, tc.superseded, tc.failed)
			}
			if rep.UserActions != 1 || rep.CommittedTwice != tc.twice {
				t.Errorf("%d user actions, %d committed twice; want 1, %d", rep.UserActions, rep.CommittedTwice, tc.twice)
			}
			// Every attempt counts once: a superseded group's apart, any
			// other by its own outcome (all winners in these records).
			if tot.Usage.Winners != tc.winners || tot.Usage.Superseded != tc.supersededUsage || tot.Usage.Losers != tc.losers {
				t.Errorf("usage %+v; want winners %d, superseded %d, losers %d", tot.Usage, tc.winners, tc.supersededUsage, tc.losers)
			}
			if tc.superseded > 0 && tot.ExtraCostRatio == 0 {
				t.Error("the superseded group's usage is not in the extra cost")
			}
		})
	}
}

func TestSupersededRecordsAreExportedUnchangedAndKeptSinceWithTheirGroup(t *testing.T) {
	lines := takeoverRecords(t, schemas.GroupCommitted, true, false)
	recs := readLines(t, lines)
	var buf bytes.Buffer
	if err := recs.WriteJSONL(&buf); err != nil {
		t.Fatal(err)
	}
	if got, want := buf.String(), string(bytes.Join(lines, []byte("\n")))+"\n"; got != want {
		t.Errorf("export:\n%s\nwant the records as read:\n%s", got, want)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		since time.Time
		want  int
	}{
		{"from the groups' time on, the superseded record is kept with its group", at, 1},
		{"after the groups' time, it leaves with its group", at.Add(time.Second), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kept := recs.Since(tc.since)
			if len(kept.Superseded) != tc.want || Compute(kept, Options{}).Total.SupersededGroups != tc.want {
				t.Errorf("%d superseded records kept, %d superseded groups; want %d", len(kept.Superseded),
					Compute(kept, Options{}).Total.SupersededGroups, tc.want)
			}
		})
	}
}

// A control group hedges; its control sample is what it would have
// measured primary-only (control_baseline_ms), not what its caller saw.
func TestAControlGroupCountsAtItsPrimaryOnlyBaselineNotItsCallersLatency(t *testing.T) {
	ms := func(v int64) *int64 { return &v }
	tests := []struct {
		name    string
		g       schemas.GroupRecord
		sampled bool
		want    float64
	}{
		{"a control group whose hedge won counts at its kept baseline",
			schemas.GroupRecord{Stream: true, Outcome: schemas.GroupCommitted, ElapsedMs: 1401, FirstByteMs: ms(1400), HedgeLaunched: true, ControlBaselineMs: ms(3000)},
			true, 3000},
		{"a control group whose baseline ran to the deadline counts there",
			schemas.GroupRecord{Stream: true, Outcome: schemas.GroupCommitted, OverallDeadlineMs: 30000, ElapsedMs: 1401, FirstByteMs: ms(1400), HedgeLaunched: true, ControlBaselineMs: ms(30000)},
			true, 30000},
		{"a control group whose baseline failed on its own after the hedge has no sample",
			schemas.GroupRecord{Stream: true, Outcome: schemas.GroupCommitted, ElapsedMs: 1401, FirstByteMs: ms(1400), HedgeLaunched: true},
			false, 0},
		{"a control group recorded before control groups hedged counts at its own latency",
			schemas.GroupRecord{Stream: true, Outcome: schemas.GroupCommitted, ElapsedMs: 3001, FirstByteMs: ms(3000)},
			true, 3000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.g.GuardrailDecision = schemas.GuardrailControl
			a := newAcc("")
			a.add(&tt.g, nil, false)
			s := a.section(Options{}.withDefaults())
			if s.ControlGroups != 1 || s.Hedged.Samples != 0 {
				t.Fatalf("control groups %d, hedged samples %d: want the one control group", s.ControlGroups, s.Hedged.Samples)
			}
			got := s.ControlLatencies()
			if (len(got) == 1) != tt.sampled || tt.sampled && got[0] != tt.want {
				t.Fatalf("control arm %v, want sampled %v at %v", got, tt.sampled, tt.want)
			}
		})
	}
}
