package hedge

import (
	"fmt"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// FuzzEngine feeds arbitrary event sequences, including ones no honest driver
// would send (duplicate answers, reports of unknown attempts, timers out of
// order). The engine must not panic, and no safety invariant may break.
func FuzzEngine(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13})
	f.Add([]byte{1, 0, 14, 0, 3, 1, 4, 1, 7, 1, 11, 1, 2, 0, 10, 2, 12, 2})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		p := DefaultOptions()
		p.MaxAttempts = 1 + int(data[0]%MaxAttemptsCap)
		p.CommitPoint = []schemas.CommitPoint{schemas.FirstToken, schemas.Complete, {Kind: schemas.CommitTokens, Tokens: 2}}[data[1]%3]
		if data[0]&0x10 != 0 {
			p.Trigger = TriggerTotal
		}
		if data[0]&0x20 != 0 {
			p.AttemptTimeout = 2 * time.Second
		}
		g, err := New(p)
		if err != nil {
			t.Fatal(err)
		}
		chk := NewChecker(p)
		now := time.Unix(1_900_000_000, 0)
		start := Start{Streaming: data[1]&0x4 != 0, HedgeEligible: data[1]&0x8 != 0, Control: data[1]&0x2 != 0, HedgeDelay: time.Duration(data[1]) * 20 * time.Millisecond, InputUnits: 10, DecodeTokensPerSecond: 50}
		if err := chk.Step(now, start, g.Step(now, start)); err != nil {
			t.Fatal(err)
		}
		res := 0
		for i := 2; i+1 < len(data); i += 2 {
			op, arg := data[i], data[i+1]
			attempt := int(arg%5) + 0
			now = now.Add(time.Duration(arg) * 37 * time.Millisecond)
			var ev Event
			switch op % 17 {
			case 0:
				res++
				ev = Admitted{Allowed: arg%4 != 0, Route: "a", Reservation: ReservationID(fmt.Sprint(res))}
			case 1:
				ev = TimerFired{Kind: []TimerKind{TimerHedge, TimerDeadline, TimerAccept, TimerHeartbeat, TimerAttempt, TimerCancelGrace, TimerReoffer}[arg%7], Attempt: attempt}
			case 2:
				ev = Accepted{Attempt: attempt}
			case 3:
				ev = Busy{Attempt: attempt}
			case 4:
				ev = Heartbeat{Attempt: attempt}
			case 5:
				ev = FirstByte{Attempt: attempt}
			case 6:
				ev = Progress{Attempt: attempt, Tokens: int(arg % 4), FirstToken: arg&1 != 0, Valid: arg&2 != 0}
			case 7:
				ev = Result{Attempt: attempt, Status: schemas.StatusOK, Valid: arg&8 != 0, Usage: schemas.Usage{InputUnits: int64(arg)}}
			case 8:
				scope := []schemas.ErrorScope{schemas.ScopeGroup, schemas.ScopeRoute, schemas.ScopeTransient, schemas.ScopePushback, ""}[arg%5]
				ev = Result{Attempt: attempt, Status: schemas.StatusServerError, Scope: scope, RetryAfter: time.Duration(arg) * time.Millisecond}
			case 9:
				ev = CancelObserved{Attempt: attempt, Usage: schemas.Usage{OutputUnits: int64(arg)}}
			case 10:
				res++
				ev = HedgeBudgetDecided{Allowed: arg%3 != 0, Route: "b", Reservation: ReservationID(fmt.Sprint(res)), Reason: "spend"}
			case 11:
				ev = GateDecided{Attempt: attempt, Won: arg%5 != 0, Gate: fmt.Sprint("g", attempt), Holder: "h"}
			case 12:
				ev = CallerGone{}
			case 13:
				ev = start
			case 14:
				ev = Reoffered{Attempt: attempt, Route: "c"}
			case 15:
				ev = Unserved{Attempt: attempt}
			default:
				now = now.Add(-time.Duration(arg) * time.Millisecond) // time going backwards is clamped
				ev = Heartbeat{Attempt: attempt}
			}
			if err := chk.Step(now, ev, g.Step(now, ev)); err != nil {
				t.Fatalf("step %d (%T%+v): %v", i/2, ev, ev, err)
			}
		}
	})
}

// TestCheckerCountsSilenceFromTheLaunch: an attempt never heard from is
// silent since its launch, for the engine and for the checker alike, so a
// heartbeat timer past HeartbeatTimeout ends it lost without a checker
// complaint (FuzzEngine found the checker counting silence only from a
// first reply).
func TestCheckerCountsSilenceFromTheLaunch(t *testing.T) {
	p := DefaultOptions()
	g, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	chk := NewChecker(p)
	now := time.Unix(1_900_000_000, 0)
	step := func(ev Event) []Action {
		t.Helper()
		acts := g.Step(now, ev)
		if err := chk.Step(now, ev, acts); err != nil {
			t.Fatalf("%T%+v: %v", ev, ev, err)
		}
		return acts
	}
	step(Start{InputUnits: 10, DecodeTokensPerSecond: 50})
	step(Admitted{Allowed: true, Route: "a", Reservation: "r1"})
	now = now.Add(p.HeartbeatTimeout)
	lost := false
	for _, act := range step(TimerFired{Kind: TimerHeartbeat, Attempt: 1}) {
		if e, ok := act.(AttemptEnded); ok && e.Attempt == 1 && e.Status == schemas.StatusLost {
			lost = true
		}
	}
	if !lost {
		t.Fatal("an attempt silent since its launch for HeartbeatTimeout was not ended lost")
	}
}
