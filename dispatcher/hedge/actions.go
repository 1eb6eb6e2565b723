package hedge

import (
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// Action is something the driver must do for the group.
type Action interface{ isAction() }

// Admit asks the driver to admit the group: one attempt slot from the user
// action's ledger, a spend reservation and a primary route. Answer with Admitted.
type Admit struct{}

// Launch sends an attempt to Route. Deadline is absolute and Remaining is the
// time left when it was launched: workers bound the upstream call by whichever
// ends first, so clock skew between hosts cannot extend the group.
type Launch struct {
	Attempt     int
	Route       string
	Role        schemas.Role
	Deadline    time.Time
	Remaining   time.Duration
	Reservation ReservationID
}

// ArmTimer asks for TimerFired{Kind, Attempt} at At. Timers are never
// cancelled: the engine ignores those that no longer matter.
type ArmTimer struct {
	Kind    TimerKind
	Attempt int
	At      time.Time
}

// AskHedgeBudget asks whether another attempt may launch, and where. A hedge
// takes a duplicate-rate token; a replacement does not. The route must differ
// from Exclude unless SameRoute allows reusing one. Answer with HedgeBudgetDecided.
type AskHedgeBudget struct {
	Attempt   int // the number the new attempt will have
	Role      schemas.Role
	Exclude   []string
	SameRoute bool
}

// Reoffer publishes a refused attempt again — the same attempt number, its
// slot and reservation kept — to the least-loaded route of the pool other
// than Busy (the route that refused it), or to Busy when no other has room
// (docs/architecture.md §4 rule 4). Answer with Reoffered, naming the route.
//
// After Unserved, Unserved is set and Busy names the route without a
// worker: the attempt goes only to a route that has one, and when none is
// left the runtime answers Result (no_responders) instead of Reoffered.
type Reoffer struct {
	Attempt  int
	Busy     string
	Unserved bool
}

// Elect asks the winner gate to elect Attempt. Answer with GateDecided.
type Elect struct{ Attempt int }

// Cancel tells the worker running Attempt to stop. A cancel decided before the
// worker's Accept is sent when the Accept arrives.
type Cancel struct {
	Attempt int
	Reason  CancelReason
}

// CancelReason says why an attempt was cancelled.
type CancelReason string

const (
	CancelLostRace   CancelReason = "lost_race"   // another attempt committed
	CancelDeadline   CancelReason = "deadline"    // the group's deadline passed
	CancelCallerGone CancelReason = "caller_gone" // the caller went away
	CancelGroupError CancelReason = "group_error" // a group-scoped failure ended the group
	CancelTimeout    CancelReason = "timeout"     // the policy's per-try timeout
	CancelInvalid    CancelReason = "invalid"     // the stream broke the contract
)

// Commit makes Attempt the group's winner. Gate is the winner gate's value.
type Commit struct {
	Attempt int
	Gate    string
	// Kept is a control group's baseline attempt that this commit does not
	// stop (0: none; Start.Control). It runs on, unseen by the caller, to
	// its own commit point, where it is cancelled as the race's loser, to
	// its own failure, or to the deadline; it is never elected. A driver
	// passes none of its bytes to the caller, and counts its usage as a
	// loser's when it ends.
	Kept int
}

// Splice says the caller's committed stream goes on with Attempt's output,
// a continuation that produced its first token (or its whole answer)
// before the attempt it continues, From, produced another: none of From's
// output reaches the caller from here on, and From is cancelled if it
// still runs (docs/architecture.md §6, "Rescue").
type Splice struct {
	Attempt int
	From    int
}

// StreamEnded says how the caller's committed stream ended, once: Status
// ok when the answer is whole (Attempt, the last attempt whose output it
// carried, gave its end), otherwise why it broke and no continuation could
// finish it — StatusTimeout at the deadline, StatusCanceled when its caller
// left. A group that committed a complete answer has none: its Commit is
// the answer.
type StreamEnded struct {
	Attempt int
	Status  schemas.StatusClass
	Scope   schemas.ErrorScope
}

// Fail ends the group with one stable error.
type Fail struct {
	Error schemas.ErrorCode
	Scope schemas.ErrorScope
	// Holder names the group that committed the user action (already_committed).
	Holder string
	// Refused is why nothing was left to try when the group failed after an
	// attempt's failure: the suppression reason of its last refused
	// replacement — ReasonNoSlot (max_attempts spent), the driver's
	// no_route (every route of the pool was tried or is unhealthy),
	// ReasonNoTime, a budget's refusal — or "" when none was refused.
	// all_routes_failed tells its caller which (docs/architecture.md §4
	// rule 4).
	Refused string
}

// Release returns an unused reservation whole.
type Release struct{ Reservation ReservationID }

// Settle charges an attempt's reservation with its usage. Usage.Estimated is
// set when the figure is an estimate rather than the provider's report.
type Settle struct {
	Attempt     int
	Reservation ReservationID
	Usage       schemas.Usage
	// Lost says the attempt was lost through no fault of its caller: it
	// ended lost (schemas.StatusLost: its worker went silent or its stream
	// broke), or its group's commit was refused by a winner gate that
	// could not decide (gate_unavailable: a Redis and ledger outage, a
	// stream without a leader). Its ledger slot is forgiven, so the fault
	// does not spend a retry's attempts (docs/architecture.md §7).
	Lost bool
}

// ClearGate removes this group's gate claim for Attempt (compare-and-delete):
// the group claimed the gate but did not commit.
type ClearGate struct {
	Attempt int
	Gate    string
}

// RouteMark says how a route is to be marked for everyone.
type RouteMark string

const (
	MarkPushback   RouteMark = "pushback"
	MarkQuarantine RouteMark = "quarantine"
)

// MarkRoute marks a route in pushback or quarantine for TTL.
type MarkRoute struct {
	Route string
	Mark  RouteMark
	TTL   time.Duration
}

// HedgeSuppressed records that a hedge or replacement was considered and not
// launched. Suppression is a load decision, not an error.
type HedgeSuppressed struct {
	Role   schemas.Role
	Reason string
}

// AttemptEnded is an attempt's one terminal record.
type AttemptEnded struct {
	Attempt              int
	Route                string
	Role                 schemas.Role
	Outcome              Outcome
	Status               schemas.StatusClass
	Scope                schemas.ErrorScope
	ContractValid        bool
	CancellationSent     bool
	CancellationObserved bool
	Elapsed              time.Duration
	FirstByte            time.Duration // zero when none arrived
	Usage                schemas.Usage
}

// Outcome is how an attempt ended, from the group's point of view.
type Outcome string

const (
	OutcomeWinner        Outcome = "winner"         // elected, or a continuation spliced into the committed stream
	OutcomeLoserCanceled Outcome = "loser_canceled" // cancelled and stopped (or presumed stopped)
	OutcomeLoserLate     Outcome = "loser_late"     // completed after the group was decided
	OutcomeFailed        Outcome = "failed"         // ended by its own failure
	OutcomeCanceled      Outcome = "canceled"       // cancelled by deadline, caller or group error
)

// Answered says that the caller's part of a committed group is over while
// a kept baseline (Commit.Kept) still runs: every other attempt ended. A
// driver that holds its answer for the attempts' total usage hands it over
// now rather than at GroupEnded, so the caller never waits for the
// baseline. Usage is the ended attempts' usage plus what the baseline had
// used by now, estimated as a cancelled loser's (docs/architecture.md §5).
// Emitted at most once, and only while a baseline is kept.
type Answered struct {
	Usage schemas.Usage
}

// Baseline is what a control group (Start.Control) would have measured had
// it run primary-only (docs/architecture.md §5): the run of its baseline
// attempt — the primary, or the replacement that took its place before the
// hedge launched — which a commit of another attempt does not stop.
type Baseline struct {
	// Observed: the group's run tells what a primary-only group would have
	// measured. False for a group that is not a control group, and for
	// one whose baseline failed on its own after the hedge launched: a
	// primary-only group would then have asked for a replacement, which
	// nobody ran.
	Observed bool
	// Attempt is the attempt whose commit point Latency reaches: the
	// baseline, or the winner of a control group that never hedged (0
	// when not Committed).
	Attempt int
	// Committed: the baseline reached its commit point valid before the
	// deadline, so a primary-only group would have committed it. Otherwise
	// the primary-only group would have failed, as this one did or at the
	// deadline.
	Committed bool
	// Latency is from Start to the baseline's commit point (its commit,
	// when it won), or to the primary-only group's failure.
	Latency time.Duration
}

// GroupEnded is the group's summary record, emitted once, last.
type GroupEnded struct {
	Committed         bool
	Winner            int // 0 when none
	Error             schemas.ErrorCode
	Scope             schemas.ErrorScope
	Attempts          int
	HedgeLaunched     bool
	HedgeSuppressed   string // the first suppression reason, if any
	LoserFinishedLate bool
	Usage             schemas.Usage
	// Latency is from Start to Commit or Fail.
	Latency time.Duration
	// Baseline is a control group's primary-only measurement; zero for
	// other groups.
	Baseline Baseline
}

func (Admit) isAction()           {}
func (Launch) isAction()          {}
func (ArmTimer) isAction()        {}
func (AskHedgeBudget) isAction()  {}
func (Reoffer) isAction()         {}
func (Elect) isAction()           {}
func (Cancel) isAction()          {}
func (Commit) isAction()          {}
func (Fail) isAction()            {}
func (Splice) isAction()          {}
func (StreamEnded) isAction()     {}
func (Release) isAction()         {}
func (Settle) isAction()          {}
func (ClearGate) isAction()       {}
func (MarkRoute) isAction()       {}
func (HedgeSuppressed) isAction() {}
func (AttemptEnded) isAction()    {}
func (Answered) isAction()        {}
func (GroupEnded) isAction()      {}
