package redistenantlimit_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit/redistenantlimit"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit/tenantlimittest"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// factory makes stores on client, each under a prefix of its own so the
// suite's stores share one server without sharing keys.
func factory(client redis.UniversalClient) tenantlimittest.Factory {
	var n atomic.Int64
	return func(t *testing.T, clock *tenantlimittest.Clock) tenantlimit.Store {
		s, err := redistenantlimit.New(client, redistenantlimit.Options{Prefix: "t" + strconv.FormatInt(n.Add(1), 10), Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

func TestStoreConformsOnStandaloneRedis(t *testing.T) {
	tenantlimittest.Run(t, factory(redistest.Start(t).Client()))
}

func TestStoreConformsOnRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = client.Close() })
	tenantlimittest.Run(t, factory(client))
}

// Two replicas on one Redis share a tenant's limits: what one takes, the
// other cannot.
func TestReplicasSharingRedisShareATenantsLimits(t *testing.T) {
	srv := redistest.Start(t)
	clock := tenantlimittest.NewClock()
	a, _ := redistenantlimit.New(srv.Client(), redistenantlimit.Options{Now: clock.Now})
	b, _ := redistenantlimit.New(srv.Client(), redistenantlimit.Options{Now: clock.Now})
	ctx := context.Background()
	if ok, _, err := a.Take(ctx, "acme", 1, 1); err != nil || !ok {
		t.Fatalf("replica a's take = %v, %v", ok, err)
	}
	if ok, wait, err := b.Take(ctx, "acme", 1, 1); err != nil || ok || wait != time.Second {
		t.Fatalf("replica b's take = %v, wait %v, %v; want refused for a's, wait 1s", ok, wait, err)
	}
	if ok, err := a.Acquire(ctx, "acme", "ha", 1, time.Minute); err != nil || !ok {
		t.Fatalf("replica a's acquire = %v, %v", ok, err)
	}
	if ok, err := b.Acquire(ctx, "acme", "hb", 1, time.Minute); err != nil || ok {
		t.Fatalf("replica b's acquire = %v, %v; want refused for a's slot", ok, err)
	}
}

// Both keys of a tenant carry a TTL, so an idle tenant's state is
// collected by Redis, and share one hash slot.
func TestTenantKeysCarryATTLAndOneHashSlot(t *testing.T) {
	client := redistest.Start(t).Client()
	s, _ := redistenantlimit.New(client, redistenantlimit.Options{Prefix: "hr"})
	ctx := context.Background()
	if _, _, err := s.Take(ctx, "acme", 10, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "acme", "h", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"hr:{tl:acme}:rate", "hr:{tl:acme}:slots"} {
		if ttl, err := client.PTTL(ctx, key).Result(); err != nil || ttl <= 0 {
			t.Errorf("PTTL %s = %v, %v; want a TTL", key, ttl, err)
		}
	}
}

// A store that cannot reach Redis fails its calls; the Limiter then admits.
func TestUnreachableRedisIsAnError(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	s, _ := redistenantlimit.New(client, redistenantlimit.Options{})
	srv.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := s.Take(ctx, "acme", 1, 1); err == nil {
		t.Error("Take on a dead Redis succeeded")
	}
	if _, err := s.Acquire(ctx, "acme", "h", 1, time.Minute); err == nil {
		t.Error("Acquire on a dead Redis succeeded")
	}
	if err := s.Release(ctx, "acme", "h"); err == nil {
		t.Error("Release on a dead Redis succeeded")
	}
}

// BenchmarkAdmitAndReleaseOnRedis is the cost a limited request pays when
// the replicas share Redis: three round trips (acquire, take, release).
func BenchmarkAdmitAndReleaseOnRedis(b *testing.B) {
	store, err := redistenantlimit.New(redistest.Start(b).Client(), redistenantlimit.Options{})
	if err != nil {
		b.Fatal(err)
	}
	l, err := tenantlimit.New(store, tenantlimit.Options{Limits: map[string]tenantlimit.Limit{"acme": {RequestsPerSecond: 1e12, Burst: 1 << 30, MaxConcurrent: 1 << 20}}})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for b.Loop() {
		release, err := l.Admit(ctx, "acme")
		if err != nil {
			b.Fatal(err)
		}
		release()
	}
}
