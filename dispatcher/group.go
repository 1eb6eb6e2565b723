package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/schemas"
)

// attemptRun is the driver's view of one launched attempt: what the wire
// told it, beyond what the engine keeps.
type attemptRun struct {
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
	stallJudged  bool             // a primary's stall verdict was fed to the picker (judgeStall)
	charge       capacityCharge   // what it spent of its route's limits (capacity.go)
	// A continuation's prefix is the text of the committed stream it
	// continues, offset that text's tokens; streamed is set once its
	// output feeds the caller's stream (the winner, a spliced continuation).
	prefix   string
	offset   int
	streamed bool
	rescued  string // a continuation's hedgerow_rescues_total outcome, once counted
}

// group drives one hedge group: the engine, fed by real events.
type group struct {
	d          *Dispatcher
	sub        Submission
	class      *policy.Class
	routes     []string
	contract   *arbiter.Contract
	cohort     delay.Cohort
	window     string // the duplicate-rate window the group counts in (policy.DuplicateWindow)
	arm        delay.Arm
	guard      schemas.GuardrailDecision
	eng        *hedge.Group
	id         string
	replyToken string // the group's key in d.replies
	ua         string
	print      string     // the prompt fingerprint, once fingerprint computed it
	inbox      string     // prefix of the attempts' reply inboxes, routed by d.replies
	events     eventQueue // engineEvent or inboundEvent
	// arrived is when the wire message the loop is handling came off NATS
	// (zero for other inputs), for the cancels it causes.
	arrived time.Time
	out     chan delivery
	gone    chan struct{}   // closed when the caller stopped reading out
	pending []delivery      // for the caller, handed over after the event's actions
	records []pendingRecord // published after pending was handed over
	// committed is the group's record at its commit, kept before pending
	// (the answer) is handed over (docs/architecture.md §9).
	committed *schemas.GroupRecord
	// ended and suppressed are what the committed record says of the
	// attempts ended by the commit and of a hedge held back.
	ended      schemas.Usage
	suppressed string
	attempts   []*attemptRun
	// timers are the engine's armed timers, stopped and cut off from the
	// group as it ends: each would hold it until it fires (up to the whole
	// deadline).
	timers    []*armedTimer
	start     time.Time
	deadline  time.Duration
	queueWait time.Duration // the pool's bound on re-offers after a Busy (§4 rule 4)
	delay     time.Duration
	// stallDelay is the cohort's delay over its pool at the start, delay
	// unless the primary's route has its own: what the primary's stall is
	// judged by (judgeStall, docs/architecture.md §5 "Route choice").
	stallDelay time.Duration
	// primary is the route the primary goes to, picked as the group starts
	// so that its hedge delay is that route's (docs/architecture.md §5);
	// empty when no route of the pool could be picked.
	primary   string
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
	// waiting is the attempt waiting for a route's capacity, if one is
	// (capacity.go); capacityAfter is the slices' wait when one gave up,
	// the Retry-After of the overloaded failure that may follow.
	waiting       *capacityWait
	capacitySeq   int // the last capacityWait's seq
	capacityAfter time.Duration
	// charges are what attempts about to launch spent of their routes'
	// limits, by reservation, until their Launch or Release.
	charges map[hedge.ReservationID]capacityCharge
	// decided is set once the engine committed or failed the group.
	decided bool
	// The committed stream and its rescue (docs/architecture.md §6,
	// "Rescue"): streamer is the attempt whose output feeds the caller's
	// stream (the winner, then each continuation spliced in), relayed the
	// text the caller got and relayedTokens its tokens — what a
	// continuation continues from. continues are the pool's routes a
	// continuation may go to, nil when this group is not rescued;
	// stallBound the cohort's stall bound as the group started.
	streamer      int
	relayed       strings.Builder
	relayedTokens int
	continues     []string
	stallBound    time.Duration
}

// contractFor is the contract of the pool a model name names (its own name
// or an alias), with the request's response_format added when it asks for
// JSON: an answer that does not parse or fails the schema never wins, and
// another attempt may. A front door calls it to
// refuse a response_format before submitting. Errors match ErrUnknownPool,
// or ErrBadRequest together with arbiter.ErrInvalidResponseFormat or
// arbiter.ErrInvalidContract (a schema that does not compile, or whose
// compile ctx or the cache's budgets stopped: arbiter.ErrCompileAborted,
// *arbiter.SchemaBudgetError). The caller's schema is compiled once per
// distinct schema (d.schemaCache), charged to tenant.
func (d *Dispatcher) contractFor(ctx context.Context, tenant, model string, responseFormat json.RawMessage) (*arbiter.Contract, error) {
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
	c, err := d.schemaCache.Contract(ctx, tenant, spec)
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
	contract, err := d.contractFor(ctx, sub.Tenant, sub.Pool, sub.Request.ResponseFormat)
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
		window:   policy.DuplicateWindow(cohort),
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
	if continues := d.continuers(pool, &sub.Request); pool.Rescue > 0 && len(continues) > 0 && sub.Request.Stream &&
		!contract.NeedsComplete() && sub.Request.Continuable() == nil {
		engine.Rescues, g.continues = pool.Rescue, continues
	}
	if g.eng, err = hedge.New(engine); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if g.inbox, err = d.replies.register(d.nc, g); err != nil {
		return nil, fmt.Errorf("dispatcher: subscribe reply inbox: %w", err)
	}
	return g, nil
}

// continuers are the routes of pool that can continue req's answer
// (Pool.Continues); for a Responses request only the Anthropic ones, as
// OpenAI's /responses has no continuation (docs/architecture.md §6).
func (d *Dispatcher) continuers(pool Pool, req *schemas.ChatRequest) []string {
	if req.SourceDialect() != schemas.DialectResponses {
		return pool.Continues
	}
	var out []string
	for _, r := range pool.Continues {
		if d.routeDialects[r] == schemas.DialectAnthropic {
			out = append(out, r)
		}
	}
	return out
}

// serve starts the group and relays its deliveries to the caller.
func (g *group) serve(ctx context.Context, sink Sink) (*Response, error) {
	g.d.groups.Add(1)
	g.d.metrics.inFlight.Inc()
	defer close(g.gone)
	// The caller's goroutine carries out the start (admission, the
	// primary's launch) before the loop takes over: the primary goes out
	// without waiting for a new goroutine to be scheduled. Until the loop
	// starts, nothing else touches the engine; what arrives meanwhile
	// waits in g.events.
	g.handle(engineEvent{g.startEvent()})
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
	g.d.rngMu.Lock()
	g.primary, _ = g.d.picker.PickPrimary(g.routes, now, g.d.rng)
	g.d.rngMu.Unlock()
	d := g.class.HedgeDelay(g.cohort, g.primary, now, g.deadline)
	s.HedgeDelay = d.Value
	g.delay, g.stallDelay = d.Value, d.Cohort
	if g.continues != nil {
		s.Continuable = true
		g.stallBound = g.class.StallBound(g.cohort.Key(), now)
		s.StallBound = g.stallBound
	}
	el := g.eligibility(now)
	s.HedgeEligible, s.NotEligibleReason = el.Eligible, el.Reason
	// A control group hedges as any group does; its baseline is measured
	// on the side (docs/architecture.md §5).
	s.Control = el.Arm == delay.ArmControl
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
	defer g.d.metrics.inFlight.Dec()
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
func (g *group) handle(input groupInput) {
	defer g.deliver()
	var first, then hedge.Event
	g.arrived = time.Time{}
	switch in := input.(type) {
	case inboundEvent:
		g.arrived = in.arrived
		first, then = g.translate(in)
	case engineEvent:
		then = in.ev
	case capacityRetry:
		then = g.retryCapacity(in)
	}
	queue := make([]hedge.Event, 0, 2)
	for _, ev := range [...]hedge.Event{first, then} {
		if ev != nil {
			queue = append(queue, ev)
		}
	}
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

func (g *group) attempt(n int) *attemptRun {
	if n < 1 || n > len(g.attempts) {
		return nil
	}
	return g.attempts[n-1]
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
			if at.role == schemas.RoleContinuation && !at.streamed && a.Reason == hedge.CancelLostRace {
				g.countRescue(at, rescueOriginalWon)
			}
		}
	case hedge.Splice:
		g.splice(a)
	case hedge.StreamEnded:
		g.streamEnded(a)
	case hedge.Commit:
		g.decide()
		g.commit(a)
	case hedge.Fail:
		g.decide()
		d.metrics.groups.WithLabelValues(string(a.Error)).Inc()
		g.finish(delivery{err: &GroupError{Group: g.id, Pool: g.sub.Pool, Code: a.Error, Scope: a.Scope, Holder: a.Holder, Refused: a.Refused, Streamed: g.streamed,
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
		g.releaseCharge(a.Reservation)
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
	case hedge.Answered:
		// Only a control group's kept baseline still runs: the caller
		// does not wait for it (docs/architecture.md §5).
		g.releaseHeld(a.Usage)
	case hedge.GroupEnded:
		g.groupEnded(a)
	}
	return nil
}

// decide notes that the engine committed or failed the group: an attempt
// waiting for a route's capacity gives up at once rather than at its
// timer, so its reservation is released and the group may end.
func (g *group) decide() {
	g.decided = true
	if g.waiting != nil {
		g.events.post(capacityRetry{seq: g.waiting.seq})
	}
}
