package redisslice_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/budgets/slice/redisslice"
	"github.com/hedgerow/hedgerow/budgets/slice/slicetest"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// factory makes granters on client, each under a prefix of its own so the
// suite's granters share one server without sharing keys.
func factory(client redis.UniversalClient) slicetest.Factory {
	var n atomic.Int64
	return func(t *testing.T, clock *slicetest.Clock) slice.Granter {
		return newGranter(t, client, "t"+strconv.FormatInt(n.Add(1), 10), clock.Now)
	}
}

func newGranter(t *testing.T, client redis.UniversalClient, prefix string, now func() time.Time) *redisslice.Granter {
	t.Helper()
	g, err := redisslice.New(client, redisslice.Options{Prefix: prefix, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestGranterConformsOnStandaloneRedis(t *testing.T) {
	slicetest.Run(t, factory(redistest.Start(t).Client()))
}

// On a cluster the suite passes too, and a ceiling's bucket and holds sit
// in one hash slot.
func TestGranterConformsOnRedisCluster(t *testing.T) {
	client := redistest.StartCluster(t).Client()
	slicetest.Run(t, factory(client))

	ctx := t.Context()
	for _, key := range []string{"tenant:acme", "a}b{c"} {
		rateSlot, err1 := client.ClusterKeySlot(ctx, "hr:{sl:"+key+"}:rate").Result()
		holdSlot, err2 := client.ClusterKeySlot(ctx, "hr:{sl:"+key+"}:hold").Result()
		if err := errors.Join(err1, err2); err != nil || rateSlot != holdSlot {
			t.Errorf("ceiling %q: rate key in slot %d, hold key in slot %d (%v); want one slot", key, rateSlot, holdSlot, err)
		}
	}
}

// Two gateways, each with its own connection to one Redis, share one
// bucket, one set of slots and one count of the living: what one takes
// or holds, the other cannot.
func TestTwoGatewaysShareOneBucketAndOneSetOfSlots(t *testing.T) {
	srv := redistest.Start(t)
	clock := slicetest.NewClock()
	a := newGranter(t, srv.Client(), "", clock.Now)
	b := newGranter(t, srv.Client(), "", clock.Now)
	ctx := t.Context()
	r := slice.Rate{Key: "tenant:acme:rate", Kind: "tenant_rate", PerSecond: 2, Burst: 4}
	c := slice.Concurrency{Key: "tenant:acme:concurrency", Kind: "tenant_concurrency", Max: 3}

	if took, wait, err := a.Take(ctx, r, 3, 0); err != nil || took != 3 || wait != 0 {
		t.Fatalf("gateway a's take = %v, %v, %v; want 3 of the burst of 4", took, wait, err)
	}
	if took, wait, err := b.Take(ctx, r, 3, 0); err != nil || took != 1 || wait != 500*time.Millisecond {
		t.Fatalf("gateway b's take = %v, wait %v, %v; want the 1 token a left, wait 500ms", took, wait, err)
	}
	if _, _, err := a.Take(ctx, r, 0, 2); err != nil { // a gives back 2 it did not spend
		t.Fatal(err)
	}
	if took, _, err := b.Take(ctx, r, 3, 0); err != nil || took != 2 {
		t.Fatalf("gateway b's take after a gave back 2 = %v, %v; want 2", took, err)
	}

	if held, err := a.Hold(ctx, c, "gateway-a", 2, time.Minute); err != nil || held != 2 {
		t.Fatalf("gateway a's hold = %d, %v; want 2", held, err)
	}
	if held, err := b.Hold(ctx, c, "gateway-b", 3, time.Minute); err != nil || held != 1 {
		t.Fatalf("gateway b's hold = %d, %v; want the 1 slot a left of 3", held, err)
	}
	if held, err := a.Hold(ctx, c, "gateway-a", 0, time.Minute); err != nil || held != 0 {
		t.Fatalf("gateway a's give-back = %d, %v", held, err)
	}
	if held, err := b.Hold(ctx, c, "gateway-b", 3, time.Minute); err != nil || held != 3 {
		t.Fatalf("gateway b's hold once a gave its slots back = %d, %v; want 3", held, err)
	}

	if n, err := a.Alive(ctx, "gateway-a", time.Minute); err != nil || n != 1 {
		t.Fatalf("a's Alive = %d, %v; want 1", n, err)
	}
	if n, err := b.Alive(ctx, "gateway-b", time.Minute); err != nil || n != 2 {
		t.Fatalf("b's Alive = %d, %v; want 2, a counted too", n, err)
	}
}

// The Redis granter answers what Memory answers, to the bit: one seeded
// sequence of takes (uneven rates and bursts, wants and give-backs with
// parts of tokens), holds and liveness calls at uneven whole-millisecond
// times, run on both, every answer compared.
func TestRedisAnswersAsMemoryDoes(t *testing.T) {
	srv := redistest.Start(t)
	clock := slicetest.NewClock()
	mem := slice.NewMemory(clock.Now)
	red := newGranter(t, srv.Client(), "", clock.Now)
	ctx := t.Context()
	rates := []slice.Rate{
		{Key: "r1", Kind: "k", PerSecond: 3, Burst: 1},
		{Key: "r2", Kind: "k", PerSecond: 7.3, Burst: 12.5},
		{Key: "r3", Kind: "k", PerSecond: 0.7, Burst: 2},
		{Key: "r4", Kind: "k", PerSecond: 1000 / 3.0, Burst: 40},
	}
	concs := []slice.Concurrency{{Key: "c1", Kind: "k", Max: 3}, {Key: "c2", Kind: "k", Max: 10}}
	rng := rand.New(rand.NewPCG(3, 0x511ce))
	waits := 0
	for i := range 2000 {
		clock.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
		switch op := rng.IntN(10); {
		case op < 6:
			r := rates[rng.IntN(len(rates))]
			want := float64(rng.IntN(8)) + float64(rng.IntN(4))/4
			back := float64(rng.IntN(3)) * float64(rng.IntN(2)) / 2
			mt, mw, merr := mem.Take(ctx, r, want, back)
			rt, rw, rerr := red.Take(ctx, r, want, back)
			if merr != nil || rerr != nil || mt != rt || mw != rw {
				t.Fatalf("step %d: Take(%s, want %v, give back %v): memory took %v, wait %v, %v; redis took %v, wait %v, %v",
					i, r.Key, want, back, mt, mw, merr, rt, rw, rerr)
			}
			if mw > 0 {
				waits++
			}
		case op < 9:
			c := concs[rng.IntN(len(concs))]
			holder := fmt.Sprint("h", rng.IntN(4))
			want, ttl := rng.IntN(5), time.Duration(1+rng.IntN(3000))*time.Millisecond
			mh, merr := mem.Hold(ctx, c, holder, want, ttl)
			rh, rerr := red.Hold(ctx, c, holder, want, ttl)
			if merr != nil || rerr != nil || mh != rh {
				t.Fatalf("step %d: Hold(%s, %s, want %d, ttl %v): memory %d, %v; redis %d, %v", i, c.Key, holder, want, ttl, mh, merr, rh, rerr)
			}
		default:
			holder, ttl := fmt.Sprint("g", rng.IntN(4)), time.Duration(1+rng.IntN(3000))*time.Millisecond
			mn, merr := mem.Alive(ctx, holder, ttl)
			rn, rerr := red.Alive(ctx, holder, ttl)
			if merr != nil || rerr != nil || mn != rn {
				t.Fatalf("step %d: Alive(%s, ttl %v): memory %d, %v; redis %d, %v", i, holder, ttl, mn, merr, rn, rerr)
			}
		}
	}
	if waits < 100 {
		t.Fatalf("only %d takes answered a wait: the sequence does not compare waits", waits)
	}
}

// Every key the granter writes carries a TTL, so Redis collects an idle
// ceiling, and follows the documented layout.
func TestKeysCarryATTL(t *testing.T) {
	client := redistest.Start(t).Client()
	g := newGranter(t, client, "hr", nil)
	ctx := t.Context()
	if _, _, err := g.Take(ctx, slice.Rate{Key: "acme", Kind: "k", PerSecond: 10, Burst: 10}, 5, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Hold(ctx, slice.Concurrency{Key: "acme", Kind: "k", Max: 2}, "gw", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Alive(ctx, "gw", time.Minute); err != nil {
		t.Fatal(err)
	}
	for key, most := range map[string]time.Duration{
		"hr:{sl:acme}:rate": time.Minute + time.Second, // refills in 0.5 s
		"hr:{sl:acme}:hold": 2 * time.Minute,
		"hr:{sl}:alive":     2 * time.Minute,
	} {
		if ttl, err := client.PTTL(ctx, key).Result(); err != nil || ttl <= time.Minute-time.Second || ttl > most {
			t.Errorf("PTTL %s = %v, %v; want a minute past when its state is full or free, at most %v", key, ttl, err, most)
		}
	}
	if n, err := client.DBSize(ctx).Result(); err != nil || n != 3 {
		t.Errorf("DBSIZE = %d, %v; want the 3 keys above", n, err)
	}
	if _, err := g.Hold(ctx, slice.Concurrency{Key: "acme", Kind: "k", Max: 2}, "gw", 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := client.Exists(ctx, "hr:{sl:acme}:hold").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS of a ceiling's holds once every slot is given back = %d, %v; want 0", n, err)
	}
}

// schedulingSlack is what a test allows past a deadline for the goroutine
// that waited on it to run again on a loaded machine.
const schedulingSlack = 250 * time.Millisecond

// A granter whose Redis is gone answers an error within the caller's
// deadline (a gateway's Slices bounds each call by slice.DefaultTimeout,
// 100 ms): never a grant, never an invalid request.
func TestStoppedRedisIsAnErrorPromptly(t *testing.T) {
	srv := redistest.Start(t)
	g := newGranter(t, srv.Client(), "", nil)
	r := slice.Rate{Key: "acme", Kind: "k", PerSecond: 1, Burst: 1}
	c := slice.Concurrency{Key: "acme", Kind: "k", Max: 1}
	if _, _, err := g.Take(t.Context(), r, 0, 0); err != nil { // a pooled connection the kill breaks
		t.Fatal(err)
	}
	srv.Kill()
	const deadline = slice.DefaultTimeout
	calls := map[string]func(context.Context) error{
		"Take": func(ctx context.Context) error { _, _, err := g.Take(ctx, r, 1, 0); return err },
		"Hold": func(ctx context.Context) error { _, err := g.Hold(ctx, c, "gw", 1, time.Minute); return err },
		"Alive": func(ctx context.Context) error {
			_, err := g.Alive(ctx, "gw", time.Minute)
			return err
		},
	}
	for name, call := range calls {
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		switch {
		case err == nil:
			t.Errorf("%s on a stopped Redis succeeded", name)
		case errors.Is(err, slice.ErrInvalidRequest) || !strings.HasPrefix(err.Error(), "redisslice: "):
			t.Errorf("%s on a stopped Redis = %v; want a redisslice error that is not an invalid request", name, err)
		case took > deadline+schedulingSlack:
			t.Errorf("%s on a stopped Redis answered %v after %v; want an answer within its deadline of %v", name, err, took, deadline)
		}
	}
}

// New refuses a missing client.
func TestNewNeedsAClient(t *testing.T) {
	if _, err := redisslice.New(nil, redisslice.Options{}); err == nil || !strings.HasPrefix(err.Error(), "redisslice: ") {
		t.Fatalf("New(nil) = %v; want a redisslice error", err)
	}
}
