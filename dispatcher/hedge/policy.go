package hedge

import (
	"errors"
	"fmt"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// Trigger says what the hedge timer waits for.
type Trigger string

const (
	// TriggerFirstByte hedges when no attempt has produced its first byte by
	// the delay, so long answers are not mistaken for stalls. The default.
	TriggerFirstByte Trigger = "first_byte"
	// TriggerTotal hedges when no valid result has arrived by the delay.
	TriggerTotal Trigger = "total"
)

// MaxAttemptsCap is the hard cap on attempts per group: primary, hedges and
// replacements together.
const MaxAttemptsCap = 4

// Options is the part of an operation class's policy the engine enforces.
// The zero value is not valid; start from DefaultOptions.
type Options struct {
	Trigger Trigger
	// MaxAttempts counts primary + hedges + replacements (1..MaxAttemptsCap).
	MaxAttempts int
	// Deadline is measured from Start and covers the whole group.
	Deadline time.Duration
	// MinUsefulTime is the least time left for which another attempt is launched.
	MinUsefulTime time.Duration
	// CommitPoint is where a streaming answer may win; non-streaming requests
	// and contracts that need the whole answer always use complete.
	CommitPoint schemas.CommitPoint
	// AcceptTimeout bounds the wait for a worker's Accept.
	AcceptTimeout time.Duration
	// HeartbeatTimeout bounds an attempt's silence (no heartbeat, first byte
	// or chunk) from its Accept until it ends, after its first byte too:
	// a silent attempt is lost (docs/architecture.md §4 rule 4). Zero
	// disables the check.
	HeartbeatTimeout time.Duration
	// AttemptTimeout is a per-try timeout after which the attempt is cancelled
	// and treated as a transient failure; zero (the default) disables it. It
	// exists to model sequential timeout-and-retry gateways.
	AttemptTimeout time.Duration
	// CancelGrace bounds the wait for a cancelled attempt's report before its
	// usage is estimated and its record written without it.
	CancelGrace time.Duration
	// QueueWait bounds how long an attempt refused Busy is offered again
	// (same attempt, no new slot) before the group gives up with overloaded
	// (docs/architecture.md §4 rule 4); never past the deadline. Zero gives
	// up at the first Busy.
	QueueWait time.Duration
	// BusyBackoff is the pause before the first re-offer of a refused
	// attempt; it doubles with every Busy, up to 8× (maxBusyBackoffFactor).
	BusyBackoff time.Duration
	// SameRouteHedging allows a hedge or replacement on a route the group used.
	SameRouteHedging bool
	// PushbackTTL is used when a pushback carries no Retry-After.
	PushbackTTL time.Duration
	// QuarantineTTL is how long a route-local permanent failure benches a route.
	QuarantineTTL time.Duration
	// FailFast ends the group with the first failure of any scope, as gateways
	// that take the first response do. Off in hedgerow's own policies; it
	// exists to model peer strategies.
	FailFast bool
	// Rescues is how many continuation attempts a committed stream that
	// breaks may get (pools.*.rescue.max, 0..MaxRescues); zero (the
	// default) ends a broken stream with an error (docs/architecture.md
	// §6, "Rescue"). A continuation may go beyond MaxAttempts.
	Rescues int
}

// MaxRescues caps Options.Rescues.
const MaxRescues = 3

// DefaultOptions returns hedgerow's defaults (docs/architecture.md §4, §8, §11).
func DefaultOptions() Options {
	return Options{
		Trigger:          TriggerFirstByte,
		MaxAttempts:      2,
		Deadline:         30 * time.Second,
		MinUsefulTime:    500 * time.Millisecond,
		CommitPoint:      schemas.FirstToken,
		AcceptTimeout:    time.Second,
		HeartbeatTimeout: 3 * time.Second,
		CancelGrace:      2 * time.Second,
		QueueWait:        time.Second,
		BusyBackoff:      10 * time.Millisecond,
		PushbackTTL:      5 * time.Second,
		QuarantineTTL:    time.Minute,
	}
}

// ErrInvalidOptions is wrapped by every error Options.Validate returns.
var ErrInvalidOptions = errors.New("hedge: invalid options")

// Validate reports the first field that is out of range.
func (p Options) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOptions, fmt.Sprintf(format, args...))
	}
	switch {
	case p.Trigger != TriggerFirstByte && p.Trigger != TriggerTotal:
		return bad("trigger %q: want first_byte or total", p.Trigger)
	case p.MaxAttempts < 1 || p.MaxAttempts > MaxAttemptsCap:
		return bad("max_attempts %d: want 1..%d", p.MaxAttempts, MaxAttemptsCap)
	case p.Deadline <= 0:
		return bad("deadline %v: must be positive", p.Deadline)
	case p.MinUsefulTime < 0 || p.MinUsefulTime >= p.Deadline:
		return bad("min_useful_time %v: want 0 ≤ it < deadline %v", p.MinUsefulTime, p.Deadline)
	case p.AcceptTimeout <= 0:
		return bad("accept_timeout %v: must be positive", p.AcceptTimeout)
	case p.HeartbeatTimeout < 0 || p.AttemptTimeout < 0:
		return bad("heartbeat_timeout and attempt_timeout must not be negative")
	case p.CancelGrace <= 0:
		return bad("cancel_grace %v: must be positive", p.CancelGrace)
	case p.QueueWait < 0 || p.BusyBackoff <= 0:
		return bad("queue_wait %v must not be negative and busy_backoff %v must be positive", p.QueueWait, p.BusyBackoff)
	case p.PushbackTTL <= 0 || p.QuarantineTTL <= 0:
		return bad("pushback_ttl and quarantine_ttl must be positive")
	case p.Rescues < 0 || p.Rescues > MaxRescues:
		return bad("rescues %d: want 0..%d", p.Rescues, MaxRescues)
	}
	switch p.CommitPoint.Kind {
	case schemas.CommitFirstToken, schemas.CommitComplete:
	case schemas.CommitTokens:
		if p.CommitPoint.Tokens < 1 {
			return bad("commit point %v: token count must be ≥ 1", p.CommitPoint)
		}
	default:
		return bad("commit point %q: unknown", p.CommitPoint.Kind)
	}
	return nil
}
