package dispatcher

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// TestPrimariesAvoidARouteLoadedByOtherReplicasWorkers: attempts in flight
// on a route's workers anywhere in the cluster hold leases in the budgets
// store (docs/architecture.md §7); the route refresh reads their count with the route
// flags, and route choice weighs it, so a route that other replicas keep
// busy gets fewer primaries than its idle twin here, though this replica
// has nothing in flight on either. Once the leases are gone the twins
// share the primaries again.
func TestPrimariesAvoidARouteLoadedByOtherReplicasWorkers(t *testing.T) {
	tests := []struct {
		name  string
		store func(t *testing.T) budgets.Store
	}{
		// Redis reads flags and leases in one round trip per refresh.
		{"redis store", func(t *testing.T) budgets.Store {
			store, _ := redisShared(t, redisClient(t, redistest.Start(t)), "sharedinflight")
			return store
		}},
		// The memory store is read with RouteStates, then InFlight.
		{"memory store", func(t *testing.T) budgets.Store { return budgets.NewMemory(nil) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := twoRoutes(t, newScript(behaviour{words: 2}))
			store := tt.store(t)
			gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d := c.addDispatcher(Options{Store: store, Gate: gate})
			ctx := context.Background()

			// Another replica's workers hold 20 attempts on route a.
			const others = 20
			for i := range others {
				if err := store.AcquireLease(ctx, "a", fmt.Sprintf("other-worker/g%d/1", i), time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			waitSharedInFlight(t, d, "a", others)
			primaries := submitAndCountPrimaries(t, c, d, 20)
			if primaries["a"] >= primaries["b"] {
				t.Fatalf("primaries %v: want fewer on a, loaded by other replicas, than on its idle twin b", primaries)
			}

			for i := range others {
				if err := store.ReleaseLease(ctx, "a", fmt.Sprintf("other-worker/g%d/1", i)); err != nil {
					t.Fatal(err)
				}
			}
			waitSharedInFlight(t, d, "a", 0)
			primaries = submitAndCountPrimaries(t, c, d, 20)
			// Which twin wins each sequential pick then depends on their
			// latency samples alone, which machine load skews either way;
			// the rule is only that a is no longer avoided.
			if primaries["a"] == 0 {
				t.Fatalf("primaries %v: want a used again once it is idle", primaries)
			}
		})
	}
}

// waitSharedInFlight waits for d's route refresh (every
// routeRefreshInterval) to give its picker the cluster's count n for route.
func waitSharedInFlight(t *testing.T, d *Dispatcher, route string, n int) {
	t.Helper()
	eventually.True(t, 10*time.Second, fmt.Sprintf("route %s to have %d shared in flight", route, n), func() bool {
		st, err := d.picker.Stats(route, d.now())
		if err != nil {
			t.Fatal(err)
		}
		return st.SharedInFlight == n
	})
}

// submitAndCountPrimaries submits n requests one after another and counts
// the route each group's first attempt went to.
func submitAndCountPrimaries(t *testing.T, c *cluster, d *Dispatcher, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		resp, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
		if err != nil {
			t.Fatalf("Submit: %v", err)
		}
		got[c.attemptRecords(resp.GroupID, resp.Attempts)[1].Route]++
	}
	return got
}
