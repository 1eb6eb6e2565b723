package worker

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// These tests run workers whose leases go to a real redis-server through
// the Redis budget store, as `hedgerow worker` with redis.url does; an
// observer reads the route's in-flight count as a dispatcher replica does.

// leasePrefix is the key prefix of the tests' stores.
const leasePrefix = "wl"

// redisConn is a client of rs as internal/node builds one: no retries,
// deadlines honoured. The test's cleanup closes it.
func redisConn(t *testing.T, rs *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: rs.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// leaseStore is a Redis budget store on its own client of rs.
func leaseStore(t *testing.T, rs *redistest.Server) (*redisstore.Store, *redis.Client) {
	t.Helper()
	c := redisConn(t, rs)
	s, err := redisstore.New(c, redisstore.Options{Prefix: leasePrefix, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// waitInFlight waits until the store counts want leases on the test route.
// Leases are taken and given back off the attempt's path, so there is no
// event to wait on: it polls, bounded by wait.
func waitInFlight(t *testing.T, s *redisstore.Store, want int) {
	t.Helper()
	eventually.True(t, wait, fmt.Sprintf("route %s to have %d leases in flight", testRoute, want), func() bool {
		n, err := s.InFlight(t.Context(), []string{testRoute})
		return err == nil && n[testRoute] == want
	})
}

// leaseExpiry reads the one lease of the test route: its holder and its
// expiry (Unix ms), straight from the store's sorted set.
func leaseExpiry(t *testing.T, c *redis.Client) (string, float64) {
	t.Helper()
	keys, err := c.Keys(t.Context(), leasePrefix+":{route:*}:leases").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("lease keys %q (%v): want one", keys, err)
	}
	zs, err := c.ZRangeWithScores(t.Context(), keys[0], 0, -1).Result()
	if err != nil || len(zs) != 1 {
		t.Fatalf("leases %v (%v): want one", zs, err)
	}
	return zs[0].Member.(string), zs[0].Score
}

func TestAttemptHoldsARouteLeaseWhileInFlightRenewedAndReleasedAtItsEnd(t *testing.T) {
	rs := redistest.Start(t)
	store, client := leaseStore(t, rs)
	// A lease call's deadline is the renew interval: 200 ms leaves room
	// for a loaded machine (20 ms timed out once under a parallel `make
	// test`). The store's connection is dialled before the worker's first
	// call, so that call is not also a dial.
	waitInFlight(t, store, 0)
	gate := make(chan struct{})
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 4, 1000)}, gate: gate,
		config: func(c *Options) { c.Leases, c.LeaseRenewInterval = store, 200*time.Millisecond }})

	att := h.attempt("hg_lease")
	in := h.send(att)
	in.accept()
	<-h.prov.arrived // the call is at the provider, held by the gate
	waitInFlight(t, store, 1)

	holder, first := leaseExpiry(t, client)
	if holder != "worker-test-1/hg_lease/1" {
		t.Errorf("lease holder %q, want worker id/group/attempt", holder)
	}
	if strings.Contains(holder, att.UserActionID) || strings.Contains(holder, promptCanary) {
		t.Errorf("lease holder %q names the user action or the prompt", holder)
	}
	// A running attempt's lease is renewed: its expiry moves forward.
	eventually.True(t, wait, fmt.Sprintf("the lease expiry to move past %.0f (a renewal)", first), func() bool {
		_, exp := leaseExpiry(t, client)
		return exp > first
	})

	close(gate)
	if _, res := in.untilResult(); res.StatusClass != schemas.StatusOK {
		t.Fatalf("attempt ended %s, want ok", res.StatusClass)
	}
	waitInFlight(t, store, 0)
	if got := h.metric("hedgerow_worker_lease_errors_total"); got != 0 {
		t.Errorf("lease errors = %v, want 0", got)
	}
}

func TestLeaseOfAWorkerCutOffFromTheStoreExpiresAfterItsTTL(t *testing.T) {
	rs := redistest.Start(t)
	observer, _ := leaseStore(t, rs)
	workerStore, workerClient := leaseStore(t, rs)
	// A lease call's deadline is the renew interval: 250 ms keeps renewals
	// from timing out on a loaded machine, which would shorten the lease's
	// life before the cut that the test measures after it.
	const renew, ttl = 250 * time.Millisecond, 2500 * time.Millisecond
	gate := make(chan struct{})
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 4, 1000)}, gate: gate,
		config: func(c *Options) { c.Leases, c.LeaseRenewInterval, c.LeaseTTL = workerStore, renew, ttl }})

	in := h.send(h.attempt("hg_orphan"))
	in.accept()
	<-h.prov.arrived
	waitInFlight(t, observer, 1)

	// The worker loses its Redis connection for good, as a killed worker
	// does: it can neither renew nor release. The lease, renewed within
	// the last renew interval and a half, outlives the cut for a while…
	_ = workerClient.Close()
	cut := time.Now()
	if n, err := observer.InFlight(t.Context(), []string{testRoute}); err != nil || n[testRoute] != 1 {
		t.Fatalf("in flight right after the cut: %v %v, want 1 until the lease's ttl", n, err)
	}
	// …and then expires on its own while the attempt still runs.
	waitInFlight(t, observer, 0)
	// It was renewed shortly before the cut, so half its ttl at least
	// passes before it lapses (not the whole: a renewal can be late).
	if lived := time.Since(cut); lived < ttl/2 {
		t.Errorf("lease gone %v after the cut, before its ttl %v could have passed", lived, ttl)
	}
	if got := h.metric("hedgerow_worker_inflight", "route", testRoute); got != 1 {
		t.Fatalf("worker runs %v attempts, want the held one still running", got)
	}

	// The attempt never noticed: it completes, and the failed renewals
	// were counted.
	close(gate)
	if _, res := in.untilResult(); res.StatusClass != schemas.StatusOK {
		t.Fatalf("attempt ended %s, want ok", res.StatusClass)
	}
	// The cut may fall between the acquire's write and its reply (the
	// observer already counts the lease): then the acquire is the call that
	// failed and no renewal follows. Either way the failure is counted.
	failed := h.metric("hedgerow_worker_lease_errors_total", "route", testRoute, "op", LeaseRenew) +
		h.metric("hedgerow_worker_lease_errors_total", "route", testRoute, "op", LeaseAcquire)
	if failed < 1 {
		t.Errorf("lease acquire and renew errors = %v, want at least 1", failed)
	}
	if logs := h.logs.String(); strings.Count(logs, "route lease not updated") != 1 {
		t.Errorf("want exactly one log line for the failures within %v:\n%s", leaseLogEvery, logs)
	}
}

func TestAStoreThatDoesNotAnswerNeverDelaysAnAttempt(t *testing.T) {
	rs := redistest.Start(t)
	store, _ := leaseStore(t, rs)
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 4, 1000)},
		config: func(c *Options) { c.Leases, c.LeaseRenewInterval = store, 100*time.Millisecond }})

	// Redis stops answering writes for the pause — lease calls are
	// scripts and ZREMs — so each lease call waits until its deadline
	// before it fails. (Pausing WRITE rather than ALL lets the test's
	// UNPAUSE through.)
	const pause = 5 * time.Second
	admin := redisConn(t, rs)
	if err := admin.Do(t.Context(), "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	for i, group := range []string{"hg_paused_1", "hg_paused_2"} {
		in := h.send(h.attempt(group))
		if _, res := in.untilResult(); res.StatusClass != schemas.StatusOK {
			t.Fatalf("attempt %d ended %s, want ok", i+1, res.StatusClass)
		}
	}
	if took := time.Since(paused); took >= time.Second {
		t.Errorf("two attempts took %v with Redis paused: their lease calls were on their path", took)
	}
	eventually.True(t, wait, "a failed acquire to be counted", func() bool {
		return h.metric("hedgerow_worker_lease_errors_total", "route", testRoute, "op", LeaseAcquire) >= 1
	})
	if err := admin.Do(t.Context(), "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
}

func TestWorkerWithoutALeaseStoreMakesNoLeases(t *testing.T) {
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 4, 1000)}})
	if h.w.leases != nil {
		t.Fatal("a worker without Options.Leases has a lease keeper")
	}
	in := h.send(h.attempt("hg_no_lease"))
	if _, res := in.untilResult(); res.StatusClass != schemas.StatusOK {
		t.Fatalf("attempt ended %s, want ok", res.StatusClass)
	}
}

// TestStopReleasesTheLeasesOfCancelledAttempts: attempts still running when
// the drain grace ends are cancelled, and their leases are given back
// before Stop returns.
func TestStopReleasesTheLeasesOfCancelledAttempts(t *testing.T) {
	rs := redistest.Start(t)
	store, _ := leaseStore(t, rs)
	h := newHarness(t, setup{fake: fakellm.Options{Model: hangModel(t)},
		config: func(c *Options) { c.Leases, c.DrainGrace = store, 20*time.Millisecond }})
	in := h.send(h.attempt("hg_hung_lease"))
	in.accept()
	<-h.prov.arrived
	waitInFlight(t, store, 1)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := h.w.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if n, err := store.InFlight(t.Context(), []string{testRoute}); err != nil || n[testRoute] != 0 {
		t.Fatalf("in flight after Stop: %v %v, want 0", n, err)
	}
	if _, res := in.untilResult(); res.StatusClass != schemas.StatusCanceled {
		t.Errorf("hung attempt ended %s, want canceled", res.StatusClass)
	}
}
