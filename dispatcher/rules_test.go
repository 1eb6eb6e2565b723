package dispatcher

import (
	"encoding/json"
	mrand "math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/dispatcher/policy/policytest"
	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/schemas"
)

// rulesGroup is a group of a class running p, as newGroup makes it, with the
// given routes in its pool; the rules need nothing else of it.
func rulesGroup(t *testing.T, p *policy.Policy, routes int) *group {
	t.Helper()
	cl, err := policy.NewClass("chat", p)
	if err != nil {
		t.Fatal(err)
	}
	g := &group{d: &Dispatcher{now: time.Now}, class: cl, id: "d0-1", cohort: delay.NewCohort("chat", "general", false, 0)}
	defs := make([]route.Route, routes)
	for i := range routes {
		g.routes = append(g.routes, "r"+strconv.Itoa(i))
		defs[i] = route.Route{Name: g.routes[i]}
	}
	if g.d.picker, err = route.NewPicker(defs, route.Options{}); err != nil {
		t.Fatal(err)
	}
	return g
}

// The dispatcher decides the shared eligibility cases as the simulator does
// (see the simulator's TestSharedEligibilityRules).
func TestSharedEligibilityRules(t *testing.T) {
	policytest.TestEligibility(t, func(t *testing.T, p *policy.Policy, f policytest.Facts) policytest.Decision {
		g := rulesGroup(t, p, f.Routes)
		now := time.Now()
		if f.PushedBack {
			// As the bookkeeping's route refresh does with a shared flag.
			if err := g.d.picker.SetState(g.routes[0], route.Pushback, now.Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
		}
		if f.Breached {
			if err := g.class.Guardrail.ReportBreach(g.cohort, now, delay.ReasonDuplicateCeiling); err != nil {
				t.Fatal(err)
			}
		}
		el := g.eligibility(now)
		return policytest.Decision{Eligible: g.armed, Reason: el.Reason, Arm: g.arm, Guardrail: g.guard}
	})
}

// The dispatcher decides the shared censoring cases as the simulator does
// (see the simulator's TestSharedCensoringRules).
func TestSharedCensoringRules(t *testing.T) {
	policytest.TestCensoring(t, func(t *testing.T, p *policy.Policy, tc policytest.Censoring) bool {
		g := rulesGroup(t, p, 2)
		now := time.Now()
		primary := &attemptRun{n: 1, role: schemas.RolePrimary, launchedAt: now.Add(-tc.Elapsed), outcome: hedge.OutcomeLoserCanceled}
		if tc.FirstByte {
			primary.firstByte = 100 * time.Millisecond
		}
		if tc.Failed {
			primary.outcome = hedge.OutcomeFailed
		}
		g.attempts = []*attemptRun{primary, {n: 2, role: schemas.RoleHedge, launchedAt: now.Add(-tc.Elapsed / 2)}}
		return g.observeSuperseded(now, hedge.GroupEnded{Committed: tc.Winner > 0, Winner: tc.Winner, Error: tc.Error})
	})
}

// The dispatcher adds a decided group's sample to its guardrail arm as the
// simulator does (see the simulator's TestSharedGuardrailSampleRules): a
// control group's is its kept baseline's.
func TestSharedGuardrailSampleRules(t *testing.T) {
	policytest.TestGuardrailSamples(t, func(t *testing.T, p *policy.Policy, c policytest.GuardrailSample) (*policy.Class, delay.Cohort, time.Time) {
		g := rulesGroup(t, p, 2)
		start := time.Now()
		g.start, g.deadline, g.arm = start, policytest.GuardrailDeadline, c.Arm
		for n := 1; n <= c.Attempts; n++ {
			// Attempt n, launched at its offset, reported its first
			// byte over the wire when the case says.
			a := &attemptRun{n: n, launchedAt: start.Add(policytest.Launched(n))}
			if fb, ok := c.FirstBytes[n]; ok {
				a.firstByte = fb - policytest.Launched(n)
			}
			g.attempts = append(g.attempts, a)
		}
		now := start.Add(time.Minute)
		g.observeGuardrail(now, c.Ended)
		return g.class, g.cohort, now
	})
}

// The dispatcher arms the hedge delay of the primary's route, from first
// bytes reported on each route, as the simulator does (see the simulator's
// TestSharedRouteDelayRules).
func TestSharedRouteDelayRules(t *testing.T) {
	policytest.TestRouteDelay(t, func(t *testing.T, p *policy.Policy, f policytest.RouteFacts) policytest.Armed {
		g := rulesGroup(t, p, policytest.RouteDelayRoutes)
		now := time.Now()
		g.d.now = func() time.Time { return now }
		g.d.rng = mrand.New(mrand.NewPCG(1, 2))
		g.deadline = 30 * time.Second
		var err error
		if g.d.metrics, err = newMetrics(prometheus.NewRegistry(), nil); err != nil {
			t.Fatal(err)
		}
		for _, s := range f.Samples {
			// A primary on the sample's route, accepted by its worker,
			// reports its first byte over the wire.
			g.attempts = []*attemptRun{{n: 1, role: schemas.RolePrimary, route: g.routes[s.Route],
				workerID: "w1", secret: "s1", launchedAt: now.Add(-s.Latency)}}
			data, err := json.Marshal(schemas.FirstByte{V: 1, GroupID: g.id, Attempt: 1, WorkerID: "w1", Secret: "s1"})
			if err != nil {
				t.Fatal(err)
			}
			if _, ev := g.translate(inboundEvent{attempt: 1, msg: &nats.Msg{Data: data}}); ev == nil {
				t.Fatal("the first byte was dropped")
			}
		}
		g.attempts = nil
		for i, name := range g.routes {
			if i != f.Primary {
				if err := g.d.picker.SetState(name, route.Quarantined, now.Add(time.Minute)); err != nil {
					t.Fatal(err)
				}
			}
		}
		s := g.startEvent()
		if g.primary != g.routes[f.Primary] {
			t.Fatalf("primary picked on %q, want %q", g.primary, g.routes[f.Primary])
		}
		return policytest.Armed{Hedge: s.HedgeDelay, StallJudgedBy: g.stallDelay}
	})
}
