package hedge

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// schedules is the number of random event schedules each property test runs.
const schedules = 10_000

// coverage counts what the random schedules exercised, so a run that never
// reached the interesting paths fails instead of passing vacuously.
type coverage struct {
	groups, hedges, replacements, lostElections, lateLosers, commits, fails, deadlines, gateClears int
	// silentAfterFirstByte: an attempt lost to the heartbeat timer after its
	// first byte; silentWinner: a committed winner lost that way.
	silentAfterFirstByte, silentWinner int
	// Busy is backpressure (§4 rule 4): re-offers, groups that failed
	// overloaded, hedges and replacements suppressed as overloaded.
	reoffers, overloadedFails, overloadedSuppressions int
	// unserved: offers that found no worker on their route, re-offered.
	unserved int
	// A control group's baseline kept running past another attempt's
	// commit (§5): kept, how many; reached its commit point, failed with
	// the group (the deadline), lost to its own failure; answered, the
	// caller's part over while it ran.
	kept, keptReached, keptFailed, keptLost, answered int
	// The committed stream's rescue (§6): continuations launched, spliced
	// in, beaten by the stalled streamer resuming; streams a continuation
	// finished whole.
	continuations, splices, streamerResumed, rescuedWhole int
}

// simWorker is the random world's view of one launched attempt.
type simWorker struct {
	n          int
	accepted   bool
	busy       bool
	heartbeats int
	firstByte  bool
	progress   int
	done       bool // the worker reported a result or a cancel
	cancelled  bool
	silent     bool // the worker went silent (killed, cut off): it reports nothing more
}

// randomWorld drives one group with a random but legal schedule: answers to
// every question, worker reports in per-attempt order, timers at or after
// their time, and the odd CallerGone.
type randomWorld struct {
	rng      *rand.Rand
	g        *Group
	chk      *Checker
	policy   Options
	now      time.Time
	timers   []ArmTimer
	admit    bool
	ask      *AskHedgeBudget
	elect    int
	reoffers []int // attempts whose Reoffer is unanswered
	workers  []*simWorker
	nextRes  int
	cov      *coverage
	routes   []string
	steps    int
	trace    []string
	lastFail schemas.ErrorCode
	// saturated worlds answer most offers Busy, so queue waits run out.
	saturated bool
	// overloaded is set while the group's last offer came back Busy: no
	// hedge or replacement may launch then (§4 rule 4).
	overloaded bool
	start      Start
	kept       int
	deadline   time.Time
	// spliced is set once a continuation fed the stream.
	spliced bool
}

func randomPolicy(rng *rand.Rand) Options {
	p := DefaultOptions()
	p.MaxAttempts = 1 + rng.IntN(MaxAttemptsCap)
	if rng.IntN(2) == 0 {
		p.Trigger = TriggerTotal
	}
	p.Deadline = time.Duration(2+rng.IntN(8)) * time.Second
	p.MinUsefulTime = time.Duration(rng.IntN(500)) * time.Millisecond
	switch rng.IntN(3) {
	case 0:
		p.CommitPoint = schemas.FirstToken
	case 1:
		p.CommitPoint = schemas.CommitPoint{Kind: schemas.CommitTokens, Tokens: 1 + rng.IntN(3)}
	default:
		p.CommitPoint = schemas.Complete
	}
	if rng.IntN(4) == 0 {
		p.AttemptTimeout = time.Duration(300+rng.IntN(2000)) * time.Millisecond
	}
	if rng.IntN(3) == 0 {
		p.HeartbeatTimeout = 0
	}
	p.SameRouteHedging = rng.IntN(3) == 0
	p.FailFast = rng.IntN(10) == 0
	if rng.IntN(2) == 0 {
		p.Rescues = 1 + rng.IntN(MaxRescues)
	}
	return p
}

func newRandomWorld(t *testing.T, seed uint64, cov *coverage) *randomWorld {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	policy := randomPolicy(rng)
	g, err := New(policy)
	if err != nil {
		t.Fatalf("seed %d: New: %v", seed, err)
	}
	return &randomWorld{
		rng: rng, g: g, chk: NewChecker(policy), policy: policy,
		now: time.Unix(1_700_000_000, 0), cov: cov,
		routes:    []string{"a", "b", "c"},
		saturated: rng.IntN(8) == 0,
	}
}

func (w *randomWorld) step(ev Event) error {
	w.steps++
	if _, ok := ev.(Accepted); ok {
		w.overloaded = false
	}
	acts := w.g.Step(w.now, ev)
	if _, ok := ev.(Busy); ok && len(acts) > 0 {
		w.overloaded = true // the engine took the refusal
	}
	w.trace = append(w.trace, fmt.Sprintf("%v %T%+v -> %d actions", w.now.Sub(time.Unix(1_700_000_000, 0)), ev, ev, len(acts)))
	if err := w.chk.Step(w.now, ev, acts); err != nil {
		return err
	}
	for _, act := range acts {
		switch a := act.(type) {
		case Admit:
			w.admit = true
		case AskHedgeBudget:
			cp := a
			w.ask = &cp
		case Elect:
			w.elect = a.Attempt
		case Reoffer:
			w.reoffers = append(w.reoffers, a.Attempt)
			w.cov.reoffers++
			if a.Unserved {
				w.cov.unserved++
			}
		case HedgeSuppressed:
			if a.Reason == "overloaded" {
				w.cov.overloadedSuppressions++
			}
		case ArmTimer:
			w.timers = append(w.timers, a)
		case Launch:
			// A continuation stands in for the committed stream's broken
			// attempt: it adds no load to what the stream needs.
			if w.overloaded && a.Role != schemas.RolePrimary && a.Role != schemas.RoleContinuation {
				return fmt.Errorf("%s launched while the pool was saturated", a.Role)
			}
			w.workers = append(w.workers, &simWorker{n: a.Attempt})
			switch a.Role {
			case schemas.RoleHedge:
				w.cov.hedges++
			case schemas.RoleReplacement:
				w.cov.replacements++
			case schemas.RoleContinuation:
				w.cov.continuations++
			}
		case Cancel:
			w.workers[a.Attempt-1].cancelled = true
			if a.Reason == CancelLostRace && w.workers[a.Attempt-1].continuation(w.g) {
				w.cov.streamerResumed++
			}
		case Splice:
			w.cov.splices++
			w.spliced = true
		case StreamEnded:
			if a.Status == schemas.StatusOK && w.spliced {
				w.cov.rescuedWhole++
			}
		case Commit:
			w.cov.commits++
			if a.Kept != 0 {
				w.cov.kept++
				w.kept = a.Kept
			}
		case Answered:
			w.cov.answered++
		case GroupEnded:
			if err := w.checkBaseline(a); err != nil {
				return err
			}
		case Fail:
			w.cov.fails++
			w.lastFail = a.Error
			switch a.Error {
			case schemas.ErrAlreadyCommitted:
				w.cov.lostElections++
			case schemas.ErrDeadlineExceeded:
				w.cov.deadlines++
			case schemas.ErrOverloaded:
				w.cov.overloadedFails++
			}
		case ClearGate:
			w.cov.gateClears++
		case AttemptEnded:
			if a.Outcome == OutcomeLoserLate {
				w.cov.lateLosers++
			}
			if a.Status == schemas.StatusLost && a.FirstByte > 0 {
				w.cov.silentAfterFirstByte++
				if a.Outcome == OutcomeWinner {
					w.cov.silentWinner++
				}
			}
		}
	}
	return nil
}

func (w *randomWorld) advance(max time.Duration) {
	w.now = w.now.Add(time.Duration(w.rng.Int64N(int64(max))))
}

// choices lists the events that may happen next.
func (w *randomWorld) choices() []func() Event {
	var out []func() Event
	if w.admit {
		out = append(out, func() Event {
			w.admit = false
			w.advance(5 * time.Millisecond)
			if w.rng.IntN(10) == 0 {
				return Admitted{Allowed: false, Reason: "spend_user_action"}
			}
			w.nextRes++
			return Admitted{Allowed: true, Route: w.routes[w.rng.IntN(3)], Reservation: ReservationID(fmt.Sprint("r", w.nextRes))}
		})
	}
	if w.ask != nil {
		out = append(out, func() Event {
			w.ask = nil
			w.advance(5 * time.Millisecond)
			if w.rng.IntN(4) == 0 {
				return HedgeBudgetDecided{Allowed: false, Reason: "duplicate_rate"}
			}
			w.nextRes++
			return HedgeBudgetDecided{Allowed: true, Route: w.routes[w.rng.IntN(3)], Reservation: ReservationID(fmt.Sprint("r", w.nextRes))}
		})
	}
	if w.elect != 0 {
		out = append(out, func() Event {
			n := w.elect
			w.elect = 0
			w.advance(2 * time.Millisecond)
			if w.rng.IntN(6) == 0 {
				return GateDecided{Attempt: n, Won: false, Holder: "other-group"}
			}
			return GateDecided{Attempt: n, Won: true, Gate: fmt.Sprintf("g/%d/1", n)}
		})
	}
	if len(w.reoffers) > 0 {
		out = append(out, func() Event {
			n := w.reoffers[0]
			w.reoffers = w.reoffers[1:]
			w.workers[n-1].busy = false // offered again: another worker answers
			return Reoffered{Attempt: n, Route: w.routes[w.rng.IntN(3)]}
		})
	}
	for _, sw := range w.workers {
		if sw.done || sw.busy || sw.silent {
			continue
		}
		out = append(out, w.workerEvent(sw))
	}
	if w.rng.IntN(200) == 0 {
		out = append(out, func() Event { return CallerGone{} })
	}
	if len(w.timers) > 0 {
		out = append(out, func() Event {
			sort.SliceStable(w.timers, func(i, j int) bool { return w.timers[i].At.Before(w.timers[j].At) })
			// Usually the earliest timer; sometimes a later one first, as real
			// timers racing with messages may appear to.
			i := 0
			if len(w.timers) > 1 && w.rng.IntN(5) == 0 {
				i = w.rng.IntN(len(w.timers))
			}
			t := w.timers[i]
			w.timers = append(w.timers[:i], w.timers[i+1:]...)
			if t.At.After(w.now) {
				w.now = t.At
			}
			return TimerFired{Kind: t.Kind, Attempt: t.Attempt}
		})
	}
	return out
}

// workerEvent is the next report of one attempt's worker.
func (w *randomWorld) workerEvent(sw *simWorker) func() Event {
	return func() Event {
		w.advance(150 * time.Millisecond)
		r := w.rng.IntN(100)
		switch {
		case sw.cancelled && r < 40:
			sw.done = true
			return CancelObserved{Attempt: sw.n, Usage: schemas.Usage{InputUnits: 100, OutputUnits: int64(sw.progress * 5)}}
		case sw.cancelled && r < 55:
			sw.done = true // completed anyway: a late loser
			return Result{Attempt: sw.n, Status: schemas.StatusOK, Scope: schemas.ScopeNone, Valid: true, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 50}}
		case !sw.accepted:
			if r < 8 || (w.saturated && r < 90) {
				sw.busy = true
				return Busy{Attempt: sw.n}
			}
			if r < 14 {
				// The route's worker is gone: NATS had no responders.
				sw.busy = true
				return Unserved{Attempt: sw.n}
			}
			sw.accepted = true
			return Accepted{Attempt: sw.n}
		case !sw.firstByte && sw.heartbeats < 3 && r < 40:
			sw.heartbeats++
			return Heartbeat{Attempt: sw.n}
		case !sw.firstByte && r < 80:
			sw.firstByte = true
			return FirstByte{Attempt: sw.n}
		case sw.firstByte && sw.progress < 3 && r < 50:
			sw.progress++
			if w.rng.IntN(8) == 0 {
				// Killed mid-answer: this is its last report.
				sw.silent = true
			}
			return Progress{Attempt: sw.n, Tokens: sw.progress * 2, FirstToken: true, Valid: w.rng.IntN(25) != 0}
		case sw.firstByte && sw.heartbeats < 6 && r < 60:
			// Heartbeats go on after the first byte until the attempt ends.
			sw.heartbeats++
			return Heartbeat{Attempt: sw.n}
		}
		sw.done = true
		usage := schemas.Usage{InputUnits: 100, OutputUnits: 20}
		switch f := w.rng.IntN(100); {
		case f < 65:
			valid := w.rng.IntN(10) != 0
			return Result{Attempt: sw.n, Status: schemas.StatusOK, Scope: schemas.ScopeNone, Valid: valid, Truncated: !valid && w.rng.IntN(2) == 0, Usage: usage}
		case f < 80:
			return Result{Attempt: sw.n, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient, Usage: usage}
		case f < 88:
			return Result{Attempt: sw.n, Status: schemas.StatusRateLimited, Scope: schemas.ScopePushback, RetryAfter: time.Second}
		case f < 95:
			return Result{Attempt: sw.n, Status: schemas.StatusAuth, Scope: schemas.ScopeRoute}
		default:
			return Result{Attempt: sw.n, Status: schemas.StatusInvalidRequest, Scope: schemas.ScopeGroup, Error: schemas.ErrInvalidRequest}
		}
	}
}

// checkBaseline holds a group record's Baseline to what the schedule did:
// none outside control groups; a control group that never hedged measured
// its own run; a kept baseline committed after the winner, never past the
// deadline.
func (w *randomWorld) checkBaseline(e GroupEnded) error {
	b := e.Baseline
	switch {
	case !w.start.Control:
		if b != (Baseline{}) {
			return fmt.Errorf("a group that is not a control group has a baseline %+v", b)
		}
	case !e.HedgeLaunched:
		if !b.Observed || b.Committed != e.Committed || b.Latency != e.Latency || (e.Committed && b.Attempt != e.Winner) {
			return fmt.Errorf("a control group that never hedged has baseline %+v, not its own run %+v", b, e)
		}
	case w.kept != 0:
		switch {
		case b.Committed && (b.Attempt != w.kept || b.Latency < e.Latency || w.start0().Add(b.Latency).After(w.deadline)):
			return fmt.Errorf("kept baseline %d measured %+v: want it, after the commit at %v, before the deadline", w.kept, b, e.Latency)
		case b.Committed:
			w.cov.keptReached++
		case b.Observed:
			w.cov.keptFailed++
		default:
			w.cov.keptLost++
		}
	}
	return nil
}

func (w *randomWorld) start0() time.Time { return time.Unix(1_700_000_000, 0) }

// run drives the group to Done, checking invariants at every step.
func (w *randomWorld) run() error {
	streaming := w.rng.IntN(4) != 0
	start := Start{
		Streaming:             streaming,
		NeedsCompleteAnswer:   w.rng.IntN(8) == 0,
		HedgeEligible:         w.rng.IntN(8) != 0,
		NotEligibleReason:     "rollout",
		Control:               w.rng.IntN(3) == 0,
		HedgeDelay:            time.Duration(w.rng.IntN(3000)) * time.Millisecond,
		InputUnits:            100,
		DecodeTokensPerSecond: 100,
		Continuable:           w.rng.IntN(4) != 0,
	}
	if w.rng.IntN(2) == 0 {
		start.StallBound = time.Duration(100+w.rng.IntN(1000)) * time.Millisecond
	}
	w.start, w.deadline = start, w.now.Add(w.policy.Deadline)
	if err := w.step(start); err != nil {
		return err
	}
	for !w.g.Done() {
		if w.steps > 1000 {
			return fmt.Errorf("not done after %d steps", w.steps)
		}
		cs := w.choices()
		if len(cs) > 1 && len(w.timers) > 0 && w.rng.IntN(4) != 0 {
			cs = cs[:len(cs)-1] // the timer choice is last: let messages outrun timers most of the time
		}
		if len(cs) == 0 {
			return fmt.Errorf("not done, and nothing left to happen")
		}
		if err := w.step(cs[w.rng.IntN(len(cs))]()); err != nil {
			return err
		}
	}
	// Stale timers and late worker reports after Done must change nothing.
	for _, t := range w.timers {
		if acts := w.g.Step(w.now, TimerFired{Kind: t.Kind, Attempt: t.Attempt}); len(acts) != 0 {
			return fmt.Errorf("stale %s timer after Done produced %v", t.Kind, acts)
		}
	}
	return w.chk.Finish()
}

func TestPropertyInvariantsHoldOverRandomSchedules(t *testing.T) {
	var cov coverage
	base := uint64(20261202)
	for i := range uint64(schedules) {
		seed := base + i
		w := newRandomWorld(t, seed, &cov)
		if err := w.run(); err != nil {
			t.Fatalf("seed %d (policy %+v): %v\ntrace:\n%s", seed, w.policy, err, joinLast(w.trace, 40))
		}
		cov.groups++
	}
	t.Logf("coverage over %d schedules: %+v", schedules, cov)
	for name, n := range map[string]int{
		"hedge launched":              cov.hedges,
		"replacement launched":        cov.replacements,
		"lost election":               cov.lostElections,
		"late loser":                  cov.lateLosers,
		"commit":                      cov.commits,
		"deadline":                    cov.deadlines,
		"gate claim cleared":          cov.gateClears,
		"silent after its first byte": cov.silentAfterFirstByte,
		"silent committed winner":     cov.silentWinner,
		"busy re-offered":             cov.reoffers,
		"unserved re-offered":         cov.unserved,
		"overloaded failure":          cov.overloadedFails,
		"overloaded suppressed":       cov.overloadedSuppressions,
		"baseline kept":               cov.kept,
		"kept baseline reached":       cov.keptReached,
		"kept baseline to deadline":   cov.keptFailed,
		"kept baseline lost":          cov.keptLost,
		"answered before the end":     cov.answered,
		"continuation launched":       cov.continuations,
		"continuation spliced":        cov.splices,
		"stalled streamer resumed":    cov.streamerResumed,
		"stream rescued whole":        cov.rescuedWhole,
	} {
		if n == 0 {
			t.Errorf("no schedule exercised: %s", name)
		}
	}
}

func joinLast(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := ""
	for _, l := range lines {
		out += "  " + l + "\n"
	}
	return out
}

// continuation reports whether sw's attempt is a continuation not yet
// spliced in: a lost-race cancel of it means the stalled streamer resumed.
func (sw *simWorker) continuation(g *Group) bool {
	a := g.attempt(sw.n)
	return a != nil && a.role == schemas.RoleContinuation && !a.streamed
}
