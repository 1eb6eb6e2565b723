package dispatcher

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/schemas"
)

func (g *group) launch(l hedge.Launch) {
	d := g.d
	a := &attemptRun{n: l.Attempt, route: l.Route, role: l.Role, launchedAt: d.now()}
	g.attempts = append(g.attempts, a)
	g.launchCharge(a, l.Reservation)
	secret, err := schemas.NewAttemptSecret()
	if err != nil { // crypto/rand does not fail on the platforms Go supports
		d.log.Warn("attempt not published", "group", g.id, "route", a.route, "err", err)
		g.post(hedge.Result{Attempt: a.n, Status: schemas.StatusNoResponders, Scope: schemas.ScopeTransient})
		return
	}
	a.secret = secret
	_ = d.picker.Acquire(l.Route)
	d.metrics.attempts.WithLabelValues(string(l.Role)).Inc()
	switch l.Role {
	case schemas.RoleHedge:
		d.metrics.hedges.Inc()
		g.judgeStall(true, false)
	case schemas.RoleContinuation:
		// It continues what the caller has of the stream (docs/architecture.md §6, "Rescue").
		a.prefix, a.offset = g.relayed.String(), g.relayedTokens
		d.metrics.rescues.WithLabelValues(rescueStarted).Inc()
	}
	g.publishAttempt(a, l.Deadline, l.Remaining)
}

// publishAttempt sends attempt a to its route: at its launch, and again
// when a worker refused it Busy (reoffer).
func (g *group) publishAttempt(a *attemptRun, deadline time.Time, remaining time.Duration) {
	d := g.d
	msg := schemas.Attempt{
		GroupID: g.id, UserActionID: g.ua, Attempt: a.n, Role: a.role, Route: a.route,
		OperationClass: g.class.Name, ModelClass: g.sub.Pool,
		DeadlineUnixMs: deadline.UnixMilli(), RemainingMs: max(remaining.Milliseconds(), 1),
		CommitPoint: g.eng.CommitPoint(), ReplyInbox: g.inbox + "." + strconv.Itoa(a.n),
		Secret:  a.secret,
		Request: g.sub.Request,
		// A stream's first chunk stands for its first byte (§8).
		FoldsFirstByte: true,
		// The cohort's stall bound, derived from its inter-token gaps
		// (docs/architecture.md §4 rule 4).
		StallAfterFirstTokenMs: g.class.StallBound(g.cohort.Key(), d.now()).Milliseconds(),
	}
	if g.stallBound > 0 {
		// A rescued group starts a continuation at the stall bound and
		// lets the stalled attempt race it for one more bound before its
		// worker gives up on it (§6, "Rescue").
		msg.StallAfterFirstTokenMs = 2 * g.stallBound.Milliseconds()
	}
	if a.role == schemas.RoleContinuation {
		msg.Continuation = &schemas.Continuation{Text: a.prefix, OffsetTokens: int64(a.offset)}
	}
	// MarshalJSON directly: json.Marshal would only re-scan its output.
	data, err := msg.MarshalJSON()
	if err == nil {
		err = d.nc.PublishMsg(&nats.Msg{Subject: d.wire.AttemptSubject(a.route), Reply: msg.ReplyInbox, Data: data})
	}
	if err != nil {
		d.log.Warn("attempt not published", "group", g.id, "route", a.route, "err", err)
		g.post(hedge.Result{Attempt: a.n, Status: schemas.StatusNoResponders, Scope: schemas.ScopeTransient})
	}
}

func (g *group) sendCancel(a *attemptRun, reason hedge.CancelReason) {
	c := schemas.Cancel{GroupID: g.id, Attempt: a.n, Reason: schemas.CancelReason(reason), Secret: a.secret}
	if a.controlInbox == "" {
		a.cancel = &c // sent when the Accept names the control inbox
		return
	}
	g.publishCancel(a, c)
	if reason == hedge.CancelLostRace && !g.arrived.IsZero() {
		g.d.metrics.cancelDispatch.Observe(g.d.now().Sub(g.arrived).Seconds())
	}
}

func (g *group) publishCancel(a *attemptRun, c schemas.Cancel) {
	g.d.log.Debug("cancel", "group", g.id, "attempt", a.n, "inbox", a.controlInbox)
	data, err := c.MarshalJSON()
	if err == nil {
		err = g.d.nc.Publish(a.controlInbox, data)
	}
	if err != nil {
		g.d.log.Warn("cancel not sent", "group", g.id, "attempt", a.n, "err", err)
	}
}

// translate turns a wire message into the engine events it stands for, once
// checkReply has found it is what the attempt's worker would send: then, and
// first before it when the message also reports the attempt's first byte
// (a folded one, schemas.Attempt.FoldsFirstByte); either may be nil.
func (g *group) translate(in inboundEvent) (first, then hedge.Event) {
	a := g.attempt(in.attempt)
	if a == nil {
		g.d.dropReply(dropAttempt)
		return nil, nil
	}
	if in.msg.Header != nil && in.msg.Header.Get("Status") == "503" {
		// The server's no-responders answer to the attempt's publication:
		// it comes before any worker took the attempt, or not at all.
		if a.workerID != "" {
			g.d.dropReply(dropStatus)
			return nil, nil
		}
		return nil, hedge.Unserved{Attempt: a.n}
	}
	reply, err := schemas.DecodeReply(in.msg.Data)
	if err != nil {
		g.d.dropReply(dropMalformed)
		g.d.log.Debug("dropped an undecodable reply", "group", g.id, "attempt", a.n, "err", err)
		return nil, nil
	}
	if reason := g.checkReply(a, reply); reason != "" {
		g.d.dropReply(reason)
		g.d.log.Debug("reply dropped", "group", g.id, "attempt", a.n, "type", reply.ReplyType(), "reason", reason)
		return nil, nil
	}
	now := g.d.now()
	switch m := reply.(type) {
	case *schemas.Accept:
		g.onAccepted(a.route)
		a.controlInbox, a.workerID = m.ControlInbox, m.WorkerID
		if a.cancel != nil {
			g.publishCancel(a, *a.cancel)
			a.cancel = nil
		}
		return nil, hedge.Accepted{Attempt: a.n}
	case *schemas.Busy:
		g.onBusy(a)
		return nil, hedge.Busy{Attempt: a.n}
	case *schemas.Heartbeat:
		return nil, hedge.Heartbeat{Attempt: a.n}
	case *schemas.FirstByte:
		return nil, g.firstByteCame(a, now)
	case *schemas.Chunk:
		if a.firstByte == 0 {
			// A worker that folds the first byte into the first chunk
			// (schemas.Attempt.FoldsFirstByte) sent no FirstByte.
			first = g.firstByteCame(a, now)
		}
		if m.Seq != a.lastSeq+1 {
			return nil, g.lost(a, "chunk sequence gap")
		}
		a.lastSeq = m.Seq
		a.tokens = int(m.CumulativeTokens)
		a.firstToken = a.firstToken || m.First
		a.content.WriteString(m.Delta)
		switch {
		case a.n == g.streamer:
			g.deliverChunk(a, *m)
		case g.winner == 0 || (a.role == schemas.RoleContinuation && !a.streamed):
			a.chunks = append(a.chunks, *m) // until the commit, or its splice, decides
		}
		// After another attempt's commit (a loser, or a control group's
		// kept baseline), or once a continuation took the stream over,
		// none of its bytes reaches the caller.
		v := arbiter.Validate(g.contract, g.eng.CommitPoint(), arbiter.Observation{WellFormed: true, Tokens: a.tokens, FirstToken: a.firstToken})
		return first, hedge.Progress{Attempt: a.n, Tokens: a.tokens, FirstToken: a.firstToken, Valid: v.Valid || !v.Ready}
	case *schemas.AttemptResult:
		if m.LastSeq != a.lastSeq {
			return nil, g.lost(a, "result after a chunk gap")
		}
		a.result = m
		if a.firstByte == 0 && m.FirstByteMs != nil {
			// A first byte that no message reported, folded into the
			// result: it came the result's elapsed_ms − first_byte_ms ago.
			before := time.Duration(max(m.ElapsedMs-*m.FirstByteMs, 0)) * time.Millisecond
			at := now.Add(-before)
			if !at.After(a.launchedAt) {
				at = a.launchedAt.Add(time.Nanosecond)
			}
			first = g.firstByteCame(a, at)
		}
		usage := m.Usage
		if m.StatusClass == schemas.StatusCanceled && m.CancellationObserved {
			return first, hedge.CancelObserved{Attempt: a.n, Usage: usage}
		}
		g.class.ObserveResult(g.cohort, a.route, now, a.role, m.StatusClass, now.Sub(a.launchedAt))
		g.class.ObserveTokenGap(g.cohort.Key(), now, m.StatusClass, time.Duration(m.MaxTokenGapMs)*time.Millisecond)
		content := m.Content
		if content == "" {
			content = a.content.String()
		}
		tokens := max(a.tokens, int(m.Usage.OutputUnits))
		if perToken, ok := route.DecodeTime(g.sub.Request.Stream && a.role != schemas.RoleContinuation, m.StatusClass, now.Sub(a.launchedAt), a.firstByte, tokens); ok {
			_ = g.d.picker.ObserveDecode(a.route, perToken, now)
		}
		if a.role == schemas.RoleContinuation {
			// A continuation is judged by the answer it ends: the text
			// it continues joined with its own (§6, "Rescue").
			content, tokens = a.prefix+content, a.offset+tokens
		}
		// The result is judged whole (the success predicate included,
		// docs/architecture.md §6) whatever the commit point: a winner
		// committed at its first token whose result fails ends its stream
		// with an error (§4 rule 3).
		obs := arbiter.Observation{Status: m.StatusClass, WellFormed: g.wellFormed(m), FirstToken: a.firstToken || content != "",
			Tokens: tokens, MaxTokens: g.sub.Request.MaxTokens,
			Done: true, FinishReason: m.FinishReason, Content: []byte(content), Refusal: m.Refusal != ""}
		switch {
		case len(m.Embeddings) > 0:
			obs.Content = m.Embeddings // an embeddings answer is its vectors
		case schemas.HasToolCalls(m.ToolCalls) && strings.TrimSpace(content) == "":
			obs.Content = m.ToolCalls
		}
		v := arbiter.Validate(g.contract, schemas.Complete, obs)
		g.retryAfter = max(g.retryAfter, time.Duration(m.RetryAfterMs)*time.Millisecond)
		return first, hedge.Result{Attempt: a.n, Status: m.StatusClass, Scope: m.ErrorScope, Valid: v.Valid, Usage: usage,
			RetryAfter: time.Duration(m.RetryAfterMs) * time.Millisecond, Truncated: arbiter.CutShort(obs)}
	}
	return nil, nil
}

// firstByteCame notes attempt a's first byte, which reached the dispatcher
// at (or, folded into its result, came at) at: the route's and cohort's
// samples, the metric, the primary's stall judgement.
func (g *group) firstByteCame(a *attemptRun, at time.Time) hedge.Event {
	a.firstByte = at.Sub(a.launchedAt)
	_ = g.d.picker.Observe(a.route, a.firstByte, at)
	g.d.metrics.firstByte.Observe(a.firstByte.Seconds())
	g.class.ObserveFirstByte(g.cohort, a.route, at, a.role, a.firstByte)
	if a.n == 1 {
		g.judgeStall(false, false)
	}
	return hedge.FirstByte{Attempt: a.n}
}

// checkReply returns why reply, which came on attempt a's inbox, is not
// one of a's worker's (a dropReason), or "" when it is: it names a's group
// and number, returns a's secret, and comes from the worker that accepted
// a — an Accept or Busy from any worker before one accepted, anything
// from that worker after (docs/architecture.md §8). The secret is
// compared in constant time.
func (g *group) checkReply(a *attemptRun, reply schemas.Reply) string {
	group, n := reply.AttemptRef()
	worker, secret := reply.Sender()
	switch {
	case n != a.n:
		return dropAttempt
	case group != g.id:
		return dropGroup
	case !schemas.SameSecret(a.secret, secret):
		return dropSecret
	case worker == "":
		return dropWorker
	case a.workerID != "":
		if worker != a.workerID {
			return dropWorker
		}
	default: // no worker has accepted a yet
		if t := reply.ReplyType(); t != schemas.ReplyAccept && t != schemas.ReplyBusy {
			return dropWorker
		}
	}
	return ""
}

// lost fails an attempt whose stream broke on the wire; its worker may still
// be running, so it is told to stop.
func (g *group) lost(a *attemptRun, why string) hedge.Event {
	g.d.log.Warn("attempt lost", "group", g.id, "attempt", a.n, "why", why)
	g.sendCancel(a, hedge.CancelInvalid)
	return hedge.Result{Attempt: a.n, Status: schemas.StatusLost, Scope: schemas.ScopeTransient}
}
