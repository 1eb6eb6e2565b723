package hedge

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// harness steps one group at millisecond offsets and checks every step with a Checker.
type harness struct {
	t   *testing.T
	g   *Group
	chk *Checker
	t0  time.Time
}

func newHarness(t *testing.T, p Options) *harness {
	t.Helper()
	g, err := New(p)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &harness{t: t, g: g, chk: NewChecker(p), t0: time.Unix(1_800_000_000, 0)}
}

func (h *harness) at(ms int, ev Event) []Action {
	h.t.Helper()
	now := h.t0.Add(time.Duration(ms) * time.Millisecond)
	acts := h.g.Step(now, ev)
	if err := h.chk.Step(now, ev, acts); err != nil {
		h.t.Fatalf("invariant broken at %dms: %v", ms, err)
	}
	return acts
}

// streamingStart is an eligible streaming group with a 1 s hedge delay.
var streamingStart = Start{Streaming: true, HedgeEligible: true, HedgeDelay: time.Second, InputUnits: 100, DecodeTokensPerSecond: 100}

// launched starts a group and admits its primary on route "a".
func (h *harness) launched(s Start) []Action {
	h.t.Helper()
	h.at(0, s)
	return h.at(1, Admitted{Allowed: true, Route: "a", Reservation: "r1"})
}

// hedged starts a group, fires the hedge timer at 1 s and grants a hedge on
// route "b", which its worker accepts at 1002ms.
func (h *harness) hedged(s Start) {
	h.t.Helper()
	h.hedgeLaunched(s)
	h.at(1002, Accepted{Attempt: 2})
}

// hedgeLaunched is hedged without the hedge's Accept.
func (h *harness) hedgeLaunched(s Start) {
	h.t.Helper()
	h.launched(s)
	h.at(2, Accepted{Attempt: 1})
	if _, ok := find[AskHedgeBudget](h.at(1000, TimerFired{Kind: TimerHedge})); !ok {
		h.t.Fatal("hedge timer did not ask for a hedge budget")
	}
	if _, ok := find[Launch](h.at(1001, HedgeBudgetDecided{Allowed: true, Route: "b", Reservation: "r2"})); !ok {
		h.t.Fatal("granted hedge was not launched")
	}
}

func find[T Action](acts []Action) (T, bool) {
	for _, a := range acts {
		if v, ok := a.(T); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

func all[T Action](acts []Action) []T {
	var out []T
	for _, a := range acts {
		if v, ok := a.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func has[T Action](acts []Action) bool { _, ok := find[T](acts); return ok }

func timerAt(acts []Action, kind TimerKind) (time.Time, bool) {
	for _, a := range all[ArmTimer](acts) {
		if a.Kind == kind {
			return a.At, true
		}
	}
	return time.Time{}, false
}

func TestPolicyValidateRejectsOutOfRangeFields(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Options)
	}{
		{"max attempts above the hard cap", func(p *Options) { p.MaxAttempts = 5 }},
		{"max attempts below one", func(p *Options) { p.MaxAttempts = 0 }},
		{"unknown trigger", func(p *Options) { p.Trigger = "sometimes" }},
		{"no deadline", func(p *Options) { p.Deadline = 0 }},
		{"min useful time not below the deadline", func(p *Options) { p.MinUsefulTime = p.Deadline }},
		{"token commit point without tokens", func(p *Options) { p.CommitPoint = schemas.CommitPoint{Kind: schemas.CommitTokens} }},
		{"no accept timeout", func(p *Options) { p.AcceptTimeout = 0 }},
	}
	if err := DefaultOptions().Validate(); err != nil {
		t.Fatalf("default policy invalid: %v", err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultOptions()
			tc.change(&p)
			if _, err := New(p); !errors.Is(err, ErrInvalidOptions) {
				t.Fatalf("New = %v, want ErrInvalidOptions", err)
			}
		})
	}
}

// Rule 1: admit first (ledger, reservation, primary route), then the primary;
// one absolute deadline; the hedge timer only for hedge-eligible cohorts.
func TestRule1AdmissionComesBeforeThePrimary(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	acts := h.at(0, streamingStart)
	if len(acts) != 1 || !has[Admit](acts) {
		t.Fatalf("Start = %v, want only Admit", acts)
	}
	acts = h.at(5, Admitted{Allowed: true, Route: "a", Reservation: "r1"})
	l, ok := find[Launch](acts)
	if !ok || l.Attempt != 1 || l.Role != schemas.RolePrimary || l.Route != "a" || l.Reservation != "r1" {
		t.Fatalf("Admitted = %v, want Launch of the primary on a with r1", acts)
	}
}

func TestRule1RefusedAdmissionFailsWithoutLaunching(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.at(0, streamingStart)
	acts := h.at(1, Admitted{Allowed: false, Reason: "attempts", Error: schemas.ErrBudgetExhausted})
	if has[Launch](acts) {
		t.Fatal("launched after a refused admission")
	}
	f, ok := find[Fail](acts)
	if !ok || f.Error != schemas.ErrBudgetExhausted {
		t.Fatalf("want Fail(budget_exhausted), got %v", acts)
	}
	if !h.g.Done() {
		t.Fatal("group not done after a refused admission")
	}
}

func TestRule1EveryAttemptCarriesTheAbsoluteDeadlineAndItsRemainingTime(t *testing.T) {
	p := DefaultOptions()
	p.Deadline = 10 * time.Second
	h := newHarness(t, p)
	acts := h.launched(streamingStart)
	deadline := h.t0.Add(10 * time.Second)
	if at, ok := timerAt(acts, TimerDeadline); !ok || !at.Equal(deadline) {
		t.Fatalf("deadline timer at %v, want Start+deadline %v", at, deadline)
	}
	primary, _ := find[Launch](acts)
	if !primary.Deadline.Equal(deadline) || primary.Remaining != deadline.Sub(h.t0.Add(time.Millisecond)) {
		t.Fatalf("primary carries %v/%v", primary.Deadline, primary.Remaining)
	}
	h.at(1000, TimerFired{Kind: TimerHedge})
	hedge, _ := find[Launch](h.at(1500, HedgeBudgetDecided{Allowed: true, Route: "b", Reservation: "r2"}))
	if !hedge.Deadline.Equal(deadline) || hedge.Remaining != 8500*time.Millisecond {
		t.Fatalf("hedge carries %v/%v, want the same deadline and 8.5s remaining", hedge.Deadline, hedge.Remaining)
	}
}

func TestRule1HedgeTimerIsArmedOnlyForEligibleCohorts(t *testing.T) {
	tests := []struct {
		name       string
		start      Start
		wantTimer  bool
		suppressed string
	}{
		{"eligible cohort arms the timer at start plus delay", streamingStart, true, ""},
		{"a group outside the rollout runs primary-only", Start{Streaming: true, HedgeEligible: false, NotEligibleReason: "rollout", HedgeDelay: time.Second}, false, "rollout"},
		{"delay past the deadline arms nothing", Start{Streaming: true, HedgeEligible: true, HedgeDelay: time.Minute}, false, "delay_past_deadline"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, DefaultOptions())
			acts := h.launched(tc.start)
			at, armed := timerAt(acts, TimerHedge)
			if armed != tc.wantTimer {
				t.Fatalf("hedge timer armed = %v, want %v", armed, tc.wantTimer)
			}
			if armed && !at.Equal(h.t0.Add(tc.start.HedgeDelay)) {
				t.Fatalf("hedge timer at %v, want Start + delay", at)
			}
			if !armed {
				h.at(10, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true})
				h.at(11, GateDecided{Attempt: 1, Won: true, Gate: "g"})
				rec, _ := find[GroupEnded](h.at(12, CancelObserved{}))
				_ = rec
			}
		})
	}
}

// Rule 2: the hedge trigger and the gates re-checked when it fires.
func TestRule2HedgeTriggerDecidesWhatCountsAsAStall(t *testing.T) {
	tests := []struct {
		name      string
		trigger   Trigger
		firstByte bool
		wantAsk   bool
	}{
		{"first_byte trigger hedges a primary without its first byte", TriggerFirstByte, false, true},
		{"first_byte trigger leaves a long answer alone once bytes flow", TriggerFirstByte, true, false},
		{"total trigger hedges any primary without a valid result", TriggerTotal, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultOptions()
			p.Trigger = tc.trigger
			p.CommitPoint = schemas.Complete
			h := newHarness(t, p)
			h.launched(streamingStart)
			h.at(2, Accepted{Attempt: 1})
			if tc.firstByte {
				h.at(500, FirstByte{Attempt: 1})
			}
			acts := h.at(1000, TimerFired{Kind: TimerHedge})
			if got := has[AskHedgeBudget](acts); got != tc.wantAsk {
				t.Fatalf("asked for a hedge = %v, want %v (%v)", got, tc.wantAsk, acts)
			}
			if !tc.wantAsk {
				s, ok := find[HedgeSuppressed](acts)
				if !ok || s.Reason != "not_stalled" {
					t.Fatalf("want suppression not_stalled, got %v", acts)
				}
			}
		})
	}
}

func TestRule2HedgeLaunchesOnlyWhenEveryGateAllows(t *testing.T) {
	tests := []struct {
		name   string
		policy func(*Options)
		before func(h *harness)
		budget *HedgeBudgetDecided
		reason string
	}{
		{name: "not enough time left", policy: func(p *Options) { p.Deadline = 1500 * time.Millisecond; p.MinUsefulTime = 600 * time.Millisecond }, reason: "delay_past_deadline"},
		{name: "no attempt slot", policy: func(p *Options) { p.MaxAttempts = 1 }, reason: "no_slot"},
		{name: "duplicate-rate budget refuses", budget: &HedgeBudgetDecided{Allowed: false, Reason: "duplicate_rate"}, reason: "duplicate_rate"},
		{name: "spend ceiling refuses", budget: &HedgeBudgetDecided{Allowed: false, Reason: "spend"}, reason: "spend"},
		{name: "no other eligible route", budget: &HedgeBudgetDecided{Allowed: false, Reason: "no_route"}, reason: "no_route"},
		{name: "a valid result already arrived", policy: func(p *Options) { p.Trigger = TriggerTotal }, before: func(h *harness) {
			h.at(900, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
		}, reason: "valid_result"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultOptions()
			if tc.policy != nil {
				tc.policy(&p)
			}
			h := newHarness(t, p)
			acts := h.launched(streamingStart)
			if _, armed := timerAt(acts, TimerHedge); !armed {
				if s := h.g.suppressed; s != tc.reason {
					t.Fatalf("no hedge timer, suppression %q, want %q", s, tc.reason)
				}
				return
			}
			h.at(2, Accepted{Attempt: 1})
			if tc.before != nil {
				tc.before(h)
			}
			acts = h.at(1000, TimerFired{Kind: TimerHedge})
			if tc.budget != nil {
				if !has[AskHedgeBudget](acts) {
					t.Fatalf("no budget asked: %v", acts)
				}
				acts = h.at(1001, *tc.budget)
			}
			if has[Launch](acts) {
				t.Fatalf("hedge launched although %s", tc.name)
			}
			s, ok := find[HedgeSuppressed](acts)
			if !ok || s.Reason != tc.reason || s.Role != schemas.RoleHedge {
				t.Fatalf("suppression = %+v, want hedge %q", s, tc.reason)
			}
		})
	}
}

func TestRule2HedgeAsksForADifferentRoute(t *testing.T) {
	for _, same := range []bool{false, true} {
		p := DefaultOptions()
		p.SameRouteHedging = same
		h := newHarness(t, p)
		h.launched(streamingStart)
		ask, ok := find[AskHedgeBudget](h.at(1000, TimerFired{Kind: TimerHedge}))
		if !ok || !slices.Equal(ask.Exclude, []string{"a"}) || ask.Role != schemas.RoleHedge || ask.SameRoute != same {
			t.Fatalf("ask = %+v, want hedge excluding the primary's route a, same-route %v", ask, same)
		}
	}
}

func TestRule2BudgetGrantedAfterAWinnerIsReleased(t *testing.T) {
	p := DefaultOptions()
	p.Trigger = TriggerTotal
	p.CommitPoint = schemas.Complete
	h := newHarness(t, p)
	h.launched(streamingStart)
	h.at(1000, TimerFired{Kind: TimerHedge})
	h.at(1001, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true, Usage: schemas.Usage{InputUnits: 10, OutputUnits: 5}})
	h.at(1002, GateDecided{Attempt: 1, Won: true, Gate: "g1"})
	acts := h.at(1003, HedgeBudgetDecided{Allowed: true, Route: "b", Reservation: "late"})
	if r, ok := find[Release](acts); !ok || r.Reservation != "late" || has[Launch](acts) {
		t.Fatalf("late grant = %v, want Release(late) and no Launch", acts)
	}
	if !h.g.Done() {
		t.Fatal("group not done")
	}
	if err := h.chk.Finish(); err != nil {
		t.Fatal(err)
	}
}

// Rule 3: only a contract-valid result may win, judged at the commit point.
func TestRule3OnlyAResultValidAtTheCommitPointIsElected(t *testing.T) {
	tokens3 := schemas.CommitPoint{Kind: schemas.CommitTokens, Tokens: 3}
	tests := []struct {
		name      string
		commit    schemas.CommitPoint
		start     Start
		event     Event
		wantElect bool
	}{
		{"first_token elects at the first content token", schemas.FirstToken, streamingStart, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true}, true},
		{"first_token waits while only a role chunk arrived", schemas.FirstToken, streamingStart, Progress{Attempt: 1, Tokens: 0, FirstToken: false, Valid: true}, false},
		{"tokens:N waits below N", tokens3, streamingStart, Progress{Attempt: 1, Tokens: 2, FirstToken: true, Valid: true}, false},
		{"tokens:N elects at N", tokens3, streamingStart, Progress{Attempt: 1, Tokens: 3, FirstToken: true, Valid: true}, true},
		{"complete never elects on progress", schemas.Complete, streamingStart, Progress{Attempt: 1, Tokens: 50, FirstToken: true, Valid: true}, false},
		{"complete elects a valid complete answer", schemas.Complete, streamingStart, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true}, true},
		{"non-streaming always commits at complete", schemas.FirstToken, Start{Streaming: false, HedgeEligible: true, HedgeDelay: time.Second}, Progress{Attempt: 1, Tokens: 5, FirstToken: true, Valid: true}, false},
		{"a contract needing the whole answer moves the commit point to complete", schemas.FirstToken, Start{Streaming: true, NeedsCompleteAnswer: true, HedgeEligible: true, HedgeDelay: time.Second}, Progress{Attempt: 1, Tokens: 5, FirstToken: true, Valid: true}, false},
		{"a malformed stream is never elected", schemas.FirstToken, streamingStart, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: false}, false},
		{"a truncated or schema-failing answer is never elected", schemas.Complete, streamingStart, Result{Attempt: 1, Status: schemas.StatusOK, Valid: false}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultOptions()
			p.CommitPoint = tc.commit
			h := newHarness(t, p)
			h.launched(tc.start)
			h.at(2, Accepted{Attempt: 1})
			h.at(3, FirstByte{Attempt: 1})
			acts := h.at(4, tc.event)
			if got := has[Elect](acts); got != tc.wantElect {
				t.Fatalf("elected = %v, want %v (%v)", got, tc.wantElect, acts)
			}
		})
	}
}

func TestRule3InvalidAnswerLosesAndTheOtherAttemptKeepsRunning(t *testing.T) {
	p := DefaultOptions()
	p.CommitPoint = schemas.Complete
	p.MaxAttempts = 2
	h := newHarness(t, p)
	h.hedged(streamingStart)
	acts := h.at(1500, Result{Attempt: 1, Status: schemas.StatusOK, Valid: false, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 1000}})
	if has[Elect](acts) || has[Cancel](acts) || has[Fail](acts) {
		t.Fatalf("invalid answer = %v, want no election, no cancel, no failure", acts)
	}
	rec, _ := find[AttemptEnded](acts)
	if rec.Status != schemas.StatusContractInvalid || rec.ContractValid {
		t.Fatalf("record = %+v, want contract_invalid", rec)
	}
	if !has[Elect](h.at(1600, Result{Attempt: 2, Status: schemas.StatusOK, Valid: true})) {
		t.Fatal("the hedge's valid answer was not elected")
	}
}

func TestRule3FirstValidIsElectedThenCommittedThenTheOthersCancelled(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.hedged(streamingStart)
	h.at(1100, FirstByte{Attempt: 2})
	if e, ok := find[Elect](h.at(1101, Progress{Attempt: 2, Tokens: 1, FirstToken: true, Valid: true})); !ok || e.Attempt != 2 {
		t.Fatal("hedge's first token not elected")
	}
	// The primary's first token arrives while the election is pending: it waits.
	if has[Elect](h.at(1102, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})) {
		t.Fatal("two elections at once")
	}
	acts := h.at(1103, GateDecided{Attempt: 2, Won: true, Gate: "g/2/7"})
	c, ok := find[Commit](acts)
	if !ok || c.Attempt != 2 || c.Gate != "g/2/7" {
		t.Fatalf("Commit = %v", acts)
	}
	cancels := all[Cancel](acts)
	if len(cancels) != 1 || cancels[0].Attempt != 1 || cancels[0].Reason != CancelLostRace {
		t.Fatalf("cancels = %v, want the primary cancelled as the race's loser", cancels)
	}
}

func TestRule3CommittedStreamWhoseResultIsInvalidEndsContractInvalid(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.hedged(streamingStart)
	h.at(1100, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
	if _, ok := find[Commit](h.at(1101, GateDecided{Attempt: 1, Won: true, Gate: "g/1/1"})); !ok {
		t.Fatal("first token not committed")
	}
	// The result shows what the first token could not: a truncated answer.
	acts := h.at(1500, Result{Attempt: 1, Status: schemas.StatusOK, Valid: false})
	rec, ok := find[AttemptEnded](acts)
	if !ok || rec.Outcome != OutcomeWinner || rec.Status != schemas.StatusContractInvalid {
		t.Fatalf("winner's invalid result = %v, want the winner ended contract_invalid", acts)
	}
	if has[Launch](acts) || has[Elect](acts) {
		t.Fatalf("after the commit no other attempt may be launched or elected: %v", acts)
	}
}

func TestRule3EveryAttemptLosingTheElectionEndsAlreadyCommitted(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.hedged(streamingStart)
	h.at(1100, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
	acts := h.at(1101, GateDecided{Attempt: 1, Won: false, Holder: "group-x"})
	f, ok := find[Fail](acts)
	if !ok || f.Error != schemas.ErrAlreadyCommitted || f.Holder != "group-x" {
		t.Fatalf("lost election = %v, want Fail(already_committed) naming the holder", acts)
	}
	if len(all[Cancel](acts)) != 2 {
		t.Fatalf("want both attempts cancelled, got %v", all[Cancel](acts))
	}
}

func TestRule3AnElectionNoGateCouldDecideFailsTheGroupWithoutACommit(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.hedged(streamingStart)
	h.at(1100, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
	acts := h.at(1101, GateDecided{Attempt: 1, Unavailable: true})
	f, ok := find[Fail](acts)
	if !ok || f.Error != schemas.ErrGateUnavailable {
		t.Fatalf("undecided election = %v, want Fail(gate_unavailable)", acts)
	}
	if has[Commit](acts) || has[Elect](acts) {
		t.Fatalf("an undecided election must neither commit nor elect another attempt: %v", acts)
	}
	if len(all[Cancel](acts)) != 2 {
		t.Fatalf("want both attempts cancelled, got %v", all[Cancel](acts))
	}
	// The caller is told to retry (503): the attempts that reached a
	// provider settle with their ledger slots forgiven, so the retries
	// do not find the user action's allowance spent by an outage.
	for n := 1; n <= 2; n++ {
		acts := h.at(1200+n, CancelObserved{Attempt: n, Usage: schemas.Usage{InputUnits: 10, OutputUnits: 3}})
		if st, ok := find[Settle](acts); !ok || !st.Lost {
			t.Fatalf("attempt %d settled %+v %v; want its slot forgiven (Lost)", n, st, ok)
		}
	}
}

// A finished answer no gate could decide settles, slot forgiven, before the
// Fail that tells its caller to retry: the retry must find the slot back.
func TestRule3AFinishedAttemptNoGateCouldDecideSettlesBeforeItsCallerIsTold(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.launched(Start{HedgeEligible: true, HedgeDelay: time.Second, InputUnits: 100})
	h.at(2, Accepted{Attempt: 1})
	h.at(500, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 20}})
	acts := h.at(501, GateDecided{Attempt: 1, Unavailable: true})
	settle, fail := -1, -1
	for i, a := range acts {
		switch a := a.(type) {
		case Settle:
			if a.Lost {
				settle = i
			}
		case Fail:
			fail = i
		}
	}
	if settle < 0 || fail < 0 || settle > fail {
		t.Fatalf("actions %v: want the forgiven Settle (at %d) before the Fail (at %d)", acts, settle, fail)
	}
}

// Rule 4: the error's scope decides, never the arrival order.
func TestRule4ErrorScopeDecidesWhatAFailureReaches(t *testing.T) {
	tests := []struct {
		name        string
		result      Result
		wantFail    schemas.ErrorCode
		wantMark    RouteMark
		wantMarkTTL time.Duration
		wantAsk     bool
	}{
		{name: "group-scoped permanent error cancels all with one stable error",
			result:   Result{Attempt: 2, Status: schemas.StatusInvalidRequest, Scope: schemas.ScopeGroup, Error: schemas.ErrInvalidRequest},
			wantFail: schemas.ErrInvalidRequest},
		{name: "route-local permanent error quarantines the route and ends only that attempt",
			result:   Result{Attempt: 2, Status: schemas.StatusAuth, Scope: schemas.ScopeRoute},
			wantMark: MarkQuarantine, wantMarkTTL: time.Minute, wantAsk: true},
		{name: "transient error launches a replacement at once",
			result:  Result{Attempt: 2, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient},
			wantAsk: true},
		{name: "pushback pauses the route until Retry-After and adds no load",
			result:   Result{Attempt: 2, Status: schemas.StatusRateLimited, Scope: schemas.ScopePushback, RetryAfter: 7 * time.Second},
			wantMark: MarkPushback, wantMarkTTL: 7 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultOptions()
			p.MaxAttempts = 3
			h := newHarness(t, p)
			h.hedged(streamingStart)
			acts := h.at(1200, tc.result)
			f, failed := find[Fail](acts)
			if (tc.wantFail != "") != failed || (failed && f.Error != tc.wantFail) {
				t.Fatalf("Fail = %v, want %q", acts, tc.wantFail)
			}
			if tc.wantFail != "" {
				if c, ok := find[Cancel](acts); !ok || c.Attempt != 1 {
					t.Fatalf("the primary was not cancelled: %v", acts)
				}
			} else if has[Cancel](acts) {
				t.Fatalf("a %s failure cancelled another attempt: %v", tc.result.Scope, acts)
			}
			m, marked := find[MarkRoute](acts)
			if (tc.wantMark != "") != marked || (marked && (m.Mark != tc.wantMark || m.Route != "b" || m.TTL != tc.wantMarkTTL)) {
				t.Fatalf("MarkRoute = %+v, want %q on b for %v", m, tc.wantMark, tc.wantMarkTTL)
			}
			ask, asked := find[AskHedgeBudget](acts)
			if asked != tc.wantAsk {
				t.Fatalf("replacement asked = %v, want %v", asked, tc.wantAsk)
			}
			if asked && (ask.Role != schemas.RoleReplacement || !slices.Equal(ask.Exclude, []string{"a", "b"})) {
				t.Fatalf("ask = %+v, want a replacement away from a and b", ask)
			}
		})
	}
}

func TestRule4ArrivalOrderDoesNotChangeTheOutcome(t *testing.T) {
	routeErr := Result{Attempt: 1, Status: schemas.StatusAuth, Scope: schemas.ScopeRoute}
	answer := Result{Attempt: 2, Status: schemas.StatusOK, Valid: true}
	for _, order := range [][]Result{{routeErr, answer}, {answer, routeErr}} {
		p := DefaultOptions()
		p.CommitPoint = schemas.Complete
		h := newHarness(t, p)
		h.hedged(streamingStart)
		h.at(1200, order[0])
		h.at(1201, order[1])
		acts := h.at(1202, GateDecided{Attempt: 2, Won: true, Gate: "g"})
		if c, ok := find[Commit](acts); !ok || c.Attempt != 2 {
			t.Fatalf("order %v: want the hedge committed, got %v", order, acts)
		}
	}
}

func TestRule4MissingAcceptAndLostHeartbeatsAreTransient(t *testing.T) {
	tests := []struct {
		name   string
		events func(h *harness) []Action
		status schemas.StatusClass
		// started: the worker had accepted, so its reservation is settled, not released.
		started bool
	}{
		{"no accept within the accept timeout", func(h *harness) []Action { return h.at(250, TimerFired{Kind: TimerAccept, Attempt: 1}) }, schemas.StatusLost, false},
		{"heartbeats stop before the first byte", func(h *harness) []Action {
			h.at(10, Accepted{Attempt: 1})
			h.at(400, Heartbeat{Attempt: 1})
			// The timer armed at accept fires early relative to the last heartbeat: it re-arms.
			if acts := h.at(1010, TimerFired{Kind: TimerHeartbeat, Attempt: 1}); has[AttemptEnded](acts) {
				h.t.Fatal("heartbeat timer ended an attempt that beat 610ms ago")
			}
			return h.at(1400, TimerFired{Kind: TimerHeartbeat, Attempt: 1})
		}, schemas.StatusLost, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, livenessPolicy())
			h.launched(streamingStart)
			acts := tc.events(h)
			rec, ok := find[AttemptEnded](acts)
			if !ok || rec.Status != tc.status || rec.Scope != schemas.ScopeTransient {
				t.Fatalf("record = %+v, want %s transient", rec, tc.status)
			}
			_, released := find[Release](acts)
			_, settled := find[Settle](acts)
			if released == tc.started || settled != tc.started {
				t.Fatalf("started=%v: released=%v settled=%v, want an unstarted attempt released and a started one settled", tc.started, released, settled)
			}
			if ask, ok := find[AskHedgeBudget](acts); !ok || ask.Role != schemas.RoleReplacement {
				t.Fatalf("no replacement asked: %v", acts)
			}
		})
	}
}

// Rule 4, lost heartbeats after the first byte: any reply of the attempt
// (heartbeat, first byte, chunk) restarts its silence; an attempt silent for
// HeartbeatTimeout after its first byte is lost, not left to the deadline.
func TestRule4AnAttemptSilentAfterItsFirstByteIsLostWithinTheHeartbeatTimeout(t *testing.T) {
	t.Run("before commit it is transient and replaced", func(t *testing.T) {
		p := livenessPolicy()
		p.CommitPoint = schemas.CommitPoint{Kind: schemas.CommitTokens, Tokens: 100}
		h := newHarness(t, p)
		h.launched(streamingStart)
		h.at(10, Accepted{Attempt: 1})
		h.at(300, FirstByte{Attempt: 1})
		h.at(900, Progress{Attempt: 1, Tokens: 10, FirstToken: true, Valid: true})
		// The timer armed at the Accept fires 110 ms after the last chunk: it re-arms at chunk + 1 s.
		acts := h.at(1010, TimerFired{Kind: TimerHeartbeat, Attempt: 1})
		if at, ok := timerAt(acts, TimerHeartbeat); !ok || !at.Equal(h.t0.Add(1900*time.Millisecond)) || has[AttemptEnded](acts) {
			t.Fatalf("early heartbeat timer after a chunk = %v, want it re-armed at 1.9s", acts)
		}
		h.at(1500, Heartbeat{Attempt: 1}) // a heartbeat after the first byte counts too
		acts = h.at(1900, TimerFired{Kind: TimerHeartbeat, Attempt: 1})
		if at, ok := timerAt(acts, TimerHeartbeat); !ok || !at.Equal(h.t0.Add(2500*time.Millisecond)) {
			t.Fatalf("heartbeat timer after a heartbeat = %v, want it re-armed at 2.5s", acts)
		}
		acts = h.at(2500, TimerFired{Kind: TimerHeartbeat, Attempt: 1})
		rec, ok := find[AttemptEnded](acts)
		if !ok || rec.Status != schemas.StatusLost || rec.Scope != schemas.ScopeTransient || rec.Outcome != OutcomeFailed {
			t.Fatalf("silent attempt record = %+v (%v), want failed lost transient", rec, acts)
		}
		if c, ok := find[Cancel](acts); !ok || c.Reason != CancelTimeout {
			t.Fatalf("silent attempt not cancelled: %v", acts)
		}
		if s, ok := find[Settle](acts); !ok || !s.Usage.Estimated || s.Usage.OutputUnits == 0 {
			t.Fatalf("silent attempt settle = %+v, want its estimated decode", s)
		}
		if ask, ok := find[AskHedgeBudget](acts); !ok || ask.Role != schemas.RoleReplacement {
			t.Fatalf("no replacement asked: %v", acts)
		}
	})
	t.Run("after commit the committed stream ends at once", func(t *testing.T) {
		h := newHarness(t, livenessPolicy())
		h.launched(streamingStart)
		h.at(10, Accepted{Attempt: 1})
		h.at(300, FirstByte{Attempt: 1})
		h.at(301, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
		if c, ok := find[Commit](h.at(302, GateDecided{Attempt: 1, Won: true, Gate: "g"})); !ok || c.Attempt != 1 {
			t.Fatal("first token was not committed")
		}
		h.at(800, Progress{Attempt: 1, Tokens: 10, FirstToken: true, Valid: true})
		acts := h.at(1800, TimerFired{Kind: TimerHeartbeat, Attempt: 1})
		rec, ok := find[AttemptEnded](acts)
		if !ok || rec.Outcome != OutcomeWinner || rec.Status != schemas.StatusLost || rec.Scope != schemas.ScopeTransient {
			t.Fatalf("silent winner record = %+v (%v), want winner lost transient", rec, acts)
		}
		if _, ok := find[Cancel](acts); !ok {
			t.Fatalf("silent winner not cancelled: %v", acts)
		}
		if end, ok := find[GroupEnded](acts); !ok || !end.Committed || !h.g.Done() {
			t.Fatalf("group not ended with the silent winner: %v", acts)
		}
	})
	t.Run("zero timeout never arms it", func(t *testing.T) {
		p := livenessPolicy()
		p.HeartbeatTimeout = 0
		h := newHarness(t, p)
		h.launched(streamingStart)
		for _, ev := range []Event{Accepted{Attempt: 1}, FirstByte{Attempt: 1}, Heartbeat{Attempt: 1}} {
			if _, ok := timerAt(h.at(10, ev), TimerHeartbeat); ok {
				t.Fatalf("%T armed a heartbeat timer with the check off", ev)
			}
		}
	})
}

// Rule 4, busy is backpressure: a Busy ends nothing and asks for nothing;
// the same attempt is offered again after a backoff, and its new route is
// the one its records and marks name.
func TestRule4BusyIsBackpressureNotAFailure(t *testing.T) {
	h := newHarness(t, livenessPolicy())
	h.launched(streamingStart)
	acts := h.at(10, Busy{Attempt: 1})
	if has[AttemptEnded](acts) || has[AskHedgeBudget](acts) || has[Release](acts) || has[Launch](acts) {
		t.Fatalf("Busy was treated as a failure: %v", acts)
	}
	at, ok := timerAt(acts, TimerReoffer)
	if !ok || at != h.t0.Add(20*time.Millisecond) {
		t.Fatalf("re-offer timer = %v %v, want at 20ms (10ms backoff)", at, ok)
	}
	// A second Busy before the re-offer is a duplicate: ignored.
	if acts := h.at(15, Busy{Attempt: 1}); len(acts) != 0 {
		t.Fatalf("duplicate Busy = %v", acts)
	}
	r, ok := find[Reoffer](h.at(20, TimerFired{Kind: TimerReoffer, Attempt: 1}))
	if !ok || r.Attempt != 1 || r.Busy != "a" {
		t.Fatalf("re-offer = %+v %v, want attempt 1 refused on a", r, ok)
	}
	// The primary's accept timer (armed at 251ms) fires while the attempt
	// waits for its re-offer's answer: it is stale.
	if acts := h.at(251, TimerFired{Kind: TimerAccept, Attempt: 1}); len(acts) != 0 {
		t.Fatalf("stale accept timer = %v", acts)
	}
	acts = h.at(252, Reoffered{Attempt: 1, Route: "b"})
	if at, ok := timerAt(acts, TimerAccept); !ok || at != h.t0.Add(502*time.Millisecond) {
		t.Fatalf("re-offer's accept timer = %v %v, want at 502ms", at, ok)
	}
	h.at(260, Accepted{Attempt: 1})
	// Capacity was found: the pool is no longer saturated, so the hedge may go.
	if _, ok := find[AskHedgeBudget](h.at(1000, TimerFired{Kind: TimerHedge})); !ok {
		t.Fatal("no hedge asked after the re-offered attempt was accepted")
	}
	h.at(1001, HedgeBudgetDecided{Allowed: false, Reason: "duplicate_rate"})
	h.at(1100, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
	h.at(1101, GateDecided{Attempt: 1, Won: true, Gate: "g"})
	acts = h.at(1200, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true, Usage: schemas.Usage{InputUnits: 1, OutputUnits: 1}})
	rec, ok := find[AttemptEnded](acts)
	if !ok || rec.Route != "b" || rec.Outcome != OutcomeWinner {
		t.Fatalf("winner record = %+v, want attempt 1 won on its new route b", rec)
	}
	if g, ok := find[GroupEnded](acts); !ok || g.Attempts != 1 {
		t.Fatalf("group record = %+v: a Busy must spend no attempt slot", g)
	}
}

// Rule 4, a route without a worker: an attempt NATS found no responders for
// keeps its slot and is offered again at once, to a route with a worker
// (the Reoffer says so); one that keeps finding none fails transient, and
// its replacement follows as for any transient failure.
func TestRule4AnAttemptWithNoWorkerIsReofferedAtOnceKeepingItsSlot(t *testing.T) {
	t.Run("re-offered and won elsewhere with one slot spent", func(t *testing.T) {
		h := newHarness(t, livenessPolicy())
		h.launched(streamingStart)
		acts := h.at(1, Unserved{Attempt: 1})
		if has[AttemptEnded](acts) || has[AskHedgeBudget](acts) || has[Launch](acts) || has[ArmTimer](acts) {
			t.Fatalf("Unserved was treated as a failure or waited for: %v", acts)
		}
		r, ok := find[Reoffer](acts)
		if !ok || r.Attempt != 1 || r.Busy != "a" || !r.Unserved {
			t.Fatalf("re-offer = %+v %v, want attempt 1 at once, away from a, marked unserved", r, ok)
		}
		h.at(2, Reoffered{Attempt: 1, Route: "b"})
		h.at(3, Accepted{Attempt: 1})
		h.at(100, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
		h.at(101, GateDecided{Attempt: 1, Won: true, Gate: "g"})
		acts = h.at(200, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true, Usage: schemas.Usage{InputUnits: 1, OutputUnits: 1}})
		if rec, ok := find[AttemptEnded](acts); !ok || rec.Route != "b" || rec.Outcome != OutcomeWinner {
			t.Fatalf("winner record = %+v, want attempt 1 won on b", rec)
		}
		if g, ok := find[GroupEnded](acts); !ok || g.Attempts != 1 {
			t.Fatalf("group record = %+v: a route without a worker must spend no attempt slot", g)
		}
	})
	t.Run("fails transient after the bound and is replaced", func(t *testing.T) {
		h := newHarness(t, livenessPolicy())
		h.launched(streamingStart)
		for i := range MaxUnservedReoffers {
			if _, ok := find[Reoffer](h.at(1+2*i, Unserved{Attempt: 1})); !ok {
				t.Fatalf("offer %d not re-offered", i+1)
			}
			h.at(2+2*i, Reoffered{Attempt: 1, Route: "b"})
		}
		acts := h.at(20, Unserved{Attempt: 1})
		if rec, ok := find[AttemptEnded](acts); !ok || rec.Status != schemas.StatusNoResponders {
			t.Fatalf("after %d re-offers: %v, want the attempt ended no_responders", MaxUnservedReoffers, acts)
		}
		if _, ok := find[AskHedgeBudget](acts); !ok {
			t.Fatalf("no replacement asked for: %v", acts)
		}
	})
}

// Past QueueWait from the first Busy the attempt gives up, and a group with
// nothing else fails overloaded: never all_routes_failed, no hedge, no
// replacement, its reservation released.
func TestRule4BusyPastTheQueueWaitFailsOverloaded(t *testing.T) {
	p := DefaultOptions()
	h := newHarness(t, p)
	h.launched(streamingStart)
	now, backoffs := 10, []int{}
	var acts []Action
	for range 100 {
		acts = h.at(now, Busy{Attempt: 1})
		if has[Fail](acts) {
			break
		}
		if has[AskHedgeBudget](acts) || has[Launch](acts) {
			t.Fatalf("Busy at %dms asked for more load: %v", now, acts)
		}
		at, ok := timerAt(acts, TimerReoffer)
		if !ok {
			t.Fatalf("Busy at %dms: no re-offer and no failure: %v", now, acts)
		}
		backoffs = append(backoffs, int(at.Sub(h.t0)/time.Millisecond)-now)
		now = int(at.Sub(h.t0) / time.Millisecond)
		if acts := h.at(now, TimerFired{Kind: TimerReoffer, Attempt: 1}); !has[Reoffer](acts) {
			t.Fatalf("re-offer timer at %dms: %v", now, acts)
		}
		h.at(now, Reoffered{Attempt: 1, Route: "b"})
		if now >= 300 && now < 1000 {
			// The hedge timer fires into the saturated pool: suppressed.
			if s, ok := find[HedgeSuppressed](h.at(now, TimerFired{Kind: TimerHedge})); ok && s.Reason != "overloaded" {
				t.Fatalf("hedge suppressed as %q, want overloaded", s.Reason)
			}
		}
		now++
	}
	f, ok := find[Fail](acts)
	if !ok || f.Error != schemas.ErrOverloaded || f.Scope != schemas.ScopePushback {
		t.Fatalf("fail = %+v %v, want overloaded", f, ok)
	}
	if queued := time.Duration(now-10) * time.Millisecond; queued > p.QueueWait {
		t.Fatalf("gave up %v after the first Busy, past the queue wait %v", queued, p.QueueWait)
	}
	if want := []int{10, 20, 40, 80, 80}; len(backoffs) < len(want) || !slices.Equal(backoffs[:len(want)], want) {
		t.Fatalf("backoffs = %v, want doubling from 10ms, capped at 80ms", backoffs)
	}
	rec, _ := find[AttemptEnded](acts)
	if rec.Status != schemas.StatusBusy || rec.Outcome != OutcomeFailed || !has[Release](acts) {
		t.Fatalf("record %+v: want the refused attempt failed busy and its reservation released", rec)
	}
	if g, ok := find[GroupEnded](acts); !ok || g.Attempts != 1 || g.HedgeLaunched || g.HedgeSuppressed != "overloaded" {
		t.Fatalf("group record = %+v, want one attempt, no hedge, suppressed overloaded", g)
	}
}

// While the group's last offer came back Busy, a failure of another attempt
// asks for no replacement, and a budget granted meanwhile is given back.
func TestRule4SaturationSuppressesReplacementsAndHedges(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.hedgeLaunched(streamingStart)
	// The primary fails while the hedge's worker is full.
	h.at(1100, Busy{Attempt: 2})
	acts := h.at(1101, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
	if has[AskHedgeBudget](acts) {
		t.Fatalf("replacement asked into a saturated pool: %v", acts)
	}
	if s, ok := find[HedgeSuppressed](acts); !ok || s.Role != schemas.RoleReplacement || s.Reason != "overloaded" {
		t.Fatalf("suppression = %+v %v, want replacement overloaded", s, ok)
	}
	if has[Fail](acts) {
		t.Fatalf("failed while the refused hedge still waits for room: %v", acts)
	}
	// The caller leaves while the hedge waits for its re-offer: no worker
	// holds it, so it ends at once.
	acts = h.at(1105, CallerGone{})
	if rec, ok := find[AttemptEnded](acts); !ok || rec.Attempt != 2 || has[Cancel](acts) {
		t.Fatalf("waiting attempt not ended at once: %v", acts)
	}
	if !has[GroupEnded](acts) {
		t.Fatalf("group not done: %v", acts)
	}
}

// A failure whose replacement the saturated pool has no room for fails the
// group overloaded, as a Busy past the queue wait does: the routes are full,
// not failed (issue 27's saturation run saw all_routes_failed here).
func TestRule4AReplacementRefusedForSaturationFailsOverloadedNotAllRoutesFailed(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.launched(streamingStart)
	acts := h.at(100, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
	if ask, ok := find[AskHedgeBudget](acts); !ok || ask.Role != schemas.RoleReplacement {
		t.Fatalf("no replacement asked: %v", acts)
	}
	acts = h.at(101, HedgeBudgetDecided{Allowed: false, Reason: ReasonOverloaded})
	f, ok := find[Fail](acts)
	if !ok || f.Error != schemas.ErrOverloaded || f.Scope != schemas.ScopePushback || f.Refused != ReasonOverloaded {
		t.Fatalf("fail = %+v %v, want overloaded, pushback scope, refused overloaded", f, ok)
	}
	// A replacement no route had capacity for (a provider key's limits,
	// the driver's route_capacity) fails the group overloaded alike.
	h = newHarness(t, DefaultOptions())
	h.launched(streamingStart)
	h.at(100, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
	f, ok = find[Fail](h.at(101, HedgeBudgetDecided{Allowed: false, Reason: ReasonRouteCapacity}))
	if !ok || f.Error != schemas.ErrOverloaded || f.Refused != ReasonRouteCapacity {
		t.Fatalf("fail = %+v %v, want overloaded, refused route_capacity", f, ok)
	}
	// Any other refusal still fails as the last failure says.
	h = newHarness(t, DefaultOptions())
	h.launched(streamingStart)
	h.at(100, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
	if f, ok := find[Fail](h.at(101, HedgeBudgetDecided{Allowed: false, Reason: ReasonBudget})); !ok || f.Error != schemas.ErrAllRoutesFailed {
		t.Fatalf("fail = %+v %v, want all_routes_failed", f, ok)
	}
}

// A replacement granted after the pool saturated is released unlaunched.
func TestRule4ReplacementGrantedIntoSaturationIsReleased(t *testing.T) {
	p := DefaultOptions()
	p.MaxAttempts = 3
	h := newHarness(t, p)
	h.hedgeLaunched(streamingStart)
	if ask, ok := find[AskHedgeBudget](h.at(1100, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})); !ok || ask.Role != schemas.RoleReplacement {
		t.Fatal("no replacement asked")
	}
	h.at(1101, Busy{Attempt: 2})
	acts := h.at(1102, HedgeBudgetDecided{Allowed: true, Route: "c", Reservation: "r3"})
	if has[Launch](acts) || !has[Release](acts) {
		t.Fatalf("replacement granted into saturation: %v", acts)
	}
}

// Rule 5: the deadline, records after the outcome, CallerGone, gate clearing.
func TestRule5DeadlineCancelsEveryAttemptAndFails(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.hedged(streamingStart)
	acts := h.at(30_000, TimerFired{Kind: TimerDeadline})
	f, ok := find[Fail](acts)
	if !ok || f.Error != schemas.ErrDeadlineExceeded {
		t.Fatalf("deadline = %v", acts)
	}
	if c := all[Cancel](acts); len(c) != 2 || c[0].Reason != CancelDeadline {
		t.Fatalf("cancels = %v", c)
	}
}

func TestRule5AnyEventPastTheDeadlineFailsTheGroupFirst(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.launched(streamingStart)
	// The deadline timer is late; a valid answer arriving after the deadline must not win.
	acts := h.at(30_001, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true})
	if has[Elect](acts) || has[Commit](acts) {
		t.Fatalf("answer past the deadline elected: %v", acts)
	}
	if f, ok := find[Fail](acts); !ok || f.Error != schemas.ErrDeadlineExceeded {
		t.Fatalf("want deadline_exceeded, got %v", acts)
	}
}

func TestRule5AfterTheOutcomeEventsOnlyRecord(t *testing.T) {
	p := DefaultOptions()
	p.CommitPoint = schemas.Complete
	h := newHarness(t, p)
	h.hedged(streamingStart)
	h.at(1100, Result{Attempt: 2, Status: schemas.StatusOK, Valid: true, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 30}})
	h.at(1101, GateDecided{Attempt: 2, Won: true, Gate: "g"})
	acts := h.at(1300, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 30}})
	for _, a := range acts {
		switch a.(type) {
		case Settle, AttemptEnded, GroupEnded:
		default:
			t.Fatalf("late completion produced %T; want only records", a)
		}
	}
	rec, _ := find[AttemptEnded](acts)
	if rec.Outcome != OutcomeLoserLate || rec.Usage.OutputUnits != 30 {
		t.Fatalf("late loser recorded as %+v", rec)
	}
	g, ok := find[GroupEnded](acts)
	if !ok || !g.LoserFinishedLate || !g.HedgeLaunched || g.Winner != 2 || g.Usage.OutputUnits != 60 {
		t.Fatalf("group record = %+v", g)
	}
}

func TestRule5CancelledAttemptsNeverTriggerALaunch(t *testing.T) {
	p := DefaultOptions()
	p.MaxAttempts = 4
	h := newHarness(t, p)
	h.hedged(streamingStart)
	h.at(1100, Progress{Attempt: 2, Tokens: 1, FirstToken: true, Valid: true})
	h.at(1101, GateDecided{Attempt: 2, Won: true, Gate: "g"})
	// The cancelled primary then fails in every way: nothing launches.
	for _, ev := range []Event{
		Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient},
		TimerFired{Kind: TimerHedge},
		TimerFired{Kind: TimerAccept, Attempt: 1},
	} {
		if acts := h.at(1200, ev); has[Launch](acts) || has[AskHedgeBudget](acts) {
			t.Fatalf("%T after cancel asked for more work: %v", ev, acts)
		}
	}
}

func TestRule5CallerGoneCancelsEverythingWithoutFallback(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.hedged(streamingStart)
	acts := h.at(1100, CallerGone{})
	if f, ok := find[Fail](acts); !ok || f.Error != schemas.ErrCanceled {
		t.Fatalf("CallerGone = %v", acts)
	}
	if len(all[Cancel](acts)) != 2 {
		t.Fatalf("want both attempts cancelled: %v", acts)
	}
	if acts := h.at(1200, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient}); has[AskHedgeBudget](acts) {
		t.Fatal("a failure after CallerGone asked for a replacement")
	}
}

func TestRule5AGateClaimThatDidNotCommitIsCleared(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.launched(streamingStart)
	h.at(500, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
	h.at(501, CallerGone{}) // decided while the election is in flight
	acts := h.at(502, GateDecided{Attempt: 1, Won: true, Gate: "g/1/3"})
	if c, ok := find[ClearGate](acts); !ok || c.Gate != "g/1/3" || has[Commit](acts) {
		t.Fatalf("won claim after the outcome = %v, want ClearGate and no Commit", acts)
	}
}

func TestCancelledAttemptIsSettledAtItsEstimatedDecode(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.hedged(streamingStart)
	h.at(1010, FirstByte{Attempt: 1})
	h.at(1011, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
	h.at(1012, GateDecided{Attempt: 1, Won: true, Gate: "g"})
	// The hedge's first byte came at 1.1 s; it reports 5 tokens when its cancel
	// is observed at 2.1 s, but 1 s of decode at 100 tokens/s bills about 100.
	h.at(1100, FirstByte{Attempt: 2})
	acts := h.at(2100, CancelObserved{Attempt: 2, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 5}})
	s, _ := find[Settle](acts)
	if s.Usage.OutputUnits != 100 || !s.Usage.Estimated || s.Reservation != "r2" {
		t.Fatalf("settle = %+v, want 100 estimated output units on r2", s)
	}
	rec, _ := find[AttemptEnded](acts)
	if rec.Outcome != OutcomeLoserCanceled || !rec.CancellationSent || !rec.CancellationObserved {
		t.Fatalf("record = %+v", rec)
	}
}

func TestCancelGraceEndsAnAttemptThatNeverReports(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.hedged(streamingStart)
	h.at(1011, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
	h.at(1012, GateDecided{Attempt: 1, Won: true, Gate: "g"})
	acts := h.at(3012, TimerFired{Kind: TimerCancelGrace, Attempt: 2})
	rec, ok := find[AttemptEnded](acts)
	if !ok || rec.CancellationObserved || !rec.CancellationSent {
		t.Fatalf("grace expiry = %v, want a record with the cancel unobserved", acts)
	}
	if s, ok := find[Settle](acts); !ok || !s.Usage.Estimated || s.Usage.InputUnits != 100 {
		t.Fatalf("settle = %+v, want the estimated input billed", s)
	}
}

func TestFailFastEndsTheGroupWithTheFirstFailure(t *testing.T) {
	p := DefaultOptions()
	p.FailFast = true
	h := newHarness(t, p)
	h.hedged(streamingStart)
	acts := h.at(1100, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
	if f, ok := find[Fail](acts); !ok || f.Error != schemas.ErrAllRoutesFailed {
		t.Fatalf("want the first failure to end the group: %v", acts)
	}
}

func TestAttemptTimeoutCancelsAndReplaces(t *testing.T) {
	p := DefaultOptions()
	p.AttemptTimeout = 3 * time.Second
	h := newHarness(t, p)
	acts := h.launched(Start{Streaming: true, HedgeDelay: time.Second})
	if at, ok := timerAt(acts, TimerAttempt); !ok || !at.Equal(h.t0.Add(3001*time.Millisecond)) {
		t.Fatalf("attempt timer = %v", at)
	}
	acts = h.at(3001, TimerFired{Kind: TimerAttempt, Attempt: 1})
	if c, ok := find[Cancel](acts); !ok || c.Reason != CancelTimeout {
		t.Fatalf("want the slow try cancelled: %v", acts)
	}
	if ask, ok := find[AskHedgeBudget](acts); !ok || ask.Role != schemas.RoleReplacement {
		t.Fatalf("want a replacement asked: %v", acts)
	}
}

// livenessPolicy is the default policy with the accept and heartbeat
// timeouts the liveness rule tests' timelines are written for (250 ms and
// 1 s), so they read the same whatever the defaults become.
func livenessPolicy() Options {
	p := DefaultOptions()
	p.AcceptTimeout, p.HeartbeatTimeout = 250*time.Millisecond, time.Second
	return p
}

// TestRule4AGroupThatFoundNoWorkerOnAnyRouteFailsNoWorkers: a group whose
// every attempt found no worker, re-offers spent, fails no_workers (the
// pool has no live worker: 503 naming it, not "every route failed"); one
// whose attempt a worker took, or that failed otherwise, still fails
// all_routes_failed.
func TestRule4AGroupThatFoundNoWorkerOnAnyRouteFailsNoWorkers(t *testing.T) {
	tests := []struct {
		name string
		end  func(h *harness) []Action // ends attempt 1 after its offers found no worker
		want schemas.ErrorCode
	}{
		{"no worker on any offer", func(h *harness) []Action { return h.at(20, Unserved{Attempt: 1}) }, schemas.ErrNoWorkers},
		{"a worker took it, then it failed", func(h *harness) []Action {
			h.at(20, Accepted{Attempt: 1})
			return h.at(30, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
		}, schemas.ErrAllRoutesFailed},
		{"a provider error on the last offer", func(h *harness) []Action {
			return h.at(20, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
		}, schemas.ErrAllRoutesFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := livenessPolicy()
			p.MaxAttempts = 1
			h := newHarness(t, p)
			h.launched(streamingStart)
			for i := range MaxUnservedReoffers {
				h.at(1+2*i, Unserved{Attempt: 1})
				h.at(2+2*i, Reoffered{Attempt: 1, Route: "b"})
			}
			if f, ok := find[Fail](tt.end(h)); !ok || f.Error != tt.want {
				t.Fatalf("Fail = %+v %v, want %s", f, ok, tt.want)
			}
		})
	}
}

// TestRule4AGroupWhoseLastAttemptRanOutOfTimeFailsDeadlineExceeded: the
// workers enforce the attempt's deadline and may report it (StatusTimeout)
// before the group's timer fires; a group left with nothing after that
// failed for the deadline (504), not because every route failed (503).
func TestRule4AGroupWhoseLastAttemptRanOutOfTimeFailsDeadlineExceeded(t *testing.T) {
	tests := []struct {
		name     string
		failFast bool
		last     schemas.StatusClass
		want     schemas.ErrorCode
	}{
		{"both attempts timed out", false, schemas.StatusTimeout, schemas.ErrDeadlineExceeded},
		{"fail fast on a timeout", true, schemas.StatusTimeout, schemas.ErrDeadlineExceeded},
		{"the last attempt failed otherwise", false, schemas.StatusServerError, schemas.ErrAllRoutesFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DefaultOptions()
			p.MaxAttempts, p.FailFast = 2, tt.failFast
			h := newHarness(t, p)
			h.hedged(streamingStart)
			acts := h.at(1100, Result{Attempt: 1, Status: schemas.StatusTimeout, Scope: schemas.ScopeTransient})
			if !tt.failFast {
				acts = h.at(1101, Result{Attempt: 2, Status: tt.last, Scope: schemas.ScopeTransient})
			}
			if f, ok := find[Fail](acts); !ok || f.Error != tt.want {
				t.Fatalf("actions %v, want Fail %s", acts, tt.want)
			}
		})
	}
}

// Every suppression is counted where it is decided, the ones at the start
// too: a driver's metric of suppressions by reason sees the control groups,
// the guardrail and the rollout as it sees a refused budget.
func TestSuppressionsAtTheStartAreEmittedWithTheirReason(t *testing.T) {
	tests := []struct {
		name   string
		policy func(*Options)
		start  Start
		reason string
	}{
		{name: "an ineligible group emits its driver's reason",
			start: Start{HedgeEligible: false, NotEligibleReason: "control", HedgeDelay: time.Second}, reason: "control"},
		{name: "an ineligible group without a reason emits not_eligible",
			start: Start{HedgeEligible: false, HedgeDelay: time.Second}, reason: ReasonNotEligible},
		{name: "a delay past the deadline emits delay_past_deadline",
			policy: func(p *Options) { p.Deadline = 1500 * time.Millisecond; p.MinUsefulTime = 600 * time.Millisecond },
			start:  Start{HedgeEligible: true, HedgeDelay: time.Second}, reason: ReasonDelayPastDeadline},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultOptions()
			if tc.policy != nil {
				tc.policy(&p)
			}
			h := newHarness(t, p)
			acts := h.launched(tc.start)
			s, ok := find[HedgeSuppressed](acts)
			if !ok || s.Reason != tc.reason || s.Role != schemas.RoleHedge {
				t.Fatalf("suppression = %+v (found %v), want hedge %q; actions %v", s, ok, tc.reason, acts)
			}
			if _, armed := timerAt(acts, TimerHedge); armed {
				t.Fatalf("a hedge timer was armed for a suppressed hedge: %v", acts)
			}
		})
	}
	t.Run("a primary not admitted emits not_admitted", func(t *testing.T) {
		h := newHarness(t, DefaultOptions())
		h.at(0, streamingStart)
		acts := h.at(1, Admitted{Allowed: false, Reason: "spend_tenant", Error: schemas.ErrBudgetExhausted})
		if s, ok := find[HedgeSuppressed](acts); !ok || s.Reason != ReasonNotAdmitted {
			t.Fatalf("suppression = %+v (found %v), want not_admitted; actions %v", s, ok, acts)
		}
	})
}

func TestRule4AllRoutesFailedSaysWhyNothingWasLeftToTry(t *testing.T) {
	const fiveHundred = schemas.StatusServerError
	tests := []struct {
		name        string
		maxAttempts int
		refusal     string // the driver's answer to the replacement's budget question; "" grants it on "b"
		want        string
	}{
		{"max_attempts spent", 2, "", ReasonNoSlot},
		{"every route tried or unhealthy", 3, "no_route", "no_route"},
		{"a budget refused the replacement", 3, "attempts", "attempts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DefaultOptions()
			p.MaxAttempts = tt.maxAttempts
			h := newHarness(t, p)
			h.launched(streamingStart)
			acts := h.at(10, Result{Attempt: 1, Status: fiveHundred, Scope: schemas.ScopeTransient})
			if _, ok := find[AskHedgeBudget](acts); !ok {
				t.Fatalf("no replacement asked after a transient failure: %v", acts)
			}
			if tt.refusal != "" {
				acts = h.at(11, HedgeBudgetDecided{Allowed: false, Reason: tt.refusal})
			} else {
				h.at(11, HedgeBudgetDecided{Allowed: true, Route: "b", Reservation: "r2"})
				acts = h.at(20, Result{Attempt: 2, Status: fiveHundred, Scope: schemas.ScopeTransient})
			}
			f, ok := find[Fail](acts)
			if !ok || f.Error != schemas.ErrAllRoutesFailed || f.Refused != tt.want {
				t.Fatalf("Fail = %+v (%v), want all_routes_failed refused %q", f, ok, tt.want)
			}
		})
	}
}

// controlStart is a control group's Start (docs/architecture.md §5): as
// streamingStart, and its baseline is measured.
var controlStart = Start{Streaming: true, HedgeEligible: true, Control: true, HedgeDelay: time.Second, InputUnits: 100, DecodeTokensPerSecond: 100}

// hedgeCommits has the hedge of a group started by hedged win: its first
// token at 1400ms (or, committing at the complete answer, its result),
// elected and committed at 1401ms. It returns the commit's actions.
func (h *harness) hedgeCommits() []Action {
	h.t.Helper()
	if h.g.CommitPoint().Kind == schemas.CommitComplete {
		h.at(1300, FirstByte{Attempt: 2})
		h.at(1400, Result{Attempt: 2, Status: schemas.StatusOK, Valid: true, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 40}})
	} else {
		h.at(1300, FirstByte{Attempt: 2})
		h.at(1400, Progress{Attempt: 2, Tokens: 1, FirstToken: true, Valid: true})
	}
	acts := h.at(1401, GateDecided{Attempt: 2, Won: true, Gate: "g/2/1"})
	if c, ok := find[Commit](acts); !ok || c.Attempt != 2 {
		h.t.Fatalf("the hedge was not committed: %v", acts)
	}
	return acts
}

func cancelsOf(acts []Action, n int) []CancelReason {
	var out []CancelReason
	for _, c := range all[Cancel](acts) {
		if c.Attempt == n {
			out = append(out, c.Reason)
		}
	}
	return out
}

func endOf(acts []Action, n int) (AttemptEnded, bool) {
	for _, e := range all[AttemptEnded](acts) {
		if e.Attempt == n {
			return e, true
		}
	}
	return AttemptEnded{}, false
}

// A control group hedges as any group does: the control draw is no
// reason to leave a stalled primary alone.
func TestAControlGroupHedgesAsAnyGroupDoes(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	acts := h.launched(controlStart)
	if at, ok := timerAt(acts, TimerHedge); !ok || !at.Equal(h.t0.Add(time.Second)) {
		t.Fatalf("hedge timer = %v (%v), want Start + delay", at, ok)
	}
	h.at(2, Accepted{Attempt: 1})
	if _, ok := find[AskHedgeBudget](h.at(1000, TimerFired{Kind: TimerHedge})); !ok {
		t.Fatal("a control group's stalled primary was not hedged")
	}
	if l, ok := find[Launch](h.at(1001, HedgeBudgetDecided{Allowed: true, Route: "b", Reservation: "r2"})); !ok || l.Role != schemas.RoleHedge {
		t.Fatalf("hedge launch = %+v (%v)", l, ok)
	}
}

// When another attempt of a control group wins, its baseline is not
// stopped: it runs on, unseen by the caller, to its own end, and that end
// is the group's baseline — what the group would have measured had it run
// primary-only — while the caller has its winner as usual.
func TestAControlGroupsBaselineRunsOnPastTheWinnersCommitToItsOwnEnd(t *testing.T) {
	type step struct {
		ms int
		ev Event
	}
	tests := []struct {
		name  string
		start Start
		// ends is what the kept primary (attempt 1) does after the hedge's
		// commit; the last step ends the group.
		ends []step
		// cancel is the reason the primary is cancelled for ("": never).
		cancel  CancelReason
		mark    bool // its failure marks its route
		outcome Outcome
		status  schemas.StatusClass
		want    Baseline
	}{
		{name: "reaching its first token it is the baseline, cancelled as the race's loser", start: controlStart,
			ends:   []step{{3000, FirstByte{Attempt: 1}}, {3001, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true}}, {3003, CancelObserved{Attempt: 1}}},
			cancel: CancelLostRace, outcome: OutcomeLoserCanceled, status: schemas.StatusCanceled,
			want: Baseline{Observed: true, Attempt: 1, Committed: true, Latency: 3001 * time.Millisecond}},
		{name: "committing at the complete answer it answers whole and ends a late loser",
			start:   Start{HedgeEligible: true, Control: true, HedgeDelay: time.Second, InputUnits: 100, DecodeTokensPerSecond: 100},
			ends:    []step{{3000, FirstByte{Attempt: 1}}, {4000, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 90}}}},
			outcome: OutcomeLoserLate, status: schemas.StatusOK,
			want: Baseline{Observed: true, Attempt: 1, Committed: true, Latency: 4 * time.Second}},
		{name: "still waiting at the deadline it is cancelled there and the baseline fails at the deadline", start: controlStart,
			ends:   []step{{2500, Heartbeat{Attempt: 1}}, {30_000, TimerFired{Kind: TimerDeadline}}, {30_002, CancelObserved{Attempt: 1}}},
			cancel: CancelDeadline, outcome: OutcomeLoserCanceled, status: schemas.StatusCanceled,
			want: Baseline{Observed: true, Latency: 30 * time.Second}},
		{name: "a report past the deadline stops it as the deadline timer does", start: controlStart,
			ends:   []step{{2500, Heartbeat{Attempt: 1}}, {30_500, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true}}, {30_502, CancelObserved{Attempt: 1}}},
			cancel: CancelDeadline, outcome: OutcomeLoserCanceled, status: schemas.StatusCanceled,
			want: Baseline{Observed: true, Latency: 30 * time.Second}},
		{name: "failing on its own it leaves no baseline: a primary-only group would have replaced it", start: controlStart,
			ends:    []step{{5000, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient}}},
			outcome: OutcomeFailed, status: schemas.StatusServerError},
		{name: "breaking the contract it leaves no baseline", start: controlStart,
			ends:   []step{{3001, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: false}}, {3003, CancelObserved{Attempt: 1}}},
			cancel: CancelInvalid, outcome: OutcomeLoserCanceled, status: schemas.StatusContractInvalid},
		{name: "going silent it is lost and leaves no baseline", start: controlStart,
			ends:   []step{{3002, TimerFired{Kind: TimerHeartbeat, Attempt: 1}}},
			cancel: CancelTimeout, outcome: OutcomeFailed, status: schemas.StatusLost},
		{name: "a group-scope error is the primary-only group's failure", start: controlStart,
			ends:    []step{{2500, Result{Attempt: 1, Status: schemas.StatusInvalidRequest, Scope: schemas.ScopeGroup, Error: schemas.ErrInvalidRequest}}},
			outcome: OutcomeFailed, status: schemas.StatusInvalidRequest,
			want: Baseline{Observed: true, Latency: 2500 * time.Millisecond}},
		{name: "a pushback still marks its route", start: controlStart,
			ends: []step{{2500, Result{Attempt: 1, Status: schemas.StatusRateLimited, Scope: schemas.ScopePushback, RetryAfter: time.Second}}},
			mark: true, outcome: OutcomeFailed, status: schemas.StatusRateLimited},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, DefaultOptions())
			h.hedged(tc.start)
			acts := h.hedgeCommits()
			if c, _ := find[Commit](acts); c.Kept != 1 {
				t.Fatalf("Commit = %+v, want the primary kept", c)
			}
			if cs := cancelsOf(acts, 1); len(cs) != 0 {
				t.Fatalf("the kept primary was cancelled at the commit: %v", cs)
			}
			if h.g.CommitPoint().Kind != schemas.CommitComplete {
				acts = h.at(1800, Result{Attempt: 2, Status: schemas.StatusOK, Valid: true, Usage: schemas.Usage{InputUnits: 100, OutputUnits: 40}})
			}
			// The caller's part is over with the winner's end: the primary
			// counts at what a loser cancelled now would be billed.
			if a, ok := find[Answered](acts); !ok || a.Usage.InputUnits != 200 || a.Usage.OutputUnits != 40 || has[GroupEnded](acts) {
				t.Fatalf("winner's end = %v, want Answered with the winner's usage and the primary's input, the group going on", acts)
			}
			var seen []Action
			for _, s := range tc.ends {
				seen = append(seen, h.at(s.ms, s.ev)...)
			}
			if has[Elect](seen) || has[Commit](seen) {
				t.Fatalf("the kept primary was elected or committed: %v", seen)
			}
			if cs := cancelsOf(seen, 1); (tc.cancel == "") != (len(cs) == 0) || len(cs) > 0 && cs[0] != tc.cancel {
				t.Fatalf("cancels of the primary = %v, want %q", cs, tc.cancel)
			}
			if got := has[MarkRoute](seen); got != tc.mark {
				t.Fatalf("route marked = %v, want %v", got, tc.mark)
			}
			rec, ok := endOf(seen, 1)
			if !ok || rec.Outcome != tc.outcome || rec.Status != tc.status || rec.Role != schemas.RolePrimary {
				t.Fatalf("the primary's record = %+v (%v), want %s %s", rec, ok, tc.outcome, tc.status)
			}
			if !has[Settle](seen) {
				t.Fatalf("the primary's usage was not settled: %v", seen)
			}
			ge, ok := find[GroupEnded](seen)
			if !ok || !h.g.Done() {
				t.Fatalf("the group did not end with the primary: %v", seen)
			}
			if !ge.Committed || ge.Winner != 2 || ge.Latency != 1401*time.Millisecond {
				t.Fatalf("group record %+v: the caller's outcome changed", ge)
			}
			if ge.Baseline != tc.want {
				t.Fatalf("baseline = %+v, want %+v", ge.Baseline, tc.want)
			}
			if err := h.chk.Finish(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The baseline is the run a primary-only group would have had: when the
// hedge launched, that group was waiting on the attempt running then.
func TestAControlGroupsBaselineIsTheAttemptItsPrimaryOnlyRunWouldBeWaitingOn(t *testing.T) {
	tests := []struct {
		name string
		run  func(h *harness) []Action // to the group's end
		kept int
		want Baseline
	}{
		{name: "a control group that never hedged is its own baseline", run: func(h *harness) []Action {
			h.launched(controlStart)
			h.at(2, Accepted{Attempt: 1})
			h.at(600, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
			h.at(601, GateDecided{Attempt: 1, Won: true, Gate: "g/1/1"})
			return h.at(900, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true})
		}, want: Baseline{Observed: true, Attempt: 1, Committed: true, Latency: 601 * time.Millisecond}},
		{name: "a control group the deadline failed before any hedge fails its baseline too", run: func(h *harness) []Action {
			h.launched(Start{Streaming: true, HedgeEligible: false, NotEligibleReason: "rollout", Control: true, HedgeDelay: time.Second})
			h.at(2, Accepted{Attempt: 1})
			h.at(30_000, TimerFired{Kind: TimerDeadline})
			return h.at(30_002, CancelObserved{Attempt: 1})
		}, want: Baseline{Observed: true, Latency: 30 * time.Second}},
		{name: "a primary that beats its hedge is its own baseline", run: func(h *harness) []Action {
			h.hedged(controlStart)
			h.at(1200, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
			acts := h.at(1201, GateDecided{Attempt: 1, Won: true, Gate: "g/1/1"})
			if cs := cancelsOf(acts, 2); len(cs) != 1 || cs[0] != CancelLostRace {
				t.Fatalf("the hedge was not cancelled as the loser: %v", acts)
			}
			h.at(1203, CancelObserved{Attempt: 2})
			return h.at(1500, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true})
		}, want: Baseline{Observed: true, Attempt: 1, Committed: true, Latency: 1201 * time.Millisecond}},
		{name: "a primary already valid when the hedge commits is measured there and stopped", run: func(h *harness) []Action {
			h.hedged(Start{HedgeEligible: true, Control: true, HedgeDelay: time.Second, InputUnits: 100})
			h.at(1300, Result{Attempt: 2, Status: schemas.StatusOK, Valid: true})
			// The primary's answer arrives while the hedge's election is pending.
			h.at(1350, Result{Attempt: 1, Status: schemas.StatusOK, Valid: true})
			acts := h.at(1401, GateDecided{Attempt: 2, Won: true, Gate: "g/2/1"})
			if rec, ok := endOf(acts, 1); !ok || rec.Outcome != OutcomeLoserLate {
				t.Fatalf("the primary = %+v (%v), want it ended a late loser at the commit", rec, ok)
			}
			return acts
		}, want: Baseline{Observed: true, Attempt: 1, Committed: true, Latency: 1350 * time.Millisecond}},
		{name: "a replacement that took the primary's place before the hedge is the baseline", run: func(h *harness) []Action {
			h.launched(controlStart)
			h.at(200, Result{Attempt: 1, Status: schemas.StatusServerError, Scope: schemas.ScopeTransient})
			h.at(201, HedgeBudgetDecided{Allowed: true, Route: "b", Reservation: "r2"})
			h.at(203, Accepted{Attempt: 2})
			h.at(1000, TimerFired{Kind: TimerHedge})
			h.at(1001, HedgeBudgetDecided{Allowed: true, Route: "c", Reservation: "r3"})
			h.at(1002, Accepted{Attempt: 3})
			h.at(1400, Progress{Attempt: 3, Tokens: 1, FirstToken: true, Valid: true})
			acts := h.at(1401, GateDecided{Attempt: 3, Won: true, Gate: "g/3/1"})
			if c, _ := find[Commit](acts); c.Kept != 2 {
				t.Fatalf("Commit = %+v, want the replacement kept", c)
			}
			h.at(1800, Result{Attempt: 3, Status: schemas.StatusOK, Valid: true})
			h.at(2200, Progress{Attempt: 2, Tokens: 1, FirstToken: true, Valid: true})
			return h.at(2202, CancelObserved{Attempt: 2})
		}, kept: 2, want: Baseline{Observed: true, Attempt: 2, Committed: true, Latency: 2200 * time.Millisecond}},
		{name: "a baseline no worker took yet is not kept, and the group has no baseline", run: func(h *harness) []Action {
			h.launched(controlStart)
			h.at(1000, TimerFired{Kind: TimerHedge})
			h.at(1001, HedgeBudgetDecided{Allowed: true, Route: "b", Reservation: "r2"})
			h.at(1002, Accepted{Attempt: 2})
			h.at(1400, Progress{Attempt: 2, Tokens: 1, FirstToken: true, Valid: true})
			acts := h.at(1401, GateDecided{Attempt: 2, Won: true, Gate: "g/2/1"})
			if c, _ := find[Commit](acts); c.Kept != 0 || len(cancelsOf(acts, 1)) != 1 {
				t.Fatalf("commit = %v, want the unaccepted primary cancelled, none kept", acts)
			}
			h.at(1403, CancelObserved{Attempt: 1})
			return h.at(1800, Result{Attempt: 2, Status: schemas.StatusOK, Valid: true})
		}},
		{name: "a group that is not a control group stops every loser at the commit and has no baseline", run: func(h *harness) []Action {
			h.hedged(streamingStart)
			acts := h.hedgeCommits()
			if c, _ := find[Commit](acts); c.Kept != 0 || len(cancelsOf(acts, 1)) != 1 {
				t.Fatalf("commit = %v, want the primary cancelled as the loser", acts)
			}
			h.at(1403, CancelObserved{Attempt: 1})
			return h.at(1800, Result{Attempt: 2, Status: schemas.StatusOK, Valid: true})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultOptions()
			p.MaxAttempts = 3
			h := newHarness(t, p)
			ge, ok := find[GroupEnded](tc.run(h))
			if !ok || !h.g.Done() {
				t.Fatal("the group did not end")
			}
			if ge.Baseline != tc.want {
				t.Fatalf("baseline = %+v, want %+v", ge.Baseline, tc.want)
			}
			if err := h.chk.Finish(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The kept baseline is no part of the caller's answer: a caller leaving
// after the commit stops the winner only, and the baseline's measurement
// goes on to its end.
func TestACallerLeavingAfterTheCommitLeavesTheBaselineRunning(t *testing.T) {
	h := newHarness(t, DefaultOptions())
	h.hedged(controlStart)
	h.hedgeCommits()
	acts := h.at(1500, CallerGone{})
	if cs := cancelsOf(acts, 2); len(cs) != 1 || cs[0] != CancelCallerGone {
		t.Fatalf("caller gone = %v, want the winner stopped", acts)
	}
	if cs := cancelsOf(acts, 1); len(cs) != 0 {
		t.Fatalf("the kept baseline was stopped by the caller leaving: %v", acts)
	}
	h.at(1502, CancelObserved{Attempt: 2})
	h.at(2600, Progress{Attempt: 1, Tokens: 1, FirstToken: true, Valid: true})
	ge, ok := find[GroupEnded](h.at(2602, CancelObserved{Attempt: 1}))
	if !ok || ge.Baseline != (Baseline{Observed: true, Attempt: 1, Committed: true, Latency: 2600 * time.Millisecond}) {
		t.Fatalf("group record %+v (%v), want the baseline measured at 2.6 s", ge, ok)
	}
}
