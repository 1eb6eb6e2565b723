package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/schemas"
)

const (
	// failTimeout is the store's bound on each call in the failure tests.
	failTimeout = 100 * time.Millisecond
	// schedulingSlack is what the failure tests allow past a deadline for
	// the goroutine that waited on it to run again on a loaded machine.
	schedulingSlack = 100 * time.Millisecond
	// atOnce bounds a call that fails without trying Redis: it takes
	// microseconds; the bound only allows for a loaded machine.
	atOnce = failTimeout / 4
)

// storeCall is one Store method with fixed arguments.
type storeCall struct {
	name string
	do   func(ctx context.Context) error
	// afterRestart is what the call returns once Redis is back, empty:
	// nil, or ErrUnknownReservation for a reservation the crash forgot.
	afterRestart error
}

// everyCall returns one call of every Store method; held is a reservation
// made before Redis went away.
func everyCall(store *redisstore.Store, held budgets.ReservationID) []storeCall {
	return []storeCall{
		{name: "Admit", do: func(ctx context.Context) error {
			_, err := store.Admit(ctx, ceilinged("ua-during"))
			return err
		}},
		{name: "ReserveExtra", do: func(ctx context.Context) error {
			_, err := store.ReserveExtra(ctx, hedgeOf(ceilinged("ua-during"), "route-x"))
			return err
		}},
		{name: "Settle", afterRestart: budgets.ErrUnknownReservation, do: func(ctx context.Context) error {
			return store.Settle(ctx, held, schemas.Usage{OutputUnits: 1})
		}},
		{name: "Release", afterRestart: budgets.ErrUnknownReservation, do: func(ctx context.Context) error {
			return store.Release(ctx, held)
		}},
		{name: "MarkRoute", do: func(ctx context.Context) error {
			return store.MarkRoute(ctx, "route-x", budgets.RoutePushback, time.Second)
		}},
		{name: "RouteStates", do: func(ctx context.Context) error {
			_, err := store.RouteStates(ctx, []string{"route-x", "route-y"})
			return err
		}},
		{name: "AcquireLease", do: func(ctx context.Context) error {
			return store.AcquireLease(ctx, "route-x", "holder", time.Second)
		}},
		{name: "ReleaseLease", do: func(ctx context.Context) error {
			return store.ReleaseLease(ctx, "route-x", "holder")
		}},
		{name: "InFlight", do: func(ctx context.Context) error {
			_, err := store.InFlight(ctx, []string{"route-x", "route-y"})
			return err
		}},
		{name: "LoadScripts", do: func(ctx context.Context) error { return store.LoadScripts(ctx) }},
	}
}

// wantUnavailableWithin checks that call fails with ErrUnavailable within
// limit.
func wantUnavailableWithin(t *testing.T, ctx context.Context, c storeCall, limit time.Duration) {
	t.Helper()
	start := time.Now()
	err := c.do(ctx)
	elapsed := time.Since(start)
	if !errors.Is(err, redisstore.ErrUnavailable) {
		t.Errorf("%s: %v, want ErrUnavailable", c.name, err)
	}
	if elapsed > limit {
		t.Errorf("%s took %v, want at most %v", c.name, elapsed, limit)
	}
	t.Logf("%s: failed after %v", c.name, elapsed.Round(time.Microsecond))
}

// TestKilledRedisFailsFastWithErrUnavailableAndRecoversAfterRestart kills
// the server: the first call finds out within the store's timeout, the
// calls after it fail at once (the breaker), and once the server is back
// (empty) a probe finds it and every call works again.
func TestKilledRedisFailsFastWithErrUnavailableAndRecoversAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	// The probe interval is long enough that no probe falls among the calls
	// that must fail at once, short enough for a quick recovery.
	const probe = 2 * time.Second
	store, err := redisstore.New(standaloneClient(t, srv), redisstore.Options{Prefix: "down", Timeout: failTimeout, ProbeInterval: probe})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	held, err := store.Admit(ctx, ceilinged("ua-before"))
	if err != nil || !held.Allowed {
		t.Fatalf("Admit before the kill: %+v, %v", held, err)
	}
	calls := everyCall(store, held.Reservation)

	srv.Kill()
	wantUnavailableWithin(t, ctx, calls[0], failTimeout+schedulingSlack)
	for _, c := range calls {
		wantUnavailableWithin(t, ctx, c, atOnce)
	}

	srv.Restart()
	// The client reconnects on its own schedule: no event to wait on.
	eventually.True(t, probe+10*time.Second, "a call after the restart", func() bool {
		_, err := store.RouteStates(ctx, []string{"route-x"})
		return err == nil
	})
	for _, c := range calls {
		if err := c.do(ctx); !errors.Is(err, c.afterRestart) {
			t.Errorf("%s after the restart: %v, want %v", c.name, err, c.afterRestart)
		}
	}
}

// TestStalledRedisTimesOutWithErrUnavailable pauses the server: a call
// gives up after the store's timeout (or the caller's earlier deadline),
// the calls after it fail at once, and calls work again once the pause
// ends.
func TestStalledRedisTimesOutWithErrUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	store, err := redisstore.New(standaloneClient(t, srv), redisstore.Options{Prefix: "stall", Timeout: failTimeout, ProbeInterval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	held, err := store.Admit(ctx, ceilinged("ua-before"))
	if err != nil || !held.Allowed {
		t.Fatalf("Admit before the stall: %+v, %v", held, err)
	}

	// CLIENT PAUSE holds every client's commands on the server: a live
	// connection that gets no answer, unlike a dead server.
	const pause = 2 * time.Second
	pauser := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 2 * pause})
	t.Cleanup(func() { _ = pauser.Close() })
	if err := pauser.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}

	// A caller's deadline earlier than the store's timeout wins, and its
	// expiry is reported as the caller's, not as an unavailable store.
	short, cancel := context.WithTimeout(ctx, failTimeout/4)
	defer cancel()
	start := time.Now()
	_, err = store.Admit(short, ceilinged("ua-short"))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redisstore.ErrUnavailable) {
		t.Errorf("Admit with a caller deadline of %v: %v, want the caller's DeadlineExceeded", failTimeout/4, err)
	}
	if elapsed := time.Since(start); elapsed > failTimeout/4+schedulingSlack {
		t.Errorf("Admit with a caller deadline of %v took %v", failTimeout/4, elapsed)
	}

	calls := everyCall(store, held.Reservation)
	wantUnavailableWithin(t, ctx, calls[0], failTimeout+schedulingSlack)
	for _, c := range calls[1:] {
		wantUnavailableWithin(t, ctx, c, atOnce)
	}

	// The pauser's own next command waits for the pause to end.
	if err := pauser.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after the pause: %v", err)
	}
	eventually.True(t, 10*time.Second, "an allowed Admit after the pause", func() bool {
		a, err := store.Admit(ctx, ceilinged("ua-after"))
		return err == nil && a.Allowed
	})
}

func TestEndedContextIsTheCallersErrorNotUnavailable(t *testing.T) {
	store, err := redisstore.New(standaloneClient(t, redistest.Start(t)), redisstore.Options{Prefix: "ended"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for _, c := range everyCall(store, "r1.never") {
		if err := c.do(ctx); !errors.Is(err, context.Canceled) || errors.Is(err, redisstore.ErrUnavailable) {
			t.Errorf("%s on a cancelled context: %v, want context.Canceled", c.name, err)
		}
	}
}
