package hedge

import (
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// Event is something that happened to a group: a request arriving, a worker
// report, a timer, or the answer to a question the engine asked.
type Event interface{ isEvent() }

// ReservationID names a budget reservation; the engine treats it as opaque and
// only promises to settle or release each one exactly once.
type ReservationID string

// Start begins a group. It must be the first event.
type Start struct {
	// Streaming is true when the caller streams; non-streaming requests always
	// commit at the complete answer.
	Streaming bool
	// NeedsCompleteAnswer is true when the contract can only be judged on the
	// whole answer (JSON schema, complete finish reason, required fields): the
	// commit point moves to complete.
	NeedsCompleteAnswer bool
	// HedgeEligible says whether this group may hedge at all: idempotent
	// operation class, inside the rollout fraction, at least two eligible
	// routes (or same-route hedging), guardrail not disabling it.
	HedgeEligible bool
	// NotEligibleReason is recorded as the hedge's suppression reason when
	// HedgeEligible is false (e.g. "rollout", "guardrail").
	NotEligibleReason string
	// Control marks a control group (docs/architecture.md §5): it hedges as
	// any group does, but its baseline — the attempt a primary-only group
	// would still be running when the hedge launched — is not stopped when
	// another attempt wins. It runs on, unseen by the caller, to its own
	// commit point, its own failure or the deadline, and GroupEnded.Baseline
	// says what the group would have measured had it run primary-only.
	Control bool
	// HedgeDelay is the cohort's current delay, already clamped by the estimator.
	HedgeDelay time.Duration
	// InputUnits is the estimated input size, billed for every attempt that
	// reached a provider when the provider's own report is missing.
	InputUnits int64
	// DecodeTokensPerSecond is the cohort's decode rate, used to estimate the
	// output billed to a cancelled attempt (docs/architecture.md §7).
	DecodeTokensPerSecond float64
	// Continuable says a committed stream of this group may be rescued by
	// a continuation attempt (Options.Rescues): the request's answer can
	// be continued from partial text and its pool has a route that
	// continues (docs/architecture.md §6, "Rescue").
	Continuable bool
	// StallBound is how long the committed stream may wait for its next
	// token before a continuation starts beside it (the stalled attempt
	// keeps its chance); zero watches no stall, and only a break the
	// worker reports is rescued.
	StallBound time.Duration
}

// Admitted answers Admit.
type Admitted struct {
	Allowed bool
	// Reason says why admission was refused; Error is the stable error the group
	// fails with (ErrBudgetExhausted, ErrNoRoute, ErrRateLimited...).
	Reason string
	Error  schemas.ErrorCode
	// Route is the primary's route and Reservation its spend reservation.
	Route       string
	Reservation ReservationID
}

// TimerKind names the engine's timers.
type TimerKind string

const (
	TimerHedge       TimerKind = "hedge"
	TimerDeadline    TimerKind = "deadline"
	TimerAccept      TimerKind = "accept"       // per attempt: no Accept in time
	TimerHeartbeat   TimerKind = "heartbeat"    // per attempt: no reply (heartbeat, first byte, chunk) for HeartbeatTimeout
	TimerAttempt     TimerKind = "attempt"      // per attempt: the policy's per-try timeout
	TimerCancelGrace TimerKind = "cancel_grace" // per attempt: no report after a cancel
	TimerReoffer     TimerKind = "reoffer"      // per attempt: the backoff after a Busy ended
	TimerStall       TimerKind = "stall"        // per attempt: the committed stream's next token is Start.StallBound late
)

// TimerFired reports that a timer armed by ArmTimer reached its time.
type TimerFired struct {
	Kind    TimerKind
	Attempt int // 0 for group timers (hedge, deadline)
}

// Accepted reports the worker's Accept of an attempt.
type Accepted struct{ Attempt int }

// Busy reports that the worker refused an attempt at its in-flight limit.
// It is backpressure, not a failure (docs/architecture.md §4 rule 4): the
// attempt is offered again, with Reoffer, until the policy's QueueWait.
type Busy struct{ Attempt int }

// Unserved reports that no worker could take an attempt: NATS answered its
// publication that the route's subject has no subscriber (no responders),
// before any worker accepted it. Nothing reached a provider, so like Busy it
// spends no slot: the attempt is offered again at once, with Reoffer, to a
// route with a worker, at most MaxUnservedReoffers times; after that it
// fails transient as no_responders (docs/architecture.md §4 rule 4).
type Unserved struct{ Attempt int }

// Reoffered answers Reoffer: the attempt was published again to Route.
type Reoffered struct {
	Attempt int
	Route   string
}

// Heartbeat reports a worker heartbeat: the attempt is alive, before and
// after its first byte (docs/architecture.md §8).
type Heartbeat struct{ Attempt int }

// FirstByte reports the provider's first byte for an attempt.
type FirstByte struct{ Attempt int }

// Progress reports streamed output of an attempt. Tokens is cumulative;
// FirstToken is true once a content or tool-call token has arrived; Valid is
// the arbiter's verdict on the stream so far (well-formed, contract-valid).
type Progress struct {
	Attempt    int
	Tokens     int
	FirstToken bool
	Valid      bool
}

// Result reports how an attempt ended on the worker's side.
type Result struct {
	Attempt int
	Status  schemas.StatusClass
	// Scope is ScopeNone for an answer; otherwise it decides what the failure
	// reaches (docs/architecture.md §4 rule 4).
	Scope schemas.ErrorScope
	// Valid is the arbiter's verdict on the complete answer at the commit point.
	// For a winner committed at a streaming point it is the verdict on what
	// that point could not see: an ok result that is not valid ends the
	// committed stream as contract_invalid.
	Valid bool
	Usage schemas.Usage
	// RetryAfter is the provider's pushback period (zero: the policy's default).
	RetryAfter time.Duration
	// Truncated says an ok answer that is not Valid failed only because it
	// ended at its length limit below the max_tokens asked: a continuation
	// may finish it, where it could not finish one the content filter
	// ended (docs/architecture.md §6, "Rescue").
	Truncated bool
	// Error is the stable error a group-scoped failure ends the group with.
	Error schemas.ErrorCode
}

// CancelObserved reports that a cancelled attempt stopped, with the usage the
// worker saw (possibly partial).
type CancelObserved struct {
	Attempt int
	Usage   schemas.Usage
}

// HedgeBudgetDecided answers AskHedgeBudget.
type HedgeBudgetDecided struct {
	Allowed     bool
	Reason      string // why it was refused: "duplicate_rate", "spend", "no_route", "budget_unavailable"...
	Route       string
	Reservation ReservationID
}

// GateDecided answers Elect with the winner gate's decision.
type GateDecided struct {
	Attempt int
	Won     bool
	// Gate is the gate value (group/attempt/epoch) that travels with a winner.
	Gate string
	// Holder names the group that holds the gate when Won is false.
	Holder string
	// Unavailable reports that no store could decide and the gate refused
	// to decide locally (gate.on_unavailable): the group fails
	// gate_unavailable, as committing might commit the user action twice.
	Unavailable bool
}

// CallerGone reports that the caller went away: everything is cancelled, and
// nothing falls back.
type CallerGone struct{}

func (Start) isEvent()              {}
func (Admitted) isEvent()           {}
func (TimerFired) isEvent()         {}
func (Accepted) isEvent()           {}
func (Busy) isEvent()               {}
func (Unserved) isEvent()           {}
func (Reoffered) isEvent()          {}
func (Heartbeat) isEvent()          {}
func (FirstByte) isEvent()          {}
func (Progress) isEvent()           {}
func (Result) isEvent()             {}
func (CancelObserved) isEvent()     {}
func (HedgeBudgetDecided) isEvent() {}
func (GateDecided) isEvent()        {}
func (CallerGone) isEvent()         {}
