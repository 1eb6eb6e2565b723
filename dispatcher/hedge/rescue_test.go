package hedge

import (
	"slices"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// rescuePolicy rescues a committed stream once.
func rescuePolicy(rescues int) Options {
	p := DefaultOptions()
	p.Rescues = rescues
	return p
}

// continuableStart is streamingStart whose stream may be continued and
// whose stall is watched after 500ms.
var continuableStart = func() Start {
	s := streamingStart
	s.Continuable, s.StallBound = true, 500*time.Millisecond
	return s
}()

// committedOnA runs the primary on route a to its commit at its first token
// at 101ms.
func (h *harness) committedOnA(s Start) {
	h.t.Helper()
	h.launched(s)
	h.at(2, Accepted{Attempt: 1})
	h.at(100, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
	if _, ok := find[Commit](h.at(101, GateDecided{Attempt: 1, Won: true, Gate: "g/1/1"})); !ok {
		h.t.Fatal("the primary did not commit")
	}
}

// continued grants a continuation on route b at ms and returns its Launch.
func (h *harness) continued(ms int, route string, res ReservationID) Launch {
	h.t.Helper()
	l, ok := find[Launch](h.at(ms, HedgeBudgetDecided{Allowed: true, Route: route, Reservation: res}))
	if !ok || l.Role != schemas.RoleContinuation || l.Route != route {
		h.t.Fatalf("granted continuation launched %+v, want a continuation on %s", l, route)
	}
	return l
}

func TestRescueABrokenCommittedStreamIsContinuedAndSplicedOnce(t *testing.T) {
	h := newHarness(t, rescuePolicy(1))
	h.committedOnA(continuableStart)
	acts := h.at(300, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 10}})
	ask, ok := find[AskHedgeBudget](acts)
	if !ok || ask.Role != schemas.RoleContinuation || !slices.Equal(ask.Exclude, []string{"a"}) || ask.Attempt != 2 {
		t.Fatalf("broken stream asked %+v, want a continuation excluding route a", ask)
	}
	if has[StreamEnded](acts) {
		t.Fatalf("the stream ended although a continuation was asked for: %v", acts)
	}
	if e, ok := endOf(acts, 1); !ok || e.Outcome != OutcomeWinner || e.Status != schemas.StatusServerError {
		t.Fatalf("the broken winner's record is %+v, want winner, server_error", e)
	}
	h.continued(301, "b", "r2")
	h.at(302, Accepted{Attempt: 2})
	acts = h.at(400, Progress{Attempt: 2, Tokens: 1, FirstToken: true, Valid: true})
	if sp, ok := find[Splice](acts); !ok || sp.Attempt != 2 || sp.From != 1 {
		t.Fatalf("the continuation's first token gave %v, want Splice{2, From 1}", acts)
	}
	if has[Elect](acts) || has[Commit](acts) {
		t.Fatalf("a continuation was elected or committed: %v", acts)
	}
	acts = h.at(500, Result{Attempt: 2, Status: schemas.StatusOK, Valid: true, Usage: schemas.Usage{InputUnits: 110, OutputUnits: 20}})
	if se, ok := find[StreamEnded](acts); !ok || se.Attempt != 2 || se.Status != schemas.StatusOK {
		t.Fatalf("the continuation's answer ended the stream with %v, want StreamEnded ok by 2", acts)
	}
	ge, ok := find[GroupEnded](acts)
	if !ok || !ge.Committed || ge.Winner != 1 || ge.Attempts != 2 {
		t.Fatalf("group record %+v, want committed by 1 with 2 attempts", ge)
	}
	if e, _ := endOf(acts, 2); e.Outcome != OutcomeWinner || e.Role != schemas.RoleContinuation {
		t.Fatalf("the continuation's record is %+v, want a winner continuation", e)
	}
	if err := h.chk.Finish(); err != nil {
		t.Fatal(err)
	}
}

func TestRescueOnlyBreaksAContinuationCanMend(t *testing.T) {
	tests := []struct {
		name   string
		policy Options
		start  Start
		result Result
		rescue bool
	}{
		{"a transient failure is continued", rescuePolicy(1), continuableStart,
			Result{Status: schemas.StatusServerError, Scope: schemas.ScopeTransient}, true},
		{"a lost stream is continued", rescuePolicy(1), continuableStart,
			Result{Status: schemas.StatusLost, Scope: schemas.ScopeTransient}, true},
		{"an answer cut at its length below the max_tokens asked is continued", rescuePolicy(1), continuableStart,
			Result{Status: schemas.StatusOK, Scope: schemas.ScopeNone, Truncated: true}, true},
		{"a content-filter ending is not", rescuePolicy(1), continuableStart,
			Result{Status: schemas.StatusOK, Scope: schemas.ScopeNone}, false},
		{"an invalid request is not", rescuePolicy(1), continuableStart,
			Result{Status: schemas.StatusInvalidRequest, Scope: schemas.ScopeGroup}, false},
		{"rescue off ends the stream as before", rescuePolicy(0), continuableStart,
			Result{Status: schemas.StatusServerError, Scope: schemas.ScopeTransient}, false},
		{"a request that cannot be continued is not", rescuePolicy(1), streamingStart,
			Result{Status: schemas.StatusServerError, Scope: schemas.ScopeTransient}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.policy)
			h.committedOnA(tc.start)
			tc.result.Attempt = 1
			acts := h.at(300, tc.result)
			_, asked := find[AskHedgeBudget](acts)
			se, ended := find[StreamEnded](acts)
			switch {
			case asked != tc.rescue:
				t.Fatalf("asked for a continuation: %v, want %v (%v)", asked, tc.rescue, acts)
			case ended == tc.rescue:
				t.Fatalf("stream ended: %v, want %v (%v)", ended, !tc.rescue, acts)
			case ended && (se.Attempt != 1 || se.Status == schemas.StatusOK):
				t.Fatalf("stream ended %+v, want attempt 1's failure", se)
			}
		})
	}
}

func TestRescueAStalledStreamerThatResumesFirstKeepsTheStream(t *testing.T) {
	h := newHarness(t, rescuePolicy(1))
	h.committedOnA(continuableStart)
	h.at(200, Progress{Attempt: 1, Tokens: 2, FirstToken: true, Valid: true})
	// The stall timer was armed for the last token: 200ms + 500ms.
	acts := h.at(700, TimerFired{Kind: TimerStall, Attempt: 1})
	if ask, ok := find[AskHedgeBudget](acts); !ok || ask.Role != schemas.RoleContinuation || !slices.Equal(ask.Exclude, []string{"a"}) {
		t.Fatalf("a streamer silent for the stall bound asked %v, want a continuation on another route than the stalled one", acts)
	}
	if len(cancelsOf(acts, 1)) != 0 {
		t.Fatal("the stalled streamer was cancelled: it keeps its chance")
	}
	h.continued(701, "b", "r2")
	h.at(702, Accepted{Attempt: 2})
	acts = h.at(800, Progress{Attempt: 1, Tokens: 3, FirstToken: true, Valid: true})
	if got := cancelsOf(acts, 2); !slices.Equal(got, []CancelReason{CancelLostRace}) || has[Splice](acts) {
		t.Fatalf("the streamer resuming first gave %v, want the continuation cancelled as the race's loser", acts)
	}
	acts = h.at(850, CancelObserved{Attempt: 2})
	if e, _ := endOf(acts, 2); e.Outcome != OutcomeLoserCanceled {
		t.Fatalf("the beaten continuation's record is %+v, want loser_canceled", e)
	}
	acts = h.at(900, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true})
	if se, ok := find[StreamEnded](acts); !ok || se.Attempt != 1 || se.Status != schemas.StatusOK {
		t.Fatalf("the resumed streamer's answer gave %v, want StreamEnded ok by 1", acts)
	}
	if err := h.chk.Finish(); err != nil {
		t.Fatal(err)
	}
}

func TestRescueAContinuationThatTalksFirstTakesTheStalledStream(t *testing.T) {
	h := newHarness(t, rescuePolicy(1))
	h.committedOnA(continuableStart)
	h.at(601, TimerFired{Kind: TimerStall, Attempt: 1})
	h.continued(602, "b", "r2")
	acts := h.at(700, Progress{Attempt: 2, Tokens: 1, FirstToken: true, Valid: true})
	if !has[Splice](acts) || !slices.Equal(cancelsOf(acts, 1), []CancelReason{CancelLostRace}) {
		t.Fatalf("the continuation's first token gave %v, want a Splice and the stalled streamer cancelled", acts)
	}
	// The cancelled streamer's late output changes nothing.
	if acts := h.at(710, Progress{Attempt: 1, Tokens: 5, FirstToken: true, Valid: true}); len(acts) != 0 {
		t.Fatalf("the spliced-away streamer's late output gave %v", acts)
	}
	acts = h.at(720, CancelObserved{Attempt: 1, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 5}})
	if e, _ := endOf(acts, 1); e.Outcome != OutcomeWinner || e.Status != schemas.StatusServerError || e.Scope != schemas.ScopeTransient {
		t.Fatalf("the spliced-away winner's record is %+v, want winner (its output is part of the answer), "+
			"a transient server_error (it stalled, as the worker's stall bound reports one)", e)
	}
	acts = h.at(900, Result{Attempt: 2, Status: schemas.StatusOK, Valid: true})
	if se, ok := find[StreamEnded](acts); !ok || se.Attempt != 2 || se.Status != schemas.StatusOK {
		t.Fatalf("got %v, want StreamEnded ok by 2", acts)
	}
	if err := h.chk.Finish(); err != nil {
		t.Fatal(err)
	}
}

func TestRescueStopsAtItsMaxAndEndsWithTheOriginalBreak(t *testing.T) {
	h := newHarness(t, rescuePolicy(2))
	h.committedOnA(continuableStart)
	h.at(300, Result{Attempt: 1, Status: schemas.StatusLost, Scope: schemas.ScopeTransient})
	h.continued(301, "b", "r2")
	// The first continuation fails before its first token: another goes
	// to a route that has not broken this stream.
	acts := h.at(400, Result{Attempt: 2, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
	ask, ok := find[AskHedgeBudget](acts)
	if !ok || ask.Role != schemas.RoleContinuation || !slices.Equal(ask.Exclude, []string{"a", "b"}) {
		t.Fatalf("a failed continuation asked %v, want another excluding a and b", acts)
	}
	h.continued(401, "c", "r3")
	acts = h.at(500, Busy{Attempt: 3})
	se, ok := find[StreamEnded](acts)
	if !ok || se.Status != schemas.StatusLost || has[AskHedgeBudget](acts) {
		t.Fatalf("the last continuation's refusal gave %v, want the stream ended with the original break", acts)
	}
	if err := h.chk.Finish(); err != nil {
		t.Fatal(err)
	}
}

func TestRescueARefusedContinuationEndsTheStream(t *testing.T) {
	h := newHarness(t, rescuePolicy(1))
	h.committedOnA(continuableStart)
	h.at(300, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
	acts := h.at(301, HedgeBudgetDecided{Allowed: false, Reason: "spend"})
	if se, ok := find[StreamEnded](acts); !ok || se.Status != schemas.StatusServerError {
		t.Fatalf("a refused continuation gave %v, want the stream ended with its break", acts)
	}
	if s, ok := find[HedgeSuppressed](acts); !ok || s.Role != schemas.RoleContinuation || s.Reason != "spend" {
		t.Fatalf("the refusal was not recorded: %v", acts)
	}
	if err := h.chk.Finish(); err != nil {
		t.Fatal(err)
	}
}

func TestRescueEndsAtTheDeadlineAndWhenTheCallerLeaves(t *testing.T) {
	tests := []struct {
		name   string
		ms     int
		ev     Event
		status schemas.StatusClass
	}{
		{"the deadline", 30_000, TimerFired{Kind: TimerDeadline}, schemas.StatusTimeout},
		{"the caller leaving", 400, CallerGone{}, schemas.StatusCanceled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, rescuePolicy(1))
			h.committedOnA(continuableStart)
			h.at(300, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
			h.continued(301, "b", "r2")
			acts := h.at(tc.ms, tc.ev)
			se, ok := find[StreamEnded](acts)
			if !ok || se.Status != tc.status || len(cancelsOf(acts, 2)) != 1 {
				t.Fatalf("got %v, want the continuation cancelled and the stream ended %s", acts, tc.status)
			}
		})
	}
}

func TestRescueNeedsTimeLeft(t *testing.T) {
	p := rescuePolicy(1)
	p.Deadline, p.MinUsefulTime = time.Second, 500*time.Millisecond
	h := newHarness(t, p)
	h.committedOnA(continuableStart)
	acts := h.at(600, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
	if has[AskHedgeBudget](acts) || !has[StreamEnded](acts) {
		t.Fatalf("a break with less than min_useful_time left gave %v, want the stream ended", acts)
	}
}
