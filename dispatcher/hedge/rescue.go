package hedge

import (
	"slices"

	"github.com/hedgerow/hedgerow/schemas"
)

// Rescue (docs/architecture.md §6, "Rescue"): a committed stream that
// breaks is continued by a continuation attempt on another route instead of
// ending with an error. The winner gate committed once and stays committed:
// a continuation extends that commit, it is never elected. The caller's
// stream is fed by one attempt at a time, the streamer — the winner, then
// each continuation spliced after it. While the streamer only stalls it
// keeps its chance: whichever of it and the continuation produces a token
// first feeds the stream, and the other is cancelled.

// brokenStream is how the streamer last broke: what the stream ends with
// when no continuation finishes it.
type brokenStream struct {
	status schemas.StatusClass
	scope  schemas.ErrorScope
}

// rescuable reports whether a committed stream's result is a break a
// continuation may mend: a transient, route or pushback failure, or an ok
// answer cut at its length limit below the max_tokens asked — not an
// invalid request (the continuation would fail the same way) nor an answer
// the content filter or the contract refused.
func rescuable(e Result, scope schemas.ErrorScope) bool {
	switch {
	case scope == schemas.ScopeNone && e.Status == schemas.StatusOK:
		return !e.Valid && e.Truncated
	case scope == schemas.ScopeGroup:
		return false
	}
	return true
}

// canRescue reports whether a continuation of the stream may be asked for
// now: the group may rescue and has a rescue left, none is running or
// being asked for, the streamer gave at least a token to continue from,
// and time is left for one to be of use.
func (g *Group) canRescue(streamer *attempt) bool {
	return g.rescueLeft() && streamer.firstToken && g.rescuing == 0 && !g.askPending &&
		g.remaining() >= g.policy.MinUsefulTime
}

func (g *Group) rescueLeft() bool {
	return g.committed && !g.streamDone && g.start.Continuable && g.rescues < g.policy.Rescues
}

func (g *Group) askRescue() {
	g.rescues++
	g.askPending = true
	g.askRole = schemas.RoleContinuation
	// Not the routes that broke or stall this stream; a route that lost
	// the race to commit is as good as any.
	exclude := slices.Clone(g.brokenRoutes)
	if s := g.attempt(g.streamer); !slices.Contains(exclude, s.route) {
		exclude = append(exclude, s.route)
	}
	g.emit(AskHedgeBudget{Attempt: len(g.attempts) + 1, Role: schemas.RoleContinuation, Exclude: exclude})
}

// onRescueBudget launches the continuation the budget granted, unless the
// stream needs it no longer.
func (g *Group) onRescueBudget(e HedgeBudgetDecided) {
	s := g.attempt(g.streamer)
	if !e.Allowed {
		reason := e.Reason
		if reason == "" {
			reason = ReasonBudget
		}
		g.emit(HedgeSuppressed{Role: schemas.RoleContinuation, Reason: reason})
		if s.state == attemptRunning {
			g.watchStall(s) // a stall: the streamer may still resume
		} else {
			g.endStream(g.streamer, g.broke.status, g.broke.scope)
		}
		return
	}
	if g.streamDone || !g.now.Before(g.deadline) || (s.state == attemptRunning && g.now.Sub(s.lastTokenAt) < g.start.StallBound) {
		// The stream ended, or the stalled streamer resumed, meanwhile.
		g.emit(Release{Reservation: e.Reservation})
		g.watchStall(s)
		return
	}
	g.launch(schemas.RoleContinuation, e.Route, e.Reservation)
	g.rescuing = len(g.attempts)
}

// onStreamProgress follows the committed stream's attempts: the streamer's
// tokens (a stalled streamer's next one wins its race), and a
// continuation's first token, which splices it in.
func (g *Group) onStreamProgress(a *attempt, e Progress, grew bool) {
	if a.n == g.rescuing {
		switch {
		case !e.Valid:
			g.cancel(a, CancelInvalid)
			g.continuationGone(a, true)
		case e.FirstToken:
			g.splice(a)
		}
		return
	}
	if !grew {
		return
	}
	a.lastTokenAt = g.now
	if c := g.live(g.rescuing); c != nil {
		// The stalled streamer resumed first: it keeps the stream.
		g.rescuing = 0
		if c.state == attemptRunning {
			g.cancel(c, CancelLostRace)
		}
	}
	g.watchStall(a)
}

// onStreamResult ends the streamer or the running continuation with its
// result.
func (g *Group) onStreamResult(a *attempt, e Result, scope schemas.ErrorScope) {
	if scope == schemas.ScopeNone && e.Status == schemas.StatusOK && e.Valid {
		if a.n == g.rescuing {
			// The continuation's whole rest came before any token of it.
			g.splice(a)
		}
		if c := g.live(g.rescuing); c != nil && c.state == attemptRunning {
			g.cancel(c, CancelLostRace)
		}
		g.rescuing = 0
		g.endStream(a.n, e.Status, scope)
		g.endAttempt(a, OutcomeWinner, e.Status, scope, e.Usage, false)
		return
	}
	mendable := rescuable(e, scope)
	status := e.Status
	if scope == schemas.ScopeNone && status == schemas.StatusOK {
		// A streaming commit point cannot see what only the result shows
		// (truncation, the content filter): the stream broke.
		status, scope = schemas.StatusContractInvalid, schemas.ScopeTransient
	}
	if scope == schemas.ScopeNone {
		scope = schemas.ScopeTransient
	}
	if a.n == g.rescuing {
		g.endAttempt(a, OutcomeFailed, status, scope, e.Usage, false)
		g.continuationGone(a, mendable)
		return
	}
	g.streamBroke(a, status, scope, e.Usage, mendable)
}

// streamBroke ends the streamer a, which broke, and asks for a
// continuation when one may mend it; otherwise the stream ends with the
// break (never with bytes of another attempt).
func (g *Group) streamBroke(a *attempt, status schemas.StatusClass, scope schemas.ErrorScope, usage schemas.Usage, mendable bool) {
	g.broke = brokenStream{status: status, scope: scope}
	g.brokenRoutes = append(g.brokenRoutes, a.route)
	switch {
	case !mendable:
		if c := g.live(g.rescuing); c != nil && c.state == attemptRunning {
			g.cancel(c, CancelGroupError)
		}
		g.rescuing = 0
		g.endStream(a.n, status, scope)
	case g.rescuing != 0 || (g.askPending && g.askRole == schemas.RoleContinuation):
		// A continuation already races the stalled streamer: it may still take over.
	case g.canRescue(a):
		g.askRescue()
	default:
		g.endStream(a.n, status, scope)
	}
	g.endAttempt(a, OutcomeWinner, status, scope, usage, false)
}

// continuationFailed ends the running continuation a with its failure.
func (g *Group) continuationFailed(a *attempt, status schemas.StatusClass, scope schemas.ErrorScope, usage schemas.Usage) {
	g.endAttempt(a, OutcomeFailed, status, scope, usage, false)
	g.continuationGone(a, scope != schemas.ScopeGroup)
}

// continuationGone goes on after the running continuation a failed: the
// stalled streamer may still resume, another continuation may be asked
// for, or the stream ends with its break.
func (g *Group) continuationGone(a *attempt, mendable bool) {
	g.rescuing = 0
	g.brokenRoutes = append(g.brokenRoutes, a.route)
	s := g.attempt(g.streamer)
	switch {
	case g.streamDone:
	case s.state == attemptRunning:
		g.watchStall(s)
	case mendable && g.canRescue(s):
		g.askRescue()
	default:
		g.endStream(g.streamer, g.broke.status, g.broke.scope)
	}
}

// splice makes continuation c the stream's streamer.
func (g *Group) splice(c *attempt) {
	old := g.attempt(g.streamer)
	g.rescuing = 0
	g.streamer = c.n
	c.streamed, c.firstToken, c.lastTokenAt = true, true, g.now
	g.emit(Splice{Attempt: c.n, From: old.n})
	if old.state == attemptRunning {
		g.cancel(old, CancelLostRace)
	}
	g.watchStall(c)
}

// watchStall arms the stall timer of the running streamer a, when a
// rescue is left to start beside it.
func (g *Group) watchStall(a *attempt) {
	if g.start.StallBound <= 0 || a.stallSet || a.state != attemptRunning || a.n != g.streamer || !g.rescueLeft() {
		return
	}
	a.stallSet = true
	g.emit(ArmTimer{Kind: TimerStall, Attempt: a.n, At: a.lastTokenAt.Add(g.start.StallBound)})
}

// onStallTimer starts a continuation beside a streamer whose next token is
// StallBound late; the streamer runs on and keeps its chance.
func (g *Group) onStallTimer(a *attempt) {
	a.stallSet = false
	if a.n != g.streamer || a.state != attemptRunning || g.rescuing != 0 || g.askPending {
		return
	}
	if g.now.Sub(a.lastTokenAt) < g.start.StallBound {
		g.watchStall(a)
		return
	}
	if g.canRescue(a) {
		g.askRescue()
	}
}

// stopStream stops the committed stream at the deadline or when its caller
// left: its streamer and a running continuation are cancelled, and no
// continuation starts.
func (g *Group) stopStream(reason CancelReason) {
	if g.streamDone {
		return
	}
	for _, n := range []int{g.streamer, g.rescuing} {
		if a := g.live(n); a != nil && a.state == attemptRunning {
			g.cancel(a, reason)
		}
	}
	g.rescuing = 0
	status := schemas.StatusCanceled
	if reason == CancelDeadline {
		status = schemas.StatusTimeout
	}
	g.endStream(g.streamer, status, schemas.ScopeNone)
}

// endStream tells the driver, once, how the caller's stream ended.
func (g *Group) endStream(n int, status schemas.StatusClass, scope schemas.ErrorScope) {
	if g.streamDone {
		return
	}
	g.streamDone = true
	g.emit(StreamEnded{Attempt: n, Status: status, Scope: scope})
}
