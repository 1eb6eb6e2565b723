// Package policytest holds the cases of dispatcher/policy's rules that every
// driver of the hedge engine must decide alike, as a suite: the dispatcher's
// and the simulator's tests each run it through their own path — the facts a
// driver gathers about a group, the decision it keeps — and expect the same
// decisions.
package policytest

import (
	"math"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/schemas"
)

// Eligibility is a case of the eligibility rule.
type Eligibility struct {
	Name string
	// Policy changes the default policy of the group's class.
	Policy func(*policy.Policy)
	// Routes is how many routes the group's pool has.
	Routes int
	// Breached: the cohort's guardrail switched hedging off before the
	// group started (delay.Guardrail.ReportBreach).
	Breached bool
	// PushedBack: the first route of the group's pool is in pushback when
	// the group starts (the driver's route flags, as a provider's 429 with
	// Retry-After set them).
	PushedBack bool

	// The decision: whether the group may hedge, the rule that said no,
	// the guardrail arm its latency counts in, and the guardrail decision
	// its record carries.
	Eligible  bool
	Reason    string
	Arm       delay.Arm
	Guardrail schemas.GuardrailDecision
}

// EligibilityCases are the eligibility rule's cases. Control and rollout
// fractions of 0 and 1 make every group's draw decide the same way,
// whatever the driver names it.
func EligibilityCases() []Eligibility {
	return []Eligibility{
		{Name: "a class that hedges, on a pool of several routes, hedges", Routes: 3,
			Eligible: true, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailAllow},
		{Name: "a class with hedging off never hedges", Policy: func(p *policy.Policy) { p.Hedge = false }, Routes: 3,
			Reason: policy.ReasonPolicy, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailIneligible},
		{Name: "a class that is not idempotent never hedges", Policy: func(p *policy.Policy) { p.Idempotent = false }, Routes: 3,
			Reason: policy.ReasonPolicy, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailIneligible},
		{Name: "the policy rule goes before the single-route rule",
			Policy: func(p *policy.Policy) { p.Hedge = false }, Routes: 1,
			Reason: policy.ReasonPolicy, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailIneligible},
		{Name: "a pool of one route does not hedge", Routes: 1,
			Reason: policy.ReasonSingleRoute, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailIneligible},
		{Name: "a pool of one route hedges on it when same-route hedging is on",
			Policy: func(p *policy.Policy) { p.SameRouteHedging = true }, Routes: 1,
			Eligible: true, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailAllow},
		{Name: "a control group hedges as any group does and counts in the control arm",
			Policy: func(p *policy.Policy) { p.ControlFraction = 1 }, Routes: 3,
			Eligible: true, Arm: delay.ArmControl, Guardrail: schemas.GuardrailControl},
		{Name: "the single-route rule goes before the control draw",
			Policy: func(p *policy.Policy) { p.ControlFraction = 1 }, Routes: 1,
			Reason: policy.ReasonSingleRoute, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailIneligible},
		{Name: "a group outside the rollout does not hedge", Policy: func(p *policy.Policy) { p.RolloutFraction = 0 }, Routes: 3,
			Reason: policy.ReasonRollout, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailIneligible},
		{Name: "a control group outside the rollout does not hedge and still counts in the control arm",
			Policy: func(p *policy.Policy) { p.ControlFraction, p.RolloutFraction = 1, 0 }, Routes: 3,
			Reason: policy.ReasonRollout, Arm: delay.ArmControl, Guardrail: schemas.GuardrailControl},
		{Name: "a cohort whose guardrail switched hedging off does not hedge", Routes: 3, Breached: true,
			Reason: policy.ReasonGuardrail, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailDisable},
		{Name: "a disabled guardrail is not asked", Policy: func(p *policy.Policy) { p.Guardrail.Enabled = false }, Routes: 3, Breached: true,
			Eligible: true, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailAllow},
		{Name: "a control group of a cohort whose guardrail switched hedging off does not hedge and counts in the control arm",
			Policy: func(p *policy.Policy) { p.ControlFraction = 1 }, Routes: 3, Breached: true,
			Reason: policy.ReasonGuardrail, Arm: delay.ArmControl, Guardrail: schemas.GuardrailControl},
		{Name: "a cohort whose pool has a route in pushback runs primary-only", Routes: 3, PushedBack: true,
			Reason: policy.ReasonPushback, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailPushback},
		{Name: "with pushback scope route a route in pushback leaves the cohort hedging",
			Policy: func(p *policy.Policy) { p.PushbackScope = policy.PushbackRoute }, Routes: 3, PushedBack: true,
			Eligible: true, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailAllow},
		{Name: "a control group runs primary-only during a pushback as any group does and stays in the control arm",
			Policy: func(p *policy.Policy) { p.ControlFraction = 1 }, Routes: 3, PushedBack: true,
			Reason: policy.ReasonPushback, Arm: delay.ArmControl, Guardrail: schemas.GuardrailControl},
		{Name: "the pushback rule goes before the guardrail", Routes: 3, PushedBack: true, Breached: true,
			Reason: policy.ReasonPushback, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailPushback},
	}
}

// CensoringDelay is the hedge delay of a censoring case's cohort: the
// class's initial delay, which CensoringPolicy keeps for every case.
const CensoringDelay = time.Second

// CensoringPolicy changes the default policy for the censoring cases: the
// delay stays CensoringDelay however many samples come in.
func CensoringPolicy(p *policy.Policy) {
	p.Delay.Initial, p.Delay.WarmupSamples = CensoringDelay, 1_000_000
}

// Censoring is a case of the censoring rule: what became of a group's
// primary when the group was decided, and whether its elapsed time joins
// the delay estimator's samples.
type Censoring struct {
	Name    string
	Trigger policy.Trigger
	// Elapsed is how long the primary had run when the group was decided.
	Elapsed time.Duration
	// FirstByte: the primary's first byte arrived 100 ms after its launch.
	FirstByte bool
	// Failed: the primary ended by its own failure 100 ms after its launch.
	Failed bool
	// Winner is the attempt that won (0: none), Error what the group failed
	// with when none did.
	Winner int
	Error  schemas.ErrorCode

	Recorded bool
}

// CensoringCases are the censoring rule's cases.
func CensoringCases() []Censoring {
	const long, short = 3 * CensoringDelay, CensoringDelay / 2
	return []Censoring{
		{Name: "a primary a hedge beat before its first byte is a censored sample", Trigger: policy.TriggerFirstByte,
			Elapsed: long, Winner: 2, Recorded: true},
		{Name: "a primary the deadline cut off before its first byte is a censored sample", Trigger: policy.TriggerFirstByte,
			Elapsed: long, Error: schemas.ErrDeadlineExceeded, Recorded: true},
		{Name: "a superseded primary younger than the delay is not recorded", Trigger: policy.TriggerFirstByte,
			Elapsed: short, Winner: 2},
		{Name: "a primary that produced its first byte is in already", Trigger: policy.TriggerFirstByte,
			Elapsed: long, FirstByte: true, Winner: 2},
		{Name: "a primary that failed fast says nothing of its latency", Trigger: policy.TriggerFirstByte,
			Elapsed: long, Failed: true, Winner: 2},
		{Name: "a primary whose caller went away says nothing of its latency", Trigger: policy.TriggerFirstByte,
			Elapsed: long, Error: schemas.ErrCanceled},
		{Name: "a primary of a group every route failed is not recorded", Trigger: policy.TriggerFirstByte,
			Elapsed: long, Error: schemas.ErrAllRoutesFailed},
		{Name: "a primary that won is no censored sample", Trigger: policy.TriggerFirstByte,
			Elapsed: long, Winner: 1},
		{Name: "the total trigger records no censored samples", Trigger: policy.TriggerTotal,
			Elapsed: long, Winner: 2},
	}
}

// Decision is what a driver keeps of a group's eligibility decision.
type Decision struct {
	Eligible  bool
	Reason    string
	Arm       delay.Arm
	Guardrail schemas.GuardrailDecision
}

// Facts are what a case sets up before its group starts.
type Facts struct {
	// Routes is how many routes the group's pool has.
	Routes int
	// Breached: the cohort's guardrail switched hedging off.
	Breached bool
	// PushedBack: the pool's first route is in pushback.
	PushedBack bool
}

// TestEligibility runs every eligibility case through decide: the driver's
// path from a group of a class running p, with the case's facts set up the
// driver's way, to the decision it keeps.
func TestEligibility(t *testing.T, decide func(t *testing.T, p *policy.Policy, f Facts) Decision) {
	for _, tc := range EligibilityCases() {
		t.Run(tc.Name, func(t *testing.T) {
			p := policy.Default()
			if tc.Policy != nil {
				tc.Policy(p)
			}
			got := decide(t, p, Facts{Routes: tc.Routes, Breached: tc.Breached, PushedBack: tc.PushedBack})
			if want := (Decision{tc.Eligible, tc.Reason, tc.Arm, tc.Guardrail}); got != want {
				t.Fatalf("eligible %v, reason %q, arm %s, guardrail decision %s; want %v, %q, %s, %s",
					got.Eligible, got.Reason, got.Arm, got.Guardrail, want.Eligible, want.Reason, want.Arm, want.Guardrail)
			}
		})
	}
}

// TestCensoring runs every censoring case through record, which reports
// whether the driver recorded the case's superseded primary in a class
// running p.
func TestCensoring(t *testing.T, record func(t *testing.T, p *policy.Policy, c Censoring) bool) {
	for _, tc := range CensoringCases() {
		t.Run(tc.Name, func(t *testing.T) {
			p := policy.Default()
			CensoringPolicy(p)
			p.Trigger = tc.Trigger
			if got := record(t, p, tc); got != tc.Recorded {
				t.Fatalf("recorded %v, want %v", got, tc.Recorded)
			}
		})
	}
}

// GuardrailDeadline is the deadline of a guardrail sample case's group.
const GuardrailDeadline = 30 * time.Second

// Launched is when attempt n of a guardrail sample case's group was
// launched, after the group's start: the primary at once, then one a
// second.
func Launched(n int) time.Duration { return time.Duration(n-1) * time.Second }

// GuardrailSample is a case of the guardrail's sample rule (policy.GuardrailSample):
// a decided group, when its attempts' first bytes came, and what its arm
// of the guardrail gets.
type GuardrailSample struct {
	Name    string
	Trigger policy.Trigger
	Arm     delay.Arm
	// Ended is the engine's group record.
	Ended hedge.GroupEnded
	// Attempts is how many attempts the group launched (at Launched(n));
	// FirstBytes[n] is when attempt n's first byte came, after the
	// group's start (absent: none came).
	Attempts   int
	FirstBytes map[int]time.Duration

	// Sampled: the arm takes a sample, of Latency, failed or not.
	Sampled bool
	Latency time.Duration
	Failed  bool
}

// GuardrailSampleCases are the sample rule's cases.
func GuardrailSampleCases() []GuardrailSample {
	const ms = time.Millisecond
	kept := hedge.GroupEnded{Committed: true, Winner: 2, Attempts: 2, HedgeLaunched: true, Latency: 1401 * ms,
		Baseline: hedge.Baseline{Observed: true, Attempt: 1, Committed: true, Latency: 3001 * ms}}
	hedged := kept
	hedged.Baseline = hedge.Baseline{}
	toDeadline := kept
	toDeadline.Baseline = hedge.Baseline{Observed: true, Latency: GuardrailDeadline}
	lost := kept
	lost.Baseline = hedge.Baseline{}
	bothBytes := map[int]time.Duration{1: 3000 * ms, 2: 1300 * ms}
	return []GuardrailSample{
		{Name: "a hedged group counts at its winner's first byte", Trigger: policy.TriggerFirstByte, Arm: delay.ArmHedged,
			Ended: hedged, Attempts: 2, FirstBytes: map[int]time.Duration{2: 1300 * ms}, Sampled: true, Latency: 1300 * ms},
		{Name: "a hedged group counts at its commit under the total trigger", Trigger: policy.TriggerTotal, Arm: delay.ArmHedged,
			Ended: hedged, Attempts: 2, FirstBytes: map[int]time.Duration{2: 1300 * ms}, Sampled: true, Latency: 1401 * ms},
		{Name: "a failed group counts failed at the deadline", Trigger: policy.TriggerFirstByte, Arm: delay.ArmHedged,
			Ended: hedge.GroupEnded{Error: schemas.ErrAllRoutesFailed, Attempts: 2, Latency: 1200 * ms}, Attempts: 2,
			Sampled: true, Latency: GuardrailDeadline, Failed: true},
		{Name: "a control group counts at its kept baseline's first byte, not its winner's", Trigger: policy.TriggerFirstByte, Arm: delay.ArmControl,
			Ended: kept, Attempts: 2, FirstBytes: bothBytes, Sampled: true, Latency: 3000 * ms},
		{Name: "a control group counts at its baseline's commit point under the total trigger", Trigger: policy.TriggerTotal, Arm: delay.ArmControl,
			Ended: kept, Attempts: 2, FirstBytes: bothBytes, Sampled: true, Latency: 3001 * ms},
		{Name: "a control group whose baseline ran to the deadline counts failed there, though its caller had an answer", Trigger: policy.TriggerFirstByte, Arm: delay.ArmControl,
			Ended: toDeadline, Attempts: 2, FirstBytes: map[int]time.Duration{2: 1300 * ms}, Sampled: true, Latency: GuardrailDeadline, Failed: true},
		{Name: "a control group whose baseline failed on its own after the hedge launched adds nothing", Trigger: policy.TriggerFirstByte, Arm: delay.ArmControl,
			Ended: lost, Attempts: 2, FirstBytes: map[int]time.Duration{2: 1300 * ms}},
		{Name: "a control group that never hedged counts as its caller saw it", Trigger: policy.TriggerFirstByte, Arm: delay.ArmControl,
			Ended: hedge.GroupEnded{Committed: true, Winner: 1, Attempts: 1, Latency: 601 * ms,
				Baseline: hedge.Baseline{Observed: true, Attempt: 1, Committed: true, Latency: 601 * ms}},
			Attempts: 1, FirstBytes: map[int]time.Duration{1: 600 * ms}, Sampled: true, Latency: 600 * ms},
	}
}

// TestGuardrailSamples runs every sample case through observe: the driver's path
// from a decided group of a class running p, its attempts set up the
// driver's way, to its guardrail, which observe returns with the group's
// cohort. The case's sample is then read back from the guardrail's
// statistics (a sketch of relative accuracy 1 %).
func TestGuardrailSamples(t *testing.T, observe func(t *testing.T, p *policy.Policy, c GuardrailSample) (*policy.Class, delay.Cohort, time.Time)) {
	for _, tc := range GuardrailSampleCases() {
		t.Run(tc.Name, func(t *testing.T) {
			p := policy.Default()
			p.Trigger = tc.Trigger
			cl, cohort, now := observe(t, p, tc)
			st := cl.Guardrail.Stats(cohort, now)
			n, q, failRate := st.HedgedSamples, st.HedgedQuantile, st.HedgedErrorRate
			other := st.ControlSamples
			if tc.Arm == delay.ArmControl {
				n, q, failRate, other = st.ControlSamples, st.ControlQuantile, st.ControlErrorRate, st.HedgedSamples
			}
			if other != 0 {
				t.Fatalf("the other arm took %d samples", other)
			}
			if got := n == 1; got != tc.Sampled {
				t.Fatalf("%s arm holds %d samples, want sampled %v", tc.Arm, n, tc.Sampled)
			}
			if !tc.Sampled {
				return
			}
			if math.Abs(q.Seconds()-tc.Latency.Seconds()) > 0.011*tc.Latency.Seconds() {
				t.Fatalf("sample %v, want %v", q, tc.Latency)
			}
			if got := failRate == 1; got != tc.Failed {
				t.Fatalf("sample failed %v, want %v", got, tc.Failed)
			}
		})
	}
}
