package delay

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/DataDog/sketches-go/ddsketch"
)

// GuardrailState is whether hedging runs for a cohort.
type GuardrailState string

const (
	// StateEnabled: hedging runs; the gain is proven or not yet decidable.
	StateEnabled GuardrailState = "enabled"
	// StateDisabled: hedging is off for the cohort until the cool-down ends.
	StateDisabled GuardrailState = "disabled"
	// StateProbing: after a cool-down, hedging runs again for a probe period
	// to gather fresh samples, then the guardrail decides anew.
	StateProbing GuardrailState = "probing"
)

// GuardrailReason says why a cohort is in its state. In StateDisabled it is
// the cause of disabling, kept through the cool-down.
type GuardrailReason string

const (
	// ReasonGain: the hedged tail is measurably below the control tail.
	ReasonGain GuardrailReason = "gain"
	// ReasonInsufficientSamples: too few samples to decide; nothing changes.
	ReasonInsufficientSamples GuardrailReason = "insufficient_samples"
	// ReasonProbe: a probe is running and its period has not ended.
	ReasonProbe GuardrailReason = "probe"
	// ReasonFlatGain: the hedged tail is measurably not below the control's
	// by the minimum gain.
	ReasonFlatGain GuardrailReason = "flat_gain"
	// ReasonInconclusive: enough samples, but the intervals show neither a
	// gain nor its absence; the state does not change.
	ReasonInconclusive GuardrailReason = "inconclusive"
	// ReasonErrorRate: hedged groups fail measurably more often than control.
	ReasonErrorRate GuardrailReason = "error_rate"
	// ReasonDuplicateCeiling: the caller reported a duplicate-rate breach.
	ReasonDuplicateCeiling GuardrailReason = "duplicate_ceiling"
	// ReasonSpendCeiling: the caller reported a spend-ceiling breach.
	ReasonSpendCeiling GuardrailReason = "spend_ceiling"
)

// Arm says how a group ran, as decided at its arrival.
type Arm string

const (
	// ArmControl: a control group (IsControl was true), observed as it
	// would have run primary-only: it hedges as any group does, and its
	// primary, kept running past another attempt's win, is measured.
	ArmControl Arm = "control"
	// ArmHedged: a group that was allowed to hedge, whether or not a hedge
	// actually launched. Counting only groups that hedged would compare the
	// slowest primaries against all control groups: a biased comparison.
	ArmHedged Arm = "hedged"
)

// ErrInvalidArm is returned by ObserveGroup for an unknown arm.
var ErrInvalidArm = errors.New("delay: unknown arm")

// ErrNotABreach is returned by ReportBreach for a reason that is not a ceiling.
var ErrNotABreach = errors.New("delay: not a ceiling breach reason")

// GuardrailOptions sets the statistics and timing of a Guardrail.
type GuardrailOptions struct {
	// Quantile of group latency compared between the arms. It must lie above
	// the delay quantile: a hedged group's latency is min(L1, d + L2), equal
	// to the primary's below the delay d, so at the delay's own quantile the
	// gain is structurally zero and every cohort would read flat.
	Quantile float64
	// Z is the normal quantile of each arm's confidence interval (1.96: 95%).
	Z float64
	// MinControlSamples and MinHedgedSamples are the samples each arm needs
	// in the window before the tail statistic is decided (and before a tail
	// gain is reported at all).
	MinControlSamples, MinHedgedSamples int
	// MinErrorSamples is the samples each arm needs before the error-rate
	// rule is decided: far fewer than the tail's, since a rate's standard
	// error needs no tail samples, so a cohort of a few requests per second
	// is protected from failing hedges long before its tail can be judged.
	MinErrorSamples int
	// MinRelativeGain is the smallest tail gain worth its duplicate load: the
	// hedged upper bound must be below (1 − MinRelativeGain) × the control
	// lower bound.
	MinRelativeGain float64
	// ErrorRateMargin is the rise in group failure rate (absolute, 0.01 = one
	// point) that hedging is allowed before it is disabled.
	ErrorRateMargin float64
	// ErrorZ is the one-sided z threshold of the error-rate test (2.326: 1%).
	ErrorZ float64
	// CoolDown is how long a disabled cohort stays disabled before probing.
	CoolDown time.Duration
	// ProbePeriod is how long a probe runs before the guardrail decides.
	ProbePeriod time.Duration
	// Window and Slots shape both arms' rolling windows. Size the window so
	// control fraction × cohort rate × Window ≥ MinControlSamples, or the
	// guardrail never decides (30 min needs ~14 req/s per cohort at 2%).
	Window time.Duration
	Slots  int
	// RelativeAccuracy and MaxBins shape the sketches, as in Options.
	RelativeAccuracy float64
	MaxBins          int
}

// DefaultGuardrailOptions is the guardrail configuration used when a policy
// sets nothing.
func DefaultGuardrailOptions() GuardrailOptions {
	return GuardrailOptions{
		Quantile:          0.99,
		Z:                 1.96,
		MinControlSamples: 1000,
		MinHedgedSamples:  500,
		MinErrorSamples:   50,
		MinRelativeGain:   0.05,
		ErrorRateMargin:   0.01,
		ErrorZ:            3.09,
		CoolDown:          5 * time.Minute,
		ProbePeriod:       5 * time.Minute,
		Window:            30 * time.Minute,
		Slots:             30,
		RelativeAccuracy:  0.01,
		MaxBins:           2048,
	}
}

// withDefaults fills zero fields from DefaultGuardrailOptions. A zero gain or
// error margin would make the guardrail trip on noise, so zero means default
// there too; set a tiny positive value to mean "no margin".
func (c GuardrailOptions) withDefaults() GuardrailOptions {
	d := DefaultGuardrailOptions()
	c.Quantile = cmp.Or(c.Quantile, d.Quantile)
	c.Z = cmp.Or(c.Z, d.Z)
	c.ErrorZ = cmp.Or(c.ErrorZ, d.ErrorZ)
	c.RelativeAccuracy = cmp.Or(c.RelativeAccuracy, d.RelativeAccuracy)
	c.MinRelativeGain = cmp.Or(c.MinRelativeGain, d.MinRelativeGain)
	c.ErrorRateMargin = cmp.Or(c.ErrorRateMargin, d.ErrorRateMargin)
	c.MinControlSamples = cmp.Or(c.MinControlSamples, d.MinControlSamples)
	c.MinHedgedSamples = cmp.Or(c.MinHedgedSamples, d.MinHedgedSamples)
	c.MinErrorSamples = cmp.Or(c.MinErrorSamples, d.MinErrorSamples)
	c.CoolDown = cmp.Or(c.CoolDown, d.CoolDown)
	c.ProbePeriod = cmp.Or(c.ProbePeriod, d.ProbePeriod)
	c.Window = cmp.Or(c.Window, d.Window)
	c.Slots = cmp.Or(c.Slots, d.Slots)
	c.MaxBins = cmp.Or(c.MaxBins, d.MaxBins)
	return c
}

func (c GuardrailOptions) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: guardrail "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	if !(c.Quantile > 0 && c.Quantile < 1) {
		bad("quantile %v not in (0, 1)", c.Quantile)
	}
	if !(c.Z > 0) || !(c.ErrorZ > 0) {
		bad("z %v and error z %v must be positive", c.Z, c.ErrorZ)
	}
	// The normal approximation behind the rank interval needs about five
	// expected samples above the quantile; fewer and its coverage is fiction.
	if minN := min(c.MinControlSamples, c.MinHedgedSamples); float64(minN)*(1-c.Quantile) < 5-1e-9 {
		bad("min samples %d/%d leave fewer than 5 expected samples above quantile %v",
			c.MinControlSamples, c.MinHedgedSamples, c.Quantile)
	}
	// Below about twenty samples an arm's failed share moves by five points
	// with one failure, and the normal approximation of the z test is
	// fiction.
	if c.MinErrorSamples < minErrorSamples {
		bad("min error samples %d below %d", c.MinErrorSamples, minErrorSamples)
	}
	if !(c.MinRelativeGain >= 0 && c.MinRelativeGain < 1) {
		bad("min relative gain %v not in [0, 1)", c.MinRelativeGain)
	}
	if !(c.ErrorRateMargin >= 0 && c.ErrorRateMargin < 1) {
		bad("error-rate margin %v not in [0, 1)", c.ErrorRateMargin)
	}
	if c.CoolDown < 0 || c.ProbePeriod <= 0 {
		bad("cool-down %v must be ≥ 0 and probe period %v > 0", c.CoolDown, c.ProbePeriod)
	}
	if c.ProbePeriod > c.Window {
		bad("probe period %v longer than window %v: probe samples would roll out before the decision", c.ProbePeriod, c.Window)
	}
	errs = append(errs, validateWindow(c.Window, c.Slots, c.RelativeAccuracy, c.MaxBins)...)
	return errors.Join(errs...)
}

// minErrorSamples is the least MinErrorSamples a config may set.
const minErrorSamples = 20

// GuardrailStats are the measurements behind a decision, for records and the
// tail_gain_ratio metric. Durations are zero for an empty arm.
type GuardrailStats struct {
	// Quantile compared (GuardrailOptions.Quantile).
	Quantile float64
	// ControlSamples and HedgedSamples are the groups in each arm's window.
	ControlSamples, HedgedSamples int
	// ControlQuantile is the control arm's point estimate, bracketed by the
	// distribution-free confidence interval [ControlLower, ControlUpper].
	ControlQuantile, ControlLower, ControlUpper time.Duration
	// HedgedQuantile is the hedged arm's point estimate, bracketed by
	// [HedgedLower, HedgedUpper].
	HedgedQuantile, HedgedLower, HedgedUpper time.Duration
	// TailGainRatio is ControlQuantile / HedgedQuantile at Quantile: 2 means
	// hedging halves the tail. 0 when either arm is empty. It is a point
	// estimate: read it only with TailGain, which withholds it below the
	// sample floors and brackets it.
	TailGainRatio float64
	// ControlErrorRate and HedgedErrorRate are the failed share of each arm.
	ControlErrorRate, HedgedErrorRate float64
	// ErrorZ is the error-rate test statistic (see the package doc).
	ErrorZ float64
}

// GuardrailDecision is a cohort's guardrail state with its reason and
// statistics, carried by group records.
type GuardrailDecision struct {
	State  GuardrailState
	Reason GuardrailReason
	// Since is when the cohort entered State.
	Since time.Time
	Stats GuardrailStats
}

// HedgingAllowed reports whether the hedge engine may hedge this cohort.
func (d GuardrailDecision) HedgingAllowed() bool { return d.State != StateDisabled }

// Guardrail decides per cohort whether hedging pays off, comparing the tail
// latency and error rate of control groups with those of hedged groups over
// a rolling window; see the package doc for the statistics. Like Estimator
// it is pure (every method takes now) and safe for concurrent use.
type Guardrail struct {
	cfg  GuardrailOptions
	spec sketchSpec

	mu              sync.Mutex
	cohorts         map[Cohort]*guardCohort
	control, hedged *ddsketch.DDSketch // scratch sketches; guarded by mu
}

type guardCohort struct {
	control, hedged ring
	state           GuardrailState
	reason          GuardrailReason
	since           time.Time
}

// NewGuardrail returns a Guardrail for cfg. Zero fields of cfg take
// DefaultGuardrailOptions's values.
func NewGuardrail(cfg GuardrailOptions) (*Guardrail, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	spec, err := newSketchSpec(cfg.RelativeAccuracy, cfg.MaxBins)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	return &Guardrail{cfg: cfg, spec: spec, cohorts: make(map[Cohort]*guardCohort)}, nil
}

// Options returns the guardrail's configuration with defaults filled in.
func (g *Guardrail) Options() GuardrailOptions { return g.cfg }

func (g *Guardrail) cohort(c Cohort, now time.Time) *guardCohort {
	gc, ok := g.cohorts[c]
	if !ok {
		gc = &guardCohort{
			control: newRing(g.spec, g.cfg.Window, g.cfg.Slots),
			hedged:  newRing(g.spec, g.cfg.Window, g.cfg.Slots),
			state:   StateEnabled,
			reason:  ReasonInsufficientSamples,
			since:   now,
		}
		g.cohorts[c] = gc
	}
	return gc
}

// ObserveGroup records a finished group of cohort c: its user-facing latency
// (first byte or total, as the cohort's trigger; a failed group at the time
// it failed, a deadline failure at the deadline) and whether it failed.
// Groups ended by CallerGone should not be recorded.
func (g *Guardrail) ObserveGroup(c Cohort, now time.Time, arm Arm, latency time.Duration, failed bool) error {
	if latency < 0 {
		return fmt.Errorf("%w: group of %s observed at %v", ErrNegativeLatency, c, latency)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	gc := g.cohort(c, now)
	switch arm {
	case ArmControl:
		gc.control.add(now, latency.Seconds(), failed)
	case ArmHedged:
		gc.hedged.add(now, latency.Seconds(), failed)
	default:
		return fmt.Errorf("%w: %q", ErrInvalidArm, arm)
	}
	return nil
}

// ReportBreach disables hedging for cohort c at once because the caller saw
// its duplicate-rate or spend ceiling breached; a breach while disabled
// restarts the cool-down. reason must be ReasonDuplicateCeiling or
// ReasonSpendCeiling.
func (g *Guardrail) ReportBreach(c Cohort, now time.Time, reason GuardrailReason) error {
	if reason != ReasonDuplicateCeiling && reason != ReasonSpendCeiling {
		return fmt.Errorf("%w: %q", ErrNotABreach, reason)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cohort(c, now).disable(now, reason)
	return nil
}

func (gc *guardCohort) disable(now time.Time, reason GuardrailReason) {
	gc.state, gc.reason, gc.since = StateDisabled, reason, now
}

// Decide evaluates cohort c at now, moves it between states and returns the
// decision. Call it when a group arrives (its HedgingAllowed gates the hedge
// timer) or on a tick; the result depends only on the observations and now.
func (g *Guardrail) Decide(c Cohort, now time.Time) GuardrailDecision {
	g.mu.Lock()
	defer g.mu.Unlock()
	gc := g.cohort(c, now)

	if gc.state == StateDisabled && !now.Before(gc.since.Add(g.cfg.CoolDown)) {
		// Fresh hedged samples only: the old ones describe the conditions
		// that got hedging disabled. Control samples stay, as they never
		// depended on the state.
		gc.hedged.reset()
		gc.state, gc.reason, gc.since = StateProbing, ReasonProbe, now
	}
	stats := g.statsLocked(gc, now)
	if gc.state == StateDisabled {
		return gc.decision(stats)
	}

	enough := stats.ControlSamples >= g.cfg.MinControlSamples && stats.HedgedSamples >= g.cfg.MinHedgedSamples
	switch {
	case g.errorsRose(stats):
		gc.disable(now, ReasonErrorRate)
	case gc.state == StateProbing && now.Before(gc.since.Add(g.cfg.ProbePeriod)):
		gc.reason = ReasonProbe
	case !enough:
		gc.reason = ReasonInsufficientSamples
	case g.gainIsFlat(stats):
		gc.disable(now, ReasonFlatGain)
	case g.gainHolds(stats):
		if gc.state == StateProbing {
			gc.state, gc.since = StateEnabled, now
		}
		gc.reason = ReasonGain
	default:
		// Neither shown: the state stands. Turning hedging off needs evidence
		// that it does not pay, not a failure to prove that it does.
		gc.reason = ReasonInconclusive
	}
	return gc.decision(stats)
}

// errorsRose says the error-rate rule holds: both arms hold MinErrorSamples
// and hedged groups fail measurably more than ErrorRateMargin above control.
func (g *Guardrail) errorsRose(s GuardrailStats) bool {
	return s.ControlSamples >= g.cfg.MinErrorSamples && s.HedgedSamples >= g.cfg.MinErrorSamples && s.ErrorZ > g.cfg.ErrorZ
}

// gainHolds says the gain is shown: the whole hedged confidence interval lies
// at least MinRelativeGain below the whole control interval.
func (g *Guardrail) gainHolds(s GuardrailStats) bool {
	return float64(s.HedgedUpper) <= (1-g.cfg.MinRelativeGain)*float64(s.ControlLower)
}

// gainIsFlat says flatness is shown. The hedged arm holds most groups, so
// its quantile is taken as known; the small control arm's interval carries
// the uncertainty. Flat means the hedged quantile lies above (1 −
// MinRelativeGain) × the control's upper bound: even the slowest control
// tail the data allow would make the gain smaller than the minimum. A point
// estimate of the control tail is not enough: at a thousand control groups a
// P99 read from a fat tail moves by half its value between windows, and a
// guardrail acting on that noise switches off hedging that pays.
func (g *Guardrail) gainIsFlat(s GuardrailStats) bool {
	return float64(s.HedgedQuantile) > (1-g.cfg.MinRelativeGain)*float64(s.ControlUpper)
}

func (gc *guardCohort) decision(s GuardrailStats) GuardrailDecision {
	return GuardrailDecision{State: gc.state, Reason: gc.reason, Since: gc.since, Stats: s}
}

// Stats returns cohort c's current statistics without changing its state.
func (g *Guardrail) Stats(c Cohort, now time.Time) GuardrailStats {
	return g.Status(c, now).Stats
}

// Status returns cohort c's state, its reason and statistics as the last
// Decide (or ReportBreach) left them, without moving it between states: a
// metrics scrape reads it, and must not be what switches hedging back on. A
// cohort never seen is enabled for insufficient samples.
func (g *Guardrail) Status(c Cohort, now time.Time) GuardrailDecision {
	g.mu.Lock()
	defer g.mu.Unlock()
	gc, ok := g.cohorts[c]
	if !ok {
		return GuardrailDecision{State: StateEnabled, Reason: ReasonInsufficientSamples,
			Stats: GuardrailStats{Quantile: g.cfg.Quantile}}
	}
	return gc.decision(g.statsLocked(gc, now))
}

// TailGain is the tail gain an operator may read: the ratio of control over
// hedged latency at the compared quantile, bracketed by the ratio of the
// arms' confidence bounds, with the samples behind it. Below either arm's
// sample floor Known is false and the figures are not given: a P99 read from
// a few dozen control groups moves by a factor of three between identical
// runs.
type TailGain struct {
	Known bool
	// Ratio is ControlQuantile / HedgedQuantile; Lower is ControlLower /
	// HedgedUpper and Upper ControlUpper / HedgedLower: the least and the
	// most gain both arms' intervals allow together.
	Ratio, Lower, Upper float64
	// ControlSamples and HedgedSamples are the groups in each arm's window.
	ControlSamples, HedgedSamples int
}

// TailGain returns the tail gain of s under the guardrail's sample floors.
func (g *Guardrail) TailGain(s GuardrailStats) TailGain {
	t := TailGain{ControlSamples: s.ControlSamples, HedgedSamples: s.HedgedSamples}
	if s.ControlSamples < g.cfg.MinControlSamples || s.HedgedSamples < g.cfg.MinHedgedSamples ||
		s.HedgedQuantile <= 0 || s.HedgedLower <= 0 || s.HedgedUpper <= 0 {
		return t
	}
	t.Known = true
	t.Ratio = float64(s.ControlQuantile) / float64(s.HedgedQuantile)
	t.Lower = float64(s.ControlLower) / float64(s.HedgedUpper)
	t.Upper = float64(s.ControlUpper) / float64(s.HedgedLower)
	return t
}

func (g *Guardrail) statsLocked(gc *guardCohort, now time.Time) GuardrailStats {
	s := GuardrailStats{Quantile: g.cfg.Quantile}
	control, cFail := gc.control.merged(now)
	hedged, hFail := gc.hedged.merged(now)
	nc, nh := control.GetCount(), hedged.GetCount()
	s.ControlSamples, s.HedgedSamples = int(math.Round(nc)), int(math.Round(nh))
	s.ControlQuantile, s.ControlLower, s.ControlUpper = quantileInterval(control, g.cfg.Quantile, g.cfg.Z)
	s.HedgedQuantile, s.HedgedLower, s.HedgedUpper = quantileInterval(hedged, g.cfg.Quantile, g.cfg.Z)
	if s.ControlQuantile > 0 && s.HedgedQuantile > 0 {
		s.TailGainRatio = float64(s.ControlQuantile) / float64(s.HedgedQuantile)
	}
	if nc > 0 {
		s.ControlErrorRate = cFail / nc
	}
	if nh > 0 {
		s.HedgedErrorRate = hFail / nh
	}
	s.ErrorZ = errorRiseZ(s.HedgedErrorRate, nh, s.ControlErrorRate, nc, g.cfg.ErrorRateMargin)
	return s
}

// quantileInterval returns the sketch's q-quantile and a distribution-free
// confidence interval for it: among n samples, the number below the true
// quantile is Binomial(n, q), so the order statistics of ranks
// nq ∓ z·√(nq(1−q)) (1-based, upper rank + 1) bracket it with the normal
// approximation's confidence. The ranks are read from the sketch, within its
// relative accuracy.
func quantileInterval(sk *ddsketch.DDSketch, q, z float64) (point, lower, upper time.Duration) {
	n := sk.GetCount()
	if n == 0 {
		return 0, 0, 0
	}
	at := func(rank float64) time.Duration { // 1-based rank
		rank = math.Min(math.Max(rank, 1), n)
		p := 0.0
		if n > 1 {
			p = (rank - 1) / (n - 1)
		}
		v, err := sk.GetValueAtQuantile(math.Min(p, 1))
		if err != nil {
			return 0
		}
		return secondsToDuration(v)
	}
	v, err := sk.GetValueAtQuantile(q)
	if err != nil {
		return 0, 0, 0
	}
	sd := math.Sqrt(n * q * (1 - q))
	return secondsToDuration(v), at(math.Floor(n*q - z*sd)), at(math.Ceil(n*q + z*sd + 1))
}

// errorRiseZ is the one-sided two-proportion z statistic of
// H0: hedged rate − control rate ≤ margin, in Agresti and Caffo's form: one
// failure and one success are added to each arm, in the difference as in its
// unpooled standard error (H0 is not equality, so pooling does not apply).
// The error-rate rule acts on a few dozen control groups, where the plain
// Wald statistic is far from normal: a control arm of 60 groups at a true 5%
// shows no failure one time in twenty, and the Wald z then read 3.1 on
// equal rates (5 false disables in 200 seeded replicas at z > 3.09). The
// added counts keep a clean arm from reading a zero rate with a near-zero
// error, and the statistic stays finite for records.
func errorRiseZ(ph, nh, pc, nc, margin float64) float64 {
	if nh == 0 || nc == 0 {
		return 0
	}
	adj := func(p, n float64) float64 { return (p*n + 1) / (n + 2) }
	ah, ac := adj(ph, nh), adj(pc, nc)
	se := math.Sqrt(ah*(1-ah)/(nh+2) + ac*(1-ac)/(nc+2))
	return (ah - ac - margin) / se
}

// Disabling is a cohort disabled by a guardrail: why and since when.
type Disabling struct {
	Cohort Cohort
	Reason GuardrailReason
	Since  time.Time
}

// Disabled lists the cohorts disabled at now whose cool-down has not ended,
// for sharing with the other replicas.
func (g *Guardrail) Disabled(now time.Time) []Disabling {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []Disabling
	for c, gc := range g.cohorts {
		if gc.state == StateDisabled && now.Before(gc.since.Add(g.cfg.CoolDown)) {
			out = append(out, Disabling{Cohort: c, Reason: gc.reason, Since: gc.since})
		}
	}
	return out
}

// ErrNotADisabling is returned by Adopt for a reason that never disables.
var ErrNotADisabling = errors.New("delay: not a reason that disables")

// Adopt disables cohort c as another replica's guardrail did at since, for
// reason, unless this one is disabled already since then or later: every
// replica then holds hedging off for the same cool-down. A disabling whose
// cool-down ended by now is ignored.
func (g *Guardrail) Adopt(c Cohort, now time.Time, reason GuardrailReason, since time.Time) error {
	switch reason {
	case ReasonFlatGain, ReasonErrorRate, ReasonDuplicateCeiling, ReasonSpendCeiling:
	default:
		return fmt.Errorf("%w: %q", ErrNotADisabling, reason)
	}
	if !now.Before(since.Add(g.cfg.CoolDown)) {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	gc := g.cohort(c, now)
	if gc.state == StateDisabled && !gc.since.Before(since) {
		return nil
	}
	gc.disable(since, reason)
	return nil
}
