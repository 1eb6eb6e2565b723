package policy

import (
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
)

// Default returns the policy of an operation class that sets nothing: the
// engine's, the estimator's and the guardrail's own defaults, and the
// budgets measured for hedgerow. A configuration file's policies take these
// values for every key they leave out, and the simulator's hedgerow strategy
// runs them.
func Default() *Policy {
	engine := hedge.DefaultOptions()
	delays := delay.DefaultOptions()
	guardrail := delay.DefaultGuardrailOptions()
	return &Policy{
		Hedge:           true,
		Idempotent:      true, // completions have no side effects at the provider
		RolloutFraction: 1,
		ControlFraction: delay.DefaultControlFraction,
		Trigger:         Trigger(engine.Trigger),
		MaxAttempts:     engine.MaxAttempts,
		Delay: Delay{
			Quantile:      delays.Quantile,
			Min:           delays.Min,
			Max:           delays.Max,
			Initial:       delays.Initial,
			WarmupSamples: delays.WarmupSamples,
			Window:        delays.Window,
			Slots:         delays.Slots,
		},
		MinUsefulTime: engine.MinUsefulTime,
		Deadline:      engine.Deadline,
		CommitPoint:   engine.CommitPoint,
		// Measured with `hedgerow simulate` (the hedgerow strategy runs these
		// defaults): room above the ~5.5% a P95 delay asks for on gpt4o, and
		// a reserve for cold pools. No replacement reserve: replacements are never
		// refused, and each attempt of room a reserve keeps is a stall of a
		// burst left unhedged (over seeds 1–4, P99.9 2.99 s with a reserve of
		// 1, 2.76 s without). Two windows (docs/architecture.md §7): the
		// ceiling holds over a minute, where stalls that cluster by chance
		// average out (a 10 s window alone refused 24 hedges of `make
		// compare-peers` at 4.2% duplicates, 4 of hedgerow's 6 slowest
		// requests), and twice the ceiling bounds every 10 s, so an incident
		// adds little load within seconds (a 1-minute window alone let the
		// degraded workload hedge 27% of its worst 10 s).
		DuplicateRate: DuplicateRate{
			Ceiling:            0.08,
			Window:             time.Minute,
			BurstWindow:        10 * time.Second,
			BurstCeiling:       0.16,
			ReplacementReserve: 0,
			// Five stalls of a cold pool hedged at once, then one every
			// 10 s: the first stalls of a fresh gateway cost the caller
			// no more than the delay (issue 27's fault runs waited the
			// whole stall behind a floor of one).
			Reserve: Reserve{Burst: 5, PerMinute: 6},
		},
		Spend:             Spend{Window: time.Hour},
		AcceptTimeout:     engine.AcceptTimeout,
		HeartbeatInterval: engine.HeartbeatTimeout / 4,
		HeartbeatTimeout:  engine.HeartbeatTimeout,
		// The worker's own default: a few times the inter-token gaps of
		// the measured models, short against the deadline.
		StallAfterFirstToken: 2 * time.Second,
		// The least derived bound: a few times the slowest inter-token
		// gaps of fast models, so a cohort whose gaps are all tiny is not
		// cut by a scheduling hiccup.
		StallFloor: 500 * time.Millisecond,
		Guardrail: Guardrail{
			Enabled:              true,
			Quantile:             guardrail.Quantile,
			MinControlSamples:    guardrail.MinControlSamples,
			MinErrorSamples:      guardrail.MinErrorSamples,
			MinGain:              guardrail.MinRelativeGain,
			MaxErrorRateIncrease: guardrail.ErrorRateMargin,
			ProbeInterval:        guardrail.CoolDown,
		},
		// A provider's pushback speaks for its route, which every cohort of
		// the pool shares: none of them answers it with more load.
		PushbackScope: PushbackCohort,
	}
}
