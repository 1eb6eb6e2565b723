package hedge_test

import (
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/schemas"
)

// A driver steps a group with the events it observes and carries out the
// actions the engine returns. Here a primary stalls before its first byte, the
// hedge timer fires, the budget grants a hedge on another route, the hedge
// answers first and wins the gate, and the primary is cancelled and settled
// at its estimated usage. Times are offsets from a fixed start, so the story
// plays the same on every run, as it does in the simulator.
func ExampleGroup() {
	p := hedge.DefaultOptions()
	p.Deadline = 10 * time.Second
	g, err := hedge.New(p)
	if err != nil {
		log.Fatal(err)
	}
	// The checker asserts the engine's invariants after every step, as the
	// property tests and the simulator do.
	chk := hedge.NewChecker(p)
	t0 := time.Unix(1_800_000_000, 0)
	step := func(ms int, ev hedge.Event) {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		fmt.Printf("%dms %T\n", ms, ev)
		acts := g.Step(now, ev)
		if err := chk.Step(now, ev, acts); err != nil {
			log.Fatal(err)
		}
		for _, a := range acts {
			fmt.Printf("  → %s\n", describe(t0, a))
		}
	}

	step(0, hedge.Start{HedgeEligible: true, HedgeDelay: 800 * time.Millisecond, InputUnits: 120, DecodeTokensPerSecond: 50})
	step(2, hedge.Admitted{Allowed: true, Route: "east", Reservation: "r1"})
	step(10, hedge.Accepted{Attempt: 1})
	step(800, hedge.TimerFired{Kind: hedge.TimerHedge})
	step(801, hedge.HedgeBudgetDecided{Allowed: true, Route: "west", Reservation: "r2"})
	step(806, hedge.Accepted{Attempt: 2})
	step(1400, hedge.Result{Attempt: 2, Status: schemas.StatusOK, Scope: schemas.ScopeNone, Valid: true,
		Usage: schemas.Usage{InputUnits: 120, OutputUnits: 40}})
	step(1401, hedge.GateDecided{Attempt: 2, Won: true, Gate: "grp-1/2/1"})
	step(1420, hedge.CancelObserved{Attempt: 1})
	fmt.Println("done:", g.Done())

	// Output:
	// 0ms hedge.Start
	//   → Admit
	// 2ms hedge.Admitted
	//   → ArmTimer deadline at +10s
	//   → Launch attempt 1 primary on east with r1, deadline +10s (9.998s left)
	//   → ArmTimer accept for attempt 1 at +1.002s
	//   → ArmTimer hedge at +800ms
	// 10ms hedge.Accepted
	//   → ArmTimer heartbeat for attempt 1 at +3.01s
	// 800ms hedge.TimerFired
	//   → AskHedgeBudget attempt 2 hedge, not on [east]
	// 801ms hedge.HedgeBudgetDecided
	//   → Launch attempt 2 hedge on west with r2, deadline +10s (9.199s left)
	//   → ArmTimer accept for attempt 2 at +1.801s
	// 806ms hedge.Accepted
	//   → ArmTimer heartbeat for attempt 2 at +3.806s
	// 1400ms hedge.Result
	//   → Elect attempt 2
	// 1401ms hedge.GateDecided
	//   → Commit attempt 2 with gate grp-1/2/1
	//   → Cancel attempt 1: lost_race
	//   → ArmTimer cancel_grace for attempt 1 at +3.401s
	//   → Settle r2 for attempt 2: 120 in, 40 out
	//   → AttemptEnded attempt 2 on west: winner, ok, 120 in, 40 out
	// 1420ms hedge.CancelObserved
	//   → Settle r1 for attempt 1: 120 in, 0 out (estimated)
	//   → AttemptEnded attempt 1 on east: loser_canceled, canceled, 120 in, 0 out (estimated)
	//   → GroupEnded committed attempt 2 of 2, hedge launched, latency 1.401s
	// done: true
}

// describe renders an action in one line, its times as offsets from t0.
func describe(t0 time.Time, a hedge.Action) string {
	at := func(t time.Time) string { return "+" + t.Sub(t0).String() }
	usage := func(u schemas.Usage) string {
		s := fmt.Sprintf("%d in, %d out", u.InputUnits, u.OutputUnits)
		if u.Estimated {
			s += " (estimated)"
		}
		return s
	}
	switch a := a.(type) {
	case hedge.Admit:
		return "Admit"
	case hedge.Launch:
		return fmt.Sprintf("Launch attempt %d %s on %s with %s, deadline %s (%v left)",
			a.Attempt, a.Role, a.Route, a.Reservation, at(a.Deadline), a.Remaining)
	case hedge.ArmTimer:
		if a.Attempt == 0 {
			return fmt.Sprintf("ArmTimer %s at %s", a.Kind, at(a.At))
		}
		return fmt.Sprintf("ArmTimer %s for attempt %d at %s", a.Kind, a.Attempt, at(a.At))
	case hedge.AskHedgeBudget:
		return fmt.Sprintf("AskHedgeBudget attempt %d %s, not on [%s]", a.Attempt, a.Role, strings.Join(a.Exclude, " "))
	case hedge.Elect:
		return fmt.Sprintf("Elect attempt %d", a.Attempt)
	case hedge.Commit:
		return fmt.Sprintf("Commit attempt %d with gate %s", a.Attempt, a.Gate)
	case hedge.Cancel:
		return fmt.Sprintf("Cancel attempt %d: %s", a.Attempt, a.Reason)
	case hedge.Settle:
		return fmt.Sprintf("Settle %s for attempt %d: %s", a.Reservation, a.Attempt, usage(a.Usage))
	case hedge.Release:
		return fmt.Sprintf("Release %s", a.Reservation)
	case hedge.AttemptEnded:
		return fmt.Sprintf("AttemptEnded attempt %d on %s: %s, %s, %s", a.Attempt, a.Route, a.Outcome, a.Status, usage(a.Usage))
	case hedge.GroupEnded:
		hedged := "no hedge"
		if a.HedgeLaunched {
			hedged = "hedge launched"
		}
		if !a.Committed {
			return fmt.Sprintf("GroupEnded failed %s after %d attempts, %s, latency %v", a.Error, a.Attempts, hedged, a.Latency)
		}
		return fmt.Sprintf("GroupEnded committed attempt %d of %d, %s, latency %v", a.Winner, a.Attempts, hedged, a.Latency)
	}
	return fmt.Sprintf("%T%+v", a, a)
}
