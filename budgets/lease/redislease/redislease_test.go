package redislease_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets/lease"
	"github.com/hedgerow/hedgerow/budgets/lease/leasetest"
	"github.com/hedgerow/hedgerow/budgets/lease/redislease"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// factory makes stores on client, each under a prefix of its own so that
// the suite's stores share one server without sharing keys.
func factory(client redis.UniversalClient) func(t *testing.T) (lease.RegionStore, *leasetest.Clock) {
	var n atomic.Int64
	return func(t *testing.T) (lease.RegionStore, *leasetest.Clock) {
		clock := leasetest.NewClock()
		return newStore(t, client, "t"+strconv.FormatInt(n.Add(1), 10), clock.Now), clock
	}
}

func newStore(t *testing.T, client redis.UniversalClient, prefix string, now func() time.Time) *redislease.Store {
	t.Helper()
	s, err := redislease.New(client, redislease.Options{Prefix: prefix, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStoreConformsOnStandaloneRedis(t *testing.T) {
	leasetest.RegionStore(t, factory(redistest.Start(t).Client()))
}

// On a cluster the suite passes too, and the store's keys sit in one hash
// slot.
func TestStoreConformsOnRedisCluster(t *testing.T) {
	client := redistest.StartCluster(t).Client()
	leasetest.RegionStore(t, factory(client))

	ctx := ctxOf(t)
	var slots []int64
	for _, key := range []string{"hr:{lease}:held", "hr:{lease}:demand", "hr:{lease}:lock", "region-b:{lease}:lock"} {
		slot, err := client.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, slot)
	}
	for _, s := range slots[1:] {
		if s != slots[0] {
			t.Fatalf("the store's keys sit in slots %v; want one", slots)
		}
	}
}

// The keys are those the package doc names, of the types it names; only
// the lock expires, its TTL longer than the hold.
func TestKeysAreThoseThePackageDocNames(t *testing.T) {
	client := redistest.Start(t).Client()
	clock := leasetest.NewClock()
	s := newStore(t, client, "", clock.Now)
	ctx := ctxOf(t)
	if err := s.SetHeld(ctx, "tenant:acme:rate", lease.Held{Share: 0.5, Expires: clock.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddDemand(ctx, map[string]float64{"tenant:acme:rate": 1.5}); err != nil {
		t.Fatal(err)
	}
	const hold = 10 * time.Second
	if ok, err := s.Lock(ctx, "gateway-a", hold); err != nil || !ok {
		t.Fatalf("lock = %v, %v", ok, err)
	}
	keys, err := client.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 {
		t.Errorf("keys %v, want the three of the package doc", keys)
	}
	for key, want := range map[string]string{"hr:{lease}:held": "hash", "hr:{lease}:demand": "hash", "hr:{lease}:lock": "hash"} {
		if typ, err := client.Type(ctx, key).Result(); err != nil || typ != want {
			t.Errorf("%s is a %q (%v), want a %s", key, typ, err, want)
		}
	}
	if v, err := client.HGet(ctx, "hr:{lease}:demand", "tenant:acme:rate").Result(); err != nil || v != "1.5" {
		t.Errorf("the demand's field = %q, %v; want 1.5", v, err)
	}
	lock, err := client.HGetAll(ctx, "hr:{lease}:lock").Result()
	if want := strconv.FormatInt(clock.Now().Add(hold).UnixMilli(), 10); err != nil || lock["holder"] != "gateway-a" || lock["until"] != want {
		t.Errorf("the lock = %v, %v; want holder gateway-a until %s, the store's clock's ms", lock, err, want)
	}
	for key, min := range map[string]time.Duration{"hr:{lease}:held": -1, "hr:{lease}:demand": -1, "hr:{lease}:lock": hold + 30*time.Second} {
		ttl, err := client.PTTL(ctx, key).Result()
		switch {
		case err != nil:
			t.Errorf("PTTL %s: %v", key, err)
		case min < 0 && ttl != -1:
			t.Errorf("%s expires in %v, want no TTL", key, ttl)
		case min >= 0 && ttl < min:
			t.Errorf("%s expires in %v, want at least %v: Redis' expiry must never cut a live hold", key, ttl, min)
		}
	}
}

// Two gateways, each with its own connection, share one region's store;
// a store under another prefix is another region's.
func TestGatewaysOfARegionShareOneStoreAndPrefixesSeparate(t *testing.T) {
	srv := redistest.Start(t)
	clock := leasetest.NewClock()
	a := newStore(t, srv.Client(), "east", clock.Now)
	b := newStore(t, srv.Client(), "east", clock.Now)
	other := newStore(t, srv.Client(), "west", clock.Now)
	ctx := ctxOf(t)

	if ok, err := a.Lock(ctx, "gateway-a", time.Minute); err != nil || !ok {
		t.Fatalf("a's lock = %v, %v", ok, err)
	}
	if ok, err := b.Lock(ctx, "gateway-b", time.Minute); err != nil || ok {
		t.Fatalf("b's lock = %v, %v; want refused: a holds the region's lock", ok, err)
	}
	if ok, err := other.Lock(ctx, "gateway-b", time.Minute); err != nil || !ok {
		t.Fatalf("the other region's lock = %v, %v; want its own, free", ok, err)
	}
	for _, s := range []*redislease.Store{a, b, other} {
		if err := s.AddDemand(ctx, map[string]float64{"tenant:acme:rate": 2}); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := b.TakeDemand(ctx); err != nil || d["tenant:acme:rate"] != 4 {
		t.Fatalf("b's take = %v, %v; want both gateways' 4", d, err)
	}
	if d, err := other.TakeDemand(ctx); err != nil || d["tenant:acme:rate"] != 2 {
		t.Fatalf("the other region's take = %v, %v; want its own 2", d, err)
	}
	h := lease.Held{Share: 0.4, Expires: clock.Now().Add(10 * time.Second)}
	if err := a.SetHeld(ctx, "tenant:acme:rate", h); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Held(ctx); err != nil || !got["tenant:acme:rate"].Expires.Equal(h.Expires) || got["tenant:acme:rate"].Share != h.Share {
		t.Fatalf("b reads %+v, %v; want a's lease %+v", got, err, h)
	}
	if got, err := other.Held(ctx); err != nil || len(got) != 0 {
		t.Fatalf("the other region holds %+v, %v; want nothing", got, err)
	}
}

func TestRefusalsSayWhatIsWrongAndChangeNothing(t *testing.T) {
	client := redistest.Start(t).Client()
	if _, err := redislease.New(nil, redislease.Options{}); err == nil {
		t.Error("New without a client succeeded")
	}
	clock := leasetest.NewClock()
	s := newStore(t, client, "", clock.Now)
	ctx := ctxOf(t)
	for name, err := range map[string]error{
		"lock without a holder":    func() error { _, err := s.Lock(ctx, "", time.Second); return err }(),
		"lock for no time":         func() error { _, err := s.Lock(ctx, "gateway-a", 0); return err }(),
		"negative demand":          s.AddDemand(ctx, map[string]float64{"a": 1, "b": -1}),
		"demand NaN":               s.AddDemand(ctx, map[string]float64{"a": 1, "b": math.NaN()}),
		"infinite demand":          s.AddDemand(ctx, map[string]float64{"a": 1, "b": math.Inf(1)}),
		"a share past the ceiling": s.SetHeld(ctx, "a", lease.Held{Share: 1.5}),
	} {
		if !errors.Is(err, lease.ErrInvalid) || !hasPrefix(err, "redislease: ") {
			t.Errorf("%s: %v, want an error wrapping lease.ErrInvalid, prefixed redislease:", name, err)
		}
	}
	if n, err := client.Exists(ctx, "hr:{lease}:held", "hr:{lease}:demand", "hr:{lease}:lock").Result(); err != nil || n != 0 {
		t.Fatalf("after refused calls %d keys exist (%v), want none", n, err)
	}
}

// A lease Redis holds that is not JSON is an error naming its ceiling, not
// a zero lease (which would spend the fallback).
func TestACorruptLeaseIsAnError(t *testing.T) {
	client := redistest.Start(t).Client()
	s := newStore(t, client, "", leasetest.NewClock().Now)
	ctx := ctxOf(t)
	if err := client.HSet(ctx, "hr:{lease}:held", "tenant:acme:rate", "not json").Err(); err != nil {
		t.Fatal(err)
	}
	if h, err := s.Held(ctx); err == nil || !hasPrefix(err, "redislease: ") {
		t.Fatalf("held = %+v, %v; want an error prefixed redislease:", h, err)
	}
}

func hasPrefix(err error, p string) bool { return err != nil && strings.HasPrefix(err.Error(), p) }
