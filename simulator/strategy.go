package simulator

import (
	"fmt"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// Strategy names, docs/architecture.md §11.
const (
	StrategyNone           = "none"
	StrategyFanout2        = "fanout2"
	StrategyTimeoutRetry   = "timeout-retry"
	StrategyFixedDelay     = "fixed-delay"
	StrategyQuantileBudget = "quantile-budget"
	StrategyHedgerow       = "hedgerow"
)

// StrategyNames lists every strategy in the order reports show them.
func StrategyNames() []string {
	return []string{StrategyNone, StrategyFanout2, StrategyTimeoutRetry, StrategyFixedDelay, StrategyQuantileBudget, StrategyHedgerow}
}

// delayMode says where a strategy's hedge delay comes from.
type delayMode int

const (
	delayNone      delayMode = iota // never hedges
	delayFixed                      // a constant
	delayEstimated                  // dispatcher/delay estimator (per cohort or one global)
)

// budgetMode says which ceilings a strategy's extra attempts must pass.
type budgetMode int

const (
	budgetNone  budgetMode = iota // every extra attempt allowed
	budgetStore                   // budgets.Store duplicate-rate ceiling
)

// strategy is one way of running the same workload. Every strategy is the
// same engine (dispatcher/hedge) with a different policy and driver choices:
// what differs between gateways is configuration, not mechanism.
type strategy struct {
	name   string
	policy hedge.Options
	delay  delayMode
	fixed  time.Duration
	// rules is the class policy the dispatcher's rules apply to the
	// strategy's groups: eligibility, the estimator's configuration and
	// samples (when delay is delayEstimated), the guardrail.
	rules *policy.Policy
	// globalCohort pools every request into one cohort (no cohorts).
	globalCohort bool
	// observeGroup feeds the estimator each committed group's latency rather
	// than the primary's own time to first byte (a naive quantile hedger).
	observeGroup bool
	budget       budgetMode
	duplicates   budgets.DuplicateCeiling
	reserve      budgets.ReserveBucket
	// routeAware picks routes by power of two choices, honouring pushback and
	// quarantine; otherwise routes are drawn uniformly, the same one allowed.
	routeAware bool
}

func newStrategy(name string, cond workload.Conditions) (strategy, error) {
	p := hedge.DefaultOptions()
	p.Deadline = cond.Deadline
	// Simulated workers neither die nor stall before accepting: the timers
	// that detect those are exercised by the live runtime's tests instead.
	p.HeartbeatTimeout = 0
	p.CancelGrace = time.Second
	s := strategy{name: name, policy: p}
	switch name {
	case StrategyNone:
		s.policy.MaxAttempts = 1
	case StrategyFanout2:
		s.policy.Trigger = hedge.TriggerTotal
		s.delay, s.fixed = delayFixed, 0
	case StrategyTimeoutRetry:
		s.policy.AttemptTimeout = 3 * time.Second
	case StrategyFixedDelay:
		s.policy.Trigger = hedge.TriggerTotal
		s.policy.FailFast = true
		s.delay, s.fixed = delayFixed, time.Second
	case StrategyQuantileBudget:
		s.policy.Trigger = hedge.TriggerTotal
		s.delay = delayEstimated
		s.rules = peerRules(s.policy.Trigger)
		s.rules.Delay = policy.Delay{Quantile: 0.95, Min: 0, Max: cond.Deadline, Initial: time.Second, WarmupSamples: 20, Window: 30 * time.Second, Slots: 6}
		s.globalCohort = true
		s.observeGroup = true
		s.budget = budgetStore
		// A retry budget in the manner of Finagle's: 20% of the requests
		// of the last 10 s, no reserve.
		s.duplicates = budgets.DuplicateCeiling{Ceiling: 0.20, Window: 10 * time.Second, Slots: 10}
	case StrategyHedgerow:
		// This project's defaults: exactly what a configuration that sets
		// nothing runs, pinned conditions aside.
		return configuredStrategy(name, policy.Default(), cond)
	default:
		return strategy{}, fmt.Errorf("unknown strategy %q (want one of %s)", name, strings.Join(StrategyNames(), ", "))
	}
	if s.rules == nil {
		s.rules = peerRules(s.policy.Trigger)
	}
	return s, s.policy.Validate()
}

// configuredStrategy runs a class policy as the dispatcher runs it: its
// engine policy, estimated delay, duplicate ceiling and reserve, route-aware
// picking. rules is taken as it is, its deadline set to the conditions'.
func configuredStrategy(name string, rules *policy.Policy, cond workload.Conditions) (strategy, error) {
	rules.Deadline = cond.Deadline
	s := strategy{name: name, rules: rules, policy: rules.Engine()}
	s.policy.Deadline = cond.Deadline
	// As for every strategy: simulated workers neither die nor stall
	// before accepting.
	s.policy.HeartbeatTimeout = 0
	s.policy.CancelGrace = time.Second
	s.delay = delayEstimated
	s.budget = budgetStore
	s.duplicates = rules.DuplicateCeiling()
	s.reserve = rules.ReserveBucket()
	s.routeAware = true
	return s, s.policy.Validate()
}

// peerRules is the class policy of a peer strategy: it may hedge every
// group, onto any route, the primary's too, with no control groups and no
// guardrail.
func peerRules(trigger hedge.Trigger) *policy.Policy {
	p := policy.Default()
	p.Trigger = policy.Trigger(trigger)
	p.SameRouteHedging = true
	p.ControlFraction = 0
	p.Guardrail.Enabled = false
	return p
}
