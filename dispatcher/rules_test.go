package dispatcher

import (
	"strconv"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/dispatcher/policy/policytest"
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
	for i := range routes {
		g.routes = append(g.routes, "r"+strconv.Itoa(i))
	}
	return g
}

// The dispatcher decides the shared eligibility cases as the simulator does
// (see the simulator's TestSharedEligibilityRules).
func TestSharedEligibilityRules(t *testing.T) {
	for _, tc := range policytest.EligibilityCases() {
		t.Run(tc.Name, func(t *testing.T) {
			p := policy.Default()
			if tc.Policy != nil {
				tc.Policy(p)
			}
			g := rulesGroup(t, p, tc.Routes)
			now := time.Now()
			if tc.Breached {
				if err := g.class.Guardrail.ReportBreach(g.cohort, now, delay.ReasonDuplicateCeiling); err != nil {
					t.Fatal(err)
				}
			}
			el := g.eligibility(now)
			if g.armed != tc.Eligible || el.Reason != tc.Reason || g.arm != tc.Arm || g.guard != tc.Guardrail {
				t.Fatalf("eligible %v, reason %q, arm %s, guardrail decision %s; want %v, %q, %s, %s",
					g.armed, el.Reason, g.arm, g.guard, tc.Eligible, tc.Reason, tc.Arm, tc.Guardrail)
			}
		})
	}
}

// The dispatcher decides the shared censoring cases as the simulator does
// (see the simulator's TestSharedCensoringRules).
func TestSharedCensoringRules(t *testing.T) {
	for _, tc := range policytest.CensoringCases() {
		t.Run(tc.Name, func(t *testing.T) {
			p := policy.Default()
			policytest.CensoringPolicy(p)
			p.Trigger = tc.Trigger
			g := rulesGroup(t, p, 2)
			now := time.Now()
			primary := &attemptState{n: 1, role: schemas.RolePrimary, launchedAt: now.Add(-tc.Elapsed), outcome: hedge.OutcomeLoserCanceled}
			if tc.FirstByte {
				primary.firstByte = 100 * time.Millisecond
			}
			if tc.Failed {
				primary.outcome = hedge.OutcomeFailed
			}
			g.attempts = []*attemptState{primary, {n: 2, role: schemas.RoleHedge, launchedAt: now.Add(-tc.Elapsed / 2)}}
			end := hedge.GroupEnded{Committed: tc.Winner > 0, Winner: tc.Winner, Error: tc.Error}
			if got := g.observeSuperseded(now, end); got != tc.Recorded {
				t.Fatalf("recorded %v, want %v", got, tc.Recorded)
			}
		})
	}
}
