package delay

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// p95Lognormal draws a lognormal (σ 0.5) whose P95 is p95.
func p95Lognormal(p95 time.Duration) func(*rand.Rand) time.Duration {
	median := time.Duration(float64(p95) / 2.2760) // exp(1.6449 × 0.5)
	return func(r *rand.Rand) time.Duration { return lognormal(r, median, 0.5) }
}

// arm describes the groups of one arm fed to the guardrail.
type arm struct {
	n         int
	latency   func(*rand.Rand) time.Duration
	errorRate float64
}

func feed(t *testing.T, g *Guardrail, r *rand.Rand, at time.Time, which Arm, a arm) {
	t.Helper()
	for range a.n {
		if err := g.ObserveGroup(testCohort, at, which, a.latency(r), r.Float64() < a.errorRate); err != nil {
			t.Fatal(err)
		}
	}
}

func mustGuardrail(t *testing.T, cfg GuardrailOptions) *Guardrail {
	t.Helper()
	g, err := NewGuardrail(cfg)
	if err != nil {
		t.Fatalf("NewGuardrail: %v", err)
	}
	return g
}

func TestGuardrailDecidesOnControlVersusHedgedTail(t *testing.T) {
	p95 := GuardrailOptions{Quantile: 0.95, MinControlSamples: 500}
	tests := []struct {
		name            string
		cfg             GuardrailOptions
		control, hedged arm
		wantState       GuardrailState
		wantReason      GuardrailReason
	}{
		{"keeps hedging when the gain is real (P95 2s vs 0.8s, 600 control)", p95,
			arm{600, p95Lognormal(2 * time.Second), 0}, arm{5000, p95Lognormal(800 * time.Millisecond), 0},
			StateEnabled, ReasonGain},
		{"keeps hedging when the gain is real at the default P99", GuardrailOptions{MinControlSamples: 500},
			arm{600, p95Lognormal(2 * time.Second), 0}, arm{5000, p95Lognormal(800 * time.Millisecond), 0},
			StateEnabled, ReasonGain},
		{"disables when the gain is shown flat (same distribution both sides)", p95,
			arm{20000, p95Lognormal(2 * time.Second), 0}, arm{60000, p95Lognormal(2 * time.Second), 0},
			StateDisabled, ReasonFlatGain},
		{"disables when the gain is shown below the minimum relative gain", p95,
			arm{20000, p95Lognormal(2 * time.Second), 0}, arm{60000, p95Lognormal(1960 * time.Millisecond), 0},
			StateDisabled, ReasonFlatGain},
		{"keeps hedging while a flat-looking gain is inconclusive", p95,
			arm{600, p95Lognormal(2 * time.Second), 0}, arm{5000, p95Lognormal(2 * time.Second), 0},
			StateEnabled, ReasonInconclusive},
		{"refuses to decide below 500 control samples", p95,
			arm{499, p95Lognormal(2 * time.Second), 0}, arm{5000, p95Lognormal(2 * time.Second), 0},
			StateEnabled, ReasonInsufficientSamples},
		{"refuses to decide below 500 hedged samples", p95,
			arm{600, p95Lognormal(2 * time.Second), 0}, arm{499, p95Lognormal(2 * time.Second), 0},
			StateEnabled, ReasonInsufficientSamples},
		{"disables when the hedged error rate rises", p95,
			arm{600, p95Lognormal(2 * time.Second), 0.01}, arm{5000, p95Lognormal(800 * time.Millisecond), 0.06},
			StateDisabled, ReasonErrorRate},
		{"tolerates an error rise within the margin", p95,
			arm{600, p95Lognormal(2 * time.Second), 0.01}, arm{5000, p95Lognormal(800 * time.Millisecond), 0.015},
			StateEnabled, ReasonGain},
		{"judges error rates below the tail's 500 control samples", p95,
			arm{499, p95Lognormal(2 * time.Second), 0.01}, arm{5000, p95Lognormal(800 * time.Millisecond), 0.20},
			StateDisabled, ReasonErrorRate},
		{"refuses to judge error rates below 50 control samples", p95,
			arm{49, p95Lognormal(2 * time.Second), 0.01}, arm{5000, p95Lognormal(800 * time.Millisecond), 0.20},
			StateEnabled, ReasonInsufficientSamples},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustGuardrail(t, tt.cfg)
			r := newRand(11)
			feed(t, g, r, t0, ArmControl, tt.control)
			feed(t, g, r, t0, ArmHedged, tt.hedged)
			d := g.Decide(testCohort, t0.Add(time.Second))
			if d.State != tt.wantState || d.Reason != tt.wantReason {
				t.Fatalf("Decide = %s/%s, want %s/%s; stats %+v", d.State, d.Reason, tt.wantState, tt.wantReason, d.Stats)
			}
			if d.HedgingAllowed() != (tt.wantState != StateDisabled) {
				t.Fatalf("HedgingAllowed = %v in state %s", d.HedgingAllowed(), d.State)
			}
			if d.Stats.ControlSamples != tt.control.n || d.Stats.HedgedSamples != tt.hedged.n {
				t.Fatalf("samples %d/%d, want %d/%d", d.Stats.ControlSamples, d.Stats.HedgedSamples, tt.control.n, tt.hedged.n)
			}
		})
	}
}

func TestGuardrailReportsTailGainRatio(t *testing.T) {
	g := mustGuardrail(t, GuardrailOptions{Quantile: 0.95})
	r := newRand(5)
	feed(t, g, r, t0, ArmControl, arm{2000, p95Lognormal(2 * time.Second), 0})
	feed(t, g, r, t0, ArmHedged, arm{20000, p95Lognormal(800 * time.Millisecond), 0})
	s := g.Stats(testCohort, t0)
	if s.TailGainRatio < 2.25 || s.TailGainRatio > 2.75 {
		t.Fatalf("TailGainRatio = %.3f, want ≈ 2.5 (2s / 0.8s); stats %+v", s.TailGainRatio, s)
	}
	if !(s.ControlLower <= s.ControlQuantile && s.ControlQuantile <= s.ControlUpper) ||
		!(s.HedgedLower <= s.HedgedQuantile && s.HedgedQuantile <= s.HedgedUpper) {
		t.Fatalf("intervals do not bracket their estimates: %+v", s)
	}
}

// hedgedAtP95 returns the gpt4o TTFT of a group hedged at the primaries'
// true P95 on an independent route: min(L1, d + L2).
func hedgedAtP95() (d time.Duration, draw func(*rand.Rand) time.Duration) {
	r := newRand(3)
	sample := make([]time.Duration, 20000)
	for i := range sample {
		sample[i] = gpt4oTTFT(r)
	}
	d = exactQuantile(sample, 0.95)
	return d, func(r *rand.Rand) time.Duration { return min(gpt4oTTFT(r), d+gpt4oTTFT(r)) }
}

// TestGuardrailCannotSeeGainAtTheDelayQuantile is why the guardrail compares
// P99 by default: with the hedge delay at the primaries' P95, a hedged
// group's latency min(L1, d + L2) equals L1 up to d, so hedged and control
// P95 coincide while the P99 halves.
func TestGuardrailCannotSeeGainAtTheDelayQuantile(t *testing.T) {
	d, hedgedTTFT := hedgedAtP95()
	tests := []struct {
		name       string
		quantile   float64
		wantState  GuardrailState
		wantReason GuardrailReason
	}{
		{"P95 under a P95 delay reads flat", 0.95, StateDisabled, ReasonFlatGain},
		{"P99 under a P95 delay sees the gain", 0.99, StateEnabled, ReasonGain},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustGuardrail(t, GuardrailOptions{Quantile: tt.quantile})
			r := newRand(4)
			feed(t, g, r, t0, ArmControl, arm{20000, gpt4oTTFT, 0})
			feed(t, g, r, t0, ArmHedged, arm{60000, hedgedTTFT, 0})
			dec := g.Decide(testCohort, t0)
			t.Logf("delay %v: %+v", d, dec.Stats)
			if dec.State != tt.wantState || dec.Reason != tt.wantReason {
				t.Fatalf("Decide = %s/%s, want %s/%s", dec.State, dec.Reason, tt.wantState, tt.wantReason)
			}
		})
	}
}

// TestGuardrailHasPowerOnTheGpt4oModel measures the default statistic over
// many seeded replicas of the same experiment. With a real gain (hedging at
// P95) it must show the gain nearly always at 2000 control groups and must
// never switch hedging off, even at the 1000-sample floor, where the
// intervals cannot yet show the gain. With no gain (the hedged arm run
// primary-only) it must never report a gain, and once the control arm is
// large enough to bound its fat P99 tail it must switch hedging off in most
// replicas (80,000 control groups: showing flatness is slow by design).
func TestGuardrailHasPowerOnTheGpt4oModel(t *testing.T) {
	_, hedgedTTFT := hedgedAtP95()
	tests := []struct {
		name                 string
		control              int
		hedged               func(*rand.Rand) time.Duration
		minGain, maxGain     int
		minFlat, maxDisabled int
	}{
		{"real gain is shown at 2000 control groups", 2000, hedgedTTFT, 18, 20, 0, 0},
		{"real gain is never switched off at the sample floor", 1000, hedgedTTFT, 0, 20, 0, 0},
		{"no gain is never invented", 2000, gpt4oTTFT, 0, 0, 0, 20},
		{"no gain is switched off once the control arm can show it", 80000, gpt4oTTFT, 0, 0, 5, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			replicas := 20
			if tt.control > 2000 {
				replicas = 10 // the large arm is slow to feed; ten replicas suffice
			}
			gain, disabled := 0, 0
			for seed := range uint64(replicas) {
				g := mustGuardrail(t, GuardrailOptions{})
				r := newRand(1000 + seed)
				feed(t, g, r, t0, ArmControl, arm{tt.control, gpt4oTTFT, 0})
				feed(t, g, r, t0, ArmHedged, arm{min(10*tt.control, 2*80000), tt.hedged, 0})
				d := g.Decide(testCohort, t0)
				if d.Reason == ReasonGain {
					gain++
				}
				if !d.HedgingAllowed() {
					disabled++
				}
			}
			if gain < tt.minGain || gain > tt.maxGain || disabled < tt.minFlat || disabled > tt.maxDisabled {
				t.Fatalf("gain shown in %d and hedging disabled in %d of %d replicas; want gain %d–%d, disabled %d–%d",
					gain, disabled, replicas, tt.minGain, tt.maxGain, tt.minFlat, tt.maxDisabled)
			}
		})
	}
}

func TestGuardrailDisablesOnCeilingBreach(t *testing.T) {
	tests := []struct {
		name   string
		reason GuardrailReason
	}{
		{"duplicate-rate ceiling", ReasonDuplicateCeiling},
		{"spend ceiling", ReasonSpendCeiling},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustGuardrail(t, GuardrailOptions{Quantile: 0.95})
			r := newRand(8)
			feed(t, g, r, t0, ArmControl, arm{600, p95Lognormal(2 * time.Second), 0})
			feed(t, g, r, t0, ArmHedged, arm{5000, p95Lognormal(800 * time.Millisecond), 0})
			if d := g.Decide(testCohort, t0); d.State != StateEnabled {
				t.Fatalf("before the breach Decide = %s/%s, want enabled", d.State, d.Reason)
			}
			if err := g.ReportBreach(testCohort, t0.Add(time.Second), tt.reason); err != nil {
				t.Fatal(err)
			}
			d := g.Decide(testCohort, t0.Add(2*time.Second))
			if d.State != StateDisabled || d.Reason != tt.reason || !d.Since.Equal(t0.Add(time.Second)) {
				t.Fatalf("after the breach Decide = %+v, want disabled/%s since the breach", d, tt.reason)
			}
		})
	}
	t.Run("a reason that is not a ceiling is refused", func(t *testing.T) {
		g := mustGuardrail(t, GuardrailOptions{})
		if err := g.ReportBreach(testCohort, t0, ReasonFlatGain); !errors.Is(err, ErrNotABreach) {
			t.Fatalf("ReportBreach(flat_gain) error = %v, want ErrNotABreach", err)
		}
		if d := g.Decide(testCohort, t0); d.State != StateEnabled {
			t.Fatalf("a refused breach changed the state to %s", d.State)
		}
	})
}

func TestGuardrailProbesAfterCoolDownAndReenablesWhenGainIsBack(t *testing.T) {
	cfg := GuardrailOptions{Quantile: 0.95, CoolDown: 5 * time.Minute, ProbePeriod: 2 * time.Minute}
	slow, fast := p95Lognormal(2*time.Second), p95Lognormal(800*time.Millisecond)
	tests := []struct {
		name         string
		probeHedged  arm
		wantAfter    GuardrailState
		wantReason   GuardrailReason
		wantDisabled bool
	}{
		{"gain is back: re-enabled", arm{3000, fast, 0}, StateEnabled, ReasonGain, false},
		{"still flat: disabled for another cool-down", arm{60000, slow, 0}, StateDisabled, ReasonFlatGain, true},
		{"too few probe samples: keeps probing", arm{100, fast, 0}, StateProbing, ReasonInsufficientSamples, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustGuardrail(t, cfg)
			r := newRand(21)
			feed(t, g, r, t0, ArmControl, arm{20000, slow, 0})
			feed(t, g, r, t0, ArmHedged, arm{60000, slow, 0})
			steps := []struct {
				at         time.Duration
				wantState  GuardrailState
				wantReason GuardrailReason
			}{
				{0, StateDisabled, ReasonFlatGain},
				{5*time.Minute - time.Millisecond, StateDisabled, ReasonFlatGain}, // cooling down
				{5 * time.Minute, StateProbing, ReasonProbe},                      // cool-down over
			}
			for _, s := range steps {
				d := g.Decide(testCohort, t0.Add(s.at))
				if d.State != s.wantState || d.Reason != s.wantReason {
					t.Fatalf("at +%v Decide = %s/%s, want %s/%s", s.at, d.State, d.Reason, s.wantState, s.wantReason)
				}
			}
			if d := g.Decide(testCohort, t0.Add(5*time.Minute)); d.Stats.HedgedSamples != 0 || d.Stats.ControlSamples != 20000 {
				t.Fatalf("probe starts with %d hedged / %d control samples, want 0 fresh hedged and the 20000 control kept",
					d.Stats.HedgedSamples, d.Stats.ControlSamples)
			}
			feed(t, g, r, t0.Add(6*time.Minute), ArmHedged, tt.probeHedged)
			if d := g.Decide(testCohort, t0.Add(7*time.Minute-time.Millisecond)); d.State != StateProbing {
				t.Fatalf("before the probe period ends Decide = %s/%s, want probing", d.State, d.Reason)
			}
			d := g.Decide(testCohort, t0.Add(7*time.Minute))
			if d.State != tt.wantAfter || d.Reason != tt.wantReason {
				t.Fatalf("after the probe Decide = %s/%s, want %s/%s; stats %+v", d.State, d.Reason, tt.wantAfter, tt.wantReason, d.Stats)
			}
			if d.HedgingAllowed() == tt.wantDisabled {
				t.Fatalf("HedgingAllowed = %v after the probe", d.HedgingAllowed())
			}
		})
	}
}

func TestGuardrailProbeStillDisablesAtOnceOnErrorsAndBreaches(t *testing.T) {
	cfg := GuardrailOptions{Quantile: 0.95, CoolDown: time.Minute, ProbePeriod: 10 * time.Minute}
	slow, fast := p95Lognormal(2*time.Second), p95Lognormal(800*time.Millisecond)
	tests := []struct {
		name       string
		during     func(t *testing.T, g *Guardrail, r *rand.Rand, at time.Time)
		wantReason GuardrailReason
	}{
		{"error rate rises during the probe", func(t *testing.T, g *Guardrail, r *rand.Rand, at time.Time) {
			feed(t, g, r, at, ArmHedged, arm{2000, fast, 0.08})
		}, ReasonErrorRate},
		{"spend ceiling breached during the probe", func(t *testing.T, g *Guardrail, r *rand.Rand, at time.Time) {
			if err := g.ReportBreach(testCohort, at, ReasonSpendCeiling); err != nil {
				t.Fatal(err)
			}
		}, ReasonSpendCeiling},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustGuardrail(t, cfg)
			r := newRand(33)
			feed(t, g, r, t0, ArmControl, arm{20000, slow, 0.01})
			feed(t, g, r, t0, ArmHedged, arm{60000, slow, 0.01})
			g.Decide(testCohort, t0)
			if d := g.Decide(testCohort, t0.Add(time.Minute)); d.State != StateProbing {
				t.Fatalf("Decide = %s, want probing after the cool-down", d.State)
			}
			tt.during(t, g, r, t0.Add(2*time.Minute))
			// Half a cool-down later: disabled at once, not re-probing yet.
			if d := g.Decide(testCohort, t0.Add(2*time.Minute+30*time.Second)); d.State != StateDisabled || d.Reason != tt.wantReason {
				t.Fatalf("Decide = %s/%s, want disabled/%s before the probe period ends", d.State, d.Reason, tt.wantReason)
			}
		})
	}
}

func TestGuardrailForgetsGroupsOlderThanItsWindow(t *testing.T) {
	g := mustGuardrail(t, GuardrailOptions{Quantile: 0.95, Window: 10 * time.Minute, Slots: 10, ProbePeriod: time.Minute})
	r := newRand(9)
	feed(t, g, r, t0, ArmControl, arm{600, p95Lognormal(2 * time.Second), 0})
	feed(t, g, r, t0, ArmHedged, arm{600, p95Lognormal(2 * time.Second), 0})
	if d := g.Decide(testCohort, t0.Add(10*time.Minute)); d.State != StateEnabled || d.Reason != ReasonInsufficientSamples {
		t.Fatalf("Decide = %s/%s with every sample rolled out, want enabled/insufficient_samples", d.State, d.Reason)
	}
}

func TestGuardrailRejectsBadInput(t *testing.T) {
	g := mustGuardrail(t, GuardrailOptions{})
	if err := g.ObserveGroup(testCohort, t0, Arm("both"), time.Second, false); !errors.Is(err, ErrInvalidArm) {
		t.Errorf("unknown arm error = %v, want ErrInvalidArm", err)
	}
	if err := g.ObserveGroup(testCohort, t0, ArmControl, -time.Second, false); !errors.Is(err, ErrNegativeLatency) {
		t.Errorf("negative latency error = %v, want ErrNegativeLatency", err)
	}
	configs := []struct {
		name string
		cfg  GuardrailOptions
	}{
		{"quantile of one", GuardrailOptions{Quantile: 1}},
		{"one control sample", GuardrailOptions{MinControlSamples: 1}},
		{"too few control samples for the quantile", GuardrailOptions{Quantile: 0.999}},
		{"gain of 100%", GuardrailOptions{MinRelativeGain: 1}},
		{"negative error margin", GuardrailOptions{ErrorRateMargin: -0.1}},
		{"probe longer than the window", GuardrailOptions{Window: time.Minute, ProbePeriod: 2 * time.Minute}},
		{"negative cool-down", GuardrailOptions{CoolDown: -time.Second}},
	}
	for _, tt := range configs {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewGuardrail(tt.cfg); !errors.Is(err, ErrInvalidOptions) {
				t.Fatalf("NewGuardrail(%+v) error = %v, want ErrInvalidOptions", tt.cfg, err)
			}
		})
	}
}

// The error-rate rule needs MinErrorSamples (50) per arm, not the tail
// rule's 1000 control groups: at a 1% control share that is 20 times less
// traffic before failing hedges are switched off. Over 200 seeded replicas
// it acts on a real rise and never on equal error rates.
func TestGuardrailErrorRateRuleActsOnFarFewerSamplesThanTheTailRule(t *testing.T) {
	lat := p95Lognormal(time.Second)
	tests := []struct {
		name            string
		control, hedged arm
		// minDisabled and maxDisabled bound the replicas (of 200) disabled
		// for error_rate.
		minDisabled, maxDisabled int
	}{
		{"hedged groups failing 30% against a clean control: disabled on 60 control groups",
			arm{60, lat, 0}, arm{600, lat, 0.30}, 200, 200},
		{"hedged groups failing 15% against 1%: disabled on 100 control groups in nearly every replica",
			arm{100, lat, 0.01}, arm{2000, lat, 0.15}, 190, 200},
		{"equal error rates of 5% on 60 control groups: never disabled",
			arm{60, lat, 0.05}, arm{600, lat, 0.05}, 0, 0},
		{"equal error rates of 2% on 50 control groups: never disabled",
			arm{50, lat, 0.02}, arm{5000, lat, 0.02}, 0, 0},
		{"equal error rates of 10% on 50 control groups: never disabled",
			arm{50, lat, 0.10}, arm{5000, lat, 0.10}, 0, 0},
		{"a rise within the one-point margin: never disabled",
			arm{100, lat, 0.01}, arm{2000, lat, 0.015}, 0, 0},
		{"below the 50-sample floor the rule waits, however bad the hedged arm",
			arm{49, lat, 0}, arm{600, lat, 0.5}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			disabled := 0
			for seed := range uint64(200) {
				g := mustGuardrail(t, GuardrailOptions{})
				r := newRand(1000 + seed)
				feed(t, g, r, t0, ArmControl, tt.control)
				feed(t, g, r, t0, ArmHedged, tt.hedged)
				d := g.Decide(testCohort, t0)
				switch {
				case d.State == StateDisabled && d.Reason == ReasonErrorRate:
					disabled++
				case d.State != StateEnabled || d.Reason != ReasonInsufficientSamples:
					t.Fatalf("seed %d: Decide = %s/%s, want error_rate or insufficient_samples below the tail floor", seed, d.State, d.Reason)
				}
			}
			if disabled < tt.minDisabled || disabled > tt.maxDisabled {
				t.Fatalf("disabled for error_rate in %d of 200 replicas, want %d–%d", disabled, tt.minDisabled, tt.maxDisabled)
			}
		})
	}
}

func TestGuardrailTailGainIsWithheldBelowTheSampleFloorAndBracketed(t *testing.T) {
	slow, fast := p95Lognormal(2*time.Second), p95Lognormal(800*time.Millisecond)
	tests := []struct {
		name            string
		control, hedged arm
		wantKnown       bool
	}{
		{"40 control groups: no gain given", arm{40, slow, 0}, arm{4000, fast, 0}, false},
		{"999 control groups: no gain given", arm{999, slow, 0}, arm{4000, fast, 0}, false},
		{"enough control but 499 hedged: no gain given", arm{1500, slow, 0}, arm{499, fast, 0}, false},
		{"1000 control and 500 hedged: the gain with its interval", arm{1000, slow, 0}, arm{500, fast, 0}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustGuardrail(t, GuardrailOptions{})
			r := newRand(77)
			feed(t, g, r, t0, ArmControl, tt.control)
			feed(t, g, r, t0, ArmHedged, tt.hedged)
			tg := g.TailGain(g.Status(testCohort, t0).Stats)
			if tg.ControlSamples != tt.control.n || tg.HedgedSamples != tt.hedged.n {
				t.Fatalf("samples %d/%d, want %d/%d", tg.ControlSamples, tg.HedgedSamples, tt.control.n, tt.hedged.n)
			}
			if tg.Known != tt.wantKnown {
				t.Fatalf("Known = %v, want %v (%+v)", tg.Known, tt.wantKnown, tg)
			}
			if !tt.wantKnown {
				if tg.Ratio != 0 || tg.Lower != 0 || tg.Upper != 0 {
					t.Fatalf("a withheld gain carries figures: %+v", tg)
				}
				return
			}
			// Same σ, P95 2 s against 0.8 s: the true ratio is 2.5.
			if !(tg.Lower <= tg.Ratio && tg.Ratio <= tg.Upper) || tg.Lower > 2.5 || tg.Upper < 2.5 || tg.Lower < 1 {
				t.Fatalf("gain %.2f in [%.2f, %.2f], want an interval around the true 2.5 above 1", tg.Ratio, tg.Lower, tg.Upper)
			}
		})
	}
}

func TestGuardrailStatusReadsWithoutMovingTheState(t *testing.T) {
	g := mustGuardrail(t, GuardrailOptions{CoolDown: time.Minute, ProbePeriod: time.Minute})
	if s := g.Status(testCohort, t0); s.State != StateEnabled || s.Reason != ReasonInsufficientSamples {
		t.Fatalf("a cohort never seen: %s/%s, want enabled/insufficient_samples", s.State, s.Reason)
	}
	if err := g.ReportBreach(testCohort, t0, ReasonDuplicateCeiling); err != nil {
		t.Fatal(err)
	}
	// Past the cool-down, Status still reads disabled: only Decide probes.
	if s := g.Status(testCohort, t0.Add(2*time.Minute)); s.State != StateDisabled || s.Reason != ReasonDuplicateCeiling {
		t.Fatalf("Status after the cool-down = %s/%s, want disabled/duplicate_ceiling untouched", s.State, s.Reason)
	}
	if d := g.Decide(testCohort, t0.Add(2*time.Minute)); d.State != StateProbing {
		t.Fatalf("Decide after the cool-down = %s, want probing", d.State)
	}
	if s := g.Status(testCohort, t0.Add(2*time.Minute)); s.State != StateProbing || s.Reason != ReasonProbe {
		t.Fatalf("Status after Decide = %s/%s, want probing/probe", s.State, s.Reason)
	}
}

func TestGuardrailAdoptsAnotherReplicasDisablingForItsCoolDown(t *testing.T) {
	cfg := GuardrailOptions{CoolDown: 5 * time.Minute, ProbePeriod: time.Minute}
	tests := []struct {
		name       string
		local      func(g *Guardrail) // what this replica decided first
		reason     GuardrailReason
		since      time.Duration // of the adopted disabling, from t0
		at         time.Duration // when it is adopted
		wantState  GuardrailState
		wantReason GuardrailReason
		wantSince  time.Duration
	}{
		{"an enabled cohort is disabled as the peer's was", nil, ReasonErrorRate, 0, time.Minute,
			StateDisabled, ReasonErrorRate, 0},
		{"a disabling whose cool-down ended is ignored", nil, ReasonErrorRate, 0, 5 * time.Minute,
			StateEnabled, ReasonInsufficientSamples, 0},
		{"an older disabling does not replace a newer local one",
			func(g *Guardrail) { _ = g.ReportBreach(testCohort, t0.Add(2*time.Minute), ReasonSpendCeiling) },
			ReasonDuplicateCeiling, time.Minute, 3 * time.Minute, StateDisabled, ReasonSpendCeiling, 2 * time.Minute},
		{"a newer disabling restarts the local cool-down",
			func(g *Guardrail) { _ = g.ReportBreach(testCohort, t0, ReasonSpendCeiling) },
			ReasonDuplicateCeiling, time.Minute, 2 * time.Minute, StateDisabled, ReasonDuplicateCeiling, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustGuardrail(t, cfg)
			if tt.local != nil {
				tt.local(g)
			}
			if err := g.Adopt(testCohort, t0.Add(tt.at), tt.reason, t0.Add(tt.since)); err != nil {
				t.Fatal(err)
			}
			s := g.Status(testCohort, t0.Add(tt.at))
			if s.State != tt.wantState || s.Reason != tt.wantReason || s.State == StateDisabled && !s.Since.Equal(t0.Add(tt.wantSince)) {
				t.Fatalf("Status = %s/%s since %v, want %s/%s since +%v", s.State, s.Reason, s.Since.Sub(t0), tt.wantState, tt.wantReason, tt.wantSince)
			}
		})
	}
	t.Run("a reason that never disables is refused", func(t *testing.T) {
		g := mustGuardrail(t, cfg)
		if err := g.Adopt(testCohort, t0, ReasonGain, t0); !errors.Is(err, ErrNotADisabling) {
			t.Fatalf("Adopt(gain) = %v, want ErrNotADisabling", err)
		}
	})
	t.Run("Disabled lists what is in its cool-down", func(t *testing.T) {
		g := mustGuardrail(t, cfg)
		_ = g.ReportBreach(testCohort, t0, ReasonDuplicateCeiling)
		if d := g.Disabled(t0.Add(time.Minute)); len(d) != 1 || d[0].Cohort != testCohort || d[0].Reason != ReasonDuplicateCeiling || !d[0].Since.Equal(t0) {
			t.Fatalf("Disabled = %+v, want the one breach", d)
		}
		if d := g.Disabled(t0.Add(5 * time.Minute)); len(d) != 0 {
			t.Fatalf("Disabled after the cool-down = %+v, want none", d)
		}
	})
}
