// Package delay estimates hedge delays and decides, per cohort, whether
// hedging pays off (docs/architecture.md §5).
//
// Like the hedge engine it is pure: no goroutines and no clock. Every method
// takes now, so the discrete-event simulator drives it on virtual time and the
// live runtime on real time, and both compute the same delays from the same
// observations. Estimator and Guardrail lock internally and are safe for
// concurrent use.
//
// # Delay
//
// A Cohort is what is known when a request arrives: operation class, model
// class, stream or not, max_tokens bucket. For each cohort the Estimator keeps
// a rolling window of primary latencies (time to first byte for the
// first_byte trigger, total time for total) in DDSketch slots of relative
// accuracy 1%: Window is split into Slots slots aligned on the Unix clock, and
// a whole slot rolls out at a time. The delay is the window's Quantile (0.95),
// clamped to [Min, Max] and then to the time left before the deadline.
// Until WarmupSamples samples exist a cohort borrows from its warm siblings
// in other max_tokens buckets (scaled by the buckets with ScaleBorrowed,
// for the total trigger), else Initial. Inside each cohort every route has
// a window too (at most MaxRoutes), and RouteDelay gives a route whose
// quantile's confidence interval lies RouteMargin apart from its sibling
// routes' a delay of its own (docs/architecture.md §5).
//
// Censoring. A primary superseded by a winning hedge never reports its
// latency, only that it exceeded its elapsed time. Dropping it removes
// exactly the slow primaries and pulls the delay down, which supersedes more
// primaries: a spiral. So ObserveSuperseded records it at its elapsed time
// when that is at least the current delay: it then falls on the correct side
// of every quantile up to the delay's, which stay exact, and is a lower bound
// in the tail above. Primaries ended by CallerGone or by a fast error are not
// recorded at all: their elapsed time says nothing about the answer's latency.
//
// Sharing. Slots carry a clock-aligned index and encode to sketches-go's
// binary format. Each replica publishes Snapshot (its own samples only) and
// calls Merge with every other replica's latest snapshots, which replaces the
// previous peer samples rather than adding to them. Every replica then holds
// the same union and computes the same delay.
//
// # Control groups
//
// IsControl marks a share (DefaultControlFraction, 1%) of groups as control
// groups from a uniform draw the caller supplies: a seeded rng in the
// simulator, UniformFromID of the group id live, so every replica agrees.
// Control groups are the live baseline against which hedging is judged:
// their arm of the guardrail holds what each would have measured had it
// run primary-only. They hedge as any group does — the hedge engine keeps
// a control group's primary running, unseen by the caller, past another
// attempt's win to the primary's own commit point, failure or deadline, and
// that run is the group's sample (docs/architecture.md §5).
//
// # Guardrail statistics
//
// The Guardrail keeps, per cohort and over the same rolling window, one
// sketch of control-group latencies and one of hedged-group latencies (every
// group allowed to hedge, whether it hedged or not), each with its failure
// count. Decide evaluates, in order:
//
//  1. Ceilings. A duplicate-rate or spend-ceiling breach reported by the
//     caller (ReportBreach) disables hedging at once.
//  2. Error rate, once each arm holds MinErrorSamples (50) groups — far
//     fewer than the tail's floor, so failing hedges are switched off on a
//     few requests per second. In Agresti and Caffo's form, with p̃ =
//     (failures + 1)/(n + 2) for n_h hedged and n_c control groups,
//     z = (p̃_h − p̃_c − margin) / √(p̃_h(1−p̃_h)/(n_h+2) + p̃_c(1−p̃_c)/(n_c+2)).
//     z > ErrorZ (3.09, one-sided 0.1%: the test is repeated at every
//     arrival, so a 1% level would fire by chance) means hedged groups fail
//     more than ErrorRateMargin (one point) above control: disabled,
//     error_rate. The added counts matter at a few dozen control groups: the
//     plain Wald form read a clean control arm as certain and fired on equal
//     rates (TestGuardrailErrorRateRuleActsOnFarFewerSamplesThanTheTailRule).
//  3. Sample size. The tail is not judged until the control arm holds
//     MinControlSamples (1000) and the hedged arm MinHedgedSamples (500); the
//     reason is then insufficient_samples and the state does not change.
//  4. Flat gain. For each arm the Quantile is bracketed by a distribution-free
//     confidence interval: the number of samples below the true q-quantile is
//     Binomial(n, q), so the order statistics of 1-based ranks
//     ⌊nq − z√(nq(1−q))⌋ and ⌈nq + z√(nq(1−q)) + 1⌉ (z = 1.96) enclose it with
//     about 95% confidence; the sketch reads them within its 1% accuracy.
//     The gain is shown when the hedged upper bound is at most
//     (1 − MinRelativeGain) × the control lower bound (5%): the intervals are
//     disjoint with a margin. Flatness is shown when the hedged quantile (the
//     hedged arm holds most groups, so its quantile is taken as known) lies
//     above (1 − MinRelativeGain) × the control upper bound: even the slowest
//     control tail the data allow makes the gain smaller than the minimum.
//     Hedging is then disabled as flat_gain.
//     Anything in between is inconclusive and changes nothing: a cohort is
//     never switched off merely because its gain is not yet shown, nor on a
//     point estimate of a fat tail, which at a thousand control groups moves
//     by half its value from one window to the next. Showing flatness takes
//     tens of thousands of control groups at P99 on a fat-tailed cohort
//     (80,000 on the gpt4o model for most replicas): the flat-gain rule is a
//     slow correction, while error rates and ceiling breaches act at once
//     and the duplicate-rate ceiling bounds the cost meanwhile.
//     The normal approximation of the intervals needs about five expected
//     samples above the quantile, so the config requires
//     MinControlSamples × (1 − Quantile) ≥ 5 (500 at P99).
//
// The compared quantile defaults to 0.99, not the delay's 0.95: a hedged
// group's latency is min(L1, d + L2), which equals the primary's latency L1
// below the delay d. At the delay's own quantile hedging cannot move the
// tail, so comparing P95s under a P95 delay reads flat for every cohort
// (TestGuardrailCannotSeeGainAtTheDelayQuantile shows it on the gpt4o model).
// The quantile must lie above the delay quantile; the sample floor and the
// order-statistic interval keep the P99 from resting on a handful of points.
//
// Power. On docs/architecture.md §11's gpt4o TTFT model hedged at its P95 (true P99 ≈ 4 s
// control vs ≈ 1.9 s hedged), with ten hedged groups per control group,
// TestGuardrailHasPowerOnTheGpt4oModel pins what the statistic does over 20
// seeded replicas: at 2000 control groups the intervals show the gain in at
// least 18; at the 1000-group floor hedging is switched off in none; with no
// gain at all a gain is never reported, and at 80,000 control groups hedging
// is switched off in at least half of 10 replicas. Size Window
// so that control fraction × rate × Window reaches the floor. TailGainRatio
// in the statistics is control over hedged at the compared quantile;
// TailGain gives it, with the interval its arms' bounds allow, only above
// the sample floors, for the tail_gain_ratio metrics.
//
// Re-enabling. A disabled cohort stays so for CoolDown, then enters probing:
// hedging runs again, the hedged arm is cleared (its old samples describe
// the conditions that got it disabled) and control keeps its window. Errors
// and breaches still disable at once; after ProbePeriod, with enough fresh
// samples, the flat-gain test decides: enabled, or disabled for another
// cool-down. A probe that cannot gather enough samples keeps probing — the
// duplicate and spend ceilings still bound what it costs.
package delay
