package dispatcher

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/schemas"
)

// capacityRig is a cluster whose dispatcher spends its routes' limits
// (docs/architecture.md §7, "Route capacity") from real slices over one
// in-process granter, as a gateway's.
type capacityRig struct {
	*cluster
	d      *Dispatcher
	reg    *prometheus.Registry
	slices *slice.Slices
}

// newCapacityRig starts pool "general" over o's routes, with o's limits,
// and a dispatcher spending them from slices the test can spend from too.
func newCapacityRig(t *testing.T, o clusterOptions) *capacityRig {
	t.Helper()
	c := newClusterWith(t, o)
	sl, err := slice.New(slice.NewMemory(nil), slice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sl.Close) // after the dispatcher's close, registered below
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	d := c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: gate, Registerer: reg, Capacity: sl})
	return &capacityRig{cluster: c, d: d, reg: reg, slices: sl}
}

// spend takes n units of route's limit (requests, or tokens with tokens
// set) from the rig's slices, as another request would: the test's way
// to leave a route without capacity.
func (r *capacityRig) spend(t *testing.T, route string, tokens bool, n float64) {
	t.Helper()
	var l RouteLimits
	for _, cr := range r.cfg.Routes {
		if cr.Name == route {
			l = RouteLimits{RequestsPerMinute: cr.Limits.RequestsPerMinute, TokensPerMinute: cr.Limits.TokensPerMinute}
		}
	}
	req, tok := RouteRates(route, l)
	rate := req
	if tokens {
		rate = tok
	}
	if ok, _ := r.slices.TakeN(context.Background(), rate, n); !ok {
		t.Fatalf("could not spend %v of %s", n, rate.Key)
	}
}

func (r *capacityRig) submit(t *testing.T) (*Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.d.Submit(ctx, Submission{Pool: "general", Request: chat(false)}, nil)
}

// arrivedAt reports how many requests reached p so far.
func arrivedAt(p *provider) int { return len(p.arrived) }

// A primary whose route has no capacity left goes to another route of its
// pool, and the route over its limit is never called.
func TestRouteCapacityAPrimaryOverItsRoutesCapacityGoesToAnotherRouteOfItsPool(t *testing.T) {
	sc := newScript(behaviour{words: 2})
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
	r := newCapacityRig(t, clusterOptions{routes: []string{"a", "b"}, providers: ps,
		limits: map[string]string{"a": "{requests_per_minute: 1}"}})
	r.spend(t, "a", false, 1) // a's one request a minute
	for i := range 20 {
		resp, err := r.submit(t)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if resp.WinnerRoute != "b" || resp.Attempts != 1 {
			t.Fatalf("request %d answered by %s in %d attempts, want b in 1", i, resp.WinnerRoute, resp.Attempts)
		}
	}
	if n := arrivedAt(ps["a"]); n != 0 {
		t.Fatalf("route a, over its limit, was called %d times", n)
	}
	// The picker drew a for about half the primaries; each was refused and
	// moved (P(a never drawn in 20) ≈ 1e-6).
	if n := metricSum(t, []*prometheus.Registry{r.reg}, "hedgerow_route_capacity_refusals_total", "route", "a"); n < 1 {
		t.Fatalf("no refusal of a's capacity counted")
	}
}

// A hedge whose target has no capacity is suppressed route_capacity: the
// primary answers alone, and the full route is never called.
func TestRouteCapacityAHedgeToARouteWithoutCapacityIsSuppressedRouteCapacity(t *testing.T) {
	// The primary stalls past the hedge delay (100 ms, policyYAML).
	sc := newScript(behaviour{firstByte: 400 * time.Millisecond, words: 2})
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
	r := newCapacityRig(t, clusterOptions{routes: []string{"a", "b"}, providers: ps,
		limits: map[string]string{"b": "{requests_per_minute: 1}"}})
	r.spend(t, "b", false, 1)
	resp, err := r.submit(t) // the primary goes to a: b has no capacity
	if err != nil {
		t.Fatal(err)
	}
	if resp.WinnerRoute != "a" || resp.Attempts != 1 || resp.Hedged {
		t.Fatalf("response %+v: want a alone", resp)
	}
	g := r.groupRecord(resp.GroupID)
	if g.HedgeSuppressedReason != hedge.ReasonRouteCapacity || g.HedgeLaunched || g.Attempts != 1 {
		t.Fatalf("group record: suppressed %q, launched %v, %d attempts; want route_capacity, none, 1",
			g.HedgeSuppressedReason, g.HedgeLaunched, g.Attempts)
	}
	regs := []*prometheus.Registry{r.reg}
	if n := metricSum(t, regs, "hedgerow_hedges_suppressed_total", "reason", hedge.ReasonRouteCapacity); n != 1 {
		t.Fatalf("hedges suppressed route_capacity: %v, want 1", n)
	}
	if n := arrivedAt(ps["b"]); n != 0 {
		t.Fatalf("route b, over its limit, was called %d times", n)
	}
}

// With no route of the pool able to take the primary within its queue
// wait, the group fails 429 overloaded with a Retry-After of the slices'
// wait; nothing reaches a provider.
func TestRouteCapacityWithEveryRouteOutOfCapacityAGroupFailsOverloadedWithRetryAfter(t *testing.T) {
	sc := newScript(behaviour{words: 2})
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
	r := newCapacityRig(t, clusterOptions{routes: []string{"a", "b"}, providers: ps,
		limits: map[string]string{"a": "{requests_per_minute: 1}", "b": "{requests_per_minute: 1}"}})
	r.spend(t, "a", false, 1)
	r.spend(t, "b", false, 1)
	start := time.Now()
	_, err := r.submit(t)
	var ge *GroupError
	if !errors.As(err, &ge) || ge.Code != schemas.ErrOverloaded {
		t.Fatalf("err %v, want overloaded", err)
	}
	// The next token of a bucket of one request a minute is about a minute
	// away: far past the queue wait (1 s), so the group did not wait.
	if ge.RetryAfter < 50*time.Second || ge.RetryAfter > 61*time.Second {
		t.Fatalf("Retry-After %v, want the slices' wait, about a minute", ge.RetryAfter)
	}
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Fatalf("refused after %v: a wait past the queue wait is not waited for", took)
	}
	if g := r.groupRecord(ge.Group); g.ErrorCode != schemas.ErrOverloaded || g.Attempts != 0 {
		t.Fatalf("group record: %s after %d attempts, want overloaded after none", g.ErrorCode, g.Attempts)
	}
	if n := arrivedAt(ps["a"]) + arrivedAt(ps["b"]); n != 0 {
		t.Fatalf("%d requests reached a provider over its limit", n)
	}
}

// A primary with no capacity now waits for it within its pool's queue
// wait, and goes when its route has some; a wait longer than what is left
// of the queue wait is refused at once, Retry-After at least a second.
func TestRouteCapacityAPrimaryWaitsForCapacityWithinItsQueueWait(t *testing.T) {
	sc := newScript(behaviour{words: 2})
	ps := map[string]*provider{"a": newProvider(t, "a", sc)}
	// One request a second, in a bucket of one.
	r := newCapacityRig(t, clusterOptions{routes: []string{"a"}, providers: ps, poolYAML: "    queue_wait: 3s\n",
		limits: map[string]string{"a": "{requests_per_minute: 60}"}})
	r.spend(t, "a", false, 1)
	start := time.Now()
	resp, err := r.submit(t)
	if err != nil {
		t.Fatalf("a primary that could wait for its route was refused: %v", err)
	}
	// The bucket was empty: its next token is about a second away.
	if took := time.Since(start); took < 500*time.Millisecond || resp.WinnerRoute != "a" {
		t.Fatalf("answered by %s after %v: want a, after waiting for its next token", resp.WinnerRoute, took)
	}

	short := newCapacityRig(t, clusterOptions{routes: []string{"a"}, providers: ps, poolYAML: "    queue_wait: 200ms\n",
		limits: map[string]string{"a": "{requests_per_minute: 60}"}})
	short.spend(t, "a", false, 1)
	start = time.Now()
	_, err = short.submit(t)
	var ge *GroupError
	if !errors.As(err, &ge) || ge.Code != schemas.ErrOverloaded || ge.RetryAfter < time.Second || ge.RetryAfter > 2*time.Second {
		t.Fatalf("err %v, want overloaded with a Retry-After of about a second", err)
	}
	if took := time.Since(start); took > 700*time.Millisecond {
		t.Fatalf("refused after %v: the token a second away is past the 200 ms queue wait, so it is refused at once", took)
	}
}

// A replacement behaves as a primary: with no other route able to take it
// now it waits within the queue wait and goes when one can; a wait longer
// than that fails the group overloaded (not all_routes_failed), naming
// route_capacity as why nothing was left.
func TestRouteCapacityAReplacementWaitsForCapacityOrFailsOverloaded(t *testing.T) {
	newRig := func(t *testing.T, rpm string) (*capacityRig, map[string]*provider) {
		sc := newScript(behaviour{words: 2}, behaviour{status: 500}) // the primary fails
		ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
		r := newCapacityRig(t, clusterOptions{routes: []string{"a", "b"}, providers: ps, poolYAML: "    queue_wait: 3s\n",
			limits: map[string]string{"b": "{requests_per_minute: " + rpm + "}"}})
		r.spend(t, "b", false, 1)
		return r, ps
	}
	t.Run("waits", func(t *testing.T) {
		r, ps := newRig(t, "60") // b's next token is a second away
		start := time.Now()
		resp, err := r.submit(t)
		if err != nil {
			t.Fatalf("the replacement did not wait for b: %v", err)
		}
		if resp.WinnerRoute != "b" || resp.Attempts != 2 || time.Since(start) < 500*time.Millisecond {
			t.Fatalf("response %+v after %v: want the replacement on b, after its wait", resp, time.Since(start))
		}
		if n := arrivedAt(ps["b"]); n != 1 {
			t.Fatalf("b called %d times, want once", n)
		}
	})
	t.Run("fails overloaded", func(t *testing.T) {
		r, ps := newRig(t, "1") // b's next token is a minute away
		_, err := r.submit(t)
		var ge *GroupError
		if !errors.As(err, &ge) || ge.Code != schemas.ErrOverloaded || ge.Refused != hedge.ReasonRouteCapacity {
			t.Fatalf("err %+v, want overloaded, refused route_capacity", err)
		}
		if ge.RetryAfter < 50*time.Second {
			t.Fatalf("Retry-After %v, want the slices' wait, about a minute", ge.RetryAfter)
		}
		if n := arrivedAt(ps["b"]); n != 0 {
			t.Fatalf("b, over its limit, was called %d times", n)
		}
	})
}

// An attempt a worker refused Busy is offered again only to a route with
// capacity: with none, to the refusing route, whose limit it already holds.
func TestRouteCapacityABusyAttemptIsReofferedOnlyToARouteWithCapacity(t *testing.T) {
	r := newCapacityRig(t, clusterOptions{routes: []string{"a", "b"},
		limits: map[string]string{"b": "{requests_per_minute: 1}"}})
	r.spend(t, "b", false, 1)
	var mu sync.Mutex
	var offers []string
	startFakeWorker(t, r.cluster, []string{"a", "b"}, func(fw *fakeWorker, a schemas.Attempt) {
		mu.Lock()
		offers = append(offers, a.Route)
		first := len(offers) == 1
		mu.Unlock()
		if first {
			fw.send(a, schemas.Busy{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: fakeWorkerID})
			return
		}
		fw.answer(a, "answered after a busy")
	})
	resp, err := r.submit(t)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(offers) != 2 || offers[0] != "a" || offers[1] != "a" || resp.WinnerRoute != "a" {
		t.Fatalf("offers %v, winner %s: want both offers to a, b being out of capacity", offers, resp.WinnerRoute)
	}
}

// tokens_per_minute spends each attempt's estimate (input and max_tokens):
// a request the route's tokens cannot cover goes elsewhere, and a pool with
// no other route refuses it.
func TestRouteCapacityTokensPerMinuteSpendsTheAttemptsEstimate(t *testing.T) {
	sc := newScript(behaviour{words: 2})
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
	// chat(false): max_tokens 50 and "hello" (2 tokens estimated): 52.
	r := newCapacityRig(t, clusterOptions{routes: []string{"a", "b"}, providers: ps,
		limits: map[string]string{"a": "{tokens_per_minute: 100}"}})
	r.spend(t, "a", true, 60) // 40 left, under one request's 52
	for i := range 10 {
		resp, err := r.submit(t)
		if err != nil || resp.WinnerRoute != "b" {
			t.Fatalf("request %d: %+v %v, want b", i, resp, err)
		}
	}
	if n := arrivedAt(ps["a"]); n != 0 {
		t.Fatalf("a, without the tokens for a request, was called %d times", n)
	}

	solo := newCapacityRig(t, clusterOptions{routes: []string{"a"}, providers: ps, poolYAML: "    queue_wait: 200ms\n",
		limits: map[string]string{"a": "{tokens_per_minute: 100}"}})
	if _, err := solo.submit(t); err != nil {
		t.Fatalf("the first request, 52 of 100 tokens: %v", err)
	}
	_, err := solo.submit(t) // 48 left
	var ge *GroupError
	if !errors.As(err, &ge) || ge.Code != schemas.ErrOverloaded {
		t.Fatalf("the second request, 52 of 48 tokens left: %v, want overloaded", err)
	}
	if n := arrivedAt(ps["a"]); n != 1 {
		t.Fatalf("a called %d times, want once", n)
	}
}

// A caller that leaves while its primary waits for capacity ends the group
// at once: canceled, no attempt launched, its reservation given back.
func TestRouteCapacityACallerGoneWhileItsPrimaryWaitsEndsTheGroupWithNoAttempt(t *testing.T) {
	sc := newScript(behaviour{words: 2})
	ps := map[string]*provider{"a": newProvider(t, "a", sc)}
	r := newCapacityRig(t, clusterOptions{routes: []string{"a"}, providers: ps, poolYAML: "    queue_wait: 3s\n",
		limits: map[string]string{"a": "{requests_per_minute: 60}"}})
	r.spend(t, "a", false, 1) // the next token is a second away
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	id := r.d.NewGroupID()
	start := time.Now()
	if _, err := r.d.Submit(ctx, Submission{Pool: "general", Request: chat(false), GroupID: id}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the caller's context", err)
	}
	g := r.groupRecord(id)
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the group ended %v after its caller left 100 ms in: it waited for capacity nobody wanted", took)
	}
	if g.ErrorCode != schemas.ErrCanceled || g.Attempts != 0 {
		t.Fatalf("group record: %s after %d attempts, want canceled after none", g.ErrorCode, g.Attempts)
	}
	if n := arrivedAt(ps["a"]); n != 0 {
		t.Fatalf("a called %d times for a caller that left", n)
	}
}

// What an attempt spent of a route's limits without reaching its provider
// goes back to the gateway's slices: a worker's Busy moves the offer to a
// route with capacity and gives the first route's back, so the next
// request finds it; and a request whose tokens a route cannot cover gives
// back the request it took of that route.
func TestRouteCapacitySpentWithoutReachingAProviderIsGivenBack(t *testing.T) {
	t.Run("busy", func(t *testing.T) {
		r := newCapacityRig(t, clusterOptions{routes: []string{"a", "b"},
			limits: map[string]string{"a": "{requests_per_minute: 1}", "b": "{requests_per_minute: 1}"}})
		var mu sync.Mutex
		var offers []string
		startFakeWorker(t, r.cluster, []string{"a", "b"}, func(fw *fakeWorker, a schemas.Attempt) {
			mu.Lock()
			offers = append(offers, a.Route)
			first := len(offers) == 1
			mu.Unlock()
			if first {
				fw.send(a, schemas.Busy{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: fakeWorkerID})
				return
			}
			fw.answer(a, "answered")
		})
		// One request a minute on each route, two routes: the Busy moved
		// the first request to the other route and gave its first back.
		for i := range 2 {
			if _, err := r.submit(t); err != nil {
				t.Fatalf("request %d: %v (offers %v)", i, err, offers)
			}
		}
		_, err := r.submit(t)
		var ge *GroupError
		if !errors.As(err, &ge) || ge.Code != schemas.ErrOverloaded {
			t.Fatalf("a third request with both routes' one request spent: %v, want overloaded", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(offers) != 3 || offers[0] == offers[1] || offers[2] != offers[0] {
			t.Fatalf("offers %v: want the first moved off its Busy route, and the second request on that route", offers)
		}
	})
	t.Run("tokens refused", func(t *testing.T) {
		sc := newScript(behaviour{words: 2})
		ps := map[string]*provider{"a": newProvider(t, "a", sc)}
		r := newCapacityRig(t, clusterOptions{routes: []string{"a"}, providers: ps, poolYAML: "    queue_wait: 200ms\n",
			limits: map[string]string{"a": "{requests_per_minute: 1, tokens_per_minute: 100}"}})
		r.spend(t, "a", true, 60) // 40 tokens left: under a request's 52
		if _, err := r.submit(t); err == nil {
			t.Fatal("a request over the tokens left was answered")
		}
		_, tok := RouteRates("a", RouteLimits{RequestsPerMinute: 1, TokensPerMinute: 100})
		r.slices.Adjust(tok, 60) // the tokens back, as if a minute had passed
		// The refused request gave back the one request a minute it took.
		if _, err := r.submit(t); err != nil {
			t.Fatalf("the request the refused one gave back was not there: %v", err)
		}
		if n := arrivedAt(ps["a"]); n != 1 {
			t.Fatalf("a called %d times, want once", n)
		}
	})
}
