package dispatcher

import (
	"context"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/schemas"
)

// delivery is what the group hands to the caller's goroutine: the commit
// of a stream, a piece of it, or the final answer or error.
type delivery struct {
	commit *Response
	delta  *Delta
	resp   *Response
	err    error
}

func (g *group) commit(c hedge.Commit) {
	d := g.d
	g.winner, g.gateValue = c.Attempt, c.Gate
	a := g.attempt(c.Attempt)
	g.streamer, a.streamed = a.n, true
	d.metrics.wins.WithLabelValues(string(a.role)).Inc()
	d.metrics.groups.WithLabelValues("committed").Inc()
	d.metrics.groupDuration.Observe(d.now().Sub(g.start).Seconds())
	if g.sub.Request.Stream {
		g.send(delivery{commit: g.commitResponse(a)})
	}
	g.deliverChunks(a)
	if !g.sub.Request.Stream || a.result != nil {
		g.finish(delivery{resp: g.response(a)})
	}
	if d.records != nil {
		rec := g.groupRecord(hedge.GroupEnded{Committed: true, Winner: c.Attempt, Attempts: len(g.attempts),
			HedgeLaunched: g.hedged(), HedgeSuppressed: g.suppressed, Usage: g.ended, Latency: d.now().Sub(g.start)})
		rec.Event = schemas.EventGroupCommitted
		g.committed = &rec
	}
}

func (g *group) response(a *attemptRun) *Response {
	r := &Response{
		UserActionID: g.ua, GroupID: g.id, Attempts: len(g.attempts), Hedged: g.hedged(),
		Winner: a.n, WinnerRoute: a.route, Gate: g.gateValue,
	}
	if a.result != nil {
		r.FinishReason, r.Usage, r.ToolCalls, r.Refusal = a.result.FinishReason, a.result.Usage, a.result.ToolCalls, a.result.Refusal
		r.Embeddings = a.result.Embeddings
		r.Content = a.result.Content
		if r.Content == "" && !g.sub.Request.Stream {
			r.Content = a.content.String()
		}
	}
	if a.n != g.winner && a.streamed {
		// A rescued stream: its answer is the winner's text and each
		// continuation's, and its usage what all of them used; the winner
		// is still the attempt the gate elected.
		r.Content, r.Usage = g.relayed.String(), g.streamUsage()
		r.Winner, r.WinnerRoute = g.winner, g.attempt(g.winner).route
	}
	return r
}

// commitResponse is the commit a stream's CommitSink is handed. Its usage
// is the winner's when its result is already in (a commit point of
// complete); before that the provider's count of the prompt arrives only
// with the result, at the stream's end, so the input is the dispatcher's
// own estimate of the request (estimateInput, the size its spend budget
// reserves and a cancelled attempt is billed), marked Estimated, and the
// output zero.
func (g *group) commitResponse(a *attemptRun) *Response {
	r := g.response(a)
	if a.result == nil {
		r.Usage = schemas.Usage{InputUnits: estimateInput(g.sub.Request), Estimated: true}
	}
	return r
}

// streamUsage is what the attempts that fed a rescued stream used: each
// one's reported usage, with no less output than the tokens the caller got
// of it (an attempt that broke may have reported none).
func (g *group) streamUsage() schemas.Usage {
	var total schemas.Usage
	next := g.relayedTokens
	for i := len(g.attempts) - 1; i >= 0; i-- {
		a := g.attempts[i]
		if !a.streamed {
			continue
		}
		var u schemas.Usage
		if a.result != nil {
			u = a.result.Usage
		}
		if relayed := int64(next - a.offset); u.OutputUnits < relayed {
			u.OutputUnits, u.Estimated = relayed, true
		}
		next = a.offset
		total = total.Add(u)
	}
	return total
}

func (g *group) hedged() bool {
	for _, a := range g.attempts {
		if a.role == schemas.RoleHedge {
			return true
		}
	}
	return false
}

// deliverChunks relays what a's output held before it fed the stream (its
// commit, or its splice).
func (g *group) deliverChunks(a *attemptRun) {
	for _, ch := range a.chunks {
		g.deliverChunk(a, ch)
	}
	a.chunks = nil
}

func (g *group) deliverChunk(a *attemptRun, ch schemas.Chunk) {
	if g.delivered || !g.sub.Request.Stream {
		return
	}
	g.streamed = true
	if g.continues != nil {
		g.relayed.WriteString(ch.Delta)
		g.relayedTokens = a.offset + int(ch.CumulativeTokens)
	}
	g.send(delivery{delta: &Delta{Content: ch.Delta, ToolCalls: ch.ToolCalls}})
}

// splice goes on with the committed stream from continuation s.Attempt's
// output (docs/architecture.md §6, "Rescue"): what it produced so far
// follows the text the caller has, and nothing more of s.From does.
func (g *group) splice(s hedge.Splice) {
	a := g.attempt(s.Attempt)
	g.streamer, a.streamed = a.n, true
	g.countRescue(a, rescueWon)
	g.deliverChunks(a)
}

// streamEnded ends the caller's committed stream as the engine decided:
// with the answer, or with an error event when it broke and no
// continuation finished it (never with bytes of another attempt).
func (g *group) streamEnded(e hedge.StreamEnded) {
	switch {
	case e.Status == schemas.StatusOK:
		g.finish(delivery{resp: g.response(g.attempt(e.Attempt))})
	case e.Status == schemas.StatusCanceled:
		g.failCommitted(schemas.ErrCanceled, e.Scope)
	case e.Status == schemas.StatusTimeout || !g.d.now().Before(g.start.Add(g.deadline)):
		// The worker enforces the attempt's deadline too, and may report
		// it before the group's own timer fires.
		g.failCommitted(schemas.ErrDeadlineExceeded, e.Scope)
	default:
		g.failCommitted(schemas.ErrStreamInterrupted, e.Scope)
	}
}

// send hands a delivery to the caller; a slow caller slows its own group's
// stream (backpressure), a departed one is skipped.
//
// Deliveries wait until every action of the event was carried out, so the
// cancels a commit decides go out before the caller is handed anything: a
// slow caller must not delay stopping the losers.
func (g *group) send(dl delivery) { g.pending = append(g.pending, dl) }

// deliver hands the caller what this event produced, in order, then
// publishes the records it produced.
func (g *group) deliver() {
	if g.committed != nil && len(g.pending) > 0 {
		g.keepCommit()
	}
	for _, dl := range g.pending {
		select {
		case g.out <- dl:
		case <-g.gone:
		}
	}
	g.pending = g.pending[:0]
	g.publishRecords()
}

// finish hands the caller its one final delivery; an answer awaiting the
// total usage waits for the group's end (groupEnded).
func (g *group) finish(dl delivery) {
	if g.delivered {
		return
	}
	g.delivered = true
	if dl.resp != nil && g.sub.AwaitTotalUsage {
		g.held = dl.resp
		return
	}
	g.send(dl)
}

// failCommitted ends a committed stream with an error. Its caller never
// got the whole answer (at most a prefix and an error event), so nothing of
// the user action was delivered: the group gives its winner gate claim
// back (compare-and-delete, before the caller hears of the failure) and its
// final record says failed, so a retry of the user action can commit
// instead of meeting this commit with 409 already_committed
// (docs/architecture.md §6, "A commit that was never delivered").
func (g *group) failCommitted(code schemas.ErrorCode, scope schemas.ErrorScope) {
	if g.delivered {
		return
	}
	g.finish(delivery{err: &GroupError{Group: g.id, Pool: g.sub.Pool, Code: code, Scope: scope, Streamed: g.streamed}})
	g.voided = code
	claim := arbiter.Claim{UserAction: g.ua, Group: g.id, Attempt: g.winner, Won: true, Value: g.gateValue}
	if err := g.d.gate.Clear(context.Background(), claim); err != nil {
		g.d.log.Warn("failed commit's gate claim not given back", "group", g.id, "err", err)
	}
}

// retryAfterFor is how long a caller should wait before retrying a group
// that failed with code: the longest pause the routes asked for when they
// all pushed back, the rest of the tenant's spend window when that refused
// the primary, and 0 when waiting does not help.
func (g *group) retryAfterFor(code schemas.ErrorCode) time.Duration {
	switch {
	case code == schemas.ErrRateLimited:
		return max(g.retryAfter, time.Second)
	case code == schemas.ErrOverloaded && g.capacityAfter > 0:
		// No route had capacity (a provider key's limits): when the
		// slices expect some (docs/architecture.md §7, "Route capacity").
		return max(g.capacityAfter, time.Second)
	case code == schemas.ErrOverloaded:
		return g.overloadedRetryAfter()
	case code == schemas.ErrGateUnavailable:
		return time.Second
	case code == schemas.ErrBudgetExhausted && g.denied == budgets.ReasonAttempts:
		// A full ledger that forgave a death's slots or holds a live
		// attempt's: the retry of a death is told when, never not to
		// retry (docs/architecture.md §7).
		return g.ledgerAfter
	case code == schemas.ErrBudgetExhausted && g.denied == budgets.ReasonSpendTenant:
		if sp := g.spend(); sp.TenantWindow > 0 {
			now := g.d.now()
			end := time.UnixMilli(budgets.TenantWindowStart(now, sp.TenantWindow)).Add(sp.TenantWindow)
			return end.Sub(now)
		}
	}
	return 0
}

// The outcomes of hedgerow_rescues_total: a continuation started, and how
// it ended — spliced into the stream, beaten by the stalled attempt it
// stood beside, or failed before either.
const (
	rescueStarted     = "started"
	rescueWon         = "won"
	rescueOriginalWon = "original_won"
	rescueFailed      = "failed"
)

// countRescue counts continuation a's outcome, once.
func (g *group) countRescue(a *attemptRun, outcome string) {
	if a.rescued != "" {
		return
	}
	a.rescued = outcome
	g.d.metrics.rescues.WithLabelValues(outcome).Inc()
}
