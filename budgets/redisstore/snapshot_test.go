package redisstore_test

import (
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
)

// TestRouteSnapshotReadsWhatRouteStatesAndInFlightRead: the snapshot a
// dispatcher's route refresh takes in one round trip agrees with the two
// calls it replaces, expired flags and leases included.
func TestRouteSnapshotReadsWhatRouteStatesAndInFlightRead(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			var mu sync.Mutex
			now := time.Unix(1_700_000_000, 0)
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			store, err := redisstore.New(be.client(t), redisstore.Options{Prefix: "snap", Timeout: suiteTimeout, Now: clock})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			must(store.MarkRoute(ctx, "pushed", budgets.RoutePushback, time.Minute))
			must(store.MarkRoute(ctx, "quarantined", budgets.RouteQuarantined, time.Minute))
			must(store.MarkRoute(ctx, "lapsed", budgets.RouteQuarantined, time.Second))
			for _, h := range []string{"w1/g/1", "w2/g/2", "w3/g/1"} {
				must(store.AcquireLease(ctx, "pushed", h, time.Minute))
			}
			must(store.AcquireLease(ctx, "idle", "w1/g/9", time.Second)) // lapses below
			must(store.AcquireLease(ctx, "lapsed", "w4/g/1", time.Minute))
			mu.Lock()
			now = now.Add(2 * time.Second)
			mu.Unlock()

			routes := []string{"pushed", "quarantined", "lapsed", "idle", "never-seen"}
			states, counts, err := store.RouteSnapshot(ctx, routes)
			must(err)
			wantStates, err := store.RouteStates(ctx, routes)
			must(err)
			wantCounts, err := store.InFlight(ctx, routes)
			must(err)
			if !maps.Equal(states, wantStates) || !maps.Equal(counts, wantCounts) {
				t.Fatalf("snapshot %v %v, want %v %v", states, counts, wantStates, wantCounts)
			}
			want := map[string]int{"pushed": 3, "quarantined": 0, "lapsed": 1, "idle": 0, "never-seen": 0}
			if !maps.Equal(counts, want) || states["pushed"] != budgets.RoutePushback ||
				states["quarantined"] != budgets.RouteQuarantined || states["lapsed"] != budgets.RouteHealthy {
				t.Fatalf("snapshot %v %v: want pushback, quarantine, an expired flag healthy, counts %v", states, counts, want)
			}
		})
	}
}
