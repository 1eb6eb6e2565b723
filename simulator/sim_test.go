package simulator

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/storetest"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func run(t *testing.T, o Options) *Report {
	t.Helper()
	rep, err := Run(o)
	if err != nil {
		t.Fatalf("Run(%+v): %v", o, err)
	}
	return rep
}

func byName(t *testing.T, rep *Report, name string) StrategyResult {
	t.Helper()
	for _, s := range rep.Strategies {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no strategy %q in the report", name)
	return StrategyResult{}
}

// Every group of every strategy runs through a hedge.Checker inside Run,
// which fails the run on the first broken invariant; this test drives every
// workload and both latency modes through it.
func TestEveryStrategyKeepsTheEngineInvariantsOnEveryGroup(t *testing.T) {
	for _, w := range workload.Names() {
		for _, stream := range []bool{false, true} {
			rep := run(t, Options{Workload: w, Requests: 3000, Seed: 7, Stream: stream})
			if len(rep.Strategies) != len(StrategyNames()) {
				t.Fatalf("%s: %d strategies reported, want all %d", w, len(rep.Strategies), len(StrategyNames()))
			}
			for _, s := range rep.Strategies {
				if s.Groups != 3000 || len(s.Latencies) != 3000 {
					t.Fatalf("%s/%s: %d groups checked, %d latencies; want 3000", w, s.Name, s.Groups, len(s.Latencies))
				}
			}
		}
	}
}

// The simulator's hedgerow strategy settles its budgets on budgets.Memory;
// the same store, on the simulator's kind of clock, passes the conformance suite.
func TestBudgetsConformanceSuitePassesOnTheSimulatorsStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) budgets.Store {
		return budgets.NewMemory(clock.Now)
	})
}

func TestSameSeedGivesTheSameReport(t *testing.T) {
	o := Options{Workload: workload.Degraded, Requests: 4000, Seed: 11, Stream: true}
	a, b := run(t, o), run(t, o)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two runs with the same seed differ")
	}
	o.Seed = 12
	if c := run(t, o); reflect.DeepEqual(a.Strategies, c.Strategies) {
		t.Fatal("a different seed gave the same figures")
	}
}

// Fidelity: strategy none on gpt4o, streaming, reproduces the published
// TTFT distribution the model was fitted to (docs/architecture.md §11).
func TestNoneReproducesTheGpt4oReference(t *testing.T) {
	rep := run(t, Options{Workload: workload.GPT4o, Requests: 60_000, Seed: 1, Stream: true, Strategies: []string{StrategyNone}})
	none := byName(t, rep, StrategyNone)
	if none.P50 < 0.9*630 || none.P50 > 1.1*630 {
		t.Errorf("P50 %.0f ms, want within ±10%% of 630", none.P50)
	}
	if none.P99 < 0.9*5800 || none.P99 > 1.1*5800 {
		t.Errorf("P99 %.0f ms, want within ±10%% of 5800", none.P99)
	}
	if none.DuplicateRate != 0 {
		t.Errorf("none launched extra attempts: duplicate rate %v", none.DuplicateRate)
	}
}

func TestHedgerowCutsTheGpt4oTailWithinItsDuplicateBudget(t *testing.T) {
	rep := run(t, Options{Workload: workload.GPT4o, Requests: 60_000, Seed: 2, Stream: true, Strategies: []string{StrategyNone, StrategyHedgerow}})
	none, hr := byName(t, rep, StrategyNone), byName(t, rep, StrategyHedgerow)
	if hr.P99 > 0.40*none.P99 {
		t.Errorf("hedgerow P99 %.0f ms is above 0.40 × none's %.0f ms", hr.P99, none.P99)
	}
	if hr.DuplicateRate > 0.07 || hr.DuplicateRate < 0.02 {
		t.Errorf("hedgerow duplicate rate %.3f, want a few percent (≤ 0.07)", hr.DuplicateRate)
	}
	if hr.P50 > 1.05*none.P50 {
		t.Errorf("hedgerow moved the median: %.0f ms vs %.0f ms", hr.P50, none.P50)
	}
}

func TestDegradedScenarioHasTeethAndHedgerowHoldsItsCeiling(t *testing.T) {
	rep := run(t, Options{Workload: workload.Degraded, Requests: 60_000, Seed: 3, Stream: true, Strategies: []string{StrategyFixedDelay, StrategyHedgerow}})
	fixed, hr := byName(t, rep, StrategyFixedDelay), byName(t, rep, StrategyHedgerow)
	if fixed.MaxWindowDuplicateRate < 0.3 {
		t.Errorf("fixed-delay's worst window duplicates %.3f: the scenario has no teeth", fixed.MaxWindowDuplicateRate)
	}
	// The ceiling bounds hedges over its minute, the burst bound over every
	// 10 s (docs/architecture.md §7, "two windows"); replacements, which
	// neither refuses, are bounded by each user action's attempts and still
	// leave the window far below a hedger without a budget.
	rate := policy.Default().DuplicateRate
	if limit := rate.Ceiling + 0.02; hr.MaxMinuteHedgeRate > limit {
		t.Errorf("hedgerow's worst minute hedges %.3f, above its ceiling + 0.02 = %.2f", hr.MaxMinuteHedgeRate, limit)
	}
	if limit := rate.BurstCeiling + 0.02; hr.MaxWindowHedgeRate > limit {
		t.Errorf("hedgerow's worst 10 s hedge %.3f, above its burst ceiling + 0.02 = %.2f", hr.MaxWindowHedgeRate, limit)
	}
	t.Logf("hedgerow's worst minute hedges %.3f, worst 10 s %.3f; fixed-delay's worst 10 s duplicates %.3f",
		hr.MaxMinuteHedgeRate, hr.MaxWindowHedgeRate, fixed.MaxWindowDuplicateRate)
	if hr.MaxWindowDuplicateRate > fixed.MaxWindowDuplicateRate/2 {
		t.Errorf("hedgerow's worst window duplicates %.3f, not well below fixed-delay's %.3f", hr.MaxWindowDuplicateRate, fixed.MaxWindowDuplicateRate)
	}
}

func TestMixedHedgesStallsNotLongAnswers(t *testing.T) {
	rep := run(t, Options{Workload: workload.Mixed, Requests: 60_000, Seed: 1, Strategies: []string{StrategyQuantileBudget, StrategyHedgerow}})
	qb, hr := byName(t, rep, StrategyQuantileBudget), byName(t, rep, StrategyHedgerow)
	if hr.ExtraCostRatio >= qb.ExtraCostRatio {
		t.Errorf("hedgerow extra cost %.3f not below quantile-budget's %.3f", hr.ExtraCostRatio, qb.ExtraCostRatio)
	}
}

func TestInvalidOptionsAreClearErrors(t *testing.T) {
	tests := []struct {
		name string
		o    Options
	}{
		{"unknown workload", Options{Workload: "gpt5", Requests: 10}},
		{"unknown strategy", Options{Workload: workload.GPT4o, Requests: 10, Strategies: []string{"yolo"}}},
		{"no requests", Options{Workload: workload.GPT4o, Requests: 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Run(tc.o); !errors.Is(err, ErrInvalidOptions) {
				t.Fatalf("Run = %v, want ErrInvalidOptions", err)
			}
		})
	}
}

func TestWritePlotDrawsAPNG(t *testing.T) {
	rep := run(t, Options{Workload: workload.Sonnet, Requests: 2000, Seed: 5, Strategies: []string{StrategyNone, StrategyHedgerow}})
	path := filepath.Join(t.TempDir(), "cdf.png")
	if err := rep.WritePlot(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")) || len(data) < 10_000 {
		t.Fatalf("plot is %d bytes and not a PNG", len(data))
	}
}

func TestTableNamesEveryStrategy(t *testing.T) {
	rep := run(t, Options{Workload: workload.GPT4o, Requests: 500, Seed: 1})
	var out bytes.Buffer
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	for _, name := range StrategyNames() {
		if !bytes.Contains(out.Bytes(), []byte(name)) {
			t.Errorf("table lacks %s:\n%s", name, out.String())
		}
	}
	if rep.Conditions.Deadline != 30*time.Second {
		t.Errorf("conditions deadline %v, want the pinned 30s", rep.Conditions.Deadline)
	}
}
