package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
)

// slowAnswer is an answer whose first byte comes well after the test
// policy's 100 ms hedge delay: a group that may hedge does.
var slowAnswer = behaviour{firstByte: 400 * time.Millisecond, words: 2}

// A provider's 429 with Retry-After moves the cohort to primary-only
// (docs/architecture.md §4 rule 4, pushback scope cohort): the group that
// met it still gets its replacement on a route not in pushback, and the next
// group of the pool hedges no more, with guardrail decision pushback. With
// pushback scope route the next group hedges as before.
func TestPushbackMovesTheCohortToPrimaryOnly(t *testing.T) {
	tests := []struct {
		scope        policy.PushbackScope
		wantHedged   bool
		wantDecision schemas.GuardrailDecision
		wantReason   string
	}{
		{policy.PushbackCohort, false, schemas.GuardrailPushback, policy.ReasonPushback},
		{policy.PushbackRoute, true, schemas.GuardrailAllow, ""},
	}
	for _, tt := range tests {
		t.Run("scope "+string(tt.scope), func(t *testing.T) {
			// The first request anywhere is pushed back for 30 s; every
			// later one answers slowly.
			sc := newScript(slowAnswer, behaviour{status: 429})
			ps := map[string]*provider{}
			for _, r := range []string{"a", "b", "c"} {
				ps[r] = newMessagesProvider(t, r, sc)
			}
			c := newCluster(t, []string{"a", "b", "c"}, ps, policyYAML+"    pushback_scope: "+string(tt.scope)+"\n")

			first, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
			if err != nil {
				t.Fatalf("the group that met the pushback: %v (its replacement must go to a route not in pushback)", err)
			}
			recs := c.attemptRecords(first.GroupID, first.Attempts)
			if recs[1].StatusClass != schemas.StatusRateLimited || first.Winner < 2 || first.WinnerRoute == recs[1].Route {
				t.Fatalf("first group: attempt 1 %s on %s, winner %d on %s; want a pushback, then a winner elsewhere",
					recs[1].StatusClass, recs[1].Route, first.Winner, first.WinnerRoute)
			}

			next, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
			if err != nil {
				t.Fatalf("the next group: %v", err)
			}
			g := c.groupRecord(next.GroupID)
			if g.HedgeLaunched != tt.wantHedged || g.GuardrailDecision != tt.wantDecision {
				t.Fatalf("next group: hedged %v, guardrail decision %q; want %v, %q", g.HedgeLaunched, g.GuardrailDecision, tt.wantHedged, tt.wantDecision)
			}
			if tt.wantReason != "" && g.HedgeSuppressedReason != tt.wantReason {
				t.Fatalf("next group: suppression reason %q, want %q", g.HedgeSuppressedReason, tt.wantReason)
			}
		})
	}
}

// A pushback that another replica recorded while a group runs stops that
// group's hedge too (reason cohort_pushback); it reaches this replica
// through the shared route flags.
func TestPushbackAnotherReplicaRecordedStopsTheHedgesOfRunningGroups(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	sc := newScript(behaviour{hold: hold, words: 2})
	ps := map[string]*provider{}
	for _, r := range []string{"a", "b", "c"} {
		ps[r] = newProvider(t, r, sc)
	}
	// A hedge delay long enough for the shared flag to arrive first.
	c := newCluster(t, []string{"a", "b", "c"}, ps, `
policies:
  default:
    control_fraction: 0
    delay: {initial: 3s, warmup_samples: 1000000}
    deadline: 6s
    duplicate_rate: {ceiling: 1}
`)
	store := budgets.NewMemory(nil)
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := c.addDispatcher(Options{Store: store, Gate: gate})
	type result struct {
		resp *Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // the 6 s deadline ends it
		defer cancel()
		resp, err := d.Submit(ctx, Submission{Pool: "general", Request: chat(false)}, nil)
		done <- result{resp, err}
	}()
	var primary string
	select {
	case primary = <-ps["a"].arrived:
	case primary = <-ps["b"].arrived:
	case primary = <-ps["c"].arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the primary reached no provider")
	}
	other := map[string]string{"a": "b", "b": "c", "c": "a"}[primary]
	if err := store.MarkRoute(context.Background(), other, budgets.RoutePushback, time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 3*time.Second, "the shared pushback to reach the replica", func() bool {
		return d.picker.PushedBack([]string{other}, d.now())
	})
	r := <-done // the deadline ends the held primary
	if r.err == nil {
		t.Fatalf("a held primary answered: %+v", r.resp)
	}
	var g schemas.GroupRecord
	for g = range c.groups {
		if g.HedgeLaunched || g.Attempts != 1 {
			t.Fatalf("group %+v: a hedge went out during the pool's pushback", g)
		}
		break
	}
	if g.HedgeSuppressedReason != reasonCohortPushback {
		t.Fatalf("suppression reason %q, want %q", g.HedgeSuppressedReason, reasonCohortPushback)
	}
}

// An ejection one replica decided reaches every replica sharing its store:
// their primaries avoid the route until it expires.
func TestAnEjectionReachesEveryReplicaThroughTheRouteFlags(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil, "")
	store := budgets.NewMemory(nil)
	replicas := make([]*Dispatcher, 2)
	for i := range replicas {
		gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		replicas[i] = c.addDispatcher(Options{Store: store, Gate: gate})
	}
	replicas[0].markRoute("a", budgets.RouteEjected, time.Minute)
	eventually.True(t, 5*time.Second, "the other replica to see the ejection", func() bool { return replicas[1].ejected("a") })
	d := replicas[1]
	d.rngMu.Lock()
	defer d.rngMu.Unlock()
	for range 50 {
		if got, ok := d.picker.PickPrimary([]string{"a", "b", "c"}, d.now(), d.rng); !ok || got == "a" {
			t.Fatalf("the other replica picked %q, %v for a primary while a is ejected", got, ok)
		}
	}
}
