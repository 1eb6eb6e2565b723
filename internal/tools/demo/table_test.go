package demo

import (
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/tools/loadgen"
	"github.com/hedgerow/hedgerow/report"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// The worst duplicate and hedge rates are taken over the gateway's own
// windows in real time — full 10 s burst windows, and the 1 m window over
// them, or the whole run's full windows when the run is shorter — so they
// compare with burst_ceiling and ceiling.
func TestWindowsAreTheGatewaysInRealTime(t *testing.T) {
	// 25 s of arrivals at 100/s real: two full 10 s windows and a cut one.
	// One group in 10 hedges in the first window, one in 20 in the second,
	// one in 2 in the cut one (which must not count).
	const n = 2500
	ru := &run{name: simulator.StrategyHedgerow, sum: &loadgen.Summary{Results: make([]loadgen.Result, n)},
		groups: make([]*schemas.GroupRecord, n), upstream: make([][]fakellm.Record, n)}
	for i := range n {
		due := time.Duration(i) * 10 * time.Millisecond
		every := map[int]int{0: 10, 1: 20, 2: 2}[int(due/(10*time.Second))]
		hedged := i%every == 0
		attempts := 1
		if hedged {
			attempts = 2
		}
		ru.sum.Results[i] = loadgen.Result{Due: due, FirstToken: 10 * time.Millisecond}
		ru.groups[i] = &schemas.GroupRecord{Outcome: schemas.GroupCommitted, Attempts: attempts, HedgeLaunched: hedged}
	}
	r := &runner{o: Options{TimeScale: 0.02}}
	res, win := r.strategy(ru, workload.PinnedConditions())
	want := Windows{BurstSeconds: 10, LongSeconds: 60, Full: 2, GroupsPerBurst: 1000, LongIsWholeRun: true}
	if win != want {
		t.Errorf("windows %+v, want %+v", win, want)
	}
	if res.MaxWindowHedgeRate != 0.1 || res.MaxWindowDuplicateRate != 0.1 {
		t.Errorf("worst 10 s: hedges %v, duplicates %v; want 0.1 (the first window's)", res.MaxWindowHedgeRate, res.MaxWindowDuplicateRate)
	}
	if want := float64(100+50) / 2000; res.MaxMinuteHedgeRate != want {
		t.Errorf("worst 1 m: hedges %v, want %v (the two full windows together)", res.MaxMinuteHedgeRate, want)
	}
}

// tableOf is the table of a demo report built of the given runs' figures.
func tableOf(t *testing.T, rep *Report) string {
	t.Helper()
	var b strings.Builder
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestTheTableExplainsWhatItsFiguresAreAndWhyAMissHappened(t *testing.T) {
	load := func(v float64) *float64 { return &v }
	base := func() *Report {
		return &Report{
			Report: simulator.Report{Workload: "gpt4o", Strategies: []simulator.StrategyResult{
				{Name: simulator.StrategyNone, P50: 900, P90: 2000, P99: 13000},
				{Name: simulator.StrategyHedgerow, P50: 950, P90: 2100, P99: 8000, MedianHedgeDelay: 1234,
					MaxWindowHedgeRate: 0.03, MaxMinuteHedgeRate: 0.02},
			}},
			TimeScale: 0.02, HostCPUs: 2, CancelLatencyP99Ms: 60, CancelLatencyP50Ms: 1,
			Windows:  Windows{BurstSeconds: 10, LongSeconds: 60, Full: 2, GroupsPerBurst: 998, LongIsWholeRun: true},
			TailGain: &report.Gain{Quantile: "p99", Ratio: 1.625, Lower: 1.1, Upper: 1.9, HedgedSamples: 3000, ControlSamples: 3000, Resamples: 1000, Seed: 1},
		}
	}
	tests := []struct {
		name      string
		change    func(*Report)
		want, not []string
	}{
		{"the gain from its own primary-only run, with its interval", func(*Report) {},
			[]string{"tail gain, primary-only P99 / hedged P99: 1.625, 95% bootstrap interval [1.100, 1.900] (n=3000 and 3000"}, nil},
		{"the hedge windows in real time against the ceilings they are bounded by", func(*Report) {},
			[]string{"2 full 10s windows of 998 groups each; the run is shorter than the 60s window",
				"worst 10s 0.030 against burst_ceiling 0.16 ok, worst 1m 0.020 against ceiling 0.08 ok"}, nil},
		{"a hedge rate over its ceiling is called so", func(r *Report) { r.Strategies[1].MaxWindowHedgeRate = 0.2 },
			[]string{"worst 10s 0.200 against burst_ceiling 0.16 ABOVE"}, nil},
		{"hedged P50/P90 above primary-only say why", func(*Report) {},
			[]string{"hedged P50/P90 above primary-only (950/2100 against 900/2000 ms)", "median armed: 1234 model ms",
				"every real ms is 50 model ms"}, nil},
		{"no such note when hedging is level or better below the delay", func(r *Report) { r.Strategies[1].P50, r.Strategies[1].P90 = 900, 1900 },
			nil, []string{"hedged P50/P90 above"}},
		{"a cancel miss on a busy host blames the host", func(r *Report) { r.LoadAverage = load(5.3) },
			[]string{"likely cause: a busy host — load average 5.3 on 2 cores",
				"this host was busier than its cores (load average 5.3 on 2 at the runs' end)"}, nil},
		{"a cancel miss on an idle host points at the cancel path", func(r *Report) { r.LoadAverage = load(0.4) },
			[]string{"the host was not saturated (load average 0.4 on 2 cores): the time is on the cancel path"},
			[]string{"busier than its cores"}},
		{"a host without a load average says it cannot tell", func(*Report) {},
			[]string{"this host keeps no load average"}, nil},
		{"no cause when the cancel latency is within its target", func(r *Report) { r.CancelLatencyP99Ms, r.LoadAverage = 4, load(5) },
			nil, []string{"cause", "not saturated"}},
		{"a withheld gain says why", func(r *Report) { r.TailGain, r.TailGainWithheld = nil, "below the sample floor" },
			[]string{"tail gain withheld: below the sample floor"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := base()
			tt.change(rep)
			out := tableOf(t, rep)
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("the table does not say %q:\n%s", w, out)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(out, n) {
					t.Errorf("the table says %q:\n%s", n, out)
				}
			}
		})
	}
}
