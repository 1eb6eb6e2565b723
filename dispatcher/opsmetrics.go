package dispatcher

import (
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/schemas"
)

// suppressionReasons are every reason hedgerow_hedges_suppressed_total
// counts, so each label set exists from the start: the engine's own, the
// eligibility rule's, the budget store's denials and the dispatcher's.
func suppressionReasons() []string {
	r := hedge.SuppressionReasons()
	r = append(r, policy.ReasonPolicy, policy.ReasonSingleRoute, reasonControl, policy.ReasonRollout,
		policy.ReasonGuardrail, policy.ReasonPushback)
	for _, b := range []budgets.Reason{budgets.ReasonAttempts, budgets.ReasonSpendUserAction, budgets.ReasonSpendTenant,
		budgets.ReasonDuplicateRate, budgets.ReasonRoutePushback, budgets.ReasonRouteQuarantined, budgets.ReasonRouteEjected} {
		r = append(r, string(b))
	}
	r = append(r, reasonBudgetInvalid, reasonBudgetUnavailable, reasonNoRoute, reasonCohortPushback, reasonTooLongToContinue)
	slices.Sort(r)
	return slices.Compact(r)
}

// reasonControl was the suppression reason of every control group while
// control groups ran primary-only. They hedge now (docs/architecture.md
// §5), so nothing counts it; its series stays, at 0, for the dashboards
// and alerts that read it.
const reasonControl = "control"

// Reasons the dispatcher gives when it refuses a hedge's budget itself.
const (
	reasonBudgetUnavailable = "budget_unavailable" // the store could not be reached
	reasonNoRoute           = "no_route"           // no route of the pool may take it
)

// breachMinPrimaries is the least number of primaries a cohort's duplicate
// window must hold before its rate can count as a breach: on a cold cohort
// two replacements of one failing primary would read a rate of 2.
const breachMinPrimaries = 100

// duplicateRates keeps this replica's duplicate-rate window of each cohort
// (docs/architecture.md §9): the primaries the store admitted and the extra
// attempts it granted, in the slots the store's own window uses
// (budgets.WindowSlot), and how many of the extras were replacements or
// continuations, which the ceiling never refuses.
// The store's window spans every replica and decides; this one is what the
// replica saw, which reads the same rate on a share of the traffic and
// needs no round trip to export or to judge a breach.
type duplicateRates struct {
	mu      sync.Mutex
	cohorts map[string]*rateWindow
}

type rateWindow struct {
	slot  time.Duration
	n     int
	slots map[int64]*rateSlot
}

// rateSlot is one slot's counts; replacements counts the replacements and
// the continuations among the extras.
type rateSlot struct{ primaries, extras, replacements int64 }

// duplicateWindowRead is a cohort window's sums, read as rateSlot's.
type duplicateWindowRead struct{ primaries, extras, replacements int64 }

// rate is extras per primary, 0 with no primary.
func (r duplicateWindowRead) rate() float64 {
	if r.primaries == 0 {
		return 0
	}
	return float64(r.extras) / float64(r.primaries)
}

// breaches reports whether the window shows the ceiling breached: enough
// primaries, and more replacements (and continuations) alone than the
// ceiling and the replacement reserve allow. The ceiling never refuses a
// replacement or a continuation, so only they carry the window past it for
// good; hedges are granted under it (or paid by the floor, on purpose), and
// the shared window hands its room to whichever replica asks first, so one
// replica's share of the hedges says nothing of the cohort's rate: judged
// locally, two replicas under a 5% ceiling read breaches that were not and
// switched hedging off. Replacements and continuations follow failures,
// which every replica sees its share of.
func (r duplicateWindowRead) breaches(c budgets.DuplicateCeiling) bool {
	return r.primaries >= breachMinPrimaries &&
		float64(r.replacements) > c.Ceiling*float64(r.primaries)+c.ReplacementReserve
}

// count adds an attempt of role to cohort's window at now and returns the
// window's sums.
func (d *duplicateRates) count(cohort string, c budgets.DuplicateCeiling, now time.Time, role schemas.Role) duplicateWindowRead {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.window(cohort, c)
	cur := budgets.WindowSlot(now, w.slot)
	s := w.slots[cur]
	if s == nil {
		s = &rateSlot{}
		w.slots[cur] = s
	}
	switch role {
	case schemas.RolePrimary:
		s.primaries++
	case schemas.RoleReplacement, schemas.RoleContinuation:
		// Neither is ever refused by the ceiling (budgets'
		// ExtraRequest.FollowsAnEndedAttempt), so both count towards a
		// breach (breaches).
		s.extras++
		s.replacements++
	default:
		s.extras++
	}
	return w.read(cur)
}

// read returns cohort's window sums at now.
func (d *duplicateRates) read(cohort string, c budgets.DuplicateCeiling, now time.Time) duplicateWindowRead {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.window(cohort, c)
	return w.read(budgets.WindowSlot(now, w.slot))
}

func (d *duplicateRates) window(cohort string, c budgets.DuplicateCeiling) *rateWindow {
	if d.cohorts == nil {
		d.cohorts = map[string]*rateWindow{}
	}
	w := d.cohorts[cohort]
	if w == nil || w.slot != c.SlotLength() || w.n != c.Slots {
		w = &rateWindow{slot: max(c.SlotLength(), time.Millisecond), n: max(c.Slots, 1), slots: map[int64]*rateSlot{}}
		d.cohorts[cohort] = w
	}
	return w
}

// read sums the slots of the window ending with slot cur and forgets older ones.
func (w *rateWindow) read(cur int64) duplicateWindowRead {
	var r duplicateWindowRead
	for i, s := range w.slots {
		if i <= cur-int64(w.n) {
			delete(w.slots, i)
			continue
		}
		if i <= cur {
			r.primaries += s.primaries
			r.extras += s.extras
			r.replacements += s.replacements
		}
	}
	return r
}

// countPrimary counts an admitted primary in its cohort's window.
func (g *group) countPrimary() {
	g.d.dupRates.count(g.window, g.class.Policy.DuplicateCeiling(), g.d.now(), schemas.RolePrimary)
}

// countExtra counts a granted hedge, replacement or continuation in its
// cohort's window and reports a breach of the duplicate ceiling to the
// cohort's guardrail, which switches hedging off at once.
func (g *group) countExtra(role schemas.Role) {
	c, now := g.class.Policy.DuplicateCeiling(), g.d.now()
	if w := g.d.dupRates.count(g.window, c, now, role); w.breaches(c) {
		g.reportBreach(now, delay.ReasonDuplicateCeiling)
	}
}

// checkSpendBreach reports a breach of the spend ceiling per user action
// when the attempts of a group that hedged or replaced used more than the
// ceiling: reservations are estimates, and what the group used of the user
// action is a lower bound of what the user action used.
func (g *group) checkSpendBreach(e hedge.GroupEnded) {
	limit := g.class.Policy.Spend.PerUserAction
	if limit > 0 && e.Attempts > 1 && e.Usage.InputUnits+e.Usage.OutputUnits > limit {
		g.reportBreach(g.d.now(), delay.ReasonSpendCeiling)
	}
}

func (g *group) reportBreach(now time.Time, reason delay.GuardrailReason) {
	if !g.class.Policy.Guardrail.Enabled {
		return
	}
	if err := g.class.Guardrail.ReportBreach(g.cohort, now, reason); err == nil {
		g.d.metrics.breaches.WithLabelValues(string(reason)).Inc()
		g.d.log.Warn("guardrail: ceiling breached, hedging off for the cohort", "cohort", g.cohort.Key(), "reason", reason)
	}
}

// duplicateRateWindow is the cohort's rate in this replica's window, for
// the records' duplicate_rate_window.
func (g *group) duplicateRateWindow() float64 {
	return g.d.dupRates.read(g.window, g.class.Policy.DuplicateCeiling(), g.d.now()).rate()
}

// cohortMetric is a cohort the dispatcher exports metrics for, and the
// class it runs under.
type cohortMetric struct {
	cohort delay.Cohort
	class  *policy.Class
}

// cohorts enumerates every cohort requests can fall in: each class on each
// pool, streamed or not, in each max_tokens bucket, and its embeddings.
func (d *Dispatcher) cohorts() []cohortMetric {
	var out []cohortMetric
	for _, cl := range slices.Sorted(maps.Keys(d.classes)) {
		for _, pool := range slices.Sorted(maps.Keys(d.pools)) {
			for _, stream := range []bool{false, true} {
				for _, mt := range delay.MaxTokensBuckets() {
					out = append(out, cohortMetric{delay.Cohort{Operation: cl, Model: pool, Stream: stream, MaxTokens: mt}, d.classes[cl]})
				}
			}
			c := delay.NewCohort(cl, pool, false, 0)
			c.Kind = delay.KindEmbeddings
			out = append(out, cohortMetric{c, d.embeddingClasses[cl]})
		}
	}
	return out
}

// guardrailStates and guardrailReasons label the guardrail gauges.
var (
	guardrailStates  = []delay.GuardrailState{delay.StateEnabled, delay.StateProbing, delay.StateDisabled}
	guardrailReasons = []delay.GuardrailReason{delay.ReasonGain, delay.ReasonInsufficientSamples, delay.ReasonProbe,
		delay.ReasonFlatGain, delay.ReasonInconclusive, delay.ReasonErrorRate, delay.ReasonDuplicateCeiling, delay.ReasonSpendCeiling}
)

// cohortCollector exports, at each scrape and for every cohort from the
// start, what the guardrail, the duplicate window and the stall bound
// hold: read, never decided, so a scrape moves no cohort between states.
type cohortCollector struct {
	d       *Dispatcher
	cohorts []cohortMetric

	gain, gainLower, gainUpper, gainSamples *prometheus.Desc
	state, reason, dupRate, dupCeiling      *prometheus.Desc
	stallBound                              *prometheus.Desc
}

func newCohortCollector(d *Dispatcher) *cohortCollector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append([]string{"cohort"}, labels...), nil)
	}
	return &cohortCollector{d: d, cohorts: d.cohorts(),
		gain: desc("hedgerow_tail_gain_ratio",
			"Control over hedged latency at the guardrail's quantile, per cohort; NaN until both arms reach the guardrail's sample floors (hedgerow_tail_gain_samples)."),
		gainLower: desc("hedgerow_tail_gain_ratio_lower",
			"Least tail gain the arms' confidence intervals allow (control lower over hedged upper bound); NaN below the floors."),
		gainUpper: desc("hedgerow_tail_gain_ratio_upper",
			"Most tail gain the arms' confidence intervals allow (control upper over hedged lower bound); NaN below the floors."),
		gainSamples: desc("hedgerow_tail_gain_samples",
			"Groups in the guardrail's window behind the tail gain, by arm (control, hedged).", "arm"),
		state: desc("hedgerow_guardrail_state",
			"1 for the cohort's guardrail state (enabled, probing, disabled), 0 for the others, as its last decision left it.", "state"),
		reason: desc("hedgerow_guardrail_reason",
			"1 for the reason of the cohort's guardrail state (the cause of disabling through a cool-down), 0 for the others.", "reason"),
		dupRate: desc("hedgerow_duplicate_rate",
			"Extra attempts (hedges and replacements) per primary over the duplicate window of the cohort's class and pool (docs/architecture.md §7), as this replica counted them; 0 with no primary."),
		dupCeiling: desc("hedgerow_duplicate_rate_ceiling",
			"The cohort's duplicate-rate ceiling (policy duplicate_rate.ceiling)."),
		stallBound: desc("hedgerow_stall_bound_seconds",
			"The stall bound after the first token the cohort's next attempt carries: derived from its inter-token gaps, within [stall_floor, stall_after_first_token]."),
	}
}

// Describe implements prometheus.Collector.
func (c *cohortCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.gain, c.gainLower, c.gainUpper, c.gainSamples, c.state, c.reason, c.dupRate, c.dupCeiling, c.stallBound} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *cohortCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.d.now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	one := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, cm := range c.cohorts {
		key := cm.cohort.Key()
		st := cm.class.Guardrail.Status(cm.cohort, now)
		tg := cm.class.Guardrail.TailGain(st.Stats)
		ratio, lower, upper := math.NaN(), math.NaN(), math.NaN()
		if tg.Known {
			ratio, lower, upper = tg.Ratio, tg.Lower, tg.Upper
		}
		gauge(c.gain, ratio, key)
		gauge(c.gainLower, lower, key)
		gauge(c.gainUpper, upper, key)
		gauge(c.gainSamples, float64(tg.ControlSamples), key, string(delay.ArmControl))
		gauge(c.gainSamples, float64(tg.HedgedSamples), key, string(delay.ArmHedged))
		for _, s := range guardrailStates {
			gauge(c.state, one(st.State == s), key, string(s))
		}
		for _, r := range guardrailReasons {
			gauge(c.reason, one(st.Reason == r), key, string(r))
		}
		ceiling := cm.class.Policy.DuplicateCeiling()
		gauge(c.dupRate, c.d.dupRates.read(policy.DuplicateWindow(cm.cohort), ceiling, now).rate(), key)
		gauge(c.dupCeiling, ceiling.Ceiling, key)
		gauge(c.stallBound, cm.class.StallBound(key, now).Seconds(), key)
	}
}
