package hedge

import (
	"fmt"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// Checker asserts the engine's invariants (docs/architecture.md §4) over one group's events
// and actions, independently of the engine's own bookkeeping. Property tests,
// the fuzz target and the simulator run every group through one.
//
// Safety invariants are checked at every Step: at most one Commit; no Commit
// after Fail (nor Fail after Commit); Commit only of an attempt that was valid
// at the commit point and won the gate; at most MaxAttempts launches; no Launch
// after the outcome or past the deadline; no attempt ends twice; no reservation
// is settled or released twice, nor one that was never granted; no Elect
// after the outcome; an attempt kept past the commit (Commit.Kept) only in
// a control group, never the winner, running when kept, and stopped or
// ended by the step that reaches the deadline; Answered only while a kept
// baseline runs, once; a refused
// attempt re-offered only while it runs, before the outcome and the deadline
// (a re-offer is never a launch, so Busy spends no slot); nothing after the
// group record; a heartbeat timer that fires once a running attempt has been
// silent (no Accept, heartbeat, first byte or chunk) for HeartbeatTimeout —
// before or after its first byte — ends or cancels it, and one that fires
// earlier does not end it as lost; a continuation launched only while a
// committed stream is open, at most Rescues of them (beyond MaxAttempts),
// Splice only of a continuation, at most one StreamEnded and only after a
// Commit. Finish checks liveness for a group that is done: every
// launched attempt ended exactly once, every granted reservation was settled
// or released, and every won gate claim was committed or cleared.
type Checker struct {
	policy      Options
	started     bool
	control     bool
	streaming   bool
	needsWhole  bool
	deadline    time.Time
	commits     int
	fails       int
	launched    int
	ended       map[int]int
	valid       map[int]bool
	reserved    map[ReservationID]int // granted → times settled or released
	admitAsked  bool
	budgetAsked bool
	electAsked  map[int]bool
	wonGate     map[int]string
	gateEnded   map[int]int // won claims committed or cleared
	groupEnded  bool
	heard       map[int]time.Time // an attempt's last reply, or its launch
	stopped     map[int]bool      // result reported, cancel sent or ended
	kept        int               // the baseline a commit kept running (Commit.Kept)
	answered    bool
	// The committed stream's rescue (docs/architecture.md §6, "Rescue").
	continuations map[int]bool // launched continuation attempts
	streamEnds    int
}

// NewChecker returns a checker for a group run with policy.
func NewChecker(policy Options) *Checker {
	return &Checker{
		policy:     policy,
		ended:      map[int]int{},
		valid:      map[int]bool{},
		reserved:   map[ReservationID]int{},
		electAsked: map[int]bool{},
		wonGate:    map[int]string{},
		gateEnded:  map[int]int{},
		heard:      map[int]time.Time{},
		stopped:    map[int]bool{},

		continuations: map[int]bool{},
	}
}

func (c *Checker) commitPoint() schemas.CommitPoint {
	if !c.streaming || c.needsWhole {
		return schemas.Complete
	}
	return c.policy.CommitPoint
}

// Step checks one event and the actions the engine returned for it.
func (c *Checker) Step(now time.Time, ev Event, actions []Action) error {
	if err := c.step(now, ev, actions); err != nil {
		return fmt.Errorf("hedge: %w", err)
	}
	return nil
}

func (c *Checker) step(now time.Time, ev Event, actions []Action) error {
	if err := c.observeEvent(now, ev); err != nil {
		return err
	}
	silent := c.silentAttempt(now, ev)
	for _, act := range actions {
		if err := c.observeAction(now, act); err != nil {
			return fmt.Errorf("after %T: %w", ev, err)
		}
	}
	if c.kept != 0 && !now.Before(c.deadline) && !c.stopped[c.kept] && c.ended[c.kept] == 0 {
		return fmt.Errorf("after %T: kept baseline %d runs on past the deadline", ev, c.kept)
	}
	return c.checkHeartbeat(now, ev, silent, actions)
}

// silentAttempt reports, for a heartbeat timer, whether its attempt is
// running and has been silent for HeartbeatTimeout (before the actions).
func (c *Checker) silentAttempt(now time.Time, ev Event) bool {
	t, ok := ev.(TimerFired)
	if !ok || t.Kind != TimerHeartbeat || c.policy.HeartbeatTimeout == 0 {
		return false
	}
	// A reply of an attempt never launched is no attempt's: the engine
	// ignores it, and its timer.
	last, heard := c.heard[t.Attempt]
	return heard && t.Attempt >= 1 && t.Attempt <= c.launched && !c.stopped[t.Attempt] && c.ended[t.Attempt] == 0 && !c.groupEnded &&
		now.Sub(last) >= c.policy.HeartbeatTimeout
}

// checkHeartbeat asserts the heartbeat invariant of docs/architecture.md
// §4 rule 4 for a heartbeat timer's step: a silent running attempt is
// ended (lost) or cancelled, whether or not it had its first byte or was
// committed; an attempt heard from within HeartbeatTimeout is not lost.
func (c *Checker) checkHeartbeat(now time.Time, ev Event, silent bool, actions []Action) error {
	t, ok := ev.(TimerFired)
	if !ok || t.Kind != TimerHeartbeat {
		return nil
	}
	var ended, cancelled bool
	for _, act := range actions {
		switch a := act.(type) {
		case AttemptEnded:
			if a.Attempt == t.Attempt {
				ended = true
				if !silent && a.Status == schemas.StatusLost {
					return fmt.Errorf("heartbeat timer ended attempt %d as lost, silent only %v", a.Attempt, now.Sub(c.heard[a.Attempt]))
				}
			}
		case Cancel:
			cancelled = cancelled || a.Attempt == t.Attempt
		}
	}
	if silent && !ended && !cancelled {
		return fmt.Errorf("attempt %d silent for %v outlived its heartbeat timer", t.Attempt, now.Sub(c.heard[t.Attempt]))
	}
	return nil
}

func (c *Checker) grant(res ReservationID) error {
	if _, dup := c.reserved[res]; dup {
		return fmt.Errorf("reservation %q granted twice", res)
	}
	c.reserved[res] = 0
	return nil
}

func (c *Checker) observeEvent(now time.Time, ev Event) error {
	switch e := ev.(type) {
	case Start:
		if !c.started {
			c.started = true
			c.control = e.Control
			c.streaming = e.Streaming
			c.needsWhole = e.NeedsCompleteAnswer
			c.deadline = now.Add(c.policy.Deadline)
		}
	case Admitted:
		if c.admitAsked {
			c.admitAsked = false
			if e.Allowed {
				return c.grant(e.Reservation)
			}
		}
	case HedgeBudgetDecided:
		if c.budgetAsked {
			c.budgetAsked = false
			if e.Allowed {
				return c.grant(e.Reservation)
			}
		}
	case GateDecided:
		if c.electAsked[e.Attempt] {
			delete(c.electAsked, e.Attempt)
			if e.Won {
				c.wonGate[e.Attempt] = e.Gate
			}
		}
	case Progress:
		c.heard[e.Attempt] = now
		cp := c.commitPoint()
		ready := (cp.Kind == schemas.CommitFirstToken && e.FirstToken) ||
			(cp.Kind == schemas.CommitTokens && e.Tokens >= cp.Tokens)
		if ready && e.Valid {
			c.valid[e.Attempt] = true
		}
	case Accepted:
		c.heard[e.Attempt] = now
	case Heartbeat:
		c.heard[e.Attempt] = now
	case FirstByte:
		c.heard[e.Attempt] = now
	case Result:
		if e.Attempt < 1 || e.Attempt > c.launched {
			break // a reply of no launched attempt: the engine ignores it
		}
		c.stopped[e.Attempt] = true
		if (e.Scope == schemas.ScopeNone || e.Scope == "") && e.Status == schemas.StatusOK && e.Valid {
			c.valid[e.Attempt] = true
		}
	}
	return nil
}

func (c *Checker) observeAction(now time.Time, act Action) error {
	if c.groupEnded {
		return fmt.Errorf("%T emitted after the group record", act)
	}
	switch a := act.(type) {
	case Admit:
		c.admitAsked = true
	case AskHedgeBudget:
		if c.budgetAsked {
			return fmt.Errorf("second AskHedgeBudget while one is unanswered")
		}
		c.budgetAsked = true
	case Reoffer:
		// Busy is backpressure (docs/architecture.md §4 rule 4): a refused
		// attempt goes out again under its own number, never as a launch.
		switch {
		case c.commits > 0 || c.fails > 0:
			return fmt.Errorf("Reoffer of attempt %d after the outcome", a.Attempt)
		case !now.Before(c.deadline):
			return fmt.Errorf("Reoffer of attempt %d at or past the deadline", a.Attempt)
		case a.Attempt < 1 || a.Attempt > c.launched || c.ended[a.Attempt] > 0:
			return fmt.Errorf("Reoffer of attempt %d, not a running launched attempt", a.Attempt)
		}
	case Elect:
		if c.commits > 0 || c.fails > 0 {
			return fmt.Errorf("Elect of attempt %d after the outcome", a.Attempt)
		}
		if !c.valid[a.Attempt] {
			return fmt.Errorf("Elect of attempt %d, which was never valid at the commit point", a.Attempt)
		}
		c.electAsked[a.Attempt] = true
	case Launch:
		c.launched++
		// Silence counts from the launch, as the engine counts it: an
		// attempt never heard from is silent since it was offered.
		c.heard[a.Attempt] = now
		if a.Role == schemas.RoleContinuation {
			c.continuations[a.Attempt] = true
		}
		switch {
		case a.Role == schemas.RoleContinuation && (c.commits == 0 || c.streamEnds > 0 || !c.streaming || c.needsWhole):
			return fmt.Errorf("Launch of continuation %d without an open committed stream", a.Attempt)
		case a.Role == schemas.RoleContinuation && len(c.continuations) > c.policy.Rescues:
			return fmt.Errorf("Launch of continuation %d: more than rescues %d", a.Attempt, c.policy.Rescues)
		case a.Role != schemas.RoleContinuation && (c.commits > 0 || c.fails > 0):
			return fmt.Errorf("Launch of attempt %d after the outcome", a.Attempt)
		case !now.Before(c.deadline):
			return fmt.Errorf("Launch of attempt %d at or past the deadline", a.Attempt)
		case c.launched-len(c.continuations) > c.policy.MaxAttempts:
			return fmt.Errorf("Launch of attempt %d: more than max_attempts %d", a.Attempt, c.policy.MaxAttempts)
		case a.Attempt != c.launched:
			return fmt.Errorf("Launch numbered %d, want %d", a.Attempt, c.launched)
		case !a.Deadline.Equal(c.deadline):
			return fmt.Errorf("Launch carries deadline %v, want the group's %v", a.Deadline, c.deadline)
		case a.Remaining != c.deadline.Sub(now):
			return fmt.Errorf("Launch carries remaining %v, want %v", a.Remaining, c.deadline.Sub(now))
		}
	case Commit:
		c.commits++
		switch {
		case c.commits > 1:
			return fmt.Errorf("second Commit (attempt %d)", a.Attempt)
		case c.fails > 0:
			return fmt.Errorf("Commit of attempt %d after Fail", a.Attempt)
		case !c.valid[a.Attempt]:
			return fmt.Errorf("Commit of attempt %d, which was never valid at the commit point", a.Attempt)
		}
		gate, won := c.wonGate[a.Attempt]
		if !won || gate != a.Gate {
			return fmt.Errorf("Commit of attempt %d without its won gate claim", a.Attempt)
		}
		c.gateEnded[a.Attempt]++
		if a.Kept != 0 {
			switch {
			case !c.control:
				return fmt.Errorf("Commit keeps attempt %d running in a group that is not a control group", a.Kept)
			case a.Kept == a.Attempt:
				return fmt.Errorf("Commit keeps its own winner %d as the baseline", a.Kept)
			case a.Kept < 1 || a.Kept > c.launched || c.ended[a.Kept] > 0 || c.stopped[a.Kept]:
				return fmt.Errorf("Commit keeps attempt %d, not a running launched attempt", a.Kept)
			}
			c.kept = a.Kept
		}
	case Answered:
		switch {
		case c.kept == 0:
			return fmt.Errorf("Answered without a kept baseline")
		case c.answered:
			return fmt.Errorf("second Answered")
		case c.ended[c.kept] > 0 || c.stopped[c.kept]:
			return fmt.Errorf("Answered after the kept baseline %d stopped", c.kept)
		}
		c.answered = true
	case Splice:
		switch {
		case !c.continuations[a.Attempt]:
			return fmt.Errorf("Splice of attempt %d, not a continuation", a.Attempt)
		case c.streamEnds > 0:
			return fmt.Errorf("Splice of continuation %d after the stream ended", a.Attempt)
		case c.ended[a.Attempt] > 0 || c.stopped[a.Attempt] && !c.valid[a.Attempt]:
			return fmt.Errorf("Splice of continuation %d, which ended or was stopped", a.Attempt)
		}
	case StreamEnded:
		c.streamEnds++
		switch {
		case c.commits == 0:
			return fmt.Errorf("StreamEnded without a commit")
		case c.streamEnds > 1:
			return fmt.Errorf("second StreamEnded")
		}
	case Fail:
		c.fails++
		if c.fails > 1 || c.commits > 0 {
			return fmt.Errorf("Fail(%s) after the outcome was decided", a.Error)
		}
	case ClearGate:
		if _, won := c.wonGate[a.Attempt]; !won {
			return fmt.Errorf("ClearGate of attempt %d, which holds no claim", a.Attempt)
		}
		c.gateEnded[a.Attempt]++
		if c.gateEnded[a.Attempt] > 1 {
			return fmt.Errorf("gate claim of attempt %d committed or cleared twice", a.Attempt)
		}
	case Settle:
		return c.endReservation(a.Reservation)
	case Release:
		return c.endReservation(a.Reservation)
	case Cancel:
		c.stopped[a.Attempt] = true
	case AttemptEnded:
		c.ended[a.Attempt]++
		if a.Attempt < 1 || a.Attempt > c.launched {
			return fmt.Errorf("terminal record of attempt %d, never launched", a.Attempt)
		}
		if c.ended[a.Attempt] > 1 {
			return fmt.Errorf("attempt %d has two terminal records", a.Attempt)
		}
	case GroupEnded:
		c.groupEnded = true
		if c.commits+c.fails != 1 {
			return fmt.Errorf("group record with %d commits and %d fails", c.commits, c.fails)
		}
	}
	return nil
}

func (c *Checker) endReservation(res ReservationID) error {
	n, ok := c.reserved[res]
	if !ok {
		return fmt.Errorf("reservation %q settled or released but never granted", res)
	}
	if n > 0 {
		return fmt.Errorf("reservation %q settled or released twice", res)
	}
	c.reserved[res] = 1
	return nil
}

// Finish checks what must hold once the group reported Done.
func (c *Checker) Finish() error {
	if err := c.finish(); err != nil {
		return fmt.Errorf("hedge: %w", err)
	}
	return nil
}

func (c *Checker) finish() error {
	if !c.groupEnded {
		return fmt.Errorf("group never emitted its group record")
	}
	for n := 1; n <= c.launched; n++ {
		if c.ended[n] != 1 {
			return fmt.Errorf("attempt %d has %d terminal records, want 1", n, c.ended[n])
		}
	}
	for res, n := range c.reserved {
		if n != 1 {
			return fmt.Errorf("reservation %q was never settled or released", res)
		}
	}
	for n := range c.wonGate {
		if c.gateEnded[n] != 1 {
			return fmt.Errorf("won gate claim of attempt %d neither committed nor cleared", n)
		}
	}
	if c.admitAsked || c.budgetAsked || len(c.electAsked) > 0 {
		return fmt.Errorf("done with a question unanswered")
	}
	return nil
}
