package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/schemas"
)

// DefaultName is the name of the policy that applies when a request names
// no operation class.
const DefaultName = "default"

// Trigger says what a hedge delay is measured against.
type Trigger string

// Hedge triggers.
const (
	// TriggerFirstByte hedges when the primary has produced no first byte by
	// the delay, so long answers are not mistaken for stalls.
	TriggerFirstByte Trigger = "first_byte"
	// TriggerTotal hedges when the primary has not completed by the delay.
	TriggerTotal Trigger = "total"
)

// Policy is the hedging policy of one operation class.
type Policy struct {
	// Hedge turns hedging on for the class; it needs Idempotent.
	Hedge bool `yaml:"hedge"`
	// Idempotent says that running a request twice has no extra effect; only
	// idempotent classes may hedge.
	Idempotent bool `yaml:"idempotent"`
	// RolloutFraction is the share of groups allowed to hedge, in [0,1].
	RolloutFraction float64 `yaml:"rollout_fraction"`
	// ControlFraction is the share of groups whose primary-only run is the
	// guardrail's live baseline, in [0,1]. A control group hedges as any
	// group does; its primary runs on, unseen by its caller, past another
	// attempt's win to its own commit point, failure or the deadline, and
	// that run is its sample (docs/architecture.md §5).
	ControlFraction float64 `yaml:"control_fraction"`
	Trigger         Trigger `yaml:"trigger"`
	// MaxAttempts counts primary, hedges and replacements, 1..MaxAttemptsCap.
	MaxAttempts int   `yaml:"max_attempts"`
	Delay       Delay `yaml:"delay"`
	// MinUsefulTime is the least time before the deadline worth launching a
	// hedge or replacement into.
	MinUsefulTime time.Duration `yaml:"min_useful_time"`
	// SameRouteHedging lets a hedge use the primary's route when the pool has
	// no other eligible one.
	SameRouteHedging bool `yaml:"same_route_hedging"`
	// Deadline is the absolute budget of a whole user action.
	Deadline    time.Duration       `yaml:"deadline"`
	CommitPoint schemas.CommitPoint `yaml:"commit_point"`
	// DuplicateRate bounds extra attempts as a share of primaries per
	// cohort, over a sliding window.
	DuplicateRate DuplicateRate `yaml:"duplicate_rate"`
	Spend         Spend         `yaml:"spend"`
	// AcceptTimeout is how long a worker has to accept an attempt.
	AcceptTimeout time.Duration `yaml:"accept_timeout"`
	// HeartbeatInterval is how often a worker signals life, from its Accept
	// until its result.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// HeartbeatTimeout is the silence (no heartbeat, first byte or chunk)
	// after which an attempt counts as lost, before or after its first byte.
	HeartbeatTimeout time.Duration `yaml:"heartbeat_timeout"`
	// StallAfterFirstToken bounds the wait for each next token once the
	// first came: the worker cuts a provider stream silent that long and
	// fails the attempt as transient (docs/architecture.md §4 rule 4). It
	// is the cap of the bound a cohort derives from its inter-token gaps
	// (Class.StallBound), and the bound until the cohort has samples.
	StallAfterFirstToken time.Duration `yaml:"stall_after_first_token"`
	// StallFloor is the least stall bound a cohort derives from its
	// inter-token gaps, in (0, StallAfterFirstToken]; equal to
	// StallAfterFirstToken, it pins the bound there.
	StallFloor time.Duration `yaml:"stall_floor"`
	Guardrail  Guardrail     `yaml:"guardrail"`
	// PushbackScope is what a provider's pushback (429, 529, a 503 with
	// Retry-After) takes to primary-only until its Retry-After passes:
	// PushbackCohort (the default) every cohort of a pool holding a route
	// in pushback, PushbackRoute only the groups that met it
	// (docs/architecture.md §4 rule 4, §5).
	PushbackScope PushbackScope `yaml:"pushback_scope"`
}

// PushbackScope says how far a route's pushback stops hedging.
type PushbackScope string

// Pushback scopes.
const (
	// PushbackCohort: while a route of the pool is in pushback, no group of
	// the class on that pool hedges (guardrail decision pushback); a
	// replacement after a failure may still go to a route not in pushback.
	PushbackCohort PushbackScope = "cohort"
	// PushbackRoute: the route in pushback takes no attempt, and only the
	// group that met the pushback stops hedging.
	PushbackRoute PushbackScope = "route"
)

// Delay configures hedge-delay estimation.
type Delay struct {
	// Quantile of the cohort's primary latencies used as the delay, in (0,1).
	Quantile float64 `yaml:"quantile"`
	// Min and Max clamp the estimated delay.
	Min time.Duration `yaml:"min"`
	Max time.Duration `yaml:"max"`
	// Initial is the delay used until WarmupSamples latencies are known.
	Initial       time.Duration `yaml:"initial"`
	WarmupSamples int           `yaml:"warmup_samples"`
	// Window is the span of the rolling latency window, kept as Slots
	// mergeable sketches of Window/Slots each.
	Window time.Duration `yaml:"window"`
	Slots  int           `yaml:"slots"`
}

// DuplicateRate configures a cohort's duplicate-rate ceiling, a rate over a
// sliding Window (docs/architecture.md §7): a hedge goes only while the
// window's extra attempts (hedges and replacements), this one and the
// reserve included, stay within Ceiling × its primaries, so a burst of
// stalls is hedged at once while every window stays within the ceiling. A
// replacement is counted but never refused by it.
type DuplicateRate struct {
	// Ceiling is the largest share of extra attempts per primary over the
	// window, in (0,1].
	Ceiling float64 `yaml:"ceiling"`
	// Window is the span the rate is taken over, kept as
	// DuplicateWindowSlots counters (without a burst window) or as
	// counters a tenth of the burst window long.
	Window time.Duration `yaml:"window"`
	// BurstWindow and BurstCeiling bound bursts inside the window: over
	// the last BurstWindow, extra attempts stay within BurstCeiling of the
	// primaries too (docs/architecture.md §7, "two windows"); a
	// BurstCeiling under Ceiling counts as Ceiling. A zero BurstWindow
	// turns the burst bound off.
	BurstWindow  time.Duration `yaml:"burst_window"`
	BurstCeiling float64       `yaml:"burst_ceiling"`
	// ReplacementReserve is the room, in extra attempts per window, that
	// hedges leave under the ceiling for the replacements counted against it.
	ReplacementReserve float64 `yaml:"replacement_reserve"`
	// Reserve pays for a hedge the window has no room for: a cold or
	// quiet pool, whose window holds too few primaries for one extra
	// attempt, still hedges its first stalls.
	Reserve Reserve `yaml:"reserve"`
}

// Reserve is a pool's minimum hedging allowance, in the spirit of gRPC's
// retry throttle (a bucket that starts full) and Finagle's retry budget (a
// floor per second beside the percentage): a token bucket per pool and
// class holding Burst hedges, full when created, refilled by PerMinute
// (docs/architecture.md §7). Zero Burst turns it off.
type Reserve struct {
	Burst     float64 `yaml:"burst"`
	PerMinute float64 `yaml:"per_minute"`
}

// Spend configures spend ceilings in usage units; zero means no ceiling.
type Spend struct {
	// PerUserAction caps the units all attempts of one user action reserve.
	PerUserAction int64 `yaml:"per_user_action"`
	// PerTenantWindow caps one tenant's units in this class per Window.
	PerTenantWindow int64         `yaml:"per_tenant_window"`
	Window          time.Duration `yaml:"window"`
}

// Guardrail configures when hedging is switched off for a cohort because it
// does not pay: the latency quantile of control groups is compared with that
// of hedged groups once both have MinControlSamples samples, and their error
// rates once both have MinErrorSamples.
type Guardrail struct {
	Enabled bool `yaml:"enabled"`
	// Quantile compared between control and hedged groups, in (0,1).
	Quantile float64 `yaml:"quantile"`
	// MinControlSamples is the least number of control samples before the
	// guardrail decides anything.
	MinControlSamples int `yaml:"min_control_samples"`
	// MinErrorSamples is the least number of samples of each arm before
	// the error-rate rule decides: far fewer than MinControlSamples, so
	// failing hedges are switched off on modest traffic.
	MinErrorSamples int `yaml:"min_error_samples"`
	// MinGain is the least relative reduction of the quantile, in [0,1),
	// below which the gain counts as flat.
	MinGain float64 `yaml:"min_gain"`
	// MaxErrorRateIncrease is the largest rise of the error rate of hedged
	// groups over control groups, in [0,1], before hedging is disabled.
	MaxErrorRateIncrease float64 `yaml:"max_error_rate_increase"`
	// ProbeInterval is how long hedging stays off before it is probed again.
	ProbeInterval time.Duration `yaml:"probe_interval"`
}

// Tenant is a caller of the front doors: the hashes of its API keys, and a
// spend limit of its own across every class. With no tenants configured the
// front doors require no API key, which suits only local use.
type Tenant struct {
	// APIKeyHashes are "sha256:<64 hex digits>" hashes of the tenant's API
	// keys (see HashAPIKey); plaintext keys are refused.
	APIKeyHashes []string `yaml:"api_key_hashes"`
	// SpendLimit caps the tenant's units across all classes per SpendWindow;
	// zero means no limit.
	SpendLimit  int64         `yaml:"spend_limit"`
	SpendWindow time.Duration `yaml:"spend_window"`
	// RequestsPerSecond, Burst and MaxConcurrent are the tenant's request
	// limits, which the front doors apply (frontdoor/tenantlimit), not the
	// dispatcher: a token bucket refilled at RequestsPerSecond holding
	// Burst requests (zero: the rate rounded up), and at most
	// MaxConcurrent requests in flight. Zero is no limit.
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	Burst             int     `yaml:"burst"`
	MaxConcurrent     int     `yaml:"max_concurrent"`
	// Reports lets the tenant's keys read the records report and the kept
	// records on a gateway (GET /v1/hedgerow/report and /v1/hedgerow/records,
	// docs/architecture.md §9); default false: a caller's key reads nobody's
	// records.
	Reports bool `yaml:"reports"`
}

// HashAPIKey returns the form in which tenants' API keys are configured and
// compared: "sha256:" followed by the lowercase hex SHA-256 of the key.
func HashAPIKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Engine returns the part of the policy the hedge engine enforces.
func (p *Policy) Engine() hedge.Options {
	e := hedge.DefaultOptions()
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

// DelayOptions returns the hedge-delay estimator's configuration.
func (p *Policy) DelayOptions() delay.Options {
	c := delay.DefaultOptions()
	c.Quantile = p.Delay.Quantile
	c.Min, c.Max, c.Initial = p.Delay.Min, p.Delay.Max, p.Delay.Initial
	c.WarmupSamples = p.Delay.WarmupSamples
	c.Window, c.Slots = p.Delay.Window, p.Delay.Slots
	return c
}

// GuardrailOptions returns the guardrail's configuration.
func (p *Policy) GuardrailOptions() delay.GuardrailOptions {
	c := delay.DefaultGuardrailOptions()
	c.Quantile = p.Guardrail.Quantile
	c.MinControlSamples = p.Guardrail.MinControlSamples
	c.MinErrorSamples = p.Guardrail.MinErrorSamples
	c.MinRelativeGain = p.Guardrail.MinGain
	c.ErrorRateMargin = p.Guardrail.MaxErrorRateIncrease
	c.CoolDown = p.Guardrail.ProbeInterval
	return c
}

// DuplicateWindowSlots is the number of counters a duplicate-rate window is
// kept as without a burst window (its rate slides by a tenth of the
// window), and the number the burst window spans with one.
const DuplicateWindowSlots = 10

// DuplicateCeiling returns the cohort's duplicate-rate ceiling every primary
// is counted in and every hedge must fit under. With a burst window, the
// counters are a tenth of the burst window long, the window is as many of
// them as it spans, and the burst bound is taken over its last
// DuplicateWindowSlots (a burst window longer than the window spans it).
func (p *Policy) DuplicateCeiling() budgets.DuplicateCeiling {
	d := p.DuplicateRate
	c := budgets.DuplicateCeiling{
		Ceiling: d.Ceiling, Window: d.Window, Slots: DuplicateWindowSlots,
		ReplacementReserve: d.ReplacementReserve,
	}
	if d.BurstWindow > 0 {
		slot := min(d.BurstWindow, d.Window) / DuplicateWindowSlots
		c.Slots = int(d.Window / slot)
		// Never below the window's own ceiling: a class that raises its
		// ceiling (up to 1, hedge everything) is not held under the
		// default burst ceiling it did not set.
		c.BurstSlots, c.BurstCeiling = DuplicateWindowSlots, max(d.BurstCeiling, d.Ceiling)
	}
	return c
}

// ReserveBucket returns the pool's reserve as the budget store's bucket.
func (p *Policy) ReserveBucket() budgets.ReserveBucket {
	r := p.DuplicateRate.Reserve
	return budgets.ReserveBucket{Capacity: r.Burst, RefillPerSecond: r.PerMinute / 60}
}

// DuplicateWindow names the duplicate-rate window a group's attempts count
// in: one per class and pool, where the duplicate load lands, shared by
// every cohort of the class on the pool (stream mode, max_tokens bucket and
// kind), which keep their own delays (docs/architecture.md §7). A window
// per cohort left most cohorts quiet, and a quiet cohort could not hedge
// its first stalls however busy its pool.
func DuplicateWindow(c delay.Cohort) string {
	return c.Operation + "/" + c.Model
}
