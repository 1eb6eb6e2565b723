package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/schemas"
)

// roundTrips counts a client's round trips.
type roundTrips struct{ redistest.RoundTrips }

// count returns how many round trips do made, failing the test on its error.
func (h *roundTrips) count(t *testing.T, what string, do func() error) int64 {
	t.Helper()
	before := h.Total()
	if err := do(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return h.Total() - before
}

// backend is a real Redis deployment a test runs against.
type backend struct {
	name   string
	client func(t *testing.T) redis.UniversalClient
}

var backends = []backend{
	{"standalone", func(t *testing.T) redis.UniversalClient { return standaloneClient(t, redistest.Start(t)) }},
	{"cluster", func(t *testing.T) redis.UniversalClient { return clusterClient(t, redistest.StartCluster(t)) }},
}

// ceilinged is a primary that counts against both spend ceilings, so that
// Admit involves every entity it can: user action, tenant and pool.
func ceilinged(ua string) budgets.AdmitRequest {
	return budgets.AdmitRequest{
		UserAction: ua,
		Tenant:     "tenant-rt",
		Pool:       "pool-rt",
		Window:     "cohort-rt",
		Attempts:   budgets.AttemptPolicy{Max: 3, TTL: time.Minute},
		Spend: budgets.SpendPolicy{
			InputUnits: 10, OutputUnits: 90,
			UserActionCeiling: 1000, TenantCeiling: 1_000_000, TenantWindow: time.Hour,
			ReservationTTL: time.Minute,
		},
		Duplicates: budgets.DuplicateCeiling{Ceiling: 1, Window: 10 * time.Second, Slots: 10},
	}
}

// hedgeOf is the hedge of a ceilinged primary towards route, paid for by
// the cohort's window or the pool's reserve.
func hedgeOf(p budgets.AdmitRequest, route string) budgets.ExtraRequest {
	return budgets.ExtraRequest{
		Role: schemas.RoleHedge, UserAction: p.UserAction, Tenant: p.Tenant, Route: route,
		Pool: p.Pool, Window: p.Window, Attempts: p.Attempts, Spend: p.Spend, Duplicates: p.Duplicates,
		Reserve: budgets.ReserveBucket{Capacity: 2, RefillPerSecond: 1},
	}
}

// TestAdmitAndReserveExtraAreOneRoundTrip counts the round trips of each
// call once the scripts are loaded: an allowed Admit or ReserveExtra is one
// pipelined batch, however many hash slots (and cluster masters) it spans;
// a denial adds one batch that gives back what the other entities granted,
// and a server that lost its scripts one batch that sends their source.
func TestAdmitAndReserveExtraAreOneRoundTrip(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			client := be.client(t)
			hook := &roundTrips{}
			client.AddHook(hook)
			store, err := redisstore.New(client, redisstore.Options{Prefix: "rt", Timeout: suiteTimeout})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()

			// steps names its entities after round, so that a warm-up
			// round (which also opens the pooled connections, whose
			// handshakes pass through the hook) leaves the counted one
			// fresh entities.
			steps := func(round string) []roundTripStep {
				p := ceilinged("ua-rt-" + round)
				var admission budgets.Admission
				var grant budgets.Grant
				batch := make([]budgets.Ending, 8)
				return []roundTripStep{
					{"allowed Admit", func() (err error) {
						admission, err = store.Admit(ctx, p)
						if err == nil && !admission.Allowed {
							t.Fatalf("Admit denied: %s", admission.Reason)
						}
						return err
					}, 1},
					{"allowed ReserveExtra", func() (err error) {
						grant, err = store.ReserveExtra(ctx, hedgeOf(p, "route-rt-"+round))
						if err == nil && !grant.Allowed {
							t.Fatalf("ReserveExtra denied: %s", grant.Reason)
						}
						return err
					}, 1},
					{"Settle", func() error { return store.Settle(ctx, admission.Reservation, schemas.Usage{OutputUnits: 40}) }, 1},
					{"Release", func() error { return store.Release(ctx, grant.Reservation) }, 1},
					{"eight allowed Admits, one each", func() error {
						for i := range batch {
							a, err := store.Admit(ctx, ceilinged(fmt.Sprintf("ua-rt-batch-%s-%d", round, i)))
							if err != nil || !a.Allowed {
								t.Fatalf("Admit for the batch: %+v, %v", a, err)
							}
							batch[i] = budgets.Ending{Reservation: a.Reservation, Usage: schemas.Usage{OutputUnits: 10}, Release: i%2 == 1}
						}
						return nil
					}, 8},
					{"EndAll of the eight", func() error { return errors.Join(store.EndAll(ctx, batch)...) }, 1},
					{"Admit denied by the tenant, then compensated", func() error {
						req := ceilinged("ua-rt-denied-" + round)
						req.Spend.TenantCeiling = 1
						a, err := store.Admit(ctx, req)
						if err == nil && a.Reason != budgets.ReasonSpendTenant {
							t.Fatalf("Admit over the tenant ceiling: %+v", a)
						}
						return err
					}, 2},
					{"MarkRoute", func() error {
						return store.MarkRoute(ctx, "route-pushed-"+round, budgets.RoutePushback, time.Minute)
					}, 1},
					{"ReserveExtra denied by pushback, then compensated", func() error {
						g, err := store.ReserveExtra(ctx, hedgeOf(ceilinged("ua-rt-pushed-"+round), "route-pushed-"+round))
						if err == nil && g.Reason != budgets.ReasonRoutePushback {
							t.Fatalf("ReserveExtra towards a pushed-back route: %+v", g)
						}
						return err
					}, 2},
					{"RouteStates of three routes", func() error {
						_, err := store.RouteStates(ctx, []string{"route-a", "route-b", "route-c"})
						return err
					}, 1},
					{"InFlight of three routes", func() error {
						_, err := store.InFlight(ctx, []string{"route-a", "route-b", "route-c"})
						return err
					}, 1},
					{"RouteSnapshot of three routes: states and leases together", func() error {
						_, _, err := store.RouteSnapshot(ctx, []string{"route-a", "route-b", "route-c"})
						return err
					}, 1},
					{"allowed Admit on servers that lost their scripts: EVALSHA refused, EVAL sent", func() error {
						flushScripts(t, client)
						a, err := store.Admit(ctx, ceilinged("ua-rt-flushed-"+round))
						if err == nil && !a.Allowed {
							t.Fatalf("Admit after SCRIPT FLUSH denied: %s", a.Reason)
						}
						return err
					}, 2},
				}
			}
			for _, s := range steps("warm-up") {
				hook.count(t, "warm-up: "+s.name, s.do)
			}
			// The warm-up ended by flushing the scripts; LoadScripts puts
			// them back on every server.
			if err := store.LoadScripts(ctx); err != nil {
				t.Fatalf("LoadScripts: %v", err)
			}
			for _, s := range steps("counted") {
				if got := hook.count(t, s.name, s.do); got != s.want {
					t.Errorf("%s: %d round trips, want %d", s.name, got, s.want)
				}
			}
		})
	}
}

type roundTripStep struct {
	name string
	do   func() error
	want int64
}

// flushScripts empties the script cache of every server behind client, as
// a restart does, through clients the counting hook is not on: a cluster's
// node clients, or a standalone client of its own.
func flushScripts(t *testing.T, client redis.UniversalClient) {
	t.Helper()
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(t.Context(), func(ctx context.Context, m *redis.Client) error {
			return m.ScriptFlush(ctx).Err()
		})
	case *redis.Client:
		// A client of its own, so the counting hook does not see it.
		direct := redis.NewClient(c.Options())
		defer direct.Close()
		err = direct.ScriptFlush(t.Context()).Err()
	}
	if err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
}
