package dispatcher

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
)

// A worker's Busy is backpressure (docs/architecture.md §4 rule 4): the same
// attempt, under its own number, goes to another route, and wins there;
// no slot is spent, nothing is counted as a failure.
func TestBusyOffersTheSameAttemptToAnotherRoute(t *testing.T) {
	c := newCluster(t, []string{"a", "b"}, nil, "")
	var mu sync.Mutex
	var offers []schemas.Attempt
	startFakeWorker(t, c, []string{"a", "b"}, func(fw *fakeWorker, a schemas.Attempt) {
		mu.Lock()
		offers = append(offers, a)
		first := len(offers) == 1
		mu.Unlock()
		if first {
			fw.send(a, schemas.Busy{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake"})
			return
		}
		fw.answer(a, "answer after a busy")
	})
	resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(offers) != 2 || offers[0].Attempt != 1 || offers[1].Attempt != 1 || offers[0].Route == offers[1].Route {
		t.Fatalf("offers %+v, want attempt 1 offered twice, to two routes", offers)
	}
	if resp.Winner != 1 || resp.Attempts != 1 || resp.WinnerRoute != offers[1].Route {
		t.Fatalf("response %+v, want attempt 1 to win on %s", resp, offers[1].Route)
	}
	g := c.groupRecord(resp.GroupID)
	if g.Attempts != 1 || g.HedgeLaunched {
		t.Fatalf("group record %+v: a Busy must spend no attempt slot", g)
	}
	rec := c.attemptRecords(resp.GroupID, 1)[1]
	if rec.Outcome != schemas.OutcomeWinner || rec.Route != offers[1].Route {
		t.Fatalf("attempt record %+v, want the winner on %s", rec, offers[1].Route)
	}
}

// A saturated pool — three routes whose workers take one attempt each, all
// held — answers more requests with 429 overloaded after the bounded queue
// wait: never all_routes_failed, and no hedge or replacement goes into it
// (docs/architecture.md §4 rule 4: never answer overload with more load).
func TestSaturatedPoolRefusesWithOverloadedAndNoMoreLoad(t *testing.T) {
	const queueWait = 600 * time.Millisecond
	hold := make(chan struct{})
	released := false
	release := func() {
		if !released {
			released = true
			close(hold)
		}
	}
	defer release()
	routes := []string{"a", "b", "c"}
	sc := newScript(behaviour{hold: hold, words: 2})
	ps := map[string]*provider{}
	for _, r := range routes {
		ps[r] = newProvider(t, r, sc)
	}
	// Held requests hedge never ("patient"), the refused ones after 100ms.
	c := newClusterWith(t, clusterOptions{routes: routes, providers: ps, maxInflight: 1,
		poolYAML: "    queue_wait: 600ms\n",
		extraYAML: policyYAML + `
  patient:
    hedge: false
    control_fraction: 0
    deadline: 20s
`})
	reg := prometheus.NewRegistry()
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: gate, Registerer: reg})
	regs := []*prometheus.Registry{reg}
	metric := func(name, label, value string) float64 { return metricSum(t, regs, name, label, value) }

	// Fill every slot of the pool.
	type result struct {
		resp    *Response
		err     error
		elapsed time.Duration
	}
	held := make(chan result, len(routes))
	for range routes {
		go func() {
			resp, err := d.Submit(context.Background(), Submission{Operation: "patient", Pool: "general", Request: chat(false)}, nil)
			held <- result{resp: resp, err: err}
		}()
	}
	for range routes {
		select {
		case <-ps["a"].arrived:
		case <-ps["b"].arrived:
		case <-ps["c"].arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("the pool's slots were not all taken")
		}
	}

	// Saturate: the first refused request makes the pool's last offer a
	// Busy before the others start, so none of them may hedge into it.
	const refusedN = 6
	refused := make(chan result, refusedN)
	submit := func() {
		start := time.Now()
		resp, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
		refused <- result{resp: resp, err: err, elapsed: time.Since(start)}
	}
	go submit()
	eventually.True(t, 10*time.Second, "a Busy from the full pool", func() bool {
		return metric("hedgerow_busy_total", "pool", "general") >= 1
	})
	for range refusedN - 1 {
		go submit()
	}
	var elapsed []time.Duration
	var ids []string
	for range refusedN {
		r := <-refused
		var ge *GroupError
		if !errors.As(r.err, &ge) || ge.Code != schemas.ErrOverloaded || ge.RetryAfter < time.Second {
			t.Fatalf("a request into the saturated pool got %v (%+v), want overloaded with a Retry-After of at least 1s", r.err, r.resp)
		}
		// The refusal comes after the bounded wait, not at the first Busy:
		// the last re-offer's backoff (at most 80ms) may end it early.
		if r.elapsed < queueWait-80*time.Millisecond {
			t.Fatalf("refused after %v, before the queue wait %v", r.elapsed, queueWait)
		}
		ids = append(ids, ge.Group)
		elapsed = append(elapsed, r.elapsed)
	}
	for _, g := range c.groupRecords(ids) {
		if g.Attempts != 1 || g.HedgeLaunched || g.ErrorCode != schemas.ErrOverloaded {
			t.Fatalf("refused group record %+v, want one attempt, no hedge, overloaded", g)
		}
	}
	slices.Sort(elapsed)
	t.Logf("figures: %d requests refused overloaded after %v..%v (queue_wait %v); %v Busy answers, %v re-offers",
		refusedN, elapsed[0], elapsed[len(elapsed)-1], queueWait,
		metric("hedgerow_busy_total", "pool", "general"), metric("hedgerow_reoffers_total", "pool", "general"))

	// Nothing went into the saturated pool beyond the primaries.
	if n := metric("hedgerow_hedges_launched_total", "", ""); n != 0 {
		t.Fatalf("%v hedges launched into the saturated pool", n)
	}
	if n := metric("hedgerow_attempts_total", "role", string(schemas.RoleReplacement)); n != 0 {
		t.Fatalf("%v replacements launched into the saturated pool", n)
	}
	if n := metric("hedgerow_hedges_suppressed_total", "reason", "overloaded"); n < 1 {
		t.Fatalf("no hedge suppressed as overloaded (%v)", n)
	}

	// The held requests finish once their providers answer, each on its
	// one attempt.
	release()
	for range routes {
		r := <-held
		if r.err != nil || r.resp.Attempts != 1 {
			t.Fatalf("held request: %v (%+v), want an answer on one attempt", r.err, r.resp)
		}
	}
	if n := metric("hedgerow_groups_total", "outcome", string(schemas.ErrAllRoutesFailed)); n != 0 {
		t.Fatalf("%v groups failed all_routes_failed", n)
	}
}

// groupRecords waits for the group records of every group of ids, in any
// order.
func (c *cluster) groupRecords(ids []string) map[string]schemas.GroupRecord {
	c.t.Helper()
	out := map[string]schemas.GroupRecord{}
	timeout := time.After(10 * time.Second)
	for len(out) < len(ids) {
		select {
		case r := <-c.groups:
			if slices.Contains(ids, r.HedgeGroupID) {
				out[r.HedgeGroupID] = r
			}
		case <-timeout:
			c.t.Fatalf("got %d of %d group records", len(out), len(ids))
		}
	}
	return out
}
