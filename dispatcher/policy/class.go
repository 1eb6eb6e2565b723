package policy

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/DataDog/sketches-go/ddsketch"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/schemas"
)

// Class is an operation class at run time: its policy, and what its groups
// teach it — the hedge delay (Estimator), whether hedging pays (Guardrail),
// how long its answers are and how fast they decode. It is safe for
// concurrent use.
type Class struct {
	Name      string
	Policy    *Policy
	Estimator *delay.Estimator
	Guardrail *delay.Guardrail

	decodeMu   sync.Mutex
	decodeRate float64 // output tokens per second of completed attempts, smoothed

	outputMu sync.Mutex
	outputs  map[string]*ddsketch.DDSketch // cohort key → output units of completed answers

	gapsMu  sync.Mutex
	gaps    map[string]*tokenGaps // cohort key → longest token gaps of successful attempts
	scratch *ddsketch.DDSketch    // merges a cohort's two generations; guarded by gapsMu
}

// NewClass returns the class name running p, with the estimator and the
// guardrail p configures.
func NewClass(name string, p *Policy) (*Class, error) {
	c := &Class{Name: name, Policy: p}
	var err error
	opts := p.DelayOptions()
	// A cold cohort borrows its delay from its siblings in other max_tokens
	// buckets, scaled by the buckets only where the time measured grows
	// with the output (docs/architecture.md §5).
	opts.ScaleBorrowed = p.Trigger == TriggerTotal
	if c.Estimator, err = delay.NewEstimator(opts); err != nil {
		return nil, fmt.Errorf("policy: class %s: %w", name, err)
	}
	if c.Guardrail, err = delay.NewGuardrail(p.GuardrailOptions()); err != nil {
		return nil, fmt.Errorf("policy: class %s: %w", name, err)
	}
	return c, nil
}

// Reasons a group is not eligible to hedge, in the order the rules apply;
// the engine reports them as the group's suppression reason. The control
// draw is none: a control group hedges as any group does, and its
// baseline is measured on the side (Eligibility, hedge.Start.Control).
const (
	ReasonPolicy      = "policy"       // the class does not hedge, or is not idempotent
	ReasonSingleRoute = "single_route" // one route, and hedging on the same one is off
	ReasonRollout     = "rollout"      // the group is outside the rollout fraction
	ReasonGuardrail   = "guardrail"    // the guardrail switched hedging off for the cohort
	ReasonPushback    = "pushback"     // a route of the pool is in pushback (scope cohort)
)

// Group is what the eligibility rule needs to know of a hedge group.
type Group struct {
	// ID draws the group's control and rollout membership, the same on
	// every replica.
	ID string
	// Routes is how many routes its pool has.
	Routes int
	Cohort delay.Cohort
	// Now is when the group starts.
	Now time.Time
	// PushedBack: a route of its pool is in pushback at Now (the shared
	// route flags, docs/architecture.md §7).
	PushedBack bool
}

// Eligibility is whether a group may hedge, and why not.
type Eligibility struct {
	Eligible bool
	// Reason is the rule that made the group ineligible; empty when eligible.
	Reason string
	// Arm is the guardrail arm the group counts in. A control group
	// (ArmControl) hedges by the same rules as any group; the engine keeps
	// its baseline running past another attempt's commit, and the arm
	// takes what the group would have measured primary-only
	// (hedge.Start.Control, GuardrailSample).
	Arm delay.Arm
	// Guardrail is the decision the group record carries.
	Guardrail schemas.GuardrailDecision
	// Consulted reports whether the guardrail was asked; Stats are then
	// its measurements.
	Consulted bool
	Stats     delay.GuardrailStats
}

// Eligibility decides whether a group of the class may hedge. The rules
// apply in order and the first that holds decides: the policy (hedge and
// idempotent), a single route, the rollout fraction, a route of the pool
// in pushback (with PushbackScope cohort: the cohort is primary-only until
// the Retry-After passes, never answering the provider's overload with
// more load), then the guardrail when enabled. Past the first two, the
// control draw puts the group in the control arm, whose record says
// control whatever the later rules decide; it decides nothing of the
// hedge.
func (c *Class) Eligibility(g Group) Eligibility {
	p := c.Policy
	e := Eligibility{Arm: delay.ArmHedged, Guardrail: schemas.GuardrailIneligible}
	switch {
	case !p.Hedge || !p.Idempotent:
		e.Reason = ReasonPolicy
		return e
	case g.Routes < 2 && !p.SameRouteHedging:
		e.Reason = ReasonSingleRoute
		return e
	}
	control := delay.IsControl(delay.UniformFromID(g.ID), p.ControlFraction)
	switch {
	case delay.UniformFromID(g.ID+"/rollout") >= p.RolloutFraction:
		e.Reason = ReasonRollout
	case g.PushedBack && p.PushbackScope != PushbackRoute:
		e.Reason, e.Guardrail = ReasonPushback, schemas.GuardrailPushback
	default:
		e.Eligible, e.Guardrail = true, schemas.GuardrailAllow
		if !p.Guardrail.Enabled {
			break
		}
		dec := c.Guardrail.Decide(g.Cohort, g.Now)
		e.Consulted, e.Stats = true, dec.Stats
		switch {
		case !dec.HedgingAllowed():
			e.Eligible, e.Reason, e.Guardrail = false, ReasonGuardrail, schemas.GuardrailDisable
		case dec.State == delay.StateProbing:
			e.Guardrail = schemas.GuardrailProbe
		}
	}
	if control {
		e.Arm, e.Guardrail = delay.ArmControl, schemas.GuardrailControl
	}
	return e
}

// GuardrailSample is what a decided group adds to its arm of the
// guardrail, and false when it adds nothing (docs/architecture.md §5). A
// group of the hedged arm counts as its caller saw it. A control group
// counts as it would have run primary-only: its Baseline, which the engine
// measured on the baseline attempt it kept running past another attempt's
// commit, and nothing when that is unknown (the baseline failed on its own
// after the hedge launched, where a primary-only group would have asked
// for a replacement nobody ran). A committed run counts at its attempt's
// first byte under the first_byte trigger, else at its commit point; a
// failed one counts failed at deadline. firstByte gives the time from the
// group's start to attempt n's first byte (0: none came), as the driver
// saw it.
func (c *Class) GuardrailSample(arm delay.Arm, e hedge.GroupEnded, deadline time.Duration, firstByte func(attempt int) time.Duration) (latency time.Duration, failed, ok bool) {
	attempt, committed, latency := e.Winner, e.Committed, e.Latency
	if arm == delay.ArmControl {
		if !e.Baseline.Observed {
			return 0, false, false
		}
		attempt, committed, latency = e.Baseline.Attempt, e.Baseline.Committed, e.Baseline.Latency
	}
	if !committed {
		return deadline, true, true
	}
	if c.Policy.Trigger == TriggerFirstByte {
		if fb := firstByte(attempt); fb > 0 {
			latency = fb
		}
	}
	return latency, false, true
}

// ObserveGroup adds a decided group's GuardrailSample to its arm of the
// cohort's guardrail, and reports whether it did.
func (c *Class) ObserveGroup(cohort delay.Cohort, now time.Time, arm delay.Arm, e hedge.GroupEnded, deadline time.Duration, firstByte func(attempt int) time.Duration) bool {
	latency, failed, ok := c.GuardrailSample(arm, e, deadline, firstByte)
	if !ok {
		return false
	}
	return c.Guardrail.ObserveGroup(cohort, now, arm, latency, failed) == nil
}

// HedgeDelay is the hedge delay of a group of cohort whose primary runs on
// route, starting at now with remaining time before its deadline: the
// route's own delay when its distribution differs from the cohort's, else
// the cohort's — its own once warm, borrowed from its warm siblings before,
// else the initial delay (delay.Estimator.RouteDelay). Both drivers arm the
// group's hedge timer with it.
func (c *Class) HedgeDelay(cohort delay.Cohort, route string, now time.Time, remaining time.Duration) delay.Delay {
	return c.Estimator.RouteDelay(cohort, route, now, remaining)
}

// ObserveFirstByte records a primary's time to first byte on its route as
// an exact latency sample when the class hedges on first bytes; other
// attempts and triggers record nothing.
func (c *Class) ObserveFirstByte(cohort delay.Cohort, route string, now time.Time, role schemas.Role, ttfb time.Duration) {
	if role == schemas.RolePrimary && c.Policy.Trigger == TriggerFirstByte {
		_ = c.Estimator.ObservePrimaryOn(cohort, route, now, ttfb)
	}
}

// ObserveResult records a primary's time to a successful answer on its
// route as an exact latency sample when the class hedges on totals; other
// attempts, outcomes and triggers record nothing.
func (c *Class) ObserveResult(cohort delay.Cohort, route string, now time.Time, role schemas.Role, status schemas.StatusClass, elapsed time.Duration) {
	if role == schemas.RolePrimary && status == schemas.StatusOK && c.Policy.Trigger == TriggerTotal {
		_ = c.Estimator.ObservePrimaryOn(cohort, route, now, elapsed)
	}
}

// Primary is what a driver knows of a group's primary attempt when the group
// is decided.
type Primary struct {
	// Route is the route it ran on: its censored sample joins that route's
	// window too.
	Route string
	// Elapsed is how long it had run.
	Elapsed time.Duration
	// FirstByte: it produced its first byte, so its exact sample is in.
	FirstByte bool
	// Failed: it ended by its own failure. A fast error says nothing of how
	// long an answer would have taken.
	Failed bool
}

// Decision is how a group was decided: the winning attempt, or none and the
// error the group failed with.
type Decision struct {
	Winner int // 0 when none
	Error  schemas.ErrorCode
}

// Censors is the censoring rule: whether the elapsed time of a primary the
// group left without a first byte is a latency sample. It is when another
// attempt won or the deadline cut the primary off: its latency is at least
// the elapsed time, and leaving out exactly the slow primaries would bias
// the delay low. A primary that failed on its own, or whose caller went
// away, says nothing of its latency. It applies to the first_byte trigger.
func (c *Class) Censors(p Primary, d Decision) bool {
	if c.Policy.Trigger != TriggerFirstByte || p.FirstByte || p.Failed {
		return false
	}
	return d.Winner > 1 || d.Winner == 0 && d.Error == schemas.ErrDeadlineExceeded
}

// ObserveSuperseded records a primary's elapsed time as a censored sample
// when the censoring rule holds, in the cohort's window when the elapsed
// time is at least the cohort's current delay and in its route's when at
// least the route's (see delay.Estimator.ObserveSupersededOn), and reports
// whether it did.
func (c *Class) ObserveSuperseded(cohort delay.Cohort, now time.Time, p Primary, d Decision) bool {
	if !c.Censors(p, d) {
		return false
	}
	recorded, _ := c.Estimator.ObserveSupersededOn(cohort, p.Route, now, p.Elapsed)
	return recorded
}

const (
	// initialOutputEstimate sizes the spend reservation of a request without
	// max_tokens until its cohort has outputSamples completed answers.
	initialOutputEstimate = 1024
	outputSamples         = 20
	// outputQuantile of a cohort's completed answers is the output estimate
	// of a request without max_tokens.
	outputQuantile = 0.95
	// initialDecodeRate is assumed until the class has completed an
	// attempt; it only sizes the usage estimate of cancelled attempts.
	initialDecodeRate = 100
)

// ObserveAnswer learns from an attempt that ended: when it succeeded with
// the provider's own usage, its output units join its cohort's answer
// lengths, and, when its first byte was seen, its decode speed the class's.
func (c *Class) ObserveAnswer(cohort string, status schemas.StatusClass, usage schemas.Usage, elapsed, firstByte time.Duration) {
	if status != schemas.StatusOK || usage.Estimated {
		return
	}
	if firstByte > 0 {
		c.ObserveDecode(usage.OutputUnits, elapsed-firstByte)
	}
	c.ObserveOutput(cohort, usage.OutputUnits)
}

// ObserveOutput records a completed answer's output units for its cohort.
func (c *Class) ObserveOutput(cohort string, units int64) {
	if units <= 0 {
		return
	}
	c.outputMu.Lock()
	defer c.outputMu.Unlock()
	sk := c.outputs[cohort]
	if sk == nil {
		var err error
		if sk, err = ddsketch.NewDefaultDDSketch(0.01); err != nil {
			return
		}
		if c.outputs == nil {
			c.outputs = map[string]*ddsketch.DDSketch{}
		}
		c.outputs[cohort] = sk
	}
	_ = sk.Add(float64(units))
}

// OutputEstimate is the P95 output of the cohort's completed answers, or
// 1024 units until there are 20 of them: what a request without max_tokens
// reserves.
func (c *Class) OutputEstimate(cohort string) int64 {
	c.outputMu.Lock()
	defer c.outputMu.Unlock()
	sk := c.outputs[cohort]
	if sk == nil || sk.GetCount() < outputSamples {
		return initialOutputEstimate
	}
	q, err := sk.GetValueAtQuantile(outputQuantile)
	if err != nil {
		return initialOutputEstimate
	}
	return int64(math.Ceil(q))
}

// ObserveDecode folds a completed attempt's decode rate, tokens over the
// time from its first byte to its end, into the class's.
func (c *Class) ObserveDecode(tokens int64, decode time.Duration) {
	if tokens < 2 || decode <= 0 {
		return
	}
	rate := float64(tokens) / decode.Seconds()
	c.decodeMu.Lock()
	defer c.decodeMu.Unlock()
	if c.decodeRate == 0 {
		c.decodeRate = rate
		return
	}
	c.decodeRate += 0.05 * (rate - c.decodeRate)
}

// DecodeRate is the class's decode rate in output tokens per second, which
// sizes the usage estimate of cancelled attempts that report none; 100
// until an attempt completed.
func (c *Class) DecodeRate() float64 {
	c.decodeMu.Lock()
	defer c.decodeMu.Unlock()
	if c.decodeRate == 0 {
		return initialDecodeRate
	}
	return c.decodeRate
}

// The stall bound after the first token (docs/architecture.md §4 rule 4):
// until a cohort has stallSamples successful attempts that measured a gap
// between tokens, the policy's stall_after_first_token; then stallFactor ×
// the stallQuantile of their longest gaps, clamped to [stall_floor,
// stall_after_first_token].
const (
	stallSamples  = 50
	stallQuantile = 0.99
	stallFactor   = 4
	// stallGeneration is how long one generation of samples is kept
	// filling; the bound reads the current and the previous one, so it
	// rests on the last 5 to 10 minutes.
	stallGeneration = 5 * time.Minute
)

// tokenGaps is a cohort's record of the longest gap between tokens of its
// successful attempts (seconds), in two generations: cur fills from since,
// prev is the one before.
type tokenGaps struct {
	since     time.Time
	cur, prev *ddsketch.DDSketch
}

// ObserveTokenGap records the longest gap between tokens after the first
// of an attempt of cohort that ended at now; only successful attempts that
// measured a gap count.
//
// Censoring: an attempt whose stream the bound cut is a failure and never
// a sample, so the streams left out are exactly those with a gap above the
// bound, i.e. above stallFactor × the P99 the bound rests on. While they
// are rare (well under 1%) leaving them out barely moves that P99, and a
// cut stream can never pull the bound down. Should a provider slow down for
// everyone, its streams are cut and stop being samples: the two
// generations then empty within 2 × stallGeneration and the bound returns
// to the policy's cap until new samples accumulate.
func (c *Class) ObserveTokenGap(cohort string, now time.Time, status schemas.StatusClass, gap time.Duration) {
	if status != schemas.StatusOK || gap <= 0 {
		return
	}
	c.gapsMu.Lock()
	defer c.gapsMu.Unlock()
	g := c.gaps[cohort]
	if g == nil {
		cur, err1 := ddsketch.NewDefaultDDSketch(0.01)
		prev, err2 := ddsketch.NewDefaultDDSketch(0.01)
		if err1 != nil || err2 != nil {
			return
		}
		if c.gaps == nil {
			c.gaps = map[string]*tokenGaps{}
		}
		g = &tokenGaps{since: now, cur: cur, prev: prev}
		c.gaps[cohort] = g
	}
	switch age := now.Sub(g.since); {
	case age >= 2*stallGeneration:
		g.cur.Clear()
		g.prev.Clear()
		g.since = now
	case age >= stallGeneration:
		g.cur, g.prev = g.prev, g.cur
		g.cur.Clear()
		g.since = now
	}
	_ = g.cur.Add(gap.Seconds())
}

// StallBound is the stall bound after the first token for an attempt of
// cohort launched at now, which the Attempt carries to the worker: the
// policy's stall_after_first_token (the cap) until the cohort has
// stallSamples samples in its last two generations, then stallFactor × the
// P99 of their longest gaps, clamped to [stall_floor, the cap]. A policy
// without a cap (0) gives 0: the worker applies its own default. It reads
// the samples and changes nothing.
func (c *Class) StallBound(cohort string, now time.Time) time.Duration {
	limit, floor := c.Policy.StallAfterFirstToken, c.Policy.StallFloor
	if limit <= 0 {
		return 0
	}
	c.gapsMu.Lock()
	defer c.gapsMu.Unlock()
	g := c.gaps[cohort]
	if g == nil {
		return limit
	}
	var view *ddsketch.DDSketch
	switch age := now.Sub(g.since); {
	case age >= 2*stallGeneration:
		return limit // both generations are stale
	case age >= stallGeneration || g.prev.IsEmpty():
		view = g.cur // the previous generation is stale, or empty
	default:
		if c.scratch == nil {
			sk, err := ddsketch.NewDefaultDDSketch(0.01)
			if err != nil {
				return limit
			}
			c.scratch = sk
		}
		c.scratch.Clear()
		// The sketches share their index mapping: MergeWith cannot fail.
		_ = c.scratch.MergeWith(g.cur)
		_ = c.scratch.MergeWith(g.prev)
		view = c.scratch
	}
	if view.GetCount() < stallSamples {
		return limit
	}
	q, err := view.GetValueAtQuantile(stallQuantile)
	if err != nil {
		return limit
	}
	bound := time.Duration(stallFactor * q * float64(time.Second))
	return min(max(bound, floor), limit)
}
