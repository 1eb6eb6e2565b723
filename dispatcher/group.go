package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/schemas"
)

// localReservation prefixes the ids of reservations made while the budget
// store was unreachable: the primary went on, and nothing is settled for it.
const localReservation = "local:"

// attemptState is the driver's view of one launched attempt: what the wire
// told it, beyond what the engine keeps.
type attemptState struct {
	n            int
	route        string
	role         schemas.Role
	launchedAt   time.Time
	secret       string // schemas.Attempt.Secret: never logged, recorded or counted
	controlInbox string
	cancel       *schemas.Cancel // decided before the Accept named the inbox
	lastSeq      int64
	tokens       int
	firstToken   bool
	chunks       []schemas.Chunk // buffered until the commit decides
	content      strings.Builder
	result       *schemas.AttemptResult
	firstByte    time.Duration
	workerID     string
	outcome      hedge.Outcome    // how it ended, once it did
	ended        *AttemptTimeline // once it did, for the group's trace
}

// delivery is what the group hands to the caller's goroutine: the commit
// of a stream, a piece of it, or the final answer or error.
type delivery struct {
	commit *Response
	delta  *Delta
	resp   *Response
	err    error
}

// group drives one hedge group: the engine, fed by real events.
type group struct {
	d          *Dispatcher
	sub        Submission
	class      *policy.Class
	routes     []string
	contract   *arbiter.Contract
	cohort     delay.Cohort
	arm        delay.Arm
	guard      schemas.GuardrailDecision
	eng        *hedge.Group
	id         string
	replyToken string // the group's key in d.replies
	ua         string
	print      string     // the prompt fingerprint, once fingerprint computed it
	inbox      string     // prefix of the attempts' reply inboxes, routed by d.replies
	events     eventQueue // hedge.Event or inboundEvent
	out        chan delivery
	gone       chan struct{}   // closed when the caller stopped reading out
	pending    []delivery      // for the caller, handed over after the event's actions
	records    []pendingRecord // published after pending was handed over
	// committed is the group's record at its commit, kept before pending
	// (the answer) is handed over (docs/architecture.md §9).
	committed *schemas.GroupRecord
	// ended and suppressed are what the committed record says of the
	// attempts ended by the commit and of a hedge held back.
	ended      schemas.Usage
	suppressed string
	attempts   []*attemptState
	// timers are the engine's armed timers, stopped and cut off from the
	// group as it ends: each would hold it until it fires (up to the whole
	// deadline).
	timers    []*armedTimer
	start     time.Time
	deadline  time.Duration
	queueWait time.Duration // the pool's bound on re-offers after a Busy (§4 rule 4)
	delay     time.Duration
	armed     bool
	winner    int
	gateValue string
	// supersedes is the orphaned group whose gate holding this group, a
	// takeover, cleared (claim); its records name it (docs/architecture.md §9).
	supersedes string
	delivered  bool // the caller got its final delivery
	// held is the final answer kept until the group ends, for a caller
	// that awaits the total usage (Submission.AwaitTotalUsage).
	held     *Response
	streamed bool // bytes of the committed stream reached the caller
	// voided is the error a committed stream ended with: its caller never
	// got the whole answer, so the group gave its gate claim back and its
	// records say it failed (failCommitted).
	voided schemas.ErrorCode
	// retryAfter is the longest pause a route's failure asked for; denied
	// is why the store refused the primary. Both size GroupError.RetryAfter.
	retryAfter time.Duration
	denied     budgets.Reason
	// ledgerAfter is when a full attempt ledger that refused the primary
	// lapses, when a death may be why it is full (budgets.Admission).
	ledgerAfter time.Duration
}

// pendingRecord is a record waiting for the caller's delivery to go first:
// published live on subject, kept under stored with message id.
type pendingRecord struct {
	subject, stored, id string
	rec                 json.Marshaler
}

// retryAfterFor is how long a caller should wait before retrying a group
// that failed with code: the longest pause the routes asked for when they
// all pushed back, the rest of the tenant's spend window when that refused
// the primary, and 0 when waiting does not help.
func (g *group) retryAfterFor(code schemas.ErrorCode) time.Duration {
	switch {
	case code == schemas.ErrRateLimited:
		return max(g.retryAfter, time.Second)
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

// contractFor is the contract of the pool a model name names (its own name
// or an alias), with the request's response_format added when it asks for
// JSON: an answer that does not parse or fails the schema never wins, and
// another attempt may. A front door calls it to
// refuse a response_format before submitting. Errors match ErrUnknownPool,
// or ErrBadRequest together with arbiter.ErrInvalidResponseFormat or
// arbiter.ErrInvalidContract (a schema that does not compile, or whose
// compile ctx or the cache's timeout stopped: arbiter.ErrCompileAborted).
// The caller's schema is compiled once per distinct schema (d.schemaCache).
func (d *Dispatcher) contractFor(ctx context.Context, model string, responseFormat json.RawMessage) (*arbiter.Contract, error) {
	pool, ok := d.resolve(model)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPool, model)
	}
	spec := d.specs[pool]
	spec, changed, err := spec.WithResponseFormat(responseFormat)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if !changed {
		return d.contracts[pool], nil
	}
	c, err := d.schemaCache.Contract(ctx, spec)
	if err != nil {
		if errors.Is(err, arbiter.ErrCompileAborted) && ctx.Err() != nil {
			// The caller left: nobody is told, and the request was not bad.
			return nil, fmt.Errorf("dispatcher: response_format: %w", ctx.Err())
		}
		return nil, fmt.Errorf("%w: response_format: %w", ErrBadRequest, err)
	}
	return c, nil
}

// NewGroupID reserves the id of a group this dispatcher will run. A door
// that must name its request's group before it runs — in the in-flight
// marker a takeover reads (docs/architecture.md §2) — passes it back in
// Submission.GroupID.
func (d *Dispatcher) NewGroupID() string {
	d.mu.Lock()
	d.nextSeq++
	seq := d.nextSeq
	d.mu.Unlock()
	return d.id + "-" + strconv.FormatUint(seq, 36)
}

func (d *Dispatcher) newGroup(ctx context.Context, sub Submission) (*group, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, ErrShuttingDown
	}
	id := sub.GroupID
	if id == "" {
		id = d.NewGroupID()
	} else if !strings.HasPrefix(id, d.id+"-") {
		return nil, fmt.Errorf("%w: group id %q was not reserved on this dispatcher", ErrBadRequest, id)
	}
	if err := sub.Request.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	// The caller may name the pool by any of its model names; from here on
	// the group knows only the pool's own name, which is what records,
	// cohorts, budgets and subjects may carry (docs/architecture.md §10).
	poolName, ok := d.resolve(sub.Pool)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPool, sub.Pool)
	}
	sub.Pool = poolName
	pool := d.pools[poolName]
	if limit := d.MaxTokens(poolName); sub.Request.MaxTokens > limit {
		return nil, fmt.Errorf("%w: %w: %d, over %d", ErrBadRequest, ErrMaxTokens, sub.Request.MaxTokens, limit)
	}
	if err := d.checkDialects(sub.Pool, &sub.Request); err != nil {
		return nil, err
	}
	cl := d.classes[sub.Operation]
	if cl == nil {
		cl = d.classes[policy.DefaultName]
	}
	contract, err := d.contractFor(ctx, sub.Pool, sub.Request.ResponseFormat)
	if err != nil {
		return nil, err
	}
	cohort := delay.NewCohort(cl.Name, sub.Pool, sub.Request.Stream, sub.Request.MaxTokens)
	if sub.Request.Embedding != nil {
		cl, cohort, contract = d.forEmbeddings(cl, cohort) // embeddings.go
	}
	g := &group{
		d: d, sub: sub, class: cl, routes: pool.Routes,
		contract: contract,
		cohort:   cohort,
		id:       id,
		events:   eventQueue{ready: make(chan struct{}, 1)},
		out:      make(chan delivery, 64),
		gone:     make(chan struct{}),
		start:    d.now(),
	}
	if sub.IdempotencyKey != "" {
		g.ua = schemas.UserActionID(d.secret, sub.Tenant, sub.IdempotencyKey)
	} else {
		g.ua = schemas.UserActionID(d.secret, sub.Tenant, g.id)
	}
	engine := cl.Policy.Engine()
	if sub.Deadline > 0 && sub.Deadline < engine.Deadline {
		engine.Deadline = sub.Deadline
		if engine.MinUsefulTime >= engine.Deadline {
			engine.MinUsefulTime = 0
		}
	}
	if pool.QueueWait > 0 {
		engine.QueueWait = pool.QueueWait
	}
	g.queueWait = engine.QueueWait
	g.deadline = engine.Deadline
	if g.eng, err = hedge.New(engine); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if g.inbox, err = d.replies.register(d.nc, g); err != nil {
		return nil, fmt.Errorf("dispatcher: subscribe reply inbox: %w", err)
	}
	return g, nil
}

// serve starts the group and relays its deliveries to the caller.
func (g *group) serve(ctx context.Context, sink Sink) (*Response, error) {
	g.d.groups.Add(1)
	defer close(g.gone)
	// The caller's goroutine carries out the start (admission, the
	// primary's launch) before the loop takes over: the primary goes out
	// without waiting for a new goroutine to be scheduled. Until the loop
	// starts, nothing else touches the engine; what arrives meanwhile
	// waits in g.events.
	g.handle(g.startEvent())
	go g.loop()
	for {
		select {
		case dl := <-g.out:
			switch {
			case dl.commit != nil:
				if c, ok := sink.(CommitSink); ok {
					c.Committed(dl.commit)
				}
			case dl.delta != nil:
				if sink == nil {
					continue
				}
				if err := sink.Delta(*dl.delta); err != nil {
					g.post(hedge.CallerGone{})
					return nil, fmt.Errorf("dispatcher: caller went away: %w", err)
				}
			case dl.err != nil:
				return nil, dl.err
			default:
				return dl.resp, nil
			}
		case <-ctx.Done():
			g.post(hedge.CallerGone{})
			return nil, ctx.Err()
		}
	}
}

func (g *group) startEvent() hedge.Start {
	s := hedge.Start{
		Streaming:             g.sub.Request.Stream,
		NeedsCompleteAnswer:   g.contract.NeedsComplete(),
		InputUnits:            estimateInput(g.sub.Request),
		DecodeTokensPerSecond: g.class.DecodeRate(),
	}
	now := g.d.now()
	d := g.class.Estimator.Delay(g.cohort, now, g.deadline)
	s.HedgeDelay = d.Value
	g.delay = d.Value
	el := g.eligibility(now)
	s.HedgeEligible, s.NotEligibleReason = el.Eligible, el.Reason
	return s
}

// eligibility decides whether the group may hedge, by its class's rule, and
// keeps what its records and its guardrail arm need of the decision.
func (g *group) eligibility(now time.Time) policy.Eligibility {
	el := g.class.Eligibility(policy.Group{ID: g.id, Routes: len(g.routes), Cohort: g.cohort, Now: now,
		PushedBack: g.d.picker.PushedBack(g.routes, now)})
	g.arm, g.guard, g.armed = el.Arm, el.Guardrail, el.Eligible
	return el
}

// estimateInput is a coarse token count of the prompt (4 bytes a token),
// used only when a provider reports no usage for a cancelled attempt.
func estimateInput(r schemas.ChatRequest) int64 {
	n := 0
	for _, m := range r.Messages {
		n += len(m.Content)
	}
	if r.Embedding != nil {
		for _, in := range r.Embedding.Input {
			n += len(in)
		}
	}
	return int64(n/4 + 1)
}

// loop owns the engine: every event is stepped here and nowhere else.
func (g *group) loop() {
	defer g.d.groups.Done()
	defer g.events.close()
	defer g.d.replies.unregister(g)
	defer g.stopTimers()
	for !g.eng.Done() {
		for _, ev := range g.events.take() {
			if g.eng.Done() {
				break
			}
			g.handle(ev)
		}
	}
}

// handle steps one event and carries out what it leads to, including the
// answers the driver gives at once (admission, budgets, elections).
func (g *group) handle(input any) {
	defer g.deliver()
	var first hedge.Event
	switch in := input.(type) {
	case inboundEvent:
		first = g.translate(in)
	case hedge.Event:
		first = in
	}
	if first == nil {
		return
	}
	queue := []hedge.Event{first}
	for len(queue) > 0 {
		ev := queue[0]
		queue = queue[1:]
		for _, act := range g.eng.Step(g.d.now(), ev) {
			if next := g.do(act); next != nil {
				queue = append(queue, next)
			}
		}
	}
}

func (g *group) attempt(n int) *attemptState {
	if n < 1 || n > len(g.attempts) {
		return nil
	}
	return g.attempts[n-1]
}

// translate turns a wire message into an engine event (nil: none), once
// checkReply has found it is what the attempt's worker would send.
func (g *group) translate(in inboundEvent) hedge.Event {
	a := g.attempt(in.attempt)
	if a == nil {
		g.d.dropReply(dropAttempt)
		return nil
	}
	if in.msg.Header != nil && in.msg.Header.Get("Status") == "503" {
		// The server's no-responders answer to the attempt's publication:
		// it comes before any worker took the attempt, or not at all.
		if a.workerID != "" {
			g.d.dropReply(dropStatus)
			return nil
		}
		return hedge.Unserved{Attempt: a.n}
	}
	reply, err := schemas.DecodeReply(in.msg.Data)
	if err != nil {
		g.d.dropReply(dropMalformed)
		g.d.log.Debug("dropped an undecodable reply", "group", g.id, "attempt", a.n, "err", err)
		return nil
	}
	if reason := g.checkReply(a, reply); reason != "" {
		g.d.dropReply(reason)
		g.d.log.Debug("reply dropped", "group", g.id, "attempt", a.n, "type", reply.ReplyType(), "reason", reason)
		return nil
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
		return hedge.Accepted{Attempt: a.n}
	case *schemas.Busy:
		g.onBusy(a)
		return hedge.Busy{Attempt: a.n}
	case *schemas.Heartbeat:
		return hedge.Heartbeat{Attempt: a.n}
	case *schemas.FirstByte:
		a.firstByte = now.Sub(a.launchedAt)
		_ = g.d.picker.Observe(a.route, a.firstByte, now)
		g.d.metrics.firstByte.Observe(a.firstByte.Seconds())
		g.class.ObserveFirstByte(g.cohort, now, a.role, a.firstByte)
		return hedge.FirstByte{Attempt: a.n}
	case *schemas.Chunk:
		if m.Seq != a.lastSeq+1 {
			return g.lost(a, "chunk sequence gap")
		}
		a.lastSeq = m.Seq
		a.tokens = int(m.CumulativeTokens)
		a.firstToken = a.firstToken || m.First
		a.content.WriteString(m.Delta)
		if g.winner == a.n {
			g.deliverChunk(*m)
		} else {
			a.chunks = append(a.chunks, *m)
		}
		v := arbiter.Validate(g.contract, g.eng.CommitPoint(), arbiter.Observation{WellFormed: true, Tokens: a.tokens, FirstToken: a.firstToken})
		return hedge.Progress{Attempt: a.n, Tokens: a.tokens, FirstToken: a.firstToken, Valid: v.Valid || !v.Ready}
	case *schemas.AttemptResult:
		if m.LastSeq != a.lastSeq {
			return g.lost(a, "result after a chunk gap")
		}
		a.result = m
		usage := m.Usage
		if m.StatusClass == schemas.StatusCanceled && m.CancellationObserved {
			return hedge.CancelObserved{Attempt: a.n, Usage: usage}
		}
		g.class.ObserveResult(g.cohort, now, a.role, m.StatusClass, now.Sub(a.launchedAt))
		g.class.ObserveTokenGap(g.cohort.Key(), now, m.StatusClass, time.Duration(m.MaxTokenGapMs)*time.Millisecond)
		content := m.Content
		if content == "" {
			content = a.content.String()
		}
		// The result is judged whole (the success predicate included,
		// docs/architecture.md §6) whatever the commit point: a winner
		// committed at its first token whose result fails ends its stream
		// with an error (§4 rule 3).
		obs := arbiter.Observation{Status: m.StatusClass, WellFormed: g.wellFormed(m), FirstToken: a.firstToken || content != "",
			Tokens: max(a.tokens, int(m.Usage.OutputUnits)), MaxTokens: g.sub.Request.MaxTokens,
			Done: true, FinishReason: m.FinishReason, Content: []byte(content), Refusal: m.Refusal != ""}
		switch {
		case len(m.Embeddings) > 0:
			obs.Content = m.Embeddings // an embeddings answer is its vectors
		case hasToolCalls(m.ToolCalls) && strings.TrimSpace(content) == "":
			obs.Content = m.ToolCalls
		}
		v := arbiter.Validate(g.contract, schemas.Complete, obs)
		g.retryAfter = max(g.retryAfter, time.Duration(m.RetryAfterMs)*time.Millisecond)
		return hedge.Result{Attempt: a.n, Status: m.StatusClass, Scope: m.ErrorScope, Valid: v.Valid, Usage: usage,
			RetryAfter: time.Duration(m.RetryAfterMs) * time.Millisecond}
	}
	return nil
}

// checkReply returns why reply, which came on attempt a's inbox, is not
// one of a's worker's (a dropReason), or "" when it is: it names a's group
// and number, returns a's secret, and comes from the worker that accepted
// a — an Accept or Busy from any worker before one accepted, anything
// from that worker after (docs/architecture.md §8). The secret is
// compared in constant time.
func (g *group) checkReply(a *attemptState, reply schemas.Reply) string {
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

// hasToolCalls reports whether a result's tool calls hold any: a JSON null
// or empty array is none.
func hasToolCalls(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null" && s != "[]"
}

// claim asks the winner gate for attempt. A group that supersedes an
// orphaned request (Submission.Supersedes) and meets that request's own
// group as the holder clears it, compare-and-delete, and claims once more:
// the orphan's gateway died with no answer kept, so its commit reached
// nobody (docs/architecture.md §2). Any other holder stands — another
// request's commit, even of the same dispatcher, may have been answered.
func (g *group) claim(ctx context.Context, attempt int) (arbiter.Claim, error) {
	claim, err := g.d.gate.Claim(ctx, g.ua, g.id, attempt)
	if err != nil || claim.Won || g.sub.Supersedes == "" {
		return claim, err
	}
	holder, perr := arbiter.ParseGateValue(claim.Holder)
	if perr != nil || holder.Group != g.sub.Supersedes {
		return claim, err
	}
	orphan := arbiter.Claim{UserAction: g.ua, Group: holder.Group, Attempt: holder.Attempt, Won: true, Value: claim.Holder}
	if cerr := g.d.gate.Clear(ctx, orphan); cerr != nil {
		g.d.log.Warn("orphaned commit not superseded", "group", g.id, "err", cerr)
		return claim, err
	}
	g.d.metrics.superseded.Inc()
	g.d.log.Info("orphaned commit superseded", "group", g.id, "orphan", holder.Group)
	g.supersedes = holder.Group
	g.keepSuperseded(holder)
	return g.d.gate.Claim(ctx, g.ua, g.id, attempt)
}

// keepSuperseded keeps the record that orphan's commit was superseded by
// this group (schemas.SupersededRecord, on a subject of its own so the
// orphan's record and usage stay), waiting for the store (bounded by the
// Recorder) before the group claims again: a commit of this group is never
// kept beside the orphan's with nothing marking the orphan's superseded
// (docs/architecture.md §9). A record not kept is logged; the group's own
// record still names the orphan (supersedes).
func (g *group) keepSuperseded(orphan arbiter.GateValue) {
	if g.d.records == nil {
		return
	}
	rec := schemas.SupersededRecord{EventTime: g.d.now(), Reporter: schemas.ReporterDispatcher, UserActionID: g.ua,
		HedgeGroupID: orphan.Group, WinnerAttempt: orphan.Attempt, GateEpoch: orphan.Epoch, SupersededBy: g.id}
	data, err := rec.MarshalJSON()
	if err == nil {
		err = g.d.records.Commit(schemas.StoredSupersededSubject(orphan.Group), schemas.StoredSupersededID(orphan.Group), data)
	}
	if err != nil {
		// The Recorder counts and logs its failures, at a bounded rate.
		g.d.log.Debug("superseded commit's record not kept", "group", g.id, "orphan", orphan.Group, "err", err)
	}
}

// lost fails an attempt whose stream broke on the wire; its worker may still
// be running, so it is told to stop.
func (g *group) lost(a *attemptState, why string) hedge.Event {
	g.d.log.Warn("attempt lost", "group", g.id, "attempt", a.n, "why", why)
	g.sendCancel(a, hedge.CancelInvalid)
	return hedge.Result{Attempt: a.n, Status: schemas.StatusLost, Scope: schemas.ScopeTransient}
}

// do carries out one action; it returns the engine's next event when the
// driver answers at once.
func (g *group) do(act hedge.Action) hedge.Event {
	ctx := context.Background()
	d := g.d
	switch a := act.(type) {
	case hedge.Admit:
		return g.admit(ctx)
	case hedge.Launch:
		g.launch(a)
	case hedge.ArmTimer:
		g.armTimer(a)
	case hedge.AskHedgeBudget:
		return g.askBudget(ctx, a)
	case hedge.Reoffer:
		return g.reoffer(a)
	case hedge.Elect:
		claim, err := g.claim(ctx, a.Attempt)
		switch {
		case errors.Is(err, arbiter.ErrGateDegraded):
			// The shared gate was unreachable: the local decision stands.
			d.metrics.gateDegraded.Inc()
			d.log.Warn("winner gate degraded to the local decision", "group", g.id, "err", err)
		case err != nil:
			// Refused (gate.on_unavailable), or a claim the gate could not
			// take: committing undecided could commit the user action twice.
			d.metrics.gateRefused.Inc()
			d.log.Warn("winner gate refused the election; the group fails gate_unavailable", "group", g.id, "err", err)
			return hedge.GateDecided{Attempt: a.Attempt, Unavailable: true}
		}
		return hedge.GateDecided{Attempt: a.Attempt, Won: claim.Won, Gate: claim.Value, Holder: claim.Holder}
	case hedge.ClearGate:
		if err := d.gate.Clear(ctx, arbiter.Claim{UserAction: g.ua, Group: g.id, Attempt: a.Attempt, Won: true, Value: a.Gate}); err != nil {
			d.log.Warn("gate claim not cleared", "group", g.id, "err", err)
		}
	case hedge.Cancel:
		if at := g.attempt(a.Attempt); at != nil {
			g.sendCancel(at, a.Reason)
		}
		if a.Attempt == g.winner && a.Reason != hedge.CancelTimeout {
			// The committed stream is stopped (its deadline passed, or its
			// caller left): it ends now, with an error, never with bytes of
			// another attempt. A winner cancelled for its silence (lost
			// heartbeats, docs/architecture.md §4 rule 4) ends with the
			// AttemptEnded that follows in the same step, as a lost attempt.
			code := schemas.ErrDeadlineExceeded
			if a.Reason == hedge.CancelCallerGone {
				code = schemas.ErrCanceled
			}
			g.failCommitted(code, "")
		}
	case hedge.Commit:
		g.commit(a)
	case hedge.Fail:
		d.metrics.groups.WithLabelValues(string(a.Error)).Inc()
		g.finish(delivery{err: &GroupError{Group: g.id, Code: a.Error, Scope: a.Scope, Holder: a.Holder, Streamed: g.streamed,
			RetryAfter: g.retryAfterFor(a.Error)}})
	case hedge.Settle:
		end := budgets.Ending{Reservation: budgets.ReservationID(a.Reservation), Usage: a.Usage, Lost: a.Lost}
		switch {
		case strings.HasPrefix(string(a.Reservation), localReservation):
		case a.Lost:
			// Forgiven now, before the group can answer its caller, so the
			// caller's retry finds the slot back (docs/architecture.md §7).
			g.settleLost(end)
		default:
			d.books.end(g.id, end)
		}
	case hedge.Release:
		if !strings.HasPrefix(string(a.Reservation), localReservation) {
			d.books.end(g.id, budgets.Ending{Reservation: budgets.ReservationID(a.Reservation), Release: true})
		}
	case hedge.MarkRoute:
		state := budgets.RoutePushback
		if a.Mark == hedge.MarkQuarantine {
			state = budgets.RouteQuarantined
		}
		d.markRoute(a.Route, state, a.TTL)
	case hedge.HedgeSuppressed:
		d.metrics.suppressed.WithLabelValues(a.Reason).Inc()
		if g.suppressed == "" {
			g.suppressed = a.Reason
		}
	case hedge.AttemptEnded:
		g.attemptEnded(a)
	case hedge.GroupEnded:
		g.groupEnded(a)
	}
	return nil
}

// settleLost settles the reservation of an attempt lost with its worker,
// forgiving its ledger slot, in one store call on the group's goroutine
// (bounded like bookkeeping's): queued behind other groups' endings, it
// could reach the store after the caller's retry was refused.
func (g *group) settleLost(end budgets.Ending) {
	ctx, cancel := context.WithTimeout(context.Background(), bookkeepingTimeout)
	defer cancel()
	if err := g.d.store.EndAll(ctx, []budgets.Ending{end})[0]; err != nil {
		g.d.log.Warn("settle of a lost attempt failed", "group", g.id, "err", err)
	}
}

// reasonBudgetInvalid is the denial reason when the budget store refused a
// decision's figures as invalid (budgets.ErrInvalidRequest): never read as
// the store being unavailable, which would let the attempt run unceilinged.
const reasonBudgetInvalid = "budget_invalid"

func (g *group) admit(ctx context.Context) hedge.Event {
	d := g.d
	d.rngMu.Lock()
	primary, ok := d.picker.PickPrimary(g.routes, d.now(), d.rng)
	d.rngMu.Unlock()
	if !ok {
		return hedge.Admitted{Allowed: false, Reason: reasonNoRoute, Error: schemas.ErrNoRoute}
	}
	p := g.class.Policy
	adm, err := d.store.Admit(ctx, budgets.AdmitRequest{
		UserAction: g.ua, Tenant: g.sub.Tenant, Pool: g.sub.Pool, Cohort: g.cohort.Key(),
		// A takeover forgives the ledger slots its dead predecessor holds
		// (docs/architecture.md §2, §7).
		Group: g.id, Forgive: g.sub.Supersedes,
		Attempts:   budgets.AttemptPolicy{Max: p.MaxAttempts, TTL: 2 * g.deadline},
		Spend:      g.spend(),
		Duplicates: p.DuplicateCeiling(),
	})
	switch {
	case errors.Is(err, budgets.ErrInvalidRequest):
		// The store refused the figures themselves (a spend estimate out
		// of its range): the store works, so running on without it would
		// run with no ceiling. The request fails instead.
		d.log.Warn("budget store refused the admission as invalid", "err", err)
		return hedge.Admitted{Allowed: false, Reason: reasonBudgetInvalid, Error: schemas.ErrInvalidRequest}
	case err != nil:
		// The primary goes on without the store; hedges will be refused.
		d.log.Warn("budget store unavailable at admission", "err", err)
		g.countPrimary()
		return hedge.Admitted{Allowed: true, Route: primary, Reservation: hedge.ReservationID(localReservation + g.id)}
	case !adm.Allowed:
		g.denied, g.ledgerAfter = adm.Reason, adm.RetryAfter
		return hedge.Admitted{Allowed: false, Reason: string(adm.Reason), Error: schemas.ErrBudgetExhausted}
	}
	g.countPrimary()
	return hedge.Admitted{Allowed: true, Route: primary, Reservation: hedge.ReservationID(adm.Reservation)}
}

func (g *group) spend() budgets.SpendPolicy {
	p := g.class.Policy
	out := int64(g.sub.Request.MaxTokens)
	if out == 0 && g.sub.Request.Embedding == nil { // an embedding has no output
		out = g.class.OutputEstimate(g.cohort.Key())
	}
	s := budgets.SpendPolicy{
		InputUnits:        estimateInput(g.sub.Request),
		OutputUnits:       out,
		UserActionCeiling: p.Spend.PerUserAction,
		TenantCeiling:     p.Spend.PerTenantWindow,
		TenantWindow:      p.Spend.Window,
		ReservationTTL:    2 * g.deadline,
	}
	if t := g.d.tenants[g.sub.Tenant]; t != nil && t.SpendLimit > 0 {
		// The tenant's own limit spans every class; it replaces the policy's.
		s.TenantCeiling, s.TenantWindow = t.SpendLimit, t.SpendWindow
	}
	if s.TenantCeiling > 0 && g.sub.Tenant == "" {
		s.TenantCeiling = 0
	}
	return s
}

func (g *group) askBudget(ctx context.Context, a hedge.AskHedgeBudget) hedge.Event {
	d := g.d
	if reason := g.refuseIntoSaturation(); reason != "" {
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reason}
	}
	if a.Role == schemas.RoleHedge && g.class.Policy.PushbackScope != policy.PushbackRoute && d.picker.PushedBack(g.routes, d.now()) {
		// A route of the pool pushed back since the group started: its
		// cohort is primary-only until the Retry-After passes (§4 rule 4).
		// A replacement may still go to a route not in pushback.
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reasonCohortPushback}
	}
	d.rngMu.Lock()
	target, ok := d.picker.PickHedge(g.routes, a.Exclude, d.now(), d.rng, a.SameRoute)
	d.rngMu.Unlock()
	if !ok {
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reasonNoRoute}
	}
	p := g.class.Policy
	grant, err := d.store.ReserveExtra(ctx, budgets.ExtraRequest{
		Role: a.Role, UserAction: g.ua, Group: g.id, Tenant: g.sub.Tenant, Route: target, Pool: g.sub.Pool, Cohort: g.cohort.Key(),
		Attempts:   budgets.AttemptPolicy{Max: p.MaxAttempts, TTL: 2 * g.deadline},
		Spend:      g.spend(),
		Duplicates: p.DuplicateCeiling(),
		Floor:      p.FloorBucket(),
	})
	switch {
	case errors.Is(err, budgets.ErrInvalidRequest):
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reasonBudgetInvalid}
	case err != nil:
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reasonBudgetUnavailable}
	case !grant.Allowed:
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: string(grant.Reason)}
	}
	g.countExtra(a.Role)
	return hedge.HedgeBudgetDecided{Allowed: true, Route: target, Reservation: hedge.ReservationID(grant.Reservation)}
}

func (g *group) launch(l hedge.Launch) {
	d := g.d
	a := &attemptState{n: l.Attempt, route: l.Route, role: l.Role, launchedAt: d.now()}
	g.attempts = append(g.attempts, a)
	secret, err := schemas.NewAttemptSecret()
	if err != nil { // crypto/rand does not fail on the platforms Go supports
		d.log.Warn("attempt not published", "group", g.id, "route", a.route, "err", err)
		g.post(hedge.Result{Attempt: a.n, Status: schemas.StatusNoResponders, Scope: schemas.ScopeTransient})
		return
	}
	a.secret = secret
	_ = d.picker.Acquire(l.Route)
	d.metrics.attempts.WithLabelValues(string(l.Role)).Inc()
	if l.Role == schemas.RoleHedge {
		d.metrics.hedges.Inc()
	}
	g.publishAttempt(a, l.Deadline, l.Remaining)
}

// publishAttempt sends attempt a to its route: at its launch, and again
// when a worker refused it Busy (reoffer).
func (g *group) publishAttempt(a *attemptState, deadline time.Time, remaining time.Duration) {
	d := g.d
	msg := schemas.Attempt{
		GroupID: g.id, UserActionID: g.ua, Attempt: a.n, Role: a.role, Route: a.route,
		OperationClass: g.class.Name, ModelClass: g.sub.Pool,
		DeadlineUnixMs: deadline.UnixMilli(), RemainingMs: max(remaining.Milliseconds(), 1),
		CommitPoint: g.eng.CommitPoint(), ReplyInbox: g.inbox + "." + strconv.Itoa(a.n),
		Secret:  a.secret,
		Request: g.sub.Request,
		// The cohort's stall bound, derived from its inter-token gaps
		// (docs/architecture.md §4 rule 4).
		StallAfterFirstTokenMs: g.class.StallBound(g.cohort.Key(), d.now()).Milliseconds(),
	}
	// MarshalJSON directly: json.Marshal would only re-scan its output.
	data, err := msg.MarshalJSON()
	if err == nil {
		err = d.nc.PublishMsg(&nats.Msg{Subject: AttemptSubjectPrefix + a.route, Reply: msg.ReplyInbox, Data: data})
	}
	if err != nil {
		d.log.Warn("attempt not published", "group", g.id, "route", a.route, "err", err)
		g.post(hedge.Result{Attempt: a.n, Status: schemas.StatusNoResponders, Scope: schemas.ScopeTransient})
	}
}

func (g *group) sendCancel(a *attemptState, reason hedge.CancelReason) {
	c := schemas.Cancel{GroupID: g.id, Attempt: a.n, Reason: schemas.CancelReason(reason), Secret: a.secret}
	if a.controlInbox == "" {
		a.cancel = &c // sent when the Accept names the control inbox
		return
	}
	g.publishCancel(a, c)
}

func (g *group) publishCancel(a *attemptState, c schemas.Cancel) {
	g.d.log.Debug("cancel", "group", g.id, "attempt", a.n, "inbox", a.controlInbox)
	data, err := c.MarshalJSON()
	if err == nil {
		err = g.d.nc.Publish(a.controlInbox, data)
	}
	if err != nil {
		g.d.log.Warn("cancel not sent", "group", g.id, "attempt", a.n, "err", err)
	}
}

func (g *group) commit(c hedge.Commit) {
	d := g.d
	g.winner, g.gateValue = c.Attempt, c.Gate
	a := g.attempt(c.Attempt)
	d.metrics.wins.WithLabelValues(string(a.role)).Inc()
	d.metrics.groups.WithLabelValues("committed").Inc()
	d.metrics.groupDuration.Observe(d.now().Sub(g.start).Seconds())
	if g.sub.Request.Stream {
		g.send(delivery{commit: g.response(a)})
	}
	for _, ch := range a.chunks {
		g.deliverChunk(ch)
	}
	a.chunks = nil
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

func (g *group) response(a *attemptState) *Response {
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
	return r
}

func (g *group) hedged() bool {
	for _, a := range g.attempts {
		if a.role == schemas.RoleHedge {
			return true
		}
	}
	return false
}

func (g *group) deliverChunk(ch schemas.Chunk) {
	if g.delivered || !g.sub.Request.Stream {
		return
	}
	g.streamed = true
	g.send(delivery{delta: &Delta{Content: ch.Delta, ToolCalls: ch.ToolCalls}})
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
	g.finish(delivery{err: &GroupError{Group: g.id, Code: code, Scope: scope, Streamed: g.streamed}})
	g.voided = code
	claim := arbiter.Claim{UserAction: g.ua, Group: g.id, Attempt: g.winner, Won: true, Value: g.gateValue}
	if err := g.d.gate.Clear(context.Background(), claim); err != nil {
		g.d.log.Warn("failed commit's gate claim not given back", "group", g.id, "err", err)
	}
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

func (g *group) attemptEnded(e hedge.AttemptEnded) {
	d := g.d
	a := g.attempt(e.Attempt)
	_ = d.picker.Release(a.route)
	d.observeRoute(g.sub.Pool, e)
	if e.Outcome == hedge.OutcomeWinner && g.sub.Request.Stream {
		// The committed stream ended: success, or a failure after its commit
		// point, which ends the caller's stream with an error, never with
		// bytes of another attempt.
		switch {
		case e.Status == schemas.StatusOK:
			g.finish(delivery{resp: g.response(a)})
		case e.Status == schemas.StatusTimeout || !d.now().Before(g.start.Add(g.deadline)):
			// The worker enforces the attempt's deadline too, and may
			// report it before the group's own timer fires.
			g.failCommitted(schemas.ErrDeadlineExceeded, e.Scope)
		default:
			g.failCommitted(schemas.ErrStreamInterrupted, e.Scope)
		}
	}
	a.outcome = e.Outcome
	g.class.ObserveAnswer(g.cohort.Key(), e.Status, e.Usage, e.Elapsed, e.FirstByte)
	if e.Outcome == hedge.OutcomeLoserLate {
		d.metrics.late.Inc()
	}
	if e.CancellationSent {
		d.metrics.cancellations.WithLabelValues(strconv.FormatBool(e.CancellationObserved)).Inc()
	}
	g.ended = g.ended.Add(e.Usage)
	d.metrics.usage.WithLabelValues(string(e.Role), "input").Add(float64(e.Usage.InputUnits))
	d.metrics.usage.WithLabelValues(string(e.Role), "output").Add(float64(e.Usage.OutputUnits))
	rec := g.attemptRecord(a, e)
	if d.tracer != nil {
		a.ended = &AttemptTimeline{Launched: a.launchedAt, Ended: d.now(), Record: rec}
	}
	g.publish(pendingRecord{subject: AttemptRecordSubject, rec: rec,
		stored: schemas.StoredAttemptSubject(g.id, a.n), id: schemas.StoredAttemptID(g.id, a.n)})
}

// observeSuperseded offers the primary's elapsed time to the class's
// censoring rule as the group ends, and reports whether it was recorded.
func (g *group) observeSuperseded(now time.Time, e hedge.GroupEnded) bool {
	p := g.attempt(1)
	if p == nil {
		return false
	}
	return g.class.ObserveSuperseded(g.cohort, now,
		policy.Primary{Elapsed: now.Sub(p.launchedAt), FirstByte: p.firstByte > 0, Failed: p.outcome == hedge.OutcomeFailed},
		policy.Decision{Winner: e.Winner, Error: e.Error})
}

func (g *group) groupEnded(e hedge.GroupEnded) {
	d := g.d
	now := d.now()
	g.observeSuperseded(now, e)
	latency := g.deadline
	if e.Committed {
		latency = e.Latency
		if w := g.attempt(e.Winner); w != nil && g.class.Policy.Trigger == policy.TriggerFirstByte && w.firstByte > 0 {
			latency = w.launchedAt.Sub(g.start) + w.firstByte
		}
	}
	_ = g.class.Guardrail.ObserveGroup(g.cohort, now, g.arm, latency, !e.Committed)
	g.checkSpendBreach(e)
	if g.held != nil {
		g.held.TotalUsage = e.Usage
		g.send(delivery{resp: g.held})
		g.held = nil
	}
	if g.armed {
		d.metrics.hedgeDelay.Observe(g.delay.Seconds())
	}
	rec := g.groupRecord(e)
	g.trace(now, rec)
	if g.committed != nil {
		// The group ended in the event that committed it: its full record
		// is kept before the answer instead.
		rec.Event = schemas.EventGroupComplete
		g.committed = &rec
		g.keepCommit()
		g.publish(pendingRecord{subject: GroupRecordSubject, rec: rec})
		return
	}
	g.publish(pendingRecord{subject: GroupRecordSubject, rec: rec,
		stored: schemas.StoredGroupSubject(g.id), id: schemas.StoredGroupID(g.id, schemas.EventGroupComplete)})
}

// trace hands the ended group's timeline to the Tracer, if there is one.
func (g *group) trace(now time.Time, rec schemas.GroupRecord) {
	if g.d.tracer == nil {
		return
	}
	tl := GroupTimeline{Start: g.start, End: now, TraceParent: g.sub.TraceParent, Embeddings: g.sub.Request.Embedding != nil, Group: rec}
	for _, a := range g.attempts {
		if a.ended != nil {
			tl.Attempts = append(tl.Attempts, *a.ended)
		}
	}
	g.d.tracer.GroupEnded(tl)
}

// keepCommit keeps the group's record at its commit, waiting for the store
// (bounded by the Recorder), so no answered group is missing from the
// records when this dispatcher stops right after answering.
func (g *group) keepCommit() {
	rec := g.committed
	g.committed = nil
	if g.d.records == nil {
		return
	}
	data, err := rec.MarshalJSON()
	if err == nil {
		err = g.d.records.Commit(schemas.StoredGroupSubject(g.id), schemas.StoredGroupID(g.id, rec.Event), data)
	}
	if err != nil {
		// The Recorder counts and logs its failures, at a bounded rate.
		g.d.log.Debug("committed group's record not kept before its answer", "group", g.id, "err", err)
	}
}

// publish queues a record; it is marshalled and published once the event's
// deliveries reached the caller (see deliver), so the caller's answer does
// not wait for the bookkeeping of the group that produced it.
func (g *group) publish(r pendingRecord) { g.records = append(g.records, r) }

// publishRecords publishes the queued records, in order: live on core
// NATS, and to the Recorder when the record has a stored subject.
func (g *group) publishRecords() {
	for i, r := range g.records {
		data, err := r.rec.MarshalJSON()
		if err == nil {
			err = g.d.nc.Publish(r.subject, data)
		}
		if err != nil {
			g.d.log.Warn("record not published", "subject", r.subject, "err", err)
		}
		if err == nil && r.stored != "" && g.d.records != nil {
			g.d.records.Publish(r.stored, r.id, data)
		}
		g.records[i] = pendingRecord{}
	}
	g.records = g.records[:0]
}
