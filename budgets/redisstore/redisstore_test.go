package redisstore_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/budgets/storetest"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/schemas"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// suiteTimeout bounds each call in the conformance runs. The suite checks
// what the store decides, not how fast; a generous bound keeps a loaded
// machine (the race detector on two shared cores) from turning a slow
// answer into a failure. The timeout itself is tested on its own.
const suiteTimeout = 5 * time.Second

// standaloneClient is a client of srv that bounds its I/O by context
// deadlines, as New requires.
func standaloneClient(t testing.TB, srv *redistest.Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// clusterClient is the cluster counterpart of standaloneClient.
func clusterClient(t testing.TB, cl *redistest.Cluster) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// factory returns stores on client under a fresh key prefix each, driven
// by the suite's clock.
func factory(client redis.UniversalClient) storetest.Factory {
	var seq atomic.Int64
	return func(t *testing.T, clock *storetest.Clock) budgets.Store {
		s, err := redisstore.New(client, redisstore.Options{
			Prefix:  fmt.Sprintf("suite%d", seq.Add(1)),
			Now:     clock.Now,
			Timeout: suiteTimeout,
		})
		if err != nil {
			t.Fatalf("redisstore.New: %v", err)
		}
		return s
	}
}

// TestStoreConformsOnStandaloneRedis runs the conformance suite against one
// real redis-server.
func TestStoreConformsOnStandaloneRedis(t *testing.T) {
	storetest.Run(t, factory(standaloneClient(t, redistest.Start(t))))
}

// TestStoreConformsOnRedisCluster runs the conformance suite against a real
// three-master Redis Cluster, where a decision's entities sit on different
// masters and compensation crosses servers.
func TestStoreConformsOnRedisCluster(t *testing.T) {
	storetest.Run(t, factory(clusterClient(t, redistest.StartCluster(t))))
}

// TestUnitsBeyondExactIntegersAreInvalid checks the one limit the Redis
// store adds to budgets' validation: its scripts compute in Lua doubles, so
// spend figures must stay below 2^53 units.
func TestUnitsBeyondExactIntegersAreInvalid(t *testing.T) {
	client := standaloneClient(t, redistest.Start(t))
	store, err := redisstore.New(client, redisstore.Options{Prefix: "exact", Timeout: suiteTimeout})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const huge = int64(1) << 53
	admits := []struct {
		name  string
		spoil func(*budgets.AdmitRequest)
	}{
		{"input units", func(r *budgets.AdmitRequest) { r.Spend.InputUnits = huge }},
		{"input and output units together", func(r *budgets.AdmitRequest) { r.Spend.InputUnits, r.Spend.OutputUnits = huge/2, huge/2 }},
		{"a tenant ceiling", func(r *budgets.AdmitRequest) { r.Spend.TenantCeiling = huge }},
	}
	for _, tt := range admits {
		req := ceilinged("ua-huge")
		tt.spoil(&req)
		if _, err := store.Admit(ctx, req); !errors.Is(err, budgets.ErrInvalidRequest) {
			t.Errorf("Admit with %s of 2^53: %v, want ErrInvalidRequest", tt.name, err)
		}
	}
	a, err := store.Admit(ctx, ceilinged("ua-huge"))
	if err != nil || !a.Allowed {
		t.Fatalf("Admit: %+v, %v", a, err)
	}
	if err := store.Settle(ctx, a.Reservation, schemas.Usage{OutputUnits: huge}); !errors.Is(err, budgets.ErrInvalidRequest) {
		t.Errorf("Settle with 2^53 units: %v, want ErrInvalidRequest", err)
	}
	if err := store.Settle(ctx, a.Reservation, schemas.Usage{OutputUnits: budgets.MaxUnits}); err != nil {
		t.Errorf("Settle with budgets.MaxUnits units: %v", err)
	}
}
