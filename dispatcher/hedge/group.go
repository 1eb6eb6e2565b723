package hedge

import (
	"fmt"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

type phase int

const (
	phaseNew       phase = iota // waiting for Start
	phaseAdmitting              // Admit asked, waiting for Admitted
	phaseRunning                // attempts may launch; no outcome yet
	phaseDecided                // Commit or Fail emitted; only recording from here on
)

type attemptState int

const (
	attemptRunning    attemptState = iota
	attemptFinished                // a valid answer arrived; waiting for its election
	attemptCancelling              // cancel sent; waiting for its report or the grace timer
	attemptEnded                   // terminal record written
)

// attempt is the engine's view of one launched attempt.
type attempt struct {
	n           int
	route       string
	role        schemas.Role
	reservation ReservationID
	launchedAt  time.Time
	state       attemptState

	// Busy is backpressure (docs/architecture.md §4 rule 4): offeredAt is
	// the last (re-)offer, queuedSince the first Busy (zero: none), busies
	// how many came back; waiting is set while the re-offer's backoff runs,
	// reoffering while its Reoffer is unanswered.
	offeredAt   time.Time
	queuedSince time.Time
	busies      int
	waiting     bool
	reoffering  bool
	// unserved counts the offers that found no worker on their route (Unserved).
	unserved int

	accepted      bool
	lastHeartbeat time.Time // the attempt's last reply of any kind (§4 rule 4, lost heartbeats)
	heartbeatSet  bool      // a heartbeat timer is armed for this attempt
	firstByteAt   time.Time // zero until the first byte
	tokens        int
	candidate     bool      // valid at the commit point, waiting to be elected
	readyAt       time.Time // when it first was valid at the commit point (zero: never)
	contractValid bool
	cancelSent    bool
	cancelReason  CancelReason

	// The committed stream (docs/architecture.md §6, "Rescue"): firstToken
	// once a content token came, lastTokenAt its latest, stallSet while its
	// stall timer is armed; streamed once its output fed the caller's
	// stream (the winner, a spliced continuation).
	firstToken  bool
	lastTokenAt time.Time
	stallSet    bool
	streamed    bool

	// What a finished attempt reported, kept until its election is decided.
	finishedStatus schemas.StatusClass
	finishedUsage  schemas.Usage
}

func (a *attempt) reachedProvider(u schemas.Usage) bool {
	return a.accepted || !a.firstByteAt.IsZero() || u.InputUnits > 0 || u.OutputUnits > 0
}

// Group is the hedge engine for one hedge group. It is not safe for
// concurrent use: a driver steps one group from one goroutine (or under a lock).
type Group struct {
	policy Options
	start  Start

	phase       phase
	now         time.Time
	startedAt   time.Time
	deadline    time.Time
	commitPoint schemas.CommitPoint

	attempts []*attempt
	// admitPending is set while Admit is unanswered.
	admitPending bool
	// askPending is set while an AskHedgeBudget is unanswered; askRole is its role.
	askPending bool
	askRole    schemas.Role
	// electing is the attempt whose Elect is unanswered (0: none).
	electing int

	hedgeConsidered bool   // the hedge timer fired (one hedge per group)
	hedgeLaunched   bool   // a hedge attempt was launched
	suppressed      string // first suppression reason, for the group record
	pushbackSeen    bool   // a route pushed back: no more load than the primary path needs
	// overloaded is set while the group's last offer came back Busy (cleared
	// by an Accept): no hedge or replacement goes into a saturated pool, and a
	// group left with nothing fails overloaded (docs/architecture.md §4 rule 4).
	overloaded bool
	// workerReached is set once any attempt was taken by a worker or ended
	// other than no_responders: without it a group that fails found no
	// worker on any route it tried, and fails no_workers (rule 4).
	workerReached bool
	lastFailScope schemas.ErrorScope
	// lastFailTimedOut says the last failed attempt ended by its deadline
	// (StatusTimeout): the workers enforce the attempt's deadline and may
	// report it before the group's own timer fires, and a group whose last
	// attempt ran out of time failed for the deadline, not the routes.
	lastFailTimedOut bool
	// replacementRefused is the suppression reason of the group's last
	// refused replacement; failRefused is what the group's Fail says of it
	// (Fail.Refused), set only when nothing was left to try.
	replacementRefused, failRefused string

	// A control group's baseline (Start.Control, docs/architecture.md §5):
	// the attempt a primary-only group would have been running when the
	// hedge launched, fixed then (0 before); how its run ended, as the
	// primary-only group would have seen it, and when (baseAt); kept is
	// the baseline while it runs on past another attempt's commit (0:
	// none), answered is set once Answered went out for it.
	baseline  int
	baseState baselineState
	baseAt    time.Time
	kept      int
	answered  bool

	committed bool
	winner    int
	// The committed stream's rescue (rescue.go): streamer is the attempt
	// feeding the caller's stream, rescuing the continuation racing it or
	// standing in for it (0: none), rescues how many were asked for,
	// streamDone set once StreamEnded went out (or a complete answer
	// committed); broke is how the streamer last broke, brokenRoutes the
	// routes that broke this stream, which no continuation goes to.
	streamer     int
	rescuing     int
	rescues      int
	streamDone   bool
	broke        brokenStream
	brokenRoutes []string
	stopReason   CancelReason // why attempts were stopped when the group failed
	// gateRefused: the group failed gate_unavailable, so its attempts'
	// ledger slots are forgiven as they settle (Settle.Lost).
	gateRefused bool
	failErr     schemas.ErrorCode
	failScope   schemas.ErrorScope
	decidedAt   time.Time
	loserLate   bool
	totalUsage  schemas.Usage
	groupEnded  bool
	pendingActs []Action
}

// baselineState is how a control group's baseline ended, as the
// primary-only group would have seen it.
type baselineState int

const (
	baseOpen    baselineState = iota // still running, or not known yet
	baseReached                      // it reached its commit point valid: the primary-only group commits it
	baseFailed                       // the primary-only group fails too: the deadline, a group-scope error
	baseLost                         // it failed on its own after the hedge launched: the primary-only group would have asked for a replacement nobody ran
)

// New returns a group that waits for Start. It fails only on an invalid policy.
func New(policy Options) (*Group, error) {
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	return &Group{policy: policy}, nil
}

// Done reports whether the group needs nothing more: its outcome is decided,
// every attempt has its terminal record, every question was answered and the
// group record was emitted.
func (g *Group) Done() bool { return g.groupEnded }

// Deadline is the group's absolute deadline (zero before Start).
func (g *Group) Deadline() time.Time { return g.deadline }

// CommitPoint is the effective commit point (known after Start).
func (g *Group) CommitPoint() schemas.CommitPoint { return g.commitPoint }

// Step feeds one event that happened at now and returns the actions to take,
// in order. Time never goes backwards: an earlier now is treated as the latest
// seen. Events that make no sense in the group's state (an unknown attempt, a
// second answer, anything before Start) are ignored.
func (g *Group) Step(now time.Time, ev Event) []Action {
	if now.Before(g.now) {
		now = g.now
	}
	g.now = now
	g.pendingActs = nil

	if g.phase == phaseNew {
		if s, ok := ev.(Start); ok {
			g.onStart(s)
		}
		return g.flush()
	}
	// One absolute deadline: whatever the event, a group past it is failed first.
	if (g.phase == phaseRunning || g.phase == phaseAdmitting) && !now.Before(g.deadline) {
		g.fail(schemas.ErrDeadlineExceeded, schemas.ScopeNone, "", CancelDeadline)
	}
	// A kept baseline runs to the deadline at the latest, whatever the event.
	g.stopKeptAtDeadline()

	switch e := ev.(type) {
	case Admitted:
		g.onAdmitted(e)
	case TimerFired:
		g.onTimer(e)
	case Accepted:
		if a := g.live(e.Attempt); a != nil {
			g.onAccepted(a)
		}
	case Busy:
		if a := g.live(e.Attempt); a != nil && a.state == attemptRunning && !a.accepted && !a.waiting && !a.reoffering {
			if a.n == g.rescuing {
				// A continuation is not queued: another route may take it.
				g.continuationFailed(a, schemas.StatusBusy, schemas.ScopePushback, schemas.Usage{})
				break
			}
			g.onBusy(a)
		}
	case Unserved:
		if a := g.live(e.Attempt); a != nil && a.state == attemptRunning && !a.accepted && !a.waiting && !a.reoffering {
			if a.n == g.rescuing {
				g.continuationFailed(a, schemas.StatusNoResponders, schemas.ScopeTransient, schemas.Usage{})
				break
			}
			g.onUnserved(a)
		}
	case Reoffered:
		if a := g.live(e.Attempt); a != nil && a.reoffering {
			g.onReoffered(a, e)
		}
	case Heartbeat:
		if a := g.live(e.Attempt); a != nil {
			g.heard(a)
		}
	case FirstByte:
		if a := g.live(e.Attempt); a != nil {
			g.heard(a)
			if a.firstByteAt.IsZero() {
				a.firstByteAt = now
				a.accepted = true
			}
		}
	case Progress:
		if a := g.live(e.Attempt); a != nil {
			g.heard(a)
			g.onProgress(a, e)
		}
	case Result:
		if a := g.live(e.Attempt); a != nil {
			g.onResult(a, e)
		}
	case CancelObserved:
		if a := g.attempt(e.Attempt); a != nil && a.state == attemptCancelling {
			g.endCancelled(a, e.Usage, true, false)
		}
	case HedgeBudgetDecided:
		g.onBudget(e)
	case GateDecided:
		g.onGate(e)
	case CallerGone:
		if g.phase != phaseDecided {
			g.fail(schemas.ErrCanceled, schemas.ScopeNone, "", CancelCallerGone)
		} else if g.committed {
			// The caller left a committed stream: stop the winner too, no fallback.
			g.stopStream(CancelCallerGone)
		}
	}
	return g.flush()
}

func (g *Group) emit(a ...Action) { g.pendingActs = append(g.pendingActs, a...) }

// flush returns the actions of this step, ending with the group record when
// the group became done.
func (g *Group) flush() []Action {
	if !g.groupEnded && g.phase == phaseDecided && !g.admitPending && !g.askPending && g.electing == 0 {
		all, allButKept := true, true
		for _, a := range g.attempts {
			if a.state != attemptEnded {
				all = false
				if a.n != g.kept || a.state != attemptRunning {
					allButKept = false
				}
			}
		}
		if !all && allButKept && !g.answered {
			// Only the kept baseline runs: the caller's part is over.
			g.answered = true
			g.emit(Answered{Usage: g.totalUsage.Add(g.estimateCancelled(g.attempt(g.kept), schemas.Usage{}))})
		}
		if all {
			g.groupEnded = true
			g.emit(GroupEnded{
				Committed:         g.committed,
				Winner:            g.winner,
				Error:             g.failErr,
				Scope:             g.failScope,
				Attempts:          len(g.attempts),
				HedgeLaunched:     g.hedgeLaunched,
				HedgeSuppressed:   g.suppressed,
				LoserFinishedLate: g.loserLate,
				Usage:             g.totalUsage,
				Latency:           g.decidedAt.Sub(g.startedAt),
				Baseline:          g.baselineRecord(),
			})
		}
	}
	out := g.pendingActs
	g.pendingActs = nil
	return out
}

func (g *Group) attempt(n int) *attempt {
	if n < 1 || n > len(g.attempts) {
		return nil
	}
	return g.attempts[n-1]
}

// live returns attempt n if it has not ended.
func (g *Group) live(n int) *attempt {
	if a := g.attempt(n); a != nil && a.state != attemptEnded {
		return a
	}
	return nil
}

func (g *Group) remaining() time.Duration { return g.deadline.Sub(g.now) }

func (g *Group) running() int {
	n := 0
	for _, a := range g.attempts {
		if a.state == attemptRunning || a.state == attemptFinished {
			n++
		}
	}
	return n
}

// Rule 1: admit first, then the primary.
func (g *Group) onStart(s Start) {
	g.start = s
	g.startedAt = g.now
	g.deadline = g.now.Add(g.policy.Deadline)
	g.commitPoint = g.policy.CommitPoint
	if !s.Streaming || s.NeedsCompleteAnswer {
		g.commitPoint = schemas.Complete
	}
	g.phase = phaseAdmitting
	g.admitPending = true
	g.emit(Admit{})
}

func (g *Group) onAdmitted(e Admitted) {
	if !g.admitPending {
		return // not asked: a driver's duplicate, ignored
	}
	g.admitPending = false
	if g.phase != phaseAdmitting {
		// Decided while admission was in flight (deadline, caller gone).
		if e.Allowed {
			g.emit(Release{Reservation: e.Reservation})
		}
		return
	}
	if !e.Allowed {
		code := e.Error
		if code == "" {
			code = schemas.ErrBudgetExhausted
		}
		g.suppress(schemas.RoleHedge, ReasonNotAdmitted)
		g.decide(false, code, schemas.ScopeGroup, "")
		return
	}
	g.phase = phaseRunning
	g.emit(ArmTimer{Kind: TimerDeadline, At: g.deadline})
	g.launch(schemas.RolePrimary, e.Route, e.Reservation)

	switch {
	case !g.start.HedgeEligible:
		reason := g.start.NotEligibleReason
		if reason == "" {
			reason = ReasonNotEligible
		}
		g.suppress(schemas.RoleHedge, reason)
	case g.start.HedgeDelay < 0 || g.startedAt.Add(g.start.HedgeDelay).After(g.deadline.Add(-g.policy.MinUsefulTime)):
		g.suppress(schemas.RoleHedge, ReasonDelayPastDeadline)
	default:
		g.emit(ArmTimer{Kind: TimerHedge, At: g.startedAt.Add(g.start.HedgeDelay)})
	}
}

func (g *Group) launch(role schemas.Role, route string, res ReservationID) {
	if role == schemas.RoleHedge && g.start.Control && g.baseline == 0 {
		// The group diverges from its primary-only run here: the attempt
		// running now is the one that run would still be waiting on.
		for _, b := range g.attempts {
			if b.state == attemptRunning {
				g.baseline = b.n
				break
			}
		}
	}
	a := &attempt{
		n:             len(g.attempts) + 1,
		route:         route,
		role:          role,
		reservation:   res,
		launchedAt:    g.now,
		offeredAt:     g.now,
		lastHeartbeat: g.now,
	}
	g.attempts = append(g.attempts, a)
	if role == schemas.RoleHedge {
		g.hedgeLaunched = true
	}
	g.emit(Launch{Attempt: a.n, Route: route, Role: role, Deadline: g.deadline, Remaining: g.remaining(), Reservation: res})
	g.emit(ArmTimer{Kind: TimerAccept, Attempt: a.n, At: g.now.Add(g.policy.AcceptTimeout)})
	if g.policy.AttemptTimeout > 0 {
		g.emit(ArmTimer{Kind: TimerAttempt, Attempt: a.n, At: g.now.Add(g.policy.AttemptTimeout)})
	}
}

func (g *Group) onTimer(e TimerFired) {
	switch e.Kind {
	case TimerHedge:
		g.onHedgeTimer()
	case TimerDeadline:
		// Before the decision, the deadline check in Step has already failed the
		// group. After a commit, a streaming winner still running is stopped:
		// the deadline covers the whole user action.
		if g.committed && !g.now.Before(g.deadline) {
			g.stopStream(CancelDeadline)
		}
		g.stopKeptAtDeadline()
	case TimerAccept:
		// A refused attempt offered again has an accept timer of its own:
		// the one armed for an earlier offer is stale.
		if a := g.live(e.Attempt); a != nil && a.state == attemptRunning && !a.accepted && !a.waiting && !a.reoffering &&
			(a.busies == 0 || g.now.Sub(a.offeredAt) >= g.policy.AcceptTimeout) {
			// No worker took it in time; it may still be queued somewhere, so it is
			// cancelled as well, but nothing more is waited for.
			g.emit(Cancel{Attempt: a.n, Reason: CancelTimeout})
			a.cancelSent = true
			g.attemptFailed(a, schemas.StatusLost, schemas.ScopeTransient, "", 0, schemas.Usage{})
		}
	case TimerHeartbeat:
		a := g.live(e.Attempt)
		if a == nil {
			return
		}
		a.heartbeatSet = false
		if a.state != attemptRunning || g.policy.HeartbeatTimeout == 0 {
			return
		}
		if silent := g.now.Sub(a.lastHeartbeat); silent < g.policy.HeartbeatTimeout {
			a.heartbeatSet = true
			g.emit(ArmTimer{Kind: TimerHeartbeat, Attempt: a.n, At: a.lastHeartbeat.Add(g.policy.HeartbeatTimeout)})
			return
		}
		g.lostHeartbeats(a)
	case TimerAttempt:
		if a := g.live(e.Attempt); a != nil && a.state == attemptRunning && !(g.committed && (a.n == g.winner || a.role == schemas.RoleContinuation)) {
			g.baselineEnds(a, baseLost)
			g.cancel(a, CancelTimeout)
			g.lastFailScope = schemas.ScopeTransient
			g.lastFailTimedOut = false
			g.afterFailure(schemas.ScopeTransient)
		}
	case TimerStall:
		if a := g.live(e.Attempt); a != nil {
			g.onStallTimer(a)
		}
	case TimerCancelGrace:
		if a := g.live(e.Attempt); a != nil && a.state == attemptCancelling {
			g.endCancelled(a, schemas.Usage{}, false, false)
		}
	case TimerReoffer:
		if a := g.live(e.Attempt); a != nil && a.state == attemptRunning && a.waiting && g.phase == phaseRunning {
			a.waiting = false
			a.reoffering = true
			g.emit(Reoffer{Attempt: a.n, Busy: a.route})
		}
	}
}

// maxBusyBackoffFactor caps the re-offer backoff at this multiple of
// Options.BusyBackoff.
const maxBusyBackoffFactor = 8

// Rule 4, busy is backpressure: a Busy spends no slot and no duplicate
// token. The same attempt is offered again after a backoff, to another route
// when one has room, until QueueWait from the first Busy (never past the
// deadline); past that bound it ends, and a group left with nothing fails
// overloaded rather than all_routes_failed.
func (g *Group) onBusy(a *attempt) {
	g.overloaded = true
	if a.queuedSince.IsZero() {
		a.queuedSince = g.now
	}
	a.busies++
	backoff := g.policy.BusyBackoff << min(a.busies-1, 3)
	backoff = min(backoff, maxBusyBackoffFactor*g.policy.BusyBackoff)
	end := a.queuedSince.Add(g.policy.QueueWait)
	if g.deadline.Before(end) {
		end = g.deadline
	}
	if !g.now.Add(backoff).Before(end) {
		// The bound passed: this attempt gives up; nothing replaces it.
		g.baselineEnds(a, baseLost)
		g.endAttempt(a, OutcomeFailed, schemas.StatusBusy, schemas.ScopePushback, schemas.Usage{}, false)
		g.lastFailScope = schemas.ScopePushback
		g.lastFailTimedOut = false
		g.suppress(schemas.RoleReplacement, ReasonOverloaded)
		g.failIfNothingLeft()
		return
	}
	a.waiting = true
	g.emit(ArmTimer{Kind: TimerReoffer, Attempt: a.n, At: g.now.Add(backoff)})
}

// MaxUnservedReoffers bounds how often one attempt is offered again after
// finding no worker on its route (Unserved).
const MaxUnservedReoffers = 3

// Rule 4, a route without a worker: nothing reached a provider, so the
// attempt keeps its slot and goes at once to a route that has a worker. An
// attempt that keeps finding none fails like any transient failure.
func (g *Group) onUnserved(a *attempt) {
	if a.unserved >= MaxUnservedReoffers {
		g.onResult(a, Result{Attempt: a.n, Status: schemas.StatusNoResponders, Scope: schemas.ScopeTransient})
		return
	}
	a.unserved++
	a.reoffering = true
	g.emit(Reoffer{Attempt: a.n, Busy: a.route, Unserved: true})
}

// onReoffered notes where a refused attempt went and gives that offer an
// accept timeout of its own.
func (g *Group) onReoffered(a *attempt, e Reoffered) {
	a.reoffering = false
	if e.Route != "" {
		a.route = e.Route
	}
	a.offeredAt = g.now
	g.emit(ArmTimer{Kind: TimerAccept, Attempt: a.n, At: g.now.Add(g.policy.AcceptTimeout)})
}

// Rule 2: the hedge trigger and the gates it re-checks.
func (g *Group) onHedgeTimer() {
	if g.phase != phaseRunning || g.hedgeConsidered {
		return
	}
	g.hedgeConsidered = true
	if reason := g.hedgeBlocked(); reason != "" {
		g.suppress(schemas.RoleHedge, reason)
		return
	}
	g.ask(schemas.RoleHedge)
}

// hedgeBlocked says why a hedge may not be asked for now, or "".
func (g *Group) hedgeBlocked() string {
	running := 0
	for _, a := range g.attempts {
		if a.state == attemptFinished || a.candidate {
			return ReasonValidResult
		}
		if a.state != attemptRunning {
			continue
		}
		running++
		if g.policy.Trigger == TriggerFirstByte && !a.firstByteAt.IsZero() {
			return ReasonNotStalled
		}
	}
	switch {
	case g.electing != 0:
		return ReasonValidResult
	case running == 0:
		return ReasonNothingToHedge
	case g.askPending:
		return ReasonReplacementPending
	case g.overloaded:
		return ReasonOverloaded
	case g.pushbackSeen:
		return ReasonPushback
	case g.remaining() < g.policy.MinUsefulTime:
		return ReasonNoTime
	case len(g.attempts) >= g.policy.MaxAttempts:
		return ReasonNoSlot
	}
	return ""
}

func (g *Group) ask(role schemas.Role) {
	g.askPending = true
	g.askRole = role
	exclude := make([]string, 0, len(g.attempts))
	for _, a := range g.attempts {
		exclude = append(exclude, a.route)
	}
	g.emit(AskHedgeBudget{Attempt: len(g.attempts) + 1, Role: role, Exclude: exclude, SameRoute: g.policy.SameRouteHedging})
}

func (g *Group) suppress(role schemas.Role, reason string) {
	if g.suppressed == "" {
		g.suppressed = reason
	}
	if role == schemas.RoleReplacement {
		g.replacementRefused = reason
	}
	g.emit(HedgeSuppressed{Role: role, Reason: reason})
}

func (g *Group) onBudget(e HedgeBudgetDecided) {
	if !g.askPending {
		return // not asked: a driver's duplicate, ignored
	}
	g.askPending = false
	role := g.askRole
	if role == schemas.RoleContinuation {
		g.onRescueBudget(e)
		return
	}
	if !e.Allowed {
		reason := e.Reason
		if reason == "" {
			reason = ReasonBudget
		}
		if g.phase == phaseRunning {
			g.suppress(role, reason)
			g.failIfNothingLeft()
		}
		return
	}
	// A budget granted after the outcome, or after the reason for it went away,
	// is released, never leaked.
	var blocked string
	switch {
	case g.phase != phaseRunning:
		blocked = ReasonDecided
	case role == schemas.RoleHedge:
		blocked = g.hedgeBlocked()
	case g.overloaded:
		blocked = ReasonOverloaded // the pool saturated while the budget was asked
	case g.remaining() < g.policy.MinUsefulTime:
		blocked = ReasonNoTime
	case len(g.attempts) >= g.policy.MaxAttempts:
		blocked = ReasonNoSlot
	}
	if blocked != "" {
		g.emit(Release{Reservation: e.Reservation})
		if g.phase == phaseRunning {
			g.suppress(role, blocked)
			g.failIfNothingLeft()
		}
		return
	}
	g.launch(role, e.Route, e.Reservation)
}

func (g *Group) onAccepted(a *attempt) {
	g.overloaded = false // a worker had room for an offer
	g.heard(a)
	a.accepted = true
}

// heard notes a reply of a running attempt (Accept, heartbeat, first byte,
// chunk): each one restarts its silence, and the first arms its heartbeat
// timer, which stays armed until the attempt ends — after the first byte
// too, so a worker lost mid-answer is noticed within HeartbeatTimeout, not
// at the deadline (docs/architecture.md §4 rule 4). The timer is never
// moved: when it fires early relative to the last reply it re-arms. A reply
// of an attempt already running says nothing of the pool's room: only an
// Accept ends the group's overload.
func (g *Group) heard(a *attempt) {
	a.lastHeartbeat = g.now
	if a.state == attemptRunning && !a.heartbeatSet && g.policy.HeartbeatTimeout > 0 {
		a.heartbeatSet = true
		g.emit(ArmTimer{Kind: TimerHeartbeat, Attempt: a.n, At: g.now.Add(g.policy.HeartbeatTimeout)})
	}
}

// lostHeartbeats ends a running attempt that has been silent for
// HeartbeatTimeout: its worker is gone or cut off. It is cancelled (the
// worker may still be alive behind a partition) and fails as lost,
// transient (§4 rule 4), with the usage a cancel would be estimated at. A
// committed winner that goes silent ends the caller's stream with an
// error at once, never with another attempt's bytes (§4 rule 3).
func (g *Group) lostHeartbeats(a *attempt) {
	g.emit(Cancel{Attempt: a.n, Reason: CancelTimeout})
	a.cancelSent = true
	usage := g.estimateCancelled(a, schemas.Usage{})
	if g.committed && a.n == g.streamer {
		g.streamBroke(a, schemas.StatusLost, schemas.ScopeTransient, usage, true)
		return
	}
	g.attemptFailed(a, schemas.StatusLost, schemas.ScopeTransient, "", 0, usage)
}

// Rule 3: validity at the commit point, for streamed output.
func (g *Group) onProgress(a *attempt, e Progress) {
	grew := e.Tokens > a.tokens
	if grew {
		a.tokens = e.Tokens
	}
	if e.FirstToken && a.n != g.rescuing {
		a.firstToken = true // a running continuation's first token splices it in (rescue.go)
	}
	a.accepted = true
	if a.n == g.kept && a.state == attemptRunning {
		g.onKeptProgress(a, e)
		return
	}
	if g.committed && a.state == attemptRunning && (a.n == g.streamer || a.n == g.rescuing) {
		g.onStreamProgress(a, e, grew)
		return
	}
	if a.state != attemptRunning || g.phase != phaseRunning || a.candidate {
		return
	}
	if !e.Valid {
		// A malformed or contract-breaking stream never wins; the others go on.
		g.baselineEnds(a, baseLost)
		g.cancel(a, CancelInvalid)
		g.lastFailScope = schemas.ScopeTransient
		g.lastFailTimedOut = false
		g.afterFailure(schemas.ScopeTransient)
		return
	}
	if g.progressReady(e) {
		a.candidate = true
		g.reached(a)
		g.tryElect()
	}
}

// progressReady reports whether streamed output reaches the commit point.
func (g *Group) progressReady(e Progress) bool {
	switch g.commitPoint.Kind {
	case schemas.CommitFirstToken:
		return e.FirstToken
	case schemas.CommitTokens:
		return e.Tokens >= g.commitPoint.Tokens
	}
	return false
}

// reached notes that an attempt is valid at the commit point.
func (g *Group) reached(a *attempt) {
	a.contractValid = true
	if a.readyAt.IsZero() {
		a.readyAt = g.now
	}
	g.baselineEnds(a, baseReached)
}

func (g *Group) onResult(a *attempt, e Result) {
	scope := e.Scope
	if scope == "" {
		scope = schemas.ScopeNone
	}
	if a.state == attemptCancelling {
		g.endCancelled(a, e.Usage, true, scope == schemas.ScopeNone && e.Status == schemas.StatusOK)
		return
	}
	if a.state == attemptFinished {
		return // a second result for an answer already in: ignore
	}
	if g.committed && (a.n == g.streamer || a.n == g.rescuing) {
		// The committed stream finished, or broke after its commit point:
		// a continuation may mend it (rescue.go), else the runtime ends
		// the caller's stream with an error event, never with bytes of
		// another attempt.
		g.onStreamResult(a, e, scope)
		return
	}
	if a.n == g.kept {
		g.onKeptResult(a, e, scope)
		return
	}
	if g.phase != phaseRunning {
		// Only the winner runs after a decision; anything else is a late record.
		g.endAttempt(a, OutcomeLoserLate, e.Status, scope, e.Usage, false)
		return
	}
	if scope == schemas.ScopeNone && e.Status == schemas.StatusOK {
		if !e.Valid {
			// Rule 3: a truncated, malformed or schema-failing answer never wins.
			g.baselineEnds(a, baseLost)
			g.lastFailScope = schemas.ScopeTransient
			g.lastFailTimedOut = false
			g.endAttempt(a, OutcomeFailed, schemas.StatusContractInvalid, schemas.ScopeTransient, e.Usage, false)
			g.afterFailure(schemas.ScopeTransient)
			return
		}
		a.state = attemptFinished
		a.candidate = true
		g.reached(a)
		a.finishedStatus = e.Status
		a.finishedUsage = e.Usage
		g.tryElect()
		return
	}
	if scope == schemas.ScopeNone {
		scope = schemas.ScopeTransient // a failure status without a scope is treated as transient
	}
	g.attemptFailed(a, e.Status, scope, e.Error, e.RetryAfter, e.Usage)
}

// Rule 4: the error's scope decides, never the arrival order.
func (g *Group) attemptFailed(a *attempt, status schemas.StatusClass, scope schemas.ErrorScope, code schemas.ErrorCode, retryAfter time.Duration, usage schemas.Usage) {
	if g.committed && a.n == g.rescuing {
		g.continuationFailed(a, status, scope, usage)
		return
	}
	if scope == schemas.ScopeGroup {
		g.baselineEnds(a, baseFailed) // the primary-only group fails with it
	} else {
		g.baselineEnds(a, baseLost)
	}
	g.endAttempt(a, OutcomeFailed, status, scope, usage, false)
	if a.n == g.kept {
		// What the kept baseline's failure says of its route holds as any
		// attempt's does; the group is decided, so nothing else follows.
		g.markRoute(a, scope, retryAfter)
		return
	}
	if g.phase != phaseRunning {
		return
	}
	g.lastFailScope = scope
	g.lastFailTimedOut = status == schemas.StatusTimeout
	if g.policy.FailFast {
		if code == "" {
			code = failCode(scope)
		}
		if g.lastFailTimedOut && scope == schemas.ScopeTransient {
			code = schemas.ErrDeadlineExceeded
		}
		g.fail(code, scope, "", CancelGroupError)
		return
	}
	if scope == schemas.ScopeGroup {
		if code == "" {
			code = schemas.ErrInvalidRequest
		}
		g.fail(code, scope, "", CancelGroupError)
		return
	}
	g.markRoute(a, scope, retryAfter)
	g.afterFailure(scope)
}

// markRoute marks the route of an attempt that failed with scope route
// (quarantine) or pushback (for retryAfter, else the policy's TTL).
func (g *Group) markRoute(a *attempt, scope schemas.ErrorScope, retryAfter time.Duration) {
	switch scope {
	case schemas.ScopeRoute:
		g.emit(MarkRoute{Route: a.route, Mark: MarkQuarantine, TTL: g.policy.QuarantineTTL})
	case schemas.ScopePushback:
		ttl := retryAfter
		if ttl <= 0 {
			ttl = g.policy.PushbackTTL
		}
		g.emit(MarkRoute{Route: a.route, Mark: MarkPushback, TTL: ttl})
		g.pushbackSeen = true
	}
}

// afterFailure launches a replacement at once when slot, time and budget allow
// (gRPC's non-fatal rule), or ends the group when nothing is left to wait for.
func (g *Group) afterFailure(scope schemas.ErrorScope) {
	if g.phase != phaseRunning || g.askPending {
		return
	}
	// After pushback no more load than the primary path needs: a replacement
	// only when no attempt is left running.
	if scope == schemas.ScopePushback && g.running() > 0 {
		g.suppress(schemas.RoleReplacement, ReasonPushback)
		return
	}
	// Never answer overload with more load (rule 4, busy is backpressure).
	if g.overloaded {
		g.suppress(schemas.RoleReplacement, ReasonOverloaded)
		g.failIfNothingLeft()
		return
	}
	switch {
	case len(g.attempts) >= g.policy.MaxAttempts:
		g.suppressIfNothingLeft(ReasonNoSlot)
	case g.remaining() < g.policy.MinUsefulTime:
		g.suppressIfNothingLeft(ReasonNoTime)
	default:
		g.ask(schemas.RoleReplacement)
	}
}

func (g *Group) suppressIfNothingLeft(reason string) {
	if g.running() == 0 && g.electing == 0 {
		g.suppress(schemas.RoleReplacement, reason)
	}
	g.failIfNothingLeft()
}

// failIfNothingLeft fails the group when no attempt can still produce a winner.
func (g *Group) failIfNothingLeft() {
	if g.phase != phaseRunning || g.running() > 0 || g.askPending || g.electing != 0 {
		return
	}
	scope := g.lastFailScope
	if scope == "" {
		scope = schemas.ScopeTransient
	}
	code := failCode(scope)
	if g.lastFailTimedOut && scope == schemas.ScopeTransient {
		// The last attempt ran out of the deadline (rule 4): 504, not
		// "every route failed", whoever noticed first.
		code = schemas.ErrDeadlineExceeded
	}
	if g.overloaded || g.replacementRefused == ReasonOverloaded || g.replacementRefused == ReasonRouteCapacity {
		// The pool stayed saturated, or had no room for the replacement a
		// failure asked for (its workers were full, or its routes' provider
		// limits spent): capacity, not the last failure, is why nothing
		// is left, and the caller is told to come back (rule 4, busy is
		// backpressure) — never all_routes_failed while routes are only full.
		code, scope = schemas.ErrOverloaded, schemas.ScopePushback
	}
	if code == schemas.ErrAllRoutesFailed && !g.workerReached && len(g.attempts) > 0 {
		// Every attempt found no worker on its route, re-offers included
		// (rule 4): the pool has no live worker, which is what its caller
		// and its operator need to hear, not that routes failed.
		code = schemas.ErrNoWorkers
	}
	g.failRefused = g.replacementRefused // the Fail says why nothing was left
	g.fail(code, scope, "", CancelGroupError)
}

func failCode(scope schemas.ErrorScope) schemas.ErrorCode {
	switch scope {
	case schemas.ScopeRoute:
		return schemas.ErrRouteFailed
	case schemas.ScopePushback:
		return schemas.ErrRateLimited
	case schemas.ScopeGroup:
		return schemas.ErrInvalidRequest
	}
	return schemas.ErrAllRoutesFailed
}

// tryElect asks the gate about the first candidate when no election is pending.
func (g *Group) tryElect() {
	if g.electing != 0 || g.phase != phaseRunning {
		return
	}
	for _, a := range g.attempts {
		if a.candidate && (a.state == attemptRunning || a.state == attemptFinished) {
			g.electing = a.n
			g.emit(Elect{Attempt: a.n})
			return
		}
	}
}

func (g *Group) onGate(e GateDecided) {
	if e.Attempt == 0 || e.Attempt != g.electing {
		return
	}
	g.electing = 0
	a := g.attempt(e.Attempt)
	a.candidate = false
	stillValid := a.state == attemptRunning || a.state == attemptFinished
	switch {
	case e.Won && (g.phase != phaseRunning || !stillValid):
		// Claimed but will not commit: give the claim back (compare-and-delete).
		g.emit(ClearGate{Attempt: a.n, Gate: e.Gate})
		if g.phase == phaseRunning {
			g.tryElect()
			g.failIfNothingLeft()
		} else {
			g.stop(a, g.stopReason)
		}
	case e.Won:
		g.commit(a, e.Gate)
	case e.Unavailable && g.phase == phaseRunning:
		// No gate could decide: every attempt's slot is forgiven, or the
		// retries its 503 asks for would find the ledger spent.
		g.gateRefused = true
		g.fail(schemas.ErrGateUnavailable, schemas.ScopeGroup, "", CancelGroupError)
		// The caller is told to retry by the Fail: the settles of the
		// attempts that already finished go first, so that retry finds
		// their slots forgiven.
		g.settlesFirst()
	case g.phase == phaseRunning:
		// Another group of this user action committed: every attempt of this
		// group would lose the same gate.
		g.fail(schemas.ErrAlreadyCommitted, schemas.ScopeGroup, e.Holder, CancelLostRace)
	default:
		g.stop(a, g.stopReason)
	}
}

func (g *Group) commit(w *attempt, gate string) {
	g.committed = true
	g.winner = w.n
	g.decidedAt = g.now
	g.phase = phaseDecided
	g.keepBaseline(w)
	g.emit(Commit{Attempt: w.n, Gate: gate, Kept: g.kept})
	for _, a := range g.attempts {
		if a != w && a.n != g.kept {
			g.stop(a, CancelLostRace)
		}
	}
	g.streamer, w.streamed = w.n, true
	if w.state == attemptFinished {
		g.streamDone = true // the answer is whole: nothing streams on
		g.endAttempt(w, OutcomeWinner, w.finishedStatus, schemas.ScopeNone, w.finishedUsage, false)
		return
	}
	w.lastTokenAt = w.readyAt
	g.watchStall(w)
}

// keepBaseline decides, as w commits, what becomes of a control group's
// baseline (docs/architecture.md §5). The winner's commit is its own. One
// that reached its commit point already (waiting for its election, or a
// complete answer in) has its measurement and stops as any loser. One
// still running at a provider is kept: it runs on, unseen by the caller.
// One a worker never took (refused, being offered again) cannot be run on
// without re-offers after the outcome: it stops, and the group has no
// baseline.
func (g *Group) keepBaseline(w *attempt) {
	if g.baseline == 0 {
		return
	}
	if w.n == g.baseline {
		g.baseState, g.baseAt = baseReached, g.now
		return
	}
	b := g.attempt(g.baseline)
	switch {
	case g.baseState != baseOpen:
	case b.state == attemptRunning && b.accepted && !b.waiting && !b.reoffering:
		g.kept = b.n
	default:
		g.baseState, g.baseAt = baseLost, g.now
	}
}

// baselineEnds records how a's run ends for the baseline, when a is a
// control group's baseline whose end is not known yet.
func (g *Group) baselineEnds(a *attempt, st baselineState) {
	if g.baseline == 0 || a.n != g.baseline || g.baseState != baseOpen {
		return
	}
	g.baseState, g.baseAt = st, g.now
	if st == baseReached {
		g.baseAt = a.readyAt
	}
}

// onKeptProgress judges the kept baseline's stream at the commit point as
// any attempt's is judged; reaching it ends the measurement, and the
// baseline is cancelled as the race's loser, never elected.
func (g *Group) onKeptProgress(a *attempt, e Progress) {
	switch {
	case !e.Valid:
		g.baselineEnds(a, baseLost)
		g.cancel(a, CancelInvalid)
	case g.progressReady(e):
		g.reached(a)
		g.cancel(a, CancelLostRace)
	}
}

// onKeptResult ends the kept baseline with its result: a valid answer is
// its commit point (complete), and it ends as a late loser; anything else
// is its own failure.
func (g *Group) onKeptResult(a *attempt, e Result, scope schemas.ErrorScope) {
	switch {
	case scope == schemas.ScopeNone && e.Status == schemas.StatusOK && e.Valid:
		g.reached(a)
		g.endAttempt(a, OutcomeLoserLate, e.Status, schemas.ScopeNone, e.Usage, false)
	case scope == schemas.ScopeNone && e.Status == schemas.StatusOK:
		g.baselineEnds(a, baseLost)
		g.endAttempt(a, OutcomeFailed, schemas.StatusContractInvalid, schemas.ScopeTransient, e.Usage, false)
	default:
		if scope == schemas.ScopeNone {
			scope = schemas.ScopeTransient
		}
		g.attemptFailed(a, e.Status, scope, e.Error, e.RetryAfter, e.Usage)
	}
}

// stopKeptAtDeadline cancels a kept baseline still running at or past the
// deadline: the primary-only group would have failed there.
func (g *Group) stopKeptAtDeadline() {
	if g.kept == 0 || g.now.Before(g.deadline) {
		return
	}
	if k := g.attempt(g.kept); k.state == attemptRunning {
		if g.baseState == baseOpen {
			g.baseState, g.baseAt = baseFailed, g.deadline
		}
		g.cancel(k, CancelDeadline)
	}
}

// baselineRecord is the group record's Baseline.
func (g *Group) baselineRecord() Baseline {
	switch {
	case !g.start.Control:
		return Baseline{}
	case g.baseline == 0:
		// It never hedged: it ran primary-only.
		b := Baseline{Observed: true, Committed: g.committed, Latency: g.decidedAt.Sub(g.startedAt)}
		if g.committed {
			b.Attempt = g.winner
		}
		return b
	case g.baseState == baseLost:
		return Baseline{}
	case !g.committed:
		return Baseline{Observed: true, Latency: g.decidedAt.Sub(g.startedAt)}
	case g.baseState == baseReached:
		return Baseline{Observed: true, Attempt: g.baseline, Committed: true, Latency: g.baseAt.Sub(g.startedAt)}
	case g.baseState == baseFailed:
		return Baseline{Observed: true, Latency: g.baseAt.Sub(g.startedAt)}
	}
	return Baseline{} // never known: no sample rather than a made-up one
}

// fail decides the group's failure and stops every attempt.
func (g *Group) fail(code schemas.ErrorCode, scope schemas.ErrorScope, holder string, reason CancelReason) {
	if g.phase == phaseDecided {
		return
	}
	g.decide(false, code, scope, holder)
	g.stopReason = reason
	for _, a := range g.attempts {
		g.stop(a, reason)
	}
}

// settlesFirst moves the pending Settles ahead of the other pending actions,
// keeping each group's order.
func (g *Group) settlesFirst() {
	var settles, rest []Action
	for _, a := range g.pendingActs {
		if _, ok := a.(Settle); ok {
			settles = append(settles, a)
		} else {
			rest = append(rest, a)
		}
	}
	g.pendingActs = append(settles, rest...)
}

func (g *Group) decide(committed bool, code schemas.ErrorCode, scope schemas.ErrorScope, holder string) {
	g.phase = phaseDecided
	g.committed = committed
	g.failErr = code
	g.failScope = scope
	g.decidedAt = g.now
	g.emit(Fail{Error: code, Scope: scope, Holder: holder, Refused: g.failRefused})
}

// stop cancels a running attempt, or ends a finished one that will not win.
func (g *Group) stop(a *attempt, reason CancelReason) {
	switch a.state {
	case attemptRunning:
		if a.waiting {
			// Refused and waiting for its re-offer: no worker holds it, so
			// it ends now, its reservation released.
			outcome := OutcomeCanceled
			if g.committed {
				outcome = OutcomeLoserCanceled
			}
			g.endAttempt(a, outcome, schemas.StatusCanceled, schemas.ScopeNone, schemas.Usage{}, false)
			return
		}
		g.cancel(a, reason)
	case attemptFinished:
		g.endAttempt(a, OutcomeLoserLate, a.finishedStatus, schemas.ScopeNone, a.finishedUsage, false)
	}
}

func (g *Group) cancel(a *attempt, reason CancelReason) {
	a.state = attemptCancelling
	a.candidate = false
	a.cancelSent = true
	a.cancelReason = reason
	g.emit(Cancel{Attempt: a.n, Reason: reason})
	g.emit(ArmTimer{Kind: TimerCancelGrace, Attempt: a.n, At: g.now.Add(g.policy.CancelGrace)})
}

// endCancelled writes the terminal record of a cancelled attempt. Its usage is
// max(reported, elapsed decode × cohort rate): cancellation is no proof that
// nothing more was billed (docs/architecture.md §7).
func (g *Group) endCancelled(a *attempt, reported schemas.Usage, observed, completed bool) {
	usage := reported
	status := schemas.StatusCanceled
	switch a.cancelReason {
	case CancelInvalid:
		status = schemas.StatusContractInvalid
	case CancelTimeout:
		status = schemas.StatusTimeout
	}
	if completed {
		status = schemas.StatusOK
	} else {
		usage = g.estimateCancelled(a, reported)
	}
	outcome, scope := OutcomeCanceled, schemas.ScopeNone
	switch {
	case a.streamed && a.cancelReason == CancelLostRace:
		// Spliced away by its continuation (rescue.go): its output is
		// part of the answer, and it had stalled past the bound, a
		// transient fault of its route as the worker's own stall bound
		// reports one.
		outcome = OutcomeWinner
		if !completed {
			status, scope = schemas.StatusServerError, schemas.ScopeTransient
		}
	case g.committed && !a.streamed:
		outcome = OutcomeLoserCanceled
		if completed {
			outcome = OutcomeLoserLate
		}
	}
	g.endAttempt(a, outcome, status, scope, usage, observed)
}

func (g *Group) estimateCancelled(a *attempt, reported schemas.Usage) schemas.Usage {
	if !a.reachedProvider(reported) {
		return reported
	}
	est := reported
	if est.InputUnits < g.start.InputUnits {
		est.InputUnits = g.start.InputUnits
		est.Estimated = true
	}
	if !a.firstByteAt.IsZero() && g.start.DecodeTokensPerSecond > 0 {
		decoded := int64(g.now.Sub(a.firstByteAt).Seconds() * g.start.DecodeTokensPerSecond)
		if decoded > est.OutputUnits {
			est.OutputUnits = decoded
			est.Estimated = true
		}
	}
	return est
}

// endAttempt writes an attempt's one terminal record and settles or releases
// its reservation.
func (g *Group) endAttempt(a *attempt, outcome Outcome, status schemas.StatusClass, scope schemas.ErrorScope, usage schemas.Usage, observed bool) {
	if a.state == attemptEnded {
		panic(fmt.Sprintf("hedge: attempt %d ended twice", a.n)) // an engine bug, never input
	}
	a.state = attemptEnded
	a.candidate = false
	if a.accepted || status != schemas.StatusNoResponders {
		g.workerReached = true
	}
	if a.reachedProvider(usage) {
		g.emit(Settle{Attempt: a.n, Reservation: a.reservation, Usage: usage, Lost: status == schemas.StatusLost || g.gateRefused})
	} else {
		g.emit(Release{Reservation: a.reservation})
	}
	g.totalUsage = g.totalUsage.Add(usage)
	if outcome == OutcomeLoserLate {
		g.loserLate = true
	}
	var firstByte time.Duration
	if !a.firstByteAt.IsZero() {
		firstByte = a.firstByteAt.Sub(a.launchedAt)
	}
	g.emit(AttemptEnded{
		Attempt:              a.n,
		Route:                a.route,
		Role:                 a.role,
		Outcome:              outcome,
		Status:               status,
		Scope:                scope,
		ContractValid:        a.contractValid,
		CancellationSent:     a.cancelSent,
		CancellationObserved: observed,
		Elapsed:              g.now.Sub(a.launchedAt),
		FirstByte:            firstByte,
		Usage:                usage,
	})
}
