package dispatcher

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/schemas"
)

// breachPolicy hedges nothing in practice (a 5 s delay on quick answers),
// replaces a failed primary once, and holds the cohort to 5% extra attempts
// with no reserve and no floor, so replacements alone can breach it.
const breachPolicy = `
policies:
  default:
    control_fraction: 0
    max_attempts: 2
    delay: {initial: 5s, min: 5s, max: 5s, warmup_samples: 1000000}
    deadline: 20s
    accept_timeout: 2s
    heartbeat_interval: 50ms
    heartbeat_timeout: 5s
    duplicate_rate: {ceiling: 0.05, window: 60s, replacement_reserve: 0, reserve: {burst: 0}}
`

// TestADuplicateCeilingBreachSwitchesTheCohortsHedgingOff: 100 quick
// groups, then groups whose primary fails at once and is replaced. The
// ceiling never refuses a replacement, so the window's rate climbs: at 5
// replacements for 105 primaries (4.8%) the cohort still hedges; the sixth
// (6 of 106, 5.7%) breaches the 5% ceiling, ReportBreach switches the
// cohort off, and the next group is suppressed by the guardrail.
func TestADuplicateCeilingBreachSwitchesTheCohortsHedgingOff(t *testing.T) {
	const steady = 100
	var next []behaviour
	for range steady {
		next = append(next, behaviour{words: 2})
	}
	for range 6 {
		next = append(next, behaviour{status: http.StatusServiceUnavailable}, behaviour{words: 2})
	}
	sc := newScript(behaviour{words: 2}, next...)
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc), "c": newProvider(t, "c", sc)}
	c := newCluster(t, []string{"a", "b", "c"}, ps, breachPolicy)
	d, regs := singleDispatcher(t, c)
	reg := regs[0]
	req := chat(false)
	cohort := delay.NewCohort("default", "general", false, req.MaxTokens).Key()
	state := func(s delay.GuardrailState) float64 {
		return gaugeValue(t, reg, "hedgerow_guardrail_state", map[string]string{"cohort": cohort, "state": string(s)})
	}
	submit := func(what string) {
		t.Helper()
		if _, err := d.Submit(context.Background(), Submission{Pool: "general", Request: req}, nil); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for range steady {
		submit("steady request")
	}
	for i := range 6 {
		if state(delay.StateEnabled) != 1 {
			t.Fatalf("disabled after %d replacements for %d primaries, under the 5%% ceiling", i, steady+i)
		}
		submit("failing primary")
	}
	tests := []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"the window's rate is 6 replacements per 106 primaries", "hedgerow_duplicate_rate", map[string]string{"cohort": cohort}, 6.0 / 106},
		{"the cohort's ceiling is exported beside it", "hedgerow_duplicate_rate_ceiling", map[string]string{"cohort": cohort}, 0.05},
		{"the cohort is disabled", "hedgerow_guardrail_state", map[string]string{"cohort": cohort, "state": "disabled"}, 1},
		{"and no longer enabled", "hedgerow_guardrail_state", map[string]string{"cohort": cohort, "state": "enabled"}, 0},
		{"for the duplicate ceiling", "hedgerow_guardrail_reason", map[string]string{"cohort": cohort, "reason": "duplicate_ceiling"}, 1},
		{"the breach is counted once", "hedgerow_guardrail_breaches_total", map[string]string{"reason": "duplicate_ceiling"}, 1},
		{"no spend breach", "hedgerow_guardrail_breaches_total", map[string]string{"reason": "spend_ceiling"}, 0},
		{"no tail gain below the sample floor", "hedgerow_tail_gain_ratio", map[string]string{"cohort": cohort}, math.NaN()},
		{"beside the samples it would rest on", "hedgerow_tail_gain_samples", map[string]string{"cohort": cohort, "arm": "hedged"}, steady + 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := gaugeValue(t, reg, tt.metric, tt.labels)
			if math.IsNaN(tt.want) != math.IsNaN(got) || !math.IsNaN(got) && math.Abs(got-tt.want) > 1e-9 {
				t.Fatalf("%s%v = %v, want %v", tt.metric, tt.labels, got, tt.want)
			}
		})
	}
	if s := metricSum(t, regs, "hedgerow_hedges_suppressed_total", "reason", "guardrail"); s != 0 {
		t.Fatalf("%v groups suppressed by the guardrail before the breach", s)
	}
	submit("request after the breach")
	if s := metricSum(t, regs, "hedgerow_hedges_suppressed_total", "reason", "guardrail"); s != 1 {
		t.Fatalf("the group after the breach: %v suppressed by the guardrail, want 1", s)
	}
	if r := metricSum(t, regs, "hedgerow_hedges_suppressed_total", "reason", string(budgets.ReasonDuplicateRate)); r != 0 {
		t.Fatalf("%v replacements refused by the ceiling, want none", r)
	}
}

// TestEverySuppressionIsCountedByItsReason: groups that never could hedge —
// the class does not hedge, the pool has one route, the group is a control
// group or outside the rollout, the delay ends past the deadline — count in
// hedgerow_hedges_suppressed_total by the reason their records carry, as a
// refused budget does.
func TestEverySuppressionIsCountedByItsReason(t *testing.T) {
	const base = `
policies:
  default:
    delay: {initial: 5s, min: 5s, max: 5s, warmup_samples: 1000000}
    deadline: 20s
    accept_timeout: 2s
    heartbeat_interval: 50ms
    heartbeat_timeout: 5s
`
	tests := []struct {
		name   string
		routes []string
		policy string
		reason string
	}{
		{"a class that does not hedge", []string{"a", "b"}, "    hedge: false\n", "policy"},
		{"a pool of one route", []string{"a"}, "", "single_route"},
		{"groups outside the rollout", []string{"a", "b"}, "    control_fraction: 0\n    rollout_fraction: 0\n", "rollout"},
		{"a delay past the deadline", []string{"a", "b"}, "    control_fraction: 0\n    min_useful_time: 16s\n", "delay_past_deadline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := newScript(behaviour{words: 2})
			ps := map[string]*provider{}
			for _, r := range tt.routes {
				ps[r] = newProvider(t, r, sc)
			}
			c := newCluster(t, tt.routes, ps, base+tt.policy)
			d, regs := singleDispatcher(t, c)
			const requests = 3
			for i := range requests {
				if _, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil); err != nil {
					t.Fatalf("request %d: %v", i+1, err)
				}
			}
			if got := metricSum(t, regs, "hedgerow_hedges_suppressed_total", "reason", tt.reason); got != requests {
				t.Fatalf("suppressed{reason=%q} = %v, want %d", tt.reason, got, requests)
			}
			if got := metricSum(t, regs, "hedgerow_hedges_suppressed_total", "", ""); got != requests {
				t.Fatalf("%v suppressions in all, want only the %d of %q", got, requests, tt.reason)
			}
		})
	}
}

// hedgeAtOnePolicy hedges a primary without its first byte after 200 ms.
const hedgeAtOnePolicy = `
policies:
  default:
    control_fraction: 0
    max_attempts: 2
    delay: {initial: 200ms, min: 200ms, max: 200ms, warmup_samples: 1000000}
    deadline: 20s
    min_useful_time: 10ms
    accept_timeout: 2s
    heartbeat_interval: 50ms
    heartbeat_timeout: 5s
`

// TestAwaitedTotalUsageCountsTheLosers: a primary stalls, a hedge wins and
// the primary is cancelled. An answer that awaits the total usage (the NATS
// door's total_usage) carries both attempts' usage — what the group record
// sums — not the winner's alone; one that does not await it carries none.
func TestAwaitedTotalUsageCountsTheLosers(t *testing.T) {
	tests := []struct {
		name  string
		await bool
	}{
		{"an awaiting caller gets every attempt's usage", true},
		{"a caller that does not await gets the winner's usage only", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := newScript(behaviour{words: 2}, behaviour{firstByte: 3 * time.Second, words: 2})
			ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
			c := newCluster(t, []string{"a", "b"}, ps, hedgeAtOnePolicy)
			d, _ := singleDispatcher(t, c)
			resp, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false), AwaitTotalUsage: tt.await}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Winner != 2 || resp.Attempts != 2 {
				t.Fatalf("winner %d of %d attempts, want the hedge of 2", resp.Winner, resp.Attempts)
			}
			rec := c.groupRecord(resp.GroupID)
			if !tt.await {
				if resp.TotalUsage != (schemas.Usage{}) {
					t.Fatalf("TotalUsage %+v without awaiting it", resp.TotalUsage)
				}
				return
			}
			total := schemas.Usage{InputUnits: rec.UsageInputUnits, OutputUnits: rec.UsageOutputUnits, Estimated: rec.UsageEstimated}
			if resp.TotalUsage != total {
				t.Fatalf("TotalUsage %+v, want the group record's %+v", resp.TotalUsage, total)
			}
			if resp.TotalUsage.InputUnits <= resp.Usage.InputUnits {
				t.Fatalf("TotalUsage %+v holds no more than the winner's %+v: the cancelled primary is missing", resp.TotalUsage, resp.Usage)
			}
		})
	}
}

// TestASpendCeilingBreachSwitchesTheCohortsHedgingOff: a hedged group's
// attempts, reserved at their estimates (52 units each, within the user
// action's 110), use more than the ceiling once the winner's answer runs
// past its estimate: ReportBreach(spend_ceiling) switches the cohort off. A
// group within the ceiling, or with no ceiling, breaches nothing.
func TestASpendCeilingBreachSwitchesTheCohortsHedgingOff(t *testing.T) {
	tests := []struct {
		name       string
		spend      string
		words      int
		wantBreach bool
	}{
		{"a hedged group using more than the user action's ceiling", "    spend: {per_user_action: 110}\n", 120, true},
		{"a hedged group within the ceiling", "    spend: {per_user_action: 110}\n", 2, false},
		{"a hedged group with no ceiling", "", 120, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := newScript(behaviour{words: tt.words}, behaviour{firstByte: 3 * time.Second, words: 2})
			ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
			c := newCluster(t, []string{"a", "b"}, ps, hedgeAtOnePolicy+tt.spend)
			d, regs := singleDispatcher(t, c)
			req := chat(false)
			resp, err := d.Submit(context.Background(), Submission{Pool: "general", Request: req, AwaitTotalUsage: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Attempts != 2 {
				t.Fatalf("%d attempts, want a hedge", resp.Attempts)
			}
			cohort := delay.NewCohort("default", "general", false, req.MaxTokens).Key()
			breaches := gaugeValue(t, regs[0], "hedgerow_guardrail_breaches_total", map[string]string{"reason": "spend_ceiling"})
			disabled := gaugeValue(t, regs[0], "hedgerow_guardrail_reason", map[string]string{"cohort": cohort, "reason": "spend_ceiling"})
			used := resp.TotalUsage.InputUnits + resp.TotalUsage.OutputUnits
			if got := breaches == 1 && disabled == 1; got != tt.wantBreach {
				t.Fatalf("breaches %v, cohort disabled for spend %v (group used %d units); want breach %v", breaches, disabled, used, tt.wantBreach)
			}
		})
	}
}
