package simulator

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/dispatcher/policy/policytest"
	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// rulesRunner is a runner of an estimating strategy whose class runs p, over
// the given number of routes; the rules need nothing else of it.
func rulesRunner(t *testing.T, p *policy.Policy, routes int) *runner {
	t.Helper()
	cl, err := policy.NewClass("chat", p)
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{strat: strategy{name: StrategyHedgerow, delay: delayEstimated, rules: p}, class: cl, now: time.Hour}
	for i := range routes {
		r.routes = append(r.routes, "route-"+strconv.Itoa(i))
	}
	return r
}

// The simulator decides the shared eligibility cases as the dispatcher does
// (see the dispatcher's TestSharedEligibilityRules).
func TestSharedEligibilityRules(t *testing.T) {
	policytest.TestEligibility(t, func(t *testing.T, p *policy.Policy, f policytest.Facts) policytest.Decision {
		r := rulesRunner(t, p, f.Routes)
		g := &simGroup{id: "g1", arrival: r.now, cohort: delay.NewCohort("chat", "gpt4o", false, 0)}
		if f.PushedBack {
			// As the simulator's MarkRoute does, on its route-aware picker.
			r.picker = picker(t, r.routes)
			if err := r.do(g, hedge.MarkRoute{Route: r.routes[0], Mark: hedge.MarkPushback, TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
		if f.Breached {
			if err := r.class.Guardrail.ReportBreach(g.cohort, r.at(), delay.ReasonDuplicateCeiling); err != nil {
				t.Fatal(err)
			}
		}
		el := r.eligibility(g)
		return policytest.Decision{Eligible: el.Eligible, Reason: el.Reason, Arm: g.arm, Guardrail: el.Guardrail}
	})
}

// The simulator decides the shared censoring cases as the dispatcher does
// (see the dispatcher's TestSharedCensoringRules).
func TestSharedCensoringRules(t *testing.T) {
	policytest.TestCensoring(t, func(t *testing.T, p *policy.Policy, tc policytest.Censoring) bool {
		r := rulesRunner(t, p, 2)
		// The dispatcher launched the primary tc.Elapsed ago; its worker
		// started it one wire delay later.
		primary := &simAttempt{role: schemas.RolePrimary, start: r.now - tc.Elapsed + workerLatency,
			draw: workload.Attempt{Outcome: workload.OutcomeHang, FirstByte: workload.Never, End: workload.Never}}
		if tc.FirstByte {
			primary.draw = workload.Attempt{Outcome: workload.OutcomeOK, FirstByte: 100 * time.Millisecond, End: workload.Never}
		}
		if tc.Failed {
			primary.draw = workload.Attempt{Outcome: workload.OutcomeServerError, FirstByte: workload.Never, End: 100 * time.Millisecond}
			primary.finished = true
		}
		g := &simGroup{id: "g1", cohort: delay.NewCohort("chat", "gpt4o", false, 0),
			attempts: []*simAttempt{primary, {role: schemas.RoleHedge, start: r.now - tc.Elapsed/2}}}
		return r.observeSuperseded(g, policy.Decision{Winner: tc.Winner, Error: tc.Error})
	})
}

// The simulator arms the hedge delay of the primary's route, from first
// bytes reported on each route, as the dispatcher does (see the
// dispatcher's TestSharedRouteDelayRules).
func TestSharedRouteDelayRules(t *testing.T) {
	policytest.TestRouteDelay(t, func(t *testing.T, p *policy.Policy, f policytest.RouteFacts) policytest.Armed {
		r := rulesRunner(t, p, policytest.RouteDelayRoutes)
		r.strat.policy, r.acc = hedge.DefaultOptions(), &accumulator{}
		r.cond.Deadline = 30 * time.Second
		r.rng = rand.New(rand.NewPCG(1, 2))
		r.picker = picker(t, r.routes)
		g := &simGroup{id: "g1", arrival: r.now, cohort: delay.NewCohort("chat", "gpt4o", false, 0)}
		for _, s := range f.Samples {
			// A primary on the sample's route reports its first byte; the
			// dispatcher launched it s.Latency ago.
			sa := &simAttempt{route: s.Route, role: schemas.RolePrimary, start: r.now - s.Latency + workerLatency}
			if err := r.observeReport(g, sa, hedge.FirstByte{Attempt: 1}); err != nil {
				t.Fatal(err)
			}
		}
		for i, name := range r.routes {
			if i != f.Primary {
				if err := r.picker.SetState(name, route.Quarantined, r.at().Add(time.Minute)); err != nil {
					t.Fatal(err)
				}
			}
		}
		start := r.start(g)
		if g.primary != r.routes[f.Primary] {
			t.Fatalf("primary picked on %q, want %q", g.primary, r.routes[f.Primary])
		}
		return policytest.Armed{Hedge: start.HedgeDelay, StallJudgedBy: g.delay}
	})
}

// picker is a fresh route-aware picker over routes, as the simulator's
// hedgerow strategy builds one.
func picker(t *testing.T, routes []string) *route.Picker {
	t.Helper()
	defs := make([]route.Route, len(routes))
	for i, name := range routes {
		defs[i] = route.Route{Name: name}
	}
	p, err := route.NewPicker(defs, route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
