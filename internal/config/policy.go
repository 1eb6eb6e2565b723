package config

import (
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
)

// Defaults returns the policy a file that sets nothing gets: every default of
// the table, as the simulator's hedgerow strategy runs them.
func Defaults() *Policy {
	c := &Config{Policies: map[string]*Policy{DefaultPolicy: {}}}
	if err := applyDefaults(c, func(string) bool { return false }); err != nil {
		panic(err) // the defaults table is checked by tests; this cannot fail at run time
	}
	return c.Policies[DefaultPolicy]
}

// Engine returns the part of the policy the hedge engine enforces.
func (p *Policy) Engine() hedge.Policy {
	e := hedge.DefaultPolicy()
	e.Trigger = hedge.Trigger(p.Trigger)
	e.MaxAttempts = p.MaxAttempts
	e.Deadline = p.Deadline
	e.MinUsefulTime = p.MinUsefulTime
	e.CommitPoint = p.CommitPoint
	e.AcceptTimeout = p.AcceptTimeout
	e.HeartbeatTimeout = p.HeartbeatTimeout
	e.SameRouteHedging = p.SameRouteHedging
	return e
}

// DelayConfig returns the hedge-delay estimator's configuration.
func (p *Policy) DelayConfig() delay.Config {
	c := delay.DefaultConfig()
	c.Quantile = p.Delay.Quantile
	c.Min, c.Max, c.Initial = p.Delay.Min, p.Delay.Max, p.Delay.Initial
	c.WarmupSamples = p.Delay.WarmupSamples
	c.Window, c.Slots = p.Delay.Window, p.Delay.Slots
	return c
}

// GuardrailConfig returns the guardrail's configuration.
func (p *Policy) GuardrailConfig() delay.GuardrailConfig {
	c := delay.DefaultGuardrailConfig()
	c.Quantile = p.Guardrail.Quantile
	c.MinControlSamples = p.Guardrail.MinControlSamples
	c.MinRelativeGain = p.Guardrail.MinGain
	c.ErrorRateMargin = p.Guardrail.MaxErrorRateIncrease
	c.CoolDown = p.Guardrail.ProbeInterval
	return c
}

// DuplicateBucket returns the cohort bucket every primary deposits into and
// every hedge or replacement draws from.
func (p *Policy) DuplicateBucket() budgets.DuplicateBucket {
	d := p.DuplicateRate
	return budgets.DuplicateBucket{Ratio: d.Ceiling, Capacity: d.Capacity, InitialFill: d.InitialFill, ReplacementReserve: d.ReplacementReserve}
}

// FloorBucket returns the pool's floor bucket.
func (p *Policy) FloorBucket() budgets.FloorBucket {
	return budgets.FloorBucket{Capacity: p.DuplicateRate.PoolFloor, RefillPerSecond: p.DuplicateRate.PoolFloorRefill}
}
