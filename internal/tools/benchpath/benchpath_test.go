package main

import (
	"errors"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/internal/tools/loadgen"
)

// TestParseStatReadsUtimeAndStimeAfterTheCommandName: fields 14 and 15
// are counted from the last ')', whatever the command name holds.
func TestParseStatReadsUtimeAndStimeAfterTheCommandName(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime ...
	tests := []struct {
		name         string
		line         string
		utime, stime int64
		err          bool
	}{
		{"a plain name", "4242 (hedgerow) S 1 4242 4242 0 -1 4194560 1200 0 3 0 731 129 0 0 20 0 9 0", 731, 129, false},
		{"a name with spaces and parentheses", "7 (a (weird) name) R 1 7 7 0 -1 0 0 0 0 0 15 2 0 0", 15, 2, false},
		{"no command name", "4242 hedgerow S 1", 0, 0, true},
		{"too few fields", "4242 (hedgerow) S 1 2 3", 0, 0, true},
		{"not a number", "4242 (hedgerow) S 1 4242 4242 0 -1 0 0 0 0 0 x 1 0 0", 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, s, err := parseStat([]byte(tt.line))
			if (err != nil) != tt.err || u != tt.utime || s != tt.stime {
				t.Fatalf("parseStat = %d, %d, %v; want %d, %d, error %v", u, s, err, tt.utime, tt.stime, tt.err)
			}
		})
	}
	// And on this very process, whose CPU only grows.
	before, err := cpuTicks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Millisecond); time.Now().Before(end); {
	}
	if after, err := cpuTicks(os.Getpid()); err != nil || after < before {
		t.Fatalf("cpu ticks went from %d to %d (%v)", before, after, err)
	}
}

// TestStepSearchDoublesWhileItHoldsThenNarrowsBetweenPassAndFail: the
// search's steps for a target that holds up to a given rate, each step's
// rate decided by the outcomes before it.
func TestStepSearchDoublesWhileItHoldsThenNarrowsBetweenPassAndFail(t *testing.T) {
	tests := []struct {
		name   string
		holds  float64 // the target sustains rates up to this
		refine int
		steps  []float64
		best   float64
		capped bool
	}{
		{name: "fails between two doublings, refined twice", holds: 2500, refine: 2,
			steps: []float64{1000, 2000, 4000, 2800, 2400}, best: 2400},
		{name: "holds to the cap", holds: 1e9, refine: 2, steps: []float64{1000, 2000, 4000, 8000}, best: 8000, capped: true},
		{name: "fails at the start, halves until it holds", holds: 300, refine: 1, steps: []float64{1000, 500, 250, 350}, best: 250},
		{name: "never holds", holds: 100, refine: 2, steps: []float64{1000, 500, 250}, best: 0},
		{name: "no refinement", holds: 1500, refine: 0, steps: []float64{1000, 2000}, best: 1000},
		{name: "stops refining within the resolution", holds: 1050, refine: 5,
			steps: []float64{1000, 2000, 1400, 1200, 1100}, best: 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &stepSearch{start: 1000, min: 250, max: 8000, refine: tt.refine, resolution: 1.15}
			var steps []float64
			for {
				rate, more := s.next()
				if !more {
					break
				}
				if len(steps) > 20 {
					t.Fatalf("no end after %v", steps)
				}
				steps = append(steps, rate)
				s.record(rate, rate <= tt.holds)
			}
			best, capped := s.best()
			if !slices.Equal(steps, tt.steps) || best != tt.best || capped != tt.capped {
				t.Fatalf("steps %v best %v capped %v; want %v best %v capped %v", steps, best, capped, tt.steps, tt.best, tt.capped)
			}
		})
	}
}

func TestRoundRateKeepsTwoSignificantFigures(t *testing.T) {
	for in, want := range map[float64]float64{1414.2: 1400, 2828.4: 2800, 353.6: 350, 11313: 11000, 99.6: 100, 0: 0} {
		if got := roundRate(in); got != want {
			t.Errorf("roundRate(%v) = %v, want %v", in, got, want)
		}
	}
}

// TestAStepHoldsOnlyOpenLoopWithoutErrorsAndWithinItsP99: the step
// verdict, each rule on its own.
func TestAStepHoldsOnlyOpenLoopWithoutErrorsAndWithinItsP99(t *testing.T) {
	bound := 25 * time.Millisecond
	ok := loadgen.TargetReport{Requests: 100, OK: 100, Latency: loadgen.Percentiles{P99: 24.9}}
	tests := []struct {
		name       string
		report     loadgen.TargetReport
		capDelayed int
		want       bool
		why        string
	}{
		{"within the bound", ok, 0, true, "ok"},
		{"at the bound", loadgen.TargetReport{Requests: 100, Latency: loadgen.Percentiles{P99: 25}}, 0, true, "ok"},
		{"over the bound", loadgen.TargetReport{Requests: 100, Latency: loadgen.Percentiles{P99: 25.1}}, 0, false, "p99 over bound"},
		{"an error", loadgen.TargetReport{Requests: 100, Errors: 1, Latency: loadgen.Percentiles{P99: 1}}, 0, false, "errors"},
		{"held back by the in-flight cap", ok, 1, false, "in-flight cap reached"},
		{"no requests", loadgen.TargetReport{}, 0, false, "no requests"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := stepVerdict(tt.report, tt.capDelayed, bound)
			if got != tt.want || why != tt.why {
				t.Fatalf("stepVerdict = %v %q, want %v %q", got, why, tt.want, tt.why)
			}
		})
	}
}

// TestARaceSampleRunsFromTheWinnersFirstTokenToTheLosersDisconnect: a
// hedged probe leaves one winner (a first write) and one loser (a client
// gone) at the race fake; anything else is no sample, said why.
func TestARaceSampleRunsFromTheWinnersFirstTokenToTheLosersDisconnect(t *testing.T) {
	winner := node.FakeTiming{ArrivedUs: 1_000_000, FirstWriteUs: 1_050_000, EndedUs: 1_050_040}
	loser := node.FakeTiming{ArrivedUs: 1_010_500, GoneUs: 1_050_870, EndedUs: 1_050_900}
	tests := []struct {
		name    string
		timings []node.FakeTiming
		want    time.Duration
		err     error
	}{
		{"winner then loser", []node.FakeTiming{winner, loser}, 870 * time.Microsecond, nil},
		{"loser kept first", []node.FakeTiming{loser, winner}, 870 * time.Microsecond, nil},
		{"no hedge reached the provider", []node.FakeTiming{winner}, 0, errNoRace},
		{"both answered", []node.FakeTiming{winner, winner}, 0, errNoRace},
		{"the loser answered before its cancel", []node.FakeTiming{winner, {ArrivedUs: 1_010_500, FirstWriteUs: 1_060_500, GoneUs: 1_060_600}}, 0, errNoRace},
		{"gone before the winner's token", []node.FakeTiming{winner, {ArrivedUs: 1_010_500, GoneUs: 1_040_000}}, 0, errTooEarly},
		{"nothing", nil, 0, errNoRace},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := raceSample(tt.timings)
			if got != tt.want || !errors.Is(err, tt.err) || (err == nil) != (tt.err == nil) {
				t.Fatalf("raceSample = %v, %v; want %v, %v", got, err, tt.want, tt.err)
			}
			if err != nil && !strings.Contains(err.Error(), "arrived") && len(tt.timings) > 0 {
				t.Errorf("error %q does not describe the requests", err)
			}
		})
	}
}

// TestADirectSampleRunsFromTheClientsCancelToTheProviderSeeingItGo.
func TestADirectSampleRunsFromTheClientsCancelToTheProviderSeeingItGo(t *testing.T) {
	const cancelled = 2_000_000
	tests := []struct {
		name    string
		timings []node.FakeTiming
		want    time.Duration
		err     error
	}{
		{"seen going", []node.FakeTiming{{ArrivedUs: 1_990_000, GoneUs: 2_000_180, EndedUs: 2_000_200}}, 180 * time.Microsecond, nil},
		{"seen at once (clock ties)", []node.FakeTiming{{ArrivedUs: 1_990_000, GoneUs: 1_999_999}}, 0, nil},
		{"arrived after the cancel", []node.FakeTiming{{ArrivedUs: 2_000_100, GoneUs: 2_000_300}}, 0, errNotSeen},
		{"answered, never gone", []node.FakeTiming{{ArrivedUs: 1_990_000, FirstWriteUs: 2_040_000}}, 0, errNotSeen},
		{"never arrived", nil, 0, errNotSeen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := directSample(tt.timings, cancelled)
			if got != tt.want || !errors.Is(err, tt.err) || (err == nil) != (tt.err == nil) {
				t.Fatalf("directSample = %v, %v; want %v, %v", got, err, tt.want, tt.err)
			}
		})
	}
}

// TestRatiosAndRatesReadAsTheTableShowsThem: a floor lost in the noise
// has no ratio; a search that hit its cap or its floor says so.
func TestRatiosAndRatesReadAsTheTableShowsThem(t *testing.T) {
	for _, tt := range []struct {
		a, b float64
		want string
	}{{4.6, 1, "4.60×"}, {1, 0, "n/a"}, {1, -0.2, "n/a"}} {
		if got := ratio(tt.a, tt.b); got != tt.want {
			t.Errorf("ratio(%v, %v) = %q, want %q", tt.a, tt.b, got, tt.want)
		}
	}
	for _, tt := range []struct {
		passed, failed float64
		want           string
	}{{2000, 2800, "2000/s"}, {8000, 0, "≥ 8000/s"}, {0, 250, "< 250/s"}} {
		s := &stepSearch{min: 250, max: 8000, passed: tt.passed, failed: tt.failed}
		if got := rateText(s); got != tt.want {
			t.Errorf("rateText(passed %v, failed %v) = %q, want %q", tt.passed, tt.failed, got, tt.want)
		}
	}
}

// TestTheCommitWaitIsReadFromTwoScrapesOfServesHistogram: the histogram
// is parsed from the text exposition, the earlier scrape taken off, and a
// quantile read as its bucket's upper bound.
func TestTheCommitWaitIsReadFromTwoScrapesOfServesHistogram(t *testing.T) {
	scrape := func(b1, b2, inf, sum float64) string {
		return "# HELP hedgerow_records_commit_publish_seconds Wait.\n# TYPE hedgerow_records_commit_publish_seconds histogram\n" +
			"hedgerow_records_commit_publish_seconds_bucket{le=\"0.0001\"} " + ftoa(b1) + "\n" +
			"hedgerow_records_commit_publish_seconds_bucket{le=\"0.0002\"} " + ftoa(b2) + "\n" +
			"hedgerow_records_commit_publish_seconds_bucket{le=\"+Inf\"} " + ftoa(inf) + "\n" +
			"hedgerow_records_commit_publish_seconds_sum " + ftoa(sum) + "\n" +
			"hedgerow_records_commit_publish_seconds_count " + ftoa(inf) + "\n" +
			"hedgerow_records_commit_publish_secondsx_count 7\nother_metric 1\n"
	}
	before, err := parseHistogram(strings.NewReader(scrape(10, 10, 10, 0.001)), commitWaitMetric)
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseHistogram(strings.NewReader(scrape(60, 109, 110, 0.021)), commitWaitMetric)
	if err != nil {
		t.Fatal(err)
	}
	d := after.minus(before)
	tests := []struct {
		name      string
		got, want float64
	}{
		{"count", d.count, 100},
		{"p50 in the first bucket", d.quantile(0.5), 0.0001},
		{"p99 in the second", d.quantile(0.99), 0.0002},
		{"p99.9 past the last bound", d.quantile(0.999), math.Inf(1)},
		{"mean", math.Round(d.mean()*1e6) / 1e6, 0.0002},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if got := d.String(); !strings.Contains(got, "p50 ≤ 0.1 ms") || !strings.Contains(got, "(100)") {
		t.Errorf("String() = %q", got)
	}
	if _, err := parseHistogram(strings.NewReader("other_metric 1\n"), commitWaitMetric); err == nil {
		t.Error("a scrape without the histogram was read")
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
