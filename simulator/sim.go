package simulator

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// epoch is virtual time zero. Any fixed instant works; this one keeps
// tenant windows and gate TTLs away from the Unix epoch's edge cases.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// simRoutes is the number of equivalent routes when a model does not fix it.
const simRoutes = 3

// workerLatency is the dispatcher↔worker message delay of the simulated wire.
const workerLatency = time.Millisecond

const pool = "general"

// progressBatch is how many finished groups each progress report covers.
const progressBatch = 1000

// simulatedAnswer stands for a simulated attempt's answer: the arbiter's
// success predicate judges only that there is one (docs/architecture.md §6).
var simulatedAnswer = []byte("simulated answer")

// item is one scheduled happening: an event for a group's engine, or an arrival.
type item struct {
	at      time.Duration
	seq     uint64
	g       *simGroup // nil for an arrival
	attempt int       // for worker reports: dropped once the attempt stopped
	ev      hedge.Event
	arrival uint64 // the request id of an arrival (g is nil)
}

type eventQueue []item

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(item)) }
func (q *eventQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// simAttempt is the simulated worker and provider side of one attempt.
type simAttempt struct {
	route    int
	role     schemas.Role
	start    time.Duration
	draw     workload.Attempt
	stopped  bool          // cancelled, or its report was delivered
	stopAt   time.Duration // model time the provider saw the disconnect
	finished bool          // ran to its End
	// firstByte is the time from launch to its first byte (0: none yet);
	// stallJudged: a primary's stall verdict was fed to the picker.
	firstByte   time.Duration
	stallJudged bool
}

// simGroup is one request's hedge group.
type simGroup struct {
	id       string
	arrival  time.Duration
	req      workload.Request
	eng      *hedge.Group
	chk      *hedge.Checker
	attempts []*simAttempt
	cohort   delay.Cohort
	arm      delay.Arm
	commitAt time.Duration
	failed   bool
	errCode  schemas.ErrorCode
	// hedgeDelay is the delay the group's hedge timer was armed with (0:
	// none); guard is the guardrail's decision, both for its records.
	hedgeDelay time.Duration
	guard      schemas.GuardrailDecision
	// primary is the primary's route, picked as the group arrives so that
	// its hedge delay is that route's, as the dispatcher does; "" when no
	// route could be picked.
	primary string
	// delay is the cohort's hedge delay over its pool at the start (not its
	// primary's route's own), whether or not the group may hedge: what its
	// primary's stall is judged by, as the dispatcher's stallDelay.
	delay time.Duration
	// winner is the committed attempt (0: none yet); keptPrimary says a
	// control group's commit kept its primary running as the baseline
	// (hedge.Commit.Kept), so its censoring waits for its end.
	winner      int
	keptPrimary bool
}

// runner simulates one strategy over the whole workload on virtual time.
type runner struct {
	strat     strategy
	cond      workload.Conditions
	stream    bool
	gen       *workload.Generator
	providers []*workload.Provider
	routes    []string
	queue     eventQueue
	seq       uint64
	now       time.Duration
	rng       *rand.Rand
	store     *budgets.Memory
	class     *policy.Class // the strategy's rules, and what its groups teach them
	picker    *route.Picker
	gate      *arbiter.LocalGate
	nextRes   int
	acc       *accumulator
	model     string     // the cohort's model class
	operation string     // the cohort's operation class
	records   RecordSink // nil: no records
}

// cohortTraffic is one cohort's traffic as a runner simulates it: a
// workload model, the cohort's classes and stream mode, how many requests
// arrive and under which conditions.
type cohortTraffic struct {
	Operation  string
	ModelClass string
	Model      *workload.Model
	Stream     bool
	Requests   int
	Cond       workload.Conditions
}

// builtinTraffic is a built-in workload as the single cohort of a run.
func builtinTraffic(o Options, cond workload.Conditions) (cohortTraffic, error) {
	model, err := workload.ByName(o.Workload)
	if err != nil {
		return cohortTraffic{}, err
	}
	// A route that degrades mid-run does so at the middle of this run.
	model.ForRun(time.Duration(float64(o.Requests) / cond.ArrivalRate * float64(time.Second)))
	return cohortTraffic{Operation: "chat", ModelClass: o.Workload, Model: model, Stream: o.Stream, Requests: o.Requests, Cond: cond}, nil
}

// newRunner prepares one strategy over one cohort's traffic; its groups'
// figures go to acc, which several cohorts' runners may share.
func newRunner(strat strategy, t cohortTraffic, seed uint64, acc *accumulator) (*runner, error) {
	gen, err := workload.NewGenerator(t.Model, seed)
	if err != nil {
		return nil, err
	}
	cond := t.Cond
	n := gen.Routes()
	if n == 0 {
		n = simRoutes
	}
	r := &runner{
		strat:     strat,
		cond:      cond,
		stream:    t.Stream,
		gen:       gen,
		rng:       rand.New(rand.NewPCG(seed, 0x5eed_0f_70_7e)),
		acc:       acc,
		model:     t.ModelClass,
		operation: t.Operation,
	}
	defs := make([]route.Route, n)
	for i := range n {
		p, err := gen.Provider(i, workload.RateLimit{})
		if err != nil {
			return nil, err
		}
		r.providers = append(r.providers, p)
		r.routes = append(r.routes, "route-"+strconv.Itoa(i))
		defs[i] = route.Route{Name: r.routes[i], Labels: map[string]string{route.LabelProvider: "provider-" + strconv.Itoa(i)}}
	}
	clock := func() time.Time { return epoch.Add(r.now) }
	if strat.routeAware {
		if r.picker, err = route.NewPicker(defs, route.Options{}); err != nil {
			return nil, err
		}
	}
	if strat.budget == budgetStore {
		r.store = budgets.NewMemory(clock)
	}
	if r.class, err = policy.NewClass(r.operation, strat.rules); err != nil {
		return nil, err
	}
	if r.gate, err = arbiter.NewLocalGate(arbiter.LocalGateOptions{TTL: 2 * cond.Deadline, Now: clock}); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *runner) at() time.Time { return epoch.Add(r.now) }

func (r *runner) schedule(at time.Duration, g *simGroup, attempt int, ev hedge.Event) {
	r.seq++
	heap.Push(&r.queue, item{at: at, seq: r.seq, g: g, attempt: attempt, ev: ev})
}

// run simulates every request and returns the strategy's figures.
func (r *runner) run(requests int, seed uint64, progress func(int)) (StrategyResult, error) {
	arrivals, err := workload.NewArrivals(r.cond.ArrivalRate, seed)
	if err != nil {
		return StrategyResult{}, err
	}
	// Arrivals are generated lazily, one ahead, so the queue stays small.
	pending := requests
	nextArrival := func() {
		if pending == 0 {
			return
		}
		pending--
		a := arrivals.Next()
		r.seq++
		heap.Push(&r.queue, item{at: a.At, seq: r.seq, arrival: a.ID})
	}
	nextArrival()
	before := r.acc.groups
	for r.queue.Len() > 0 {
		it := heap.Pop(&r.queue).(item)
		r.now = it.at
		if it.g == nil {
			if err := r.arrive(it.arrival); err != nil {
				return StrategyResult{}, err
			}
			nextArrival()
			continue
		}
		g := it.g
		if it.attempt > 0 {
			sa := g.attempts[it.attempt-1]
			if sa.stopped {
				continue // the worker stopped: its later reports never happen
			}
			if err := r.observeReport(g, sa, it.ev); err != nil {
				return StrategyResult{}, err
			}
		}
		if err := r.step(g, it.ev); err != nil {
			return StrategyResult{}, err
		}
		if g.eng.Done() {
			if err := g.chk.Finish(); err != nil {
				return StrategyResult{}, fmt.Errorf("strategy %s, group %s: %w", r.strat.name, g.id, err)
			}
			if progress != nil && r.acc.groups%progressBatch == 0 {
				progress(progressBatch)
			}
		}
	}
	if progress != nil {
		progress(r.acc.groups % progressBatch)
	}
	if r.acc.groups-before != requests {
		return StrategyResult{}, fmt.Errorf("strategy %s: %d of %d groups finished", r.strat.name, r.acc.groups-before, requests)
	}
	return r.acc.result(r.strat.name, r.cond), nil
}

func (r *runner) arrive(id uint64) error {
	g := &simGroup{
		id:      "g" + strconv.FormatUint(id, 10),
		arrival: r.now,
		req:     r.gen.Request(id),
		cohort:  delay.NewCohort(r.operation, r.model, r.stream, 0),
	}
	if r.strat.globalCohort {
		g.cohort = delay.NewCohort("all", "all", false, 0)
	}
	var err error
	if g.eng, err = hedge.New(r.strat.policy); err != nil {
		return err
	}
	g.chk = hedge.NewChecker(r.strat.policy)
	return r.step(g, r.start(g))
}

// start picks the group's primary route and builds its Start: the hedge
// delay (the primary's route's, as the dispatcher's startEvent) and the
// eligibility.
func (r *runner) start(g *simGroup) hedge.Start {
	g.primary, _ = r.pickPrimary()
	start := hedge.Start{
		Streaming:             r.stream,
		InputUnits:            int64(g.req.InputTokens),
		DecodeTokensPerSecond: r.class.DecodeRate(),
	}
	switch r.strat.delay {
	case delayFixed:
		start.HedgeDelay, g.delay = r.strat.fixed, r.strat.fixed
	case delayEstimated:
		d := r.class.HedgeDelay(g.cohort, g.primary, r.at(), r.cond.Deadline)
		start.HedgeDelay, g.delay = d.Value, d.Cohort
	}
	el := r.eligibility(g)
	start.HedgeEligible, start.NotEligibleReason = el.Eligible, el.Reason
	// A control group hedges as any group does; its baseline is measured
	// on the side (docs/architecture.md §5).
	start.Control = g.arm == delay.ArmControl
	if start.Control {
		r.acc.controlGroups++
	}
	g.guard = el.Guardrail
	if el.Eligible && r.strat.policy.MaxAttempts > 1 {
		g.hedgeDelay = start.HedgeDelay
		r.acc.hedgeDelays = append(r.acc.hedgeDelays, float64(start.HedgeDelay)/float64(time.Millisecond))
	}
	return start
}

// notHedgingStrategy is the suppression reason of a strategy that never
// hedges.
const notHedgingStrategy = "strategy"

// eligibility decides whether a group may hedge: never for a strategy that
// does not hedge, otherwise by the dispatcher's rule over the strategy's
// class policy. It keeps the group's guardrail arm.
func (r *runner) eligibility(g *simGroup) policy.Eligibility {
	el := policy.Eligibility{Reason: notHedgingStrategy, Arm: delay.ArmHedged, Guardrail: schemas.GuardrailIneligible}
	if r.strat.delay != delayNone {
		pushedBack := r.picker != nil && r.picker.PushedBack(r.routes, r.at())
		el = r.class.Eligibility(policy.Group{ID: g.id, Routes: len(r.routes), Cohort: g.cohort, Now: r.at(), PushedBack: pushedBack})
	}
	g.arm = el.Arm
	return el
}

// learnsDelay reports whether the strategy's estimator learns from the
// primaries' own latencies, as the dispatcher's does.
func (r *runner) learnsDelay() bool {
	return r.strat.delay == delayEstimated && !r.strat.observeGroup
}

// step feeds one event to a group's engine, checks the invariants and
// carries out the actions.
func (r *runner) step(g *simGroup, ev hedge.Event) error {
	now := r.at()
	acts := g.eng.Step(now, ev)
	if err := g.chk.Step(now, ev, acts); err != nil {
		return fmt.Errorf("strategy %s, group %s: invariant broken: %w", r.strat.name, g.id, err)
	}
	for _, act := range acts {
		if err := r.do(g, act); err != nil {
			return fmt.Errorf("strategy %s, group %s, %T: %w", r.strat.name, g.id, act, err)
		}
	}
	return nil
}

func (r *runner) newReservation() hedge.ReservationID {
	r.nextRes++
	return hedge.ReservationID("sim-" + strconv.Itoa(r.nextRes))
}

func (r *runner) spend(g *simGroup) budgets.SpendPolicy {
	return budgets.SpendPolicy{
		InputUnits:     int64(g.req.InputTokens),
		OutputUnits:    int64(r.gen.Model().MaxOutputTokens),
		ReservationTTL: 2 * r.cond.Deadline,
	}
}

func (r *runner) attemptPolicy() budgets.AttemptPolicy {
	return budgets.AttemptPolicy{Max: r.strat.policy.MaxAttempts, TTL: 2 * r.cond.Deadline}
}

// do carries out one engine action.
func (r *runner) do(g *simGroup, act hedge.Action) error {
	ctx := context.Background()
	switch a := act.(type) {
	case hedge.Admit:
		route := g.primary // picked as the group arrived
		if route == "" {
			r.schedule(r.now, g, 0, hedge.Admitted{Allowed: false, Reason: "no_route", Error: schemas.ErrNoRoute})
			return nil
		}
		res := r.newReservation()
		if r.store != nil {
			adm, err := r.store.Admit(ctx, budgets.AdmitRequest{
				UserAction: g.id, Pool: pool, Window: policy.DuplicateWindow(g.cohort),
				Attempts: r.attemptPolicy(), Spend: r.spend(g), Duplicates: r.strat.duplicates,
			})
			if err != nil {
				return err
			}
			if !adm.Allowed {
				r.schedule(r.now, g, 0, hedge.Admitted{Allowed: false, Reason: string(adm.Reason), Error: schemas.ErrBudgetExhausted})
				return nil
			}
			res = hedge.ReservationID(adm.Reservation)
		}
		r.schedule(r.now, g, 0, hedge.Admitted{Allowed: true, Route: route, Reservation: res})
	case hedge.AskHedgeBudget:
		r.schedule(r.now, g, 0, r.decideExtra(ctx, g, a))
	case hedge.Launch:
		r.launch(g, a)
	case hedge.ArmTimer:
		r.schedule(a.At.Sub(epoch), g, 0, hedge.TimerFired{Kind: a.Kind, Attempt: a.Attempt})
	case hedge.Cancel:
		sa := g.attempts[a.Attempt-1]
		if !sa.stopped {
			sa.stopped = true
			sa.stopAt = r.now + workerLatency - sa.start
			reported := schemas.Usage{InputUnits: int64(g.req.InputTokens), OutputUnits: int64(sa.draw.TokensBy(sa.stopAt))}
			if sa.draw.Outcome == workload.OutcomeRateLimited {
				reported = schemas.Usage{}
			}
			r.schedule(r.now+2*workerLatency, g, 0, hedge.CancelObserved{Attempt: a.Attempt, Usage: reported})
		}
	case hedge.Elect:
		claim, err := r.gate.Claim(ctx, g.id, g.id, a.Attempt)
		if err != nil {
			return err
		}
		r.schedule(r.now, g, 0, hedge.GateDecided{Attempt: a.Attempt, Won: claim.Won, Gate: claim.Value, Holder: claim.Holder})
	case hedge.ClearGate:
		return r.gate.Clear(ctx, arbiter.Claim{UserAction: g.id, Group: g.id, Attempt: a.Attempt, Won: true, Value: a.Gate})
	case hedge.Commit:
		g.commitAt, g.winner = r.now, a.Attempt
		g.keptPrimary = a.Kept == 1
		if a.Kept != 0 {
			r.acc.keptBaselines++
		}
		r.observeCommit(g, a.Attempt)
	case hedge.Fail:
		g.failed, g.errCode = true, a.Error
	case hedge.Settle:
		if r.store != nil {
			return r.store.Settle(ctx, budgets.ReservationID(a.Reservation), a.Usage)
		}
	case hedge.Release:
		if r.store != nil {
			return r.store.Release(ctx, budgets.ReservationID(a.Reservation))
		}
	case hedge.MarkRoute:
		state, rs := budgets.RoutePushback, route.Pushback
		if a.Mark == hedge.MarkQuarantine {
			state, rs = budgets.RouteQuarantined, route.Quarantined
		}
		if r.store != nil {
			if err := r.store.MarkRoute(ctx, a.Route, state, a.TTL); err != nil {
				return err
			}
		}
		if r.picker != nil {
			return r.picker.SetState(a.Route, rs, r.at().Add(a.TTL))
		}
	case hedge.AttemptEnded:
		r.class.ObserveAnswer(g.cohort.Key(), a.Status, a.Usage, a.Elapsed, a.FirstByte)
		if err := r.recordAttempt(g, a); err != nil {
			return err
		}
		sa := g.attempts[a.Attempt-1]
		if !sa.stopped {
			sa.stopped = true
			sa.stopAt = r.now - sa.start
		}
		if a.Attempt == 1 && g.keptPrimary && r.learnsDelay() {
			// A kept primary is superseded at its own end, as a
			// primary-only group's would be: at its first byte (in
			// already), its failure or the deadline.
			r.observeSuperseded(g, policy.Decision{Winner: g.winner})
		}
		if r.picker != nil {
			// What the live driver feeds at the same moment (dispatcher
			// observeRoute, judgeStall): the attempt's verdict, before any
			// replacement's route is picked, and the primary's stall.
			cancelled := a.Outcome == hedge.OutcomeLoserCanceled || a.Outcome == hedge.OutcomeCanceled
			if failed, counted := route.Verdict(a.Status, a.Scope, a.ContractValid, cancelled); counted {
				if err := r.picker.ObserveOutcome(r.routes[sa.route], !failed, r.at()); err != nil {
					return err
				}
			}
			if a.Attempt == 1 {
				if err := r.judgeStall(g, false, true); err != nil {
					return err
				}
			}
			return r.picker.Release(r.routes[sa.route])
		}
	case hedge.GroupEnded:
		r.endGroup(g, a)
		return r.recordGroup(g, a)
	}
	return nil
}

func (r *runner) pickPrimary() (string, bool) {
	if r.picker != nil {
		return r.picker.PickPrimary(r.routes, r.at(), r.rng)
	}
	return r.routes[r.rng.IntN(len(r.routes))], true
}

// decideExtra answers AskHedgeBudget: a route, then the budget.
func (r *runner) decideExtra(ctx context.Context, g *simGroup, a hedge.AskHedgeBudget) hedge.HedgeBudgetDecided {
	var target string
	if r.picker != nil {
		var ok bool
		if target, ok = r.picker.PickHedge(r.routes, a.Exclude, r.at(), r.rng, a.SameRoute); !ok {
			return hedge.HedgeBudgetDecided{Allowed: false, Reason: "no_route"}
		}
	} else if r.strat.budget == budgetStore {
		target = r.routes[r.rng.IntN(len(r.routes))] // no route awareness: any route, the same one too
	} else {
		target = r.otherRoute(a.Exclude)
	}
	if r.store == nil {
		return hedge.HedgeBudgetDecided{Allowed: true, Route: target, Reservation: r.newReservation()}
	}
	grant, err := r.store.ReserveExtra(ctx, budgets.ExtraRequest{
		Role: a.Role, UserAction: g.id, Route: target, Pool: pool, Window: policy.DuplicateWindow(g.cohort),
		Attempts: r.attemptPolicy(), Spend: r.spend(g), Duplicates: r.strat.duplicates, Reserve: r.strat.reserve,
	})
	if err != nil {
		// The store is down: the optional duplicate fails closed.
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: "budget_unavailable"}
	}
	if !grant.Allowed {
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: string(grant.Reason)}
	}
	return hedge.HedgeBudgetDecided{Allowed: true, Route: target, Reservation: hedge.ReservationID(grant.Reservation)}
}

// otherRoute draws a route not in exclude, or any route when all are.
func (r *runner) otherRoute(exclude []string) string {
	free := make([]string, 0, len(r.routes))
	for _, name := range r.routes {
		used := false
		for _, e := range exclude {
			if e == name {
				used = true
			}
		}
		if !used {
			free = append(free, name)
		}
	}
	if len(free) == 0 {
		free = r.routes
	}
	return free[r.rng.IntN(len(free))]
}

func (r *runner) routeIndex(name string) int {
	for i, n := range r.routes {
		if n == name {
			return i
		}
	}
	return 0
}

// launch draws the attempt from the route's provider and schedules what its
// worker will report.
func (r *runner) launch(g *simGroup, l hedge.Launch) {
	idx := r.routeIndex(l.Route)
	start := r.now + workerLatency
	draw, err := r.providers[idx].Attempt(g.req, l.Attempt, start)
	if err != nil {
		// Invalid arguments are a simulator bug: surface it as a hang so the
		// invariant checker and the figures still see a consistent group.
		draw = workload.Attempt{Outcome: workload.OutcomeHang, FirstByte: workload.Never, End: workload.Never}
	}
	sa := &simAttempt{route: idx, role: l.Role, start: start, draw: draw}
	if l.Role != schemas.RolePrimary {
		r.acc.windowExtras[int64(r.now/durationWindow)]++
	}
	if l.Role == schemas.RoleHedge {
		r.acc.windowHedges[int64(r.now/durationWindow)]++
		r.acc.hedges[l.Route]++
	}
	g.attempts = append(g.attempts, sa)
	if r.picker != nil {
		_ = r.picker.Acquire(l.Route)
		if l.Role == schemas.RoleHedge {
			_ = r.judgeStall(g, true, false)
		}
	}
	n := l.Attempt
	r.schedule(start+workerLatency, g, n, hedge.Accepted{Attempt: n})
	report := func(after time.Duration, ev hedge.Event) {
		r.schedule(start+after+workerLatency, g, n, ev)
	}
	switch draw.Outcome {
	case workload.OutcomeOK:
		// The arbiter judges the simulated output as it judges live output:
		// a well-formed stream whose first token arrived, then a complete,
		// non-empty answer with a complete finish reason.
		cp := g.eng.CommitPoint()
		first := arbiter.Validate(nil, cp, arbiter.Observation{WellFormed: true, Tokens: 1, FirstToken: true})
		done := arbiter.Validate(nil, cp, arbiter.Observation{Status: schemas.StatusOK, WellFormed: true, Tokens: g.req.OutputTokens,
			FirstToken: true, Done: true, FinishReason: "stop", Content: simulatedAnswer})
		report(draw.FirstByte, hedge.FirstByte{Attempt: n})
		report(draw.FirstByte, hedge.Progress{Attempt: n, Tokens: 1, FirstToken: true, Valid: first.Valid || !first.Ready})
		report(draw.End, hedge.Result{Attempt: n, Status: schemas.StatusOK, Scope: schemas.ScopeNone, Valid: done.Valid, Usage: draw.BilledUsage(workload.Never)})
	case workload.OutcomeServerError:
		report(draw.End, hedge.Result{Attempt: n, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient, Usage: draw.BilledUsage(workload.Never)})
	case workload.OutcomeRateLimited:
		report(draw.End, hedge.Result{Attempt: n, Status: schemas.StatusRateLimited, Scope: schemas.ScopePushback, RetryAfter: draw.RetryAfter})
	case workload.OutcomeHang:
		// Nothing arrives: the deadline or a cancel ends it.
	}
}

// observeReport updates what the dispatcher learns from a worker report
// before the engine sees it: route latency, the delay estimator's samples,
// and whether the attempt ran to its end.
func (r *runner) observeReport(g *simGroup, sa *simAttempt, ev hedge.Event) error {
	switch e := ev.(type) {
	case hedge.FirstByte:
		ttft := r.now - (sa.start - workerLatency)
		sa.firstByte = ttft
		if r.picker != nil {
			if err := r.picker.Observe(r.routes[sa.route], ttft, r.at()); err != nil {
				return err
			}
			if sa.role == schemas.RolePrimary {
				if err := r.judgeStall(g, false, false); err != nil {
					return err
				}
			}
		}
		if r.learnsDelay() {
			r.class.ObserveFirstByte(g.cohort, r.routes[sa.route], r.at(), sa.role, ttft)
		}
	case hedge.Result:
		elapsed := r.now - (sa.start - workerLatency)
		if r.learnsDelay() {
			r.class.ObserveResult(g.cohort, r.routes[sa.route], r.at(), sa.role, e.Status, elapsed)
		}
		if perToken, ok := route.DecodeTime(r.stream && sa.role != schemas.RoleContinuation, e.Status, elapsed, sa.firstByte, int(e.Usage.OutputUnits)); ok && r.picker != nil {
			if err := r.picker.ObserveDecode(r.routes[sa.route], perToken, r.at()); err != nil {
				return err
			}
		}
		sa.finished = true
		sa.stopped = true
		sa.stopAt = workload.Never
	}
	return nil
}

// judgeStall feeds the primary's stall verdict into its route's stall share
// the first time it is known, at the moments the live driver judges it: the
// primary's first byte, a hedge's launch (hedged) and the primary's end
// (ended), after which it is never judged again.
func (r *runner) judgeStall(g *simGroup, hedged, ended bool) error {
	if len(g.attempts) == 0 {
		return nil
	}
	p := g.attempts[0]
	if p.role != schemas.RolePrimary || p.stallJudged {
		return nil
	}
	stalled, known := route.PrimaryState{Delay: g.delay, Elapsed: r.now - (p.start - workerLatency), FirstByte: p.firstByte, Hedged: hedged}.Stalled()
	p.stallJudged = known || ended
	if !known {
		return nil
	}
	return r.picker.ObserveStall(r.routes[p.route], stalled, r.at())
}

// observeCommit feeds the estimator what a commit reveals: a naive quantile
// hedger's group latency, or hedgerow's censored sample of a primary that
// was superseded before its first byte.
func (r *runner) observeCommit(g *simGroup, winner int) {
	switch {
	case r.strat.delay == delayEstimated && r.strat.observeGroup:
		_ = r.class.Estimator.ObservePrimary(g.cohort, r.at(), r.now-g.arrival)
	case r.learnsDelay() && !g.keptPrimary:
		r.observeSuperseded(g, policy.Decision{Winner: winner})
	}
}

// observeSuperseded offers the primary's elapsed time to the class's
// censoring rule as the group is decided, and reports whether it was
// recorded.
func (r *runner) observeSuperseded(g *simGroup, d policy.Decision) bool {
	if len(g.attempts) == 0 {
		return false
	}
	primary := g.attempts[0]
	elapsed := r.now - (primary.start - workerLatency)
	return r.class.ObserveSuperseded(g.cohort, r.at(), policy.Primary{
		Route:     r.routes[primary.route],
		Elapsed:   elapsed,
		FirstByte: primary.finished || primary.draw.FirstByte < r.now-primary.start,
		Failed:    primary.finished && primary.draw.Outcome != workload.OutcomeOK,
	}, d)
}
