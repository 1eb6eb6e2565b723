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
	engine := hedge.DefaultPolicy()
	delays := delay.DefaultConfig()
	guardrail := delay.DefaultGuardrailConfig()
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
		// defaults): room above the ~5.5% a P95 delay asks for on gpt4o, over
		// a 10-second window (500 primaries at the pinned 50/s), and a floor
		// for cold cohorts. No reserve: replacements are never refused, and
		// each attempt of room a reserve keeps is a stall of a burst left
		// unhedged (over seeds 1–4, P99.9 2.99 s with a reserve of 1, 2.76 s
		// without); a 30 s window cuts it to 2.54 s but lets the worst 10 s of
		// the degraded workload hedge 14%.
		DuplicateRate: DuplicateRate{
			Ceiling:            0.08,
			Window:             10 * time.Second,
			ReplacementReserve: 0,
			PoolFloor:          1,
			PoolFloorRefill:    0.05,
		},
		Spend:             Spend{Window: time.Hour},
		AcceptTimeout:     engine.AcceptTimeout,
		HeartbeatInterval: engine.HeartbeatTimeout / 4,
		HeartbeatTimeout:  engine.HeartbeatTimeout,
		// The worker's own default: a few times the inter-token gaps of
		// the measured models, short against the deadline.
		StallAfterFirstToken: 2 * time.Second,
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
