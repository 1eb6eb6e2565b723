package simulator

import (
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/dispatcher/policy/policytest"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// The simulator adds a decided group's sample to its guardrail arm as the
// dispatcher does (see the dispatcher's TestSharedGuardrailSampleRules): a
// control group's is its kept baseline's.
func TestSharedGuardrailSampleRules(t *testing.T) {
	policytest.TestGuardrailSamples(t, func(t *testing.T, p *policy.Policy, c policytest.GuardrailSample) (*policy.Class, delay.Cohort, time.Time) {
		r := rulesRunner(t, p, 2)
		r.cond.Deadline = policytest.GuardrailDeadline
		g := &simGroup{id: "g1", arrival: r.now, arm: c.Arm, cohort: delay.NewCohort("chat", "gpt4o", true, 0)}
		for n := 1; n <= c.Attempts; n++ {
			// Attempt n, launched at its offset, started at its worker one
			// wire delay later; its first byte, when the case has one,
			// reached the dispatcher one wire delay after the provider's.
			sa := &simAttempt{role: schemas.RolePrimary, start: g.arrival + policytest.Launched(n) + workerLatency,
				draw: workload.Attempt{Outcome: workload.OutcomeHang, FirstByte: workload.Never, End: workload.Never}}
			if fb, ok := c.FirstBytes[n]; ok {
				sa.draw = workload.Attempt{Outcome: workload.OutcomeOK, FirstByte: fb - policytest.Launched(n) - 2*workerLatency, End: workload.Never}
			}
			g.attempts = append(g.attempts, sa)
		}
		r.now += time.Minute
		r.observeGuardrail(g, c.Ended)
		return r.class, g.cohort, r.at()
	})
}

// recordCollector keeps a run's records: attempt records by group and
// number, group records in order.
type recordCollector struct {
	mu       sync.Mutex
	attempts map[string]map[int]schemas.AttemptRecord
	groups   []schemas.GroupRecord
}

func (c *recordCollector) AttemptRecord(r schemas.AttemptRecord) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.attempts == nil {
		c.attempts = map[string]map[int]schemas.AttemptRecord{}
	}
	if c.attempts[r.HedgeGroupID] == nil {
		c.attempts[r.HedgeGroupID] = map[int]schemas.AttemptRecord{}
	}
	c.attempts[r.HedgeGroupID][r.Attempt] = r
	return nil
}

func (c *recordCollector) GroupRecord(r schemas.GroupRecord) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.groups = append(c.groups, r)
	return nil
}

// TestEveryControlGroupIsHedgedForItsCallerWhileItsBaselineMeasuresItsPrimaryOnlyRun:
// with every group a control group (control fraction 1), on uneven routes,
// each caller is hedged as any caller is, and each group's baseline is
// what it would have measured primary-only: its primary's own first byte
// when it had one — the primaries a hedge beat included, kept running
// past the commit to it — and the deadline when it had none. No caller
// waits longer than its primary would have made it wait.
func TestEveryControlGroupIsHedgedForItsCallerWhileItsBaselineMeasuresItsPrimaryOnlyRun(t *testing.T) {
	const requests, seed = 20_000, 5
	cond := workload.PinnedConditions()
	p := policy.Default()
	p.ControlFraction = 1
	strat, err := configuredStrategy(StrategyHedgerow, p, cond)
	if err != nil {
		t.Fatal(err)
	}
	traffic, err := builtinTraffic(Options{Workload: workload.Uneven, Requests: requests, Stream: true}, cond)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRunner(strat, traffic, seed, newAccumulator(requests))
	if err != nil {
		t.Fatal(err)
	}
	col := &recordCollector{}
	r.records = col
	res, err := r.run(requests, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Simulated errors come 0.2–0.5 s into an attempt, before any hedge:
	// a primary that fails is replaced as a primary-only group's is, so no
	// baseline fails on its own after its hedge, and every group is a
	// sample.
	if res.ControlGroups != requests || res.ControlSamples != requests {
		t.Fatalf("%d control groups, %d control samples: want all %d", res.ControlGroups, res.ControlSamples, requests)
	}
	deadline := cond.Deadline.Milliseconds()
	var hedgeWon, keptToFirstByte, keptToDeadline, replaced int
	for _, g := range col.groups {
		primary, ok := col.attempts[g.HedgeGroupID][1]
		if !ok || primary.Role != schemas.RolePrimary {
			t.Fatalf("group %s: no primary record", g.HedgeGroupID)
		}
		if g.GuardrailDecision != schemas.GuardrailControl || g.ControlBaselineMs == nil {
			t.Fatalf("group %s: guardrail decision %q, control baseline %v: want a control group's baseline", g.HedgeGroupID, g.GuardrailDecision, g.ControlBaselineMs)
		}
		baseline := *g.ControlBaselineMs
		if g.Outcome == schemas.GroupCommitted && g.WinnerAttempt != 1 {
			hedgeWon++
		}
		switch {
		case primary.Outcome == schemas.OutcomeFailed:
			// Replaced before any hedge, as a primary-only group's: the
			// replacement is the baseline.
			replaced++
			continue
		case primary.FirstByteMs != nil:
			// The primary launched as the group arrived.
			if baseline != *primary.FirstByteMs {
				t.Fatalf("group %s: baseline %d ms, want its primary's first byte at %d ms", g.HedgeGroupID, baseline, *primary.FirstByteMs)
			}
			if g.WinnerAttempt > 1 {
				keptToFirstByte++ // or valid already when the hedge won
			}
		default:
			if baseline != deadline {
				t.Fatalf("group %s: baseline %d ms for a primary with no first byte, want the deadline %d ms", g.HedgeGroupID, baseline, deadline)
			}
			if g.WinnerAttempt > 1 {
				keptToDeadline++
			}
		}
		caller := deadline
		if g.Outcome == schemas.GroupCommitted && g.FirstByteMs != nil {
			caller = *g.FirstByteMs
		}
		if caller > baseline {
			t.Fatalf("group %s: its caller waited %d ms, longer than its primary-only run's %d ms", g.HedgeGroupID, caller, baseline)
		}
	}
	if res.KeptBaselines == 0 || keptToFirstByte == 0 || keptToDeadline == 0 {
		t.Fatalf("%d baselines kept; of the primaries a hedge beat, %d reached their first byte and %d the deadline: want some of each",
			res.KeptBaselines, keptToFirstByte, keptToDeadline)
	}
	t.Logf("%d groups: hedge won %d, baselines kept %d; of the primaries it beat, %d measured to their first byte, %d to the deadline; primaries replaced before a hedge %d; duplicate rate %.4f",
		len(col.groups), hedgeWon, res.KeptBaselines, keptToFirstByte, keptToDeadline, replaced, res.DuplicateRate)
}

// A kept primary's elapsed time is censored at its own end, as a
// primary-only group's primary is: at its first byte it is an exact
// sample already, not a censored one at the commit that beat it.
func TestAKeptPrimaryIsAnExactDelaySampleNotACensoredOne(t *testing.T) {
	p := policy.Default()
	policytest.CensoringPolicy(p) // the delay stays 1 s
	r := rulesRunner(t, p, 2)
	r.strat.policy, r.acc = hedge.DefaultOptions(), newAccumulator(1)
	r.cond.Deadline = 30 * time.Second
	g := &simGroup{id: "g1", arrival: r.now, cohort: delay.NewCohort("chat", "gpt4o", true, 0),
		attempts: []*simAttempt{
			{role: schemas.RolePrimary, start: r.now + workerLatency, draw: workload.Attempt{Outcome: workload.OutcomeOK, FirstByte: 3 * time.Second, End: workload.Never}},
			{route: 1, role: schemas.RoleHedge, start: r.now + time.Second + workerLatency},
		}}
	sketch := func() int { return r.class.Estimator.Delay(g.cohort, r.at(), time.Hour).Samples }
	r.now += 1500 * time.Millisecond // the hedge's commit, 1.5 s into the primary's stall
	if err := r.do(g, hedge.Commit{Attempt: 2, Gate: "g/2/1", Kept: 1}); err != nil {
		t.Fatal(err)
	}
	if n := sketch(); n != 0 {
		t.Fatalf("%d samples at the hedge's commit: a kept primary is no censored sample yet", n)
	}
	r.now = g.arrival + 3*time.Second + 2*workerLatency // its first byte reaches the dispatcher
	if err := r.observeReport(g, g.attempts[0], hedge.FirstByte{Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	r.now += 2 * workerLatency
	if err := r.do(g, hedge.AttemptEnded{Attempt: 1, Role: schemas.RolePrimary, Outcome: hedge.OutcomeLoserCanceled, Status: schemas.StatusCanceled}); err != nil {
		t.Fatal(err)
	}
	if n := sketch(); n != 1 {
		t.Fatalf("%d samples after the kept primary's first byte and end, want its exact sample alone", n)
	}
}
