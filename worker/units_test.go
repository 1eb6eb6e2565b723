package worker

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

func TestPendingCancelIsTakenOnceWhileFresh(t *testing.T) {
	const sec = "0123456789abcdef0123456789abcdef"
	t0 := time.Date(2026, 7, 31, 12, 0, 0, 0, time.UTC)
	k := attemptKey{"hg_1", 2}
	for name, tc := range map[string]struct {
		takeAt time.Duration
		want   bool
	}{
		"at once":         {0, true},
		"just before ttl": {PendingCancelTTL - time.Millisecond, true},
		"at ttl":          {PendingCancelTTL, false},
		"long after":      {time.Hour, false},
		"clock went back": {-time.Second, true},
	} {
		t.Run(name, func(t *testing.T) {
			p := newPendingCancels()
			p.add(k, sec, schemas.CancelLostRace, t0)
			c, ok := p.take(k, sec, t0.Add(tc.takeAt))
			if ok != tc.want || (ok && (c.reason != schemas.CancelLostRace || !c.at.Equal(t0))) {
				t.Fatalf("take = %+v, %v; want found=%v", c, ok, tc.want)
			}
			if _, again := p.take(k, sec, t0.Add(tc.takeAt)); again {
				t.Error("a cancel was taken twice")
			}
			if _, other := p.take(attemptKey{"hg_1", 1}, sec, t0); other {
				t.Error("a cancel applied to another attempt of the group")
			}
		})
	}
}

func TestPendingCancelsStayBounded(t *testing.T) {
	const sec = "0123456789abcdef0123456789abcdef"
	t0 := time.Date(2026, 7, 31, 12, 0, 0, 0, time.UTC)
	p := newPendingCancels()
	for i := range maxPendingCancels + 100 {
		p.add(attemptKey{"hg", i + 1}, sec, schemas.CancelDeadline, t0)
	}
	if p.len() != maxPendingCancels {
		t.Fatalf("%d cancels remembered, want the bound %d", p.len(), maxPendingCancels)
	}
	if _, ok := p.take(attemptKey{"hg", 1}, sec, t0); ok {
		t.Error("the oldest cancel survived the bound")
	}
	if _, ok := p.take(attemptKey{"hg", maxPendingCancels + 100}, sec, t0); !ok {
		t.Error("the newest cancel was dropped")
	}
	p.add(attemptKey{"hg_late", 1}, sec, schemas.CancelDeadline, t0.Add(PendingCancelTTL))
	if p.len() != 1 {
		t.Errorf("%d cancels remembered after the rest expired, want 1", p.len())
	}
}

func TestRepeatedCancelKeepsTheFirstReason(t *testing.T) {
	const sec = "0123456789abcdef0123456789abcdef"
	t0 := time.Date(2026, 7, 31, 12, 0, 0, 0, time.UTC)
	p := newPendingCancels()
	k := attemptKey{"hg", 1}
	p.add(k, sec, schemas.CancelLostRace, t0)
	p.add(k, sec, schemas.CancelDeadline, t0.Add(time.Second))
	if c, ok := p.take(k, sec, t0.Add(time.Second)); !ok || c.reason != schemas.CancelLostRace {
		t.Errorf("take = %+v, %v; want the first cancel", c, ok)
	}
}

func TestEarlyCancelStandsOnlyForTheAttemptWhoseSecretItCarries(t *testing.T) {
	const real, forged = "0123456789abcdef0123456789abcdef", "ffffffffffffffffffffffffffffffff"
	t0 := time.Date(2026, 7, 31, 12, 0, 0, 0, time.UTC)
	p := newPendingCancels()
	k := attemptKey{"hg", 1}
	p.add(k, forged, schemas.CancelCallerGone, t0) // the forger is first
	if _, ok := p.take(k, real, t0); ok {
		t.Fatal("a forged early cancel stood for the attempt")
	}
	p.add(k, forged, schemas.CancelCallerGone, t0)
	p.add(k, real, schemas.CancelLostRace, t0.Add(time.Millisecond))
	if c, ok := p.take(k, real, t0.Add(time.Millisecond)); !ok || c.reason != schemas.CancelLostRace {
		t.Errorf("take = %+v, %v; want the real cancel, not shadowed by the forged one before it", c, ok)
	}
}

// nopUpstream satisfies the interface for config checks; it is never called.
type nopUpstream struct{}

func (nopUpstream) Stream(_ context.Context, _ *schemas.ChatRequest, _ upstream.Sink) (upstream.Outcome, error) {
	return upstream.Outcome{}, nil
}

func TestNewRejectsAnInvalidConfig(t *testing.T) {
	nc := &nats.Conn{}
	valid := Options{Route: "openai-east", Upstream: nopUpstream{}, Conn: nc}
	for name, mutate := range map[string]func(*Options){
		"empty route":          func(c *Options) { c.Route = "" },
		"route with a dot":     func(c *Options) { c.Route = "openai.east" },
		"route with wildcards": func(c *Options) { c.Route = "openai-*" },
		"no upstream":          func(c *Options) { c.Upstream = nil },
		"no connection":        func(c *Options) { c.Conn = nil },
		"negative inflight":    func(c *Options) { c.MaxInflight = -1 },
		"negative heartbeat":   func(c *Options) { c.HeartbeatInterval = -time.Second },
		"worker id with space": func(c *Options) { c.WorkerID = "worker 1" },
		"negative lease renew": func(c *Options) { c.LeaseRenewInterval = -time.Second },
		"lease ttl under two renew intervals": func(c *Options) {
			c.LeaseRenewInterval, c.LeaseTTL = time.Second, 1500*time.Millisecond
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := valid
			mutate(&cfg)
			if _, err := New(cfg); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("New: %v, want ErrInvalidOptions", err)
			}
		})
	}
	w, err := New(valid)
	if err != nil {
		t.Fatalf("New(valid): %v", err)
	}
	c := w.cfg
	if c.MaxInflight != DefaultMaxInflight || c.HeartbeatInterval != DefaultHeartbeatInterval ||
		c.CoalesceTokens != DefaultCoalesceTokens || c.CoalesceDelay != DefaultCoalesceDelay ||
		c.DrainGrace != DefaultDrainGrace || !idPattern.MatchString(c.WorkerID) || len(c.FingerprintKey) == 0 ||
		c.LeaseRenewInterval != DefaultLeaseRenewInterval || c.LeaseTTL != DefaultLeaseRenewals*DefaultLeaseRenewInterval {
		t.Errorf("defaults not applied: %+v", c)
	}
}

func TestDefaultHeartbeatIsWellInsideTheDispatcherTimeouts(t *testing.T) {
	const heartbeatTimeout, acceptTimeout = time.Second, 250 * time.Millisecond
	if DefaultHeartbeatInterval > heartbeatTimeout/4 || DefaultHeartbeatInterval >= acceptTimeout {
		t.Errorf("heartbeat interval %v: want ≤ %v and < %v", DefaultHeartbeatInterval, heartbeatTimeout/4, acceptTimeout)
	}
}

func TestWorkerOutcomeNeverClaimsAWin(t *testing.T) {
	ok := schemas.AttemptResult{StatusClass: schemas.StatusOK, ErrorScope: schemas.ScopeNone}
	cancelled := schemas.AttemptResult{StatusClass: schemas.StatusCanceled, ErrorScope: schemas.ScopeNone, CancellationObserved: true}
	shutdown := schemas.AttemptResult{StatusClass: schemas.StatusCanceled, ErrorScope: schemas.ScopeTransient}
	failed := schemas.AttemptResult{StatusClass: schemas.StatusServerError, ErrorScope: schemas.ScopeTransient}
	for name, tc := range map[string]struct {
		res       schemas.AttemptResult
		cancelled bool
		reason    schemas.CancelReason
		want      schemas.Outcome
	}{
		"complete, no cancel":               {ok, false, "", schemas.OutcomeCompleted},
		"complete despite a lost race":      {ok, true, schemas.CancelLostRace, schemas.OutcomeLoserLate},
		"complete despite the caller going": {ok, true, schemas.CancelCallerGone, schemas.OutcomeCompleted},
		"stopped on a lost race":            {cancelled, true, schemas.CancelLostRace, schemas.OutcomeLoserCanceled},
		"stopped, other group won":          {cancelled, true, schemas.CancelAlreadyCommitted, schemas.OutcomeLoserCanceled},
		"stopped at the group deadline":     {cancelled, true, schemas.CancelDeadline, schemas.OutcomeCanceled},
		"stopped, caller gone":              {cancelled, true, schemas.CancelCallerGone, schemas.OutcomeCanceled},
		"stopped as invalid":                {cancelled, true, schemas.CancelInvalid, schemas.OutcomeFailed},
		"stopped by per-try timeout":        {cancelled, true, schemas.CancelTimeout, schemas.OutcomeFailed},
		"worker shut down":                  {shutdown, false, "", schemas.OutcomeFailed},
		"provider error":                    {failed, false, "", schemas.OutcomeFailed},
		"provider error after a cancel":     {failed, true, schemas.CancelLostRace, schemas.OutcomeFailed},
	} {
		t.Run(name, func(t *testing.T) {
			if got := workerOutcome(tc.res, tc.cancelled, tc.reason); got != tc.want {
				t.Errorf("outcome %s, want %s", got, tc.want)
			}
		})
	}
}

func TestCoalescedToolCallFragmentsKeepTheirOrder(t *testing.T) {
	var p pendingChunk
	for _, d := range []upstream.Delta{
		{ToolCalls: json.RawMessage(`[{"index":0,"id":"call_1","function":{"name":"lookup"}}]`), Tokens: 1},
		{ToolCalls: json.RawMessage(`null`), Tokens: 0},
		{ToolCalls: json.RawMessage(`[{"index":0,"function":{"arguments":"{\"q\""}}]`), Tokens: 1},
		{ToolCalls: json.RawMessage(`[{"index":0,"function":{"arguments":":1}"}},{"index":1,"id":"call_2"}]`), Tokens: 1},
	} {
		p.add(d)
	}
	got, err := json.Marshal(p.toolCalls)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"index":0,"id":"call_1","function":{"name":"lookup"}},{"index":0,"function":{"arguments":"{\"q\""}},` +
		`{"index":0,"function":{"arguments":":1}"}},{"index":1,"id":"call_2"}]`
	if string(got) != want || p.tokens != 3 {
		t.Errorf("coalesced %s (%d tokens), want %s (3)", got, p.tokens, want)
	}
}
