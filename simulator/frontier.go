package simulator

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// DefaultSweepQuantiles are the delay quantiles a sweep tries when none are
// given: from hedging half the primaries to hedging one in a hundred.
var DefaultSweepQuantiles = []float64{0.50, 0.75, 0.90, 0.95, 0.97, 0.99}

// SweepOptions selects the settings of a sweep and what bounds the
// recommendation (docs/architecture.md §11, what-if).
type SweepOptions struct {
	// Quantiles are the delay quantiles tried (DefaultSweepQuantiles when
	// empty), each in (0, 1).
	Quantiles []float64
	// AsConfigured runs the configured setting alone, each class at its
	// own delay quantile and ceiling: a replay without a sweep.
	AsConfigured bool
	// Ceilings are the duplicate-rate ceilings tried with every quantile;
	// empty: each class's configured ceiling only.
	Ceilings []float64
	// Policy returns an operation class's configured policy; nil: the
	// defaults (policy.Default) for every class. The sweep changes only the
	// delay quantile and, when Ceilings are given, the duplicate ceiling of
	// a copy.
	Policy func(operation string) *policy.Policy
	// MaxExtraCostRatio bounds the recommendation's extra cost; 0: the
	// tightest configured duplicate ceiling, since an extra attempt costs at
	// most about what its winner does.
	MaxExtraCostRatio float64
	// Requests replaces the recorded traffic's group count (0: as
	// recorded); Seed seeds every draw; Parallel bounds the settings run at
	// once (0: all); Progress is told of finished groups.
	Requests int
	Seed     uint64
	Parallel int
	Progress func(groups int)
}

// FrontierPoint is one setting of a sweep and what it gave.
type FrontierPoint struct {
	Quantile float64 `json:"quantile"`
	// DuplicateCeiling is the ceiling the setting ran under (the tightest
	// when cohorts' classes differ).
	DuplicateCeiling float64 `json:"duplicate_ceiling"`
	// DelayMs is the median hedge delay the estimator armed at this
	// quantile, over the groups that could hedge.
	DelayMs        float64 `json:"delay_ms"`
	P99            float64 `json:"p99_ms"`
	P999           float64 `json:"p999_ms"`
	DuplicateRate  float64 `json:"duplicate_rate"`
	ExtraCostRatio float64 `json:"extra_cost_ratio"`

	latencies []float64
}

// Ceilings are the bounds a recommendation must stay inside.
type Ceilings struct {
	DuplicateRate  float64 `json:"duplicate_rate"`
	ExtraCostRatio float64 `json:"extra_cost_ratio"`
}

// Frontier is the outcome of a sweep; its JSON form is what `hedgerow
// simulate --sweep --json` prints.
type Frontier struct {
	Source  string           `json:"source"` // the records file or the workload
	Seed    uint64           `json:"seed"`
	Cohorts []RecordedCohort `json:"cohorts,omitempty"`
	// Skipped names the recorded cohorts the replay left out, and why.
	Skipped []SkippedCohort `json:"skipped_cohorts,omitempty"`
	// OrphanGroups counts recorded groups left out for want of their group
	// record.
	OrphanGroups int             `json:"orphan_groups,omitempty"`
	Frontier     []FrontierPoint `json:"frontier"`
	Ceilings     Ceilings        `json:"ceilings"`
	// Recommended is the setting with the best P99.9 (then P99, then the
	// fewest duplicates) whose duplicate rate and extra cost stay inside
	// Ceilings; null when none does.
	Recommended *FrontierPoint `json:"recommended"`
}

// SweepRecords replays recorded traffic (ReadTraffic) through the
// production engine and rules at every setting of the sweep.
func SweepRecords(t *Traffic, source string, so SweepOptions) (*Frontier, error) {
	traffic, summary, skipped, err := t.cohorts(so.Requests)
	if err != nil {
		return nil, err
	}
	f, err := sweep(traffic, so)
	if err != nil {
		return nil, err
	}
	f.Source, f.Cohorts, f.Skipped, f.OrphanGroups = source, summary, skipped, t.Orphans()
	return f, nil
}

// SweepWorkload runs the same sweep over a built-in workload (o.Workload,
// o.Stream, o.Requests under the pinned conditions): the frontier a
// replay of that workload's records should find again.
func SweepWorkload(o Options, so SweepOptions) (*Frontier, error) {
	if o.Requests < 1 {
		return nil, fmt.Errorf("%w: requests must be at least 1, got %d", ErrInvalidOptions, o.Requests)
	}
	t, err := builtinTraffic(o, workload.PinnedConditions())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	f, err := sweep([]cohortTraffic{t}, so)
	if err != nil {
		return nil, err
	}
	f.Source = o.Workload
	return f, nil
}

// setting is one point of the sweep.
type setting struct {
	quantile, ceiling float64 // 0: as configured
}

func (so SweepOptions) policyFor(operation string) *policy.Policy {
	var p policy.Policy
	if so.Policy != nil {
		if c := so.Policy(operation); c != nil {
			p = *c
			return &p
		}
	}
	return policy.Default()
}

func (so SweepOptions) settings() ([]setting, error) {
	if so.AsConfigured {
		return []setting{{}}, nil
	}
	qs := so.Quantiles
	if len(qs) == 0 {
		qs = DefaultSweepQuantiles
	}
	cs := so.Ceilings
	if len(cs) == 0 {
		cs = []float64{0}
	}
	var out []setting
	for _, q := range qs {
		if !(q > 0 && q < 1) {
			return nil, fmt.Errorf("%w: delay quantile %v not in (0, 1)", ErrInvalidOptions, q)
		}
		for _, c := range cs {
			if !(c >= 0 && c <= 1) {
				return nil, fmt.Errorf("%w: duplicate ceiling %v not in (0, 1]", ErrInvalidOptions, c)
			}
			out = append(out, setting{quantile: q, ceiling: c})
		}
	}
	return out, nil
}

// sweep runs every setting over all cohorts' traffic. Within a setting the
// cohorts run one after another on the same virtual timeline into one
// accumulator, so the figures are the whole traffic's; settings run in
// parallel.
func sweep(traffic []cohortTraffic, so SweepOptions) (*Frontier, error) {
	settings, err := so.settings()
	if err != nil {
		return nil, err
	}
	ceilings := Ceilings{DuplicateRate: math.Inf(1)}
	for _, t := range traffic {
		ceilings.DuplicateRate = min(ceilings.DuplicateRate, so.policyFor(t.Operation).DuplicateRate.Ceiling)
	}
	ceilings.ExtraCostRatio = so.MaxExtraCostRatio
	if ceilings.ExtraCostRatio == 0 {
		ceilings.ExtraCostRatio = ceilings.DuplicateRate
	}
	points := make([]FrontierPoint, len(settings))
	err = inParallel(len(settings), so.Parallel, func(i int) error {
		var err error
		points[i], err = runSetting(traffic, so, settings[i])
		return err
	})
	if err != nil {
		return nil, err
	}
	f := &Frontier{Seed: so.Seed, Frontier: points, Ceilings: ceilings}
	f.Recommended = recommend(points, ceilings)
	return f, nil
}

func runSetting(traffic []cohortTraffic, so SweepOptions, st setting) (FrontierPoint, error) {
	total := 0
	for _, t := range traffic {
		total += t.Requests
	}
	acc := newAccumulator(total)
	name := "configured"
	if st.quantile > 0 {
		name = "q" + strconv.FormatFloat(st.quantile, 'g', -1, 64)
	}
	pt := FrontierPoint{Quantile: st.quantile, DuplicateCeiling: math.Inf(1)}
	largest := 0
	for i, t := range traffic {
		rules := so.policyFor(t.Operation)
		if st.quantile > 0 {
			rules.Delay.Quantile = st.quantile
		} else if t.Requests > largest {
			// As configured: the row shows the busiest cohort's quantile.
			pt.Quantile, largest = rules.Delay.Quantile, t.Requests
		}
		if st.ceiling > 0 {
			rules.DuplicateRate.Ceiling = st.ceiling
		}
		pt.DuplicateCeiling = min(pt.DuplicateCeiling, rules.DuplicateRate.Ceiling)
		strat, err := configuredStrategy(name, rules, t.Cond)
		if err != nil {
			return FrontierPoint{}, fmt.Errorf("%w: class %s: %w", ErrInvalidOptions, t.Operation, err)
		}
		// Each cohort draws from its own streams of the seed.
		seed := so.Seed + uint64(i)*0x9e3779b97f4a7c15
		r, err := newRunner(strat, t, seed, acc)
		if err != nil {
			return FrontierPoint{}, err
		}
		if _, err := r.run(t.Requests, seed, so.Progress); err != nil {
			return FrontierPoint{}, err
		}
	}
	res := acc.result(name, workload.Conditions{})
	pt.DelayMs, pt.P99, pt.P999 = res.MedianHedgeDelay, res.P99, res.P999
	pt.DuplicateRate, pt.ExtraCostRatio = res.DuplicateRate, res.ExtraCostRatio
	pt.latencies = res.Latencies
	return pt, nil
}

// recommend picks the best P99.9 inside the ceilings (ties: the better
// P99, then the fewer duplicates).
func recommend(points []FrontierPoint, c Ceilings) *FrontierPoint {
	var best *FrontierPoint
	for i := range points {
		p := &points[i]
		if p.DuplicateRate > c.DuplicateRate || p.ExtraCostRatio > c.ExtraCostRatio {
			continue
		}
		if best == nil || p.P999 < best.P999 ||
			(p.P999 == best.P999 && (p.P99 < best.P99 || (p.P99 == best.P99 && p.DuplicateRate < best.DuplicateRate))) {
			best = p
		}
	}
	if best == nil {
		return nil
	}
	out := *best
	return &out
}

// WriteTable prints the frontier, the ceilings and the recommendation.
func (f *Frontier) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "delay frontier of %s, seed %d\n", f.Source, f.Seed)
	for _, c := range f.Cohorts {
		fmt.Fprintf(w, "  cohort %s: %d groups at %.1f/s, %d primaries (%d censored by a cancel), hang fraction %.4f\n",
			c.Name, c.Groups, c.Rate, c.Primaries, c.Censored, c.HangFraction)
	}
	for _, c := range f.Skipped {
		groups := "groups"
		if c.Groups == 1 {
			groups = "group"
		}
		fmt.Fprintf(w, "  cohort %s left out (%d %s): %s\n", c.Name, c.Groups, groups, c.Reason)
	}
	if f.OrphanGroups > 0 {
		fmt.Fprintf(w, "  %d groups left out: attempt records without their group record\n", f.OrphanGroups)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "quantile\tdup ceiling\tdelay ms\tp99 ms\tp99.9 ms\tdup rate\textra cost\t\t")
	for _, p := range f.Frontier {
		mark := ""
		if f.Recommended != nil && p.Quantile == f.Recommended.Quantile && p.DuplicateCeiling == f.Recommended.DuplicateCeiling {
			mark = "← recommended"
		}
		fmt.Fprintf(tw, "%g\t%.3f\t%.0f\t%.0f\t%.0f\t%.4f\t%.4f\t%s\t\n",
			p.Quantile, p.DuplicateCeiling, p.DelayMs, p.P99, p.P999, p.DuplicateRate, p.ExtraCostRatio, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nceilings: duplicate rate %.3f, extra cost %.3f\n", f.Ceilings.DuplicateRate, f.Ceilings.ExtraCostRatio)
	if f.Recommended == nil {
		_, err := fmt.Fprintln(w, "recommended: none of these settings stays inside the ceilings")
		return err
	}
	_, err := fmt.Fprintf(w, "recommended: delay quantile %g (duplicate ceiling %.3f): P99.9 %.0f ms, P99 %.0f ms, duplicate rate %.4f, extra cost %.4f\n",
		f.Recommended.Quantile, f.Recommended.DuplicateCeiling, f.Recommended.P999, f.Recommended.P99,
		f.Recommended.DuplicateRate, f.Recommended.ExtraCostRatio)
	return err
}
