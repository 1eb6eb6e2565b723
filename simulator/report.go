package simulator

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// durationWindow is the width of the windows max_window_duplicate_rate is taken over.
const durationWindow = 10 * time.Second

// StrategyResult is one strategy's figures over the whole run. Latency is the
// time to the first committed token (--stream) or to the complete committed
// answer; a failed group counts at the deadline.
type StrategyResult struct {
	Name string  `json:"name"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Mean float64 `json:"mean_ms"`
	// DuplicateRate is attempts beyond the first (hedges and replacements) per group.
	DuplicateRate float64 `json:"duplicate_rate"`
	// ExtraTokensRatio and ExtraCostRatio compare what attempts that did not
	// win were billed with what winners were billed; input is billed for every
	// attempt that reached a provider, output including the cancellation lag.
	ExtraTokensRatio float64 `json:"extra_tokens_ratio"`
	ExtraCostRatio   float64 `json:"extra_cost_ratio"`
	DeadlineMissRate float64 `json:"deadline_miss_rate"`
	ErrorRate        float64 `json:"error_rate"`
	// MaxWindowDuplicateRate is the worst DuplicateRate over the run's full
	// 10-second windows: extra attempts launched in the window per group
	// arriving in it, the extra load a provider sees.
	MaxWindowDuplicateRate float64 `json:"max_window_duplicate_rate"`
	// MaxWindowHedgeRate is the same for hedges alone: what the duplicate
	// ceiling bounds. Replacements are counted against the ceiling but never
	// refused by it (docs/architecture.md §7), so in a window of failures
	// MaxWindowDuplicateRate may pass the ceiling where this does not.
	MaxWindowHedgeRate float64 `json:"max_window_hedge_rate"`
	// MaxMinuteHedgeRate is the worst hedge rate over the run's full
	// 1-minute windows (six 10-second windows in a row, sliding by 10 s):
	// what the duplicate ceiling's long window bounds, where
	// MaxWindowHedgeRate is what its burst bound bounds.
	MaxMinuteHedgeRate float64 `json:"max_minute_hedge_rate"`

	// Groups is how many groups finished, each checked against the engine's
	// invariants; Latencies are their latencies in ms, sorted, for plots.
	Groups    int       `json:"-"`
	Latencies []float64 `json:"-"`
	// MedianHedgeDelay is the median delay, in ms, of the hedge timers of
	// groups that could hedge (0 when none could).
	MedianHedgeDelay float64 `json:"-"`

	// ControlGroups is how many groups the control draw put in the
	// guardrail's control arm; ControlSamples how many samples that arm
	// took (a control group whose baseline failed on its own after its
	// hedge launched gives none); KeptBaselines how many control groups'
	// commits kept their baseline running past another attempt's win
	// (docs/architecture.md §5).
	ControlGroups  int `json:"control_groups"`
	ControlSamples int `json:"control_samples"`
	KeptBaselines  int `json:"kept_baselines"`

	// PrimaryShares is the share of groups whose primary went to each
	// route: where route choice sent the first attempts (on uneven routes,
	// how few the degraded route drew).
	PrimaryShares map[string]float64 `json:"primary_shares"`
	// HedgeShares is the share of hedges launched to each route: where
	// route choice sent the duplicates (on uneven routes, how many met the
	// degraded route).
	HedgeShares map[string]float64 `json:"hedge_shares"`
	// EndP99 and EndP999 are, for --stream, the tail of the time to the
	// committed stream's last token (a failed group at the deadline): what
	// a route's decode speed adds after the first token. 0 without --stream.
	EndP99  float64 `json:"end_p99_ms"`
	EndP999 float64 `json:"end_p999_ms"`
}

// accumulator gathers one strategy's per-group figures.
type accumulator struct {
	latencies                  []float64
	groups, extras             int
	deadlineMisses, errors     int
	winnerTokens, extraTokens  float64
	winnerCost, extraCost      float64
	windowGroups, windowExtras map[int64]int
	windowHedges               map[int64]int
	lastArrival                time.Duration
	hedgeDelays                []float64 // ms, the delay of every group that may hedge
	// The guardrail's control arm: its groups, its samples, the baselines
	// kept past another attempt's commit.
	controlGroups, controlSamples, keptBaselines int
	primaries                                    map[string]int // groups by their primary's route
	hedges                                       map[string]int // hedges by their route
	ends                                         []float64      // ms, --stream: to the committed stream's end
}

func newAccumulator(requests int) *accumulator {
	return &accumulator{
		latencies:    make([]float64, 0, requests),
		windowGroups: map[int64]int{},
		windowExtras: map[int64]int{},
		windowHedges: map[int64]int{},
		primaries:    map[string]int{},
		hedges:       map[string]int{},
	}
}

// endGroup accounts a finished group: its latency, attempts and billed usage.
func (r *runner) endGroup(g *simGroup, rec hedge.GroupEnded) {
	acc := r.acc
	latency := r.cond.Deadline
	if rec.Committed {
		latency = g.commitAt - g.arrival
	}
	latency = r.cond.LatencyAtDeadline(latency, !rec.Committed)
	acc.latencies = append(acc.latencies, float64(latency)/float64(time.Millisecond))
	if r.stream {
		end := r.cond.Deadline
		if w := rec.Winner; rec.Committed && w >= 1 && w <= len(g.attempts) && g.attempts[w-1].draw.End != workload.Never {
			a := g.attempts[w-1]
			end = min(a.start+a.draw.End+workerLatency-g.arrival, r.cond.Deadline)
		}
		acc.ends = append(acc.ends, float64(end)/float64(time.Millisecond))
	}
	acc.groups++
	extras := max(len(g.attempts)-1, 0)
	acc.extras += extras
	acc.windowGroups[int64(g.arrival/durationWindow)]++
	acc.primaries[g.primary]++
	acc.lastArrival = max(acc.lastArrival, g.arrival)
	switch {
	case rec.Committed:
	case rec.Error == schemas.ErrDeadlineExceeded:
		acc.deadlineMisses++
	default:
		acc.errors++
	}
	for i, sa := range g.attempts {
		billed := sa.draw.BilledUsage(sa.stopAt)
		tokens := float64(billed.InputUnits + billed.OutputUnits)
		cost := r.cond.Cost(billed)
		if rec.Committed && rec.Winner == i+1 {
			acc.winnerTokens += tokens
			acc.winnerCost += cost
		} else {
			acc.extraTokens += tokens
			acc.extraCost += cost
		}
	}
	if r.class.Policy.Guardrail.Enabled && r.observeGuardrail(g, rec) && g.arm == delay.ArmControl {
		acc.controlSamples++
	}
	if r.learnsDelay() && !rec.Committed {
		r.observeSuperseded(g, policy.Decision{Error: rec.Error})
	}
}

func (acc *accumulator) result(name string, cond workload.Conditions) StrategyResult {
	slices.Sort(acc.latencies)
	res := StrategyResult{Name: name, Groups: acc.groups, Latencies: acc.latencies,
		ControlGroups: acc.controlGroups, ControlSamples: acc.controlSamples, KeptBaselines: acc.keptBaselines}
	n := float64(acc.groups)
	if acc.groups == 0 {
		return res
	}
	var sum float64
	for _, l := range acc.latencies {
		sum += l
	}
	res.Mean = sum / n
	res.P50 = quantile(acc.latencies, 0.50)
	res.P90 = quantile(acc.latencies, 0.90)
	res.P99 = quantile(acc.latencies, 0.99)
	res.P999 = quantile(acc.latencies, 0.999)
	slices.Sort(acc.hedgeDelays)
	res.MedianHedgeDelay = quantile(acc.hedgeDelays, 0.5)
	res.PrimaryShares = make(map[string]float64, len(acc.primaries))
	for route, groups := range acc.primaries {
		res.PrimaryShares[route] = float64(groups) / n
	}
	hedges := 0
	for _, n := range acc.hedges {
		hedges += n
	}
	res.HedgeShares = make(map[string]float64, len(acc.hedges))
	for route, n := range acc.hedges {
		res.HedgeShares[route] = float64(n) / float64(hedges)
	}
	if len(acc.ends) > 0 {
		slices.Sort(acc.ends)
		res.EndP99, res.EndP999 = quantile(acc.ends, 0.99), quantile(acc.ends, 0.999)
	}
	res.DuplicateRate = float64(acc.extras) / n
	res.DeadlineMissRate = float64(acc.deadlineMisses) / n
	res.ErrorRate = float64(acc.errors) / n
	if acc.winnerTokens > 0 {
		res.ExtraTokensRatio = acc.extraTokens / acc.winnerTokens
	}
	if acc.winnerCost > 0 {
		res.ExtraCostRatio = acc.extraCost / acc.winnerCost
	}
	// Only full windows: the last one, cut short by the end of arrivals, is
	// too small a sample to call a worst case.
	last := int64(acc.lastArrival / durationWindow)
	for w, groups := range acc.windowGroups {
		if w >= last || groups == 0 {
			continue
		}
		res.MaxWindowDuplicateRate = max(res.MaxWindowDuplicateRate, float64(acc.windowExtras[w])/float64(groups))
		res.MaxWindowHedgeRate = max(res.MaxWindowHedgeRate, float64(acc.windowHedges[w])/float64(groups))
	}
	const perMinute = int64(time.Minute / durationWindow)
	for first := int64(0); first+perMinute <= last; first++ {
		groups, hedges := 0, 0
		for w := first; w < first+perMinute; w++ {
			groups += acc.windowGroups[w]
			hedges += acc.windowHedges[w]
		}
		if groups > 0 {
			res.MaxMinuteHedgeRate = max(res.MaxMinuteHedgeRate, float64(hedges)/float64(groups))
		}
	}
	return res
}

// quantile is the nearest-rank quantile of sorted values.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// WriteTable prints the report as an aligned table.
func (rep *Report) WriteTable(w io.Writer) error {
	mode := "complete answer"
	if rep.Stream {
		mode = "first committed token"
	}
	fmt.Fprintf(w, "workload %s, %d requests, seed %d, latency to the %s (failed groups at the %v deadline)\n\n",
		rep.Workload, rep.Requests, rep.Seed, mode, rep.Conditions.Deadline)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\tmean ms\tdup rate\tmax 10s dup\tmax 10s hedge\tmax 1m hedge\textra tokens\textra cost\tdeadline miss\terrors\t")
	for _, s := range rep.Strategies {
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.4f\t%.4f\t\n",
			s.Name, s.P50, s.P90, s.P99, s.P999, s.Mean, s.DuplicateRate, s.MaxWindowDuplicateRate, s.MaxWindowHedgeRate, s.MaxMinuteHedgeRate,
			s.ExtraTokensRatio, s.ExtraCostRatio, s.DeadlineMissRate, s.ErrorRate)
	}
	return tw.Flush()
}

// observeGuardrail adds the ended group's sample to its guardrail arm, by
// the class's rule (policy.Class.ObserveGroup, as the dispatcher does: a
// control group's is its kept baseline's), and reports whether it did. The
// first byte of an attempt is when its worker's report reached the
// dispatcher.
func (r *runner) observeGuardrail(g *simGroup, rec hedge.GroupEnded) bool {
	return r.class.ObserveGroup(g.cohort, r.at(), g.arm, rec, r.cond.Deadline, func(n int) time.Duration {
		if n < 1 || n > len(g.attempts) {
			return 0
		}
		a := g.attempts[n-1]
		if a.draw.FirstByte <= 0 || a.draw.FirstByte == workload.Never {
			return 0
		}
		return a.start + a.draw.FirstByte + workerLatency - g.arrival
	})
}
