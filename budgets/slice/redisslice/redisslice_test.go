package redisslice_test

import (
	"context"
	"errors"
	"fmt"
	"math"
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
	aliveSlot, err1 := client.ClusterKeySlot(ctx, "hr:{sl}:alive").Result()
	epochSlot, err2 := client.ClusterKeySlot(ctx, "hr:{sl}:epoch").Result()
	if err := errors.Join(err1, err2); err != nil || aliveSlot != epochSlot {
		t.Errorf("the live holders in slot %d, the epoch in slot %d (%v); want one slot, for one script", aliveSlot, epochSlot, err)
	}
}

// Two gateways, each with its own connection to one Redis, share one
// bucket, one set of slots, one count of the living and one epoch: what
// one takes or holds, the other cannot, and each is granted its share of
// a contended bucket.
func TestTwoGatewaysShareOneBucketAndOneSetOfSlots(t *testing.T) {
	srv := redistest.Start(t)
	clock := slicetest.NewClock()
	a := newGranter(t, srv.Client(), "", clock.Now)
	b := newGranter(t, srv.Client(), "", clock.Now)
	ctx := t.Context()
	r := slice.Rate{Key: "tenant:acme:rate", Kind: "tenant_rate", PerSecond: 2, Burst: 4}
	c := slice.Concurrency{Key: "tenant:acme:concurrency", Kind: "tenant_concurrency", Max: 3}

	if took, _, wait, err := a.Take(ctx, r, "gateway-a", 3, 0); err != nil || took != 3 || wait != 0 {
		t.Fatalf("gateway a's take = %v, %v, %v; want 3 of the burst of 4", took, wait, err)
	}
	if took, _, wait, err := b.Take(ctx, r, "gateway-b", 3, 0); err != nil || took != 1 || wait != 500*time.Millisecond {
		t.Fatalf("gateway b's take = %v, wait %v, %v; want the 1 token a left (a got all it asked for), wait 500ms", took, wait, err)
	}
	if _, _, _, err := a.Take(ctx, r, "gateway-a", 0, 2); err != nil { // a puts back 2 it did not spend
		t.Fatal(err)
	}
	if took, _, _, err := a.Take(ctx, r, "gateway-a", 2, 0); err != nil || took != 1 {
		t.Fatalf("gateway a's take after it put back 2 = %v, %v; want half of the 2 there (b still wants 2)", took, err)
	}
	if took, _, _, err := b.Take(ctx, r, "gateway-b", 1, 0); err != nil || took != 0.5 {
		t.Fatalf("gateway b's take = %v, %v; want half of the 1 left (a still wants 1)", took, err)
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

	n, epochA, err := a.Alive(ctx, "gateway-a", time.Minute)
	if err != nil || n != 1 || epochA == "" {
		t.Fatalf("a's Alive = %d, %q, %v; want 1 and an epoch", n, epochA, err)
	}
	if n, epochB, err := b.Alive(ctx, "gateway-b", time.Minute); err != nil || n != 2 || epochB != epochA {
		t.Fatalf("b's Alive = %d, %q, %v; want 2, a counted too, and a's epoch %q", n, epochB, err, epochA)
	}
}

// The Redis granter answers what Memory answers, to the bit: one seeded
// sequence of takes by four holders (uneven rates and bursts, budgets that
// never refill, bursts changed by a reload, wants with parts of tokens,
// puts back and charges, calls that only adjust), holds and liveness calls
// at uneven whole-millisecond times, run on both, every answer compared;
// each granter's epoch stays its own.
func TestRedisAnswersAsMemoryDoes(t *testing.T) {
	srv := redistest.Start(t)
	clock := slicetest.NewClock()
	mem := slice.NewMemory(clock.Now)
	red := newGranter(t, srv.Client(), "", clock.Now)
	ctx := t.Context()
	rates := []slice.Rate{
		{Key: "r1", Kind: "k", PerSecond: 3, Burst: 1},
		{Key: "r2", Kind: "k", PerSecond: 7.3, Burst: 12.5},
		{Key: "r2", Kind: "k", PerSecond: 7.3, Burst: 6}, // r2 reloaded with a lower burst, and back
		{Key: "r3", Kind: "k", PerSecond: 0.7, Burst: 2},
		{Key: "r4", Kind: "k", PerSecond: 1000 / 3.0, Burst: 40},
		{Key: "w1", Kind: "k", PerSecond: 0, Burst: 10},
		{Key: "w1", Kind: "k", PerSecond: 0, Burst: 14.5}, // w1 raised and lowered
		{Key: "w1", Kind: "k", PerSecond: 0, Burst: 7},
		{Key: "w2", Kind: "k", PerSecond: 0, Burst: 3},
	}
	concs := []slice.Concurrency{{Key: "c1", Kind: "k", Max: 3}, {Key: "c2", Kind: "k", Max: 10}}
	rng := rand.New(rand.NewPCG(3, 0x511ce))
	var waits, parts, charges, budgetGrants, shared int
	var memEpoch, redEpoch string
	for i := range 3000 {
		clock.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
		switch op := rng.IntN(10); {
		case op < 7:
			r := rates[rng.IntN(len(rates))]
			holder := fmt.Sprint("h", rng.IntN(4))
			want := float64(rng.IntN(12)) + float64(rng.IntN(4))/4
			if rng.IntN(6) == 0 {
				want = 0
			}
			adjust := 0.0
			switch rng.IntN(6) {
			case 0:
				adjust = float64(1+rng.IntN(12)) / 4
			case 1:
				adjust = -float64(1+rng.IntN(12)) / 4
				charges++
			}
			mt, ml, mw, merr := mem.Take(ctx, r, holder, want, adjust)
			rt, rl, rw, rerr := red.Take(ctx, r, holder, want, adjust)
			if merr != nil || rerr != nil || math.Float64bits(mt) != math.Float64bits(rt) || math.Float64bits(ml) != math.Float64bits(rl) || mw != rw {
				t.Fatalf("step %d: Take(%s per second %v burst %v, %s, want %v, adjust %v): memory took %v, left %v, wait %v, %v; redis took %v, left %v, wait %v, %v",
					i, r.Key, r.PerSecond, r.Burst, holder, want, adjust, mt, ml, mw, merr, rt, rl, rw, rerr)
			}
			if mw > 0 {
				waits++
			}
			if mt != math.Floor(mt) {
				parts++
			}
			if r.PerSecond == 0 && mt > 0 {
				budgetGrants++
			}
			if mt > 0 && mt < want && mw == time.Millisecond {
				shared++ // short of the want with tokens left: a contended bucket
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
			mn, me, merr := mem.Alive(ctx, holder, ttl)
			rn, re, rerr := red.Alive(ctx, holder, ttl)
			if merr != nil || rerr != nil || mn != rn {
				t.Fatalf("step %d: Alive(%s, ttl %v): memory %d, %v; redis %d, %v", i, holder, ttl, mn, merr, rn, rerr)
			}
			if memEpoch == "" {
				memEpoch, redEpoch = me, re
			}
			if me != memEpoch || re != redEpoch || re == "" {
				t.Fatalf("step %d: epochs memory %q, redis %q; want each granter's first, %q and %q", i, me, re, memEpoch, redEpoch)
			}
		}
	}
	for what, n := range map[string]int{
		"answered a wait": waits, "took a part of a token": parts, "charged": charges,
		"granted from a budget that never refills": budgetGrants, "shared a contended bucket": shared,
	} {
		if n < 50 {
			t.Errorf("only %d takes %s: the sequence does not compare them", n, what)
		}
		t.Logf("%d takes %s", n, what)
	}
}

// Every key the granter writes but the epoch carries a TTL, so Redis
// collects an idle ceiling, and follows the documented layout: a refilling
// bucket is kept a minute past when it would be full again, its debt paid;
// a budget that never refills, a minute when it is full, else
// KeepBudgets past its last call; holds and live holders, a minute past
// the last lapse. The epoch never expires.
func TestKeysCarryATTL(t *testing.T) {
	client := redistest.Start(t).Client()
	g := newGranter(t, client, "hr", nil)
	keep := 31 * 24 * time.Hour
	long, err := redisslice.New(client, redisslice.Options{Prefix: "kb", KeepBudgets: keep})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	takes := []struct {
		g            *redisslice.Granter
		r            slice.Rate
		want, adjust float64
	}{
		{g, slice.Rate{Key: "acme", Kind: "k", PerSecond: 10, Burst: 10}, 5, 0},     // full in 0.5 s
		{g, slice.Rate{Key: "debt", Kind: "k", PerSecond: 10, Burst: 10}, 0, -20},   // −10: full in 2 s
		{g, slice.Rate{Key: "spent", Kind: "k", PerSecond: 0, Burst: 10}, 4, 0},     // a window's budget spent from
		{g, slice.Rate{Key: "untouched", Kind: "k", PerSecond: 0, Burst: 10}, 0, 0}, // full
		{long, slice.Rate{Key: "spent", Kind: "k", PerSecond: 0, Burst: 10}, 1, 0},  // kept as its granter says
	}
	for _, tk := range takes {
		if _, _, _, err := tk.g.Take(ctx, tk.r, "gw", tk.want, tk.adjust); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Hold(ctx, slice.Concurrency{Key: "acme", Kind: "k", Max: 2}, "gw", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Alive(ctx, "gw", time.Minute); err != nil {
		t.Fatal(err)
	}
	for key, span := range map[string][2]time.Duration{
		"hr:{sl:acme}:rate":      {time.Minute, time.Minute + 500*time.Millisecond},
		"hr:{sl:debt}:rate":      {time.Minute + time.Second, time.Minute + 2*time.Second},
		"hr:{sl:spent}:rate":     {redisslice.DefaultKeepBudgets - time.Minute, redisslice.DefaultKeepBudgets},
		"hr:{sl:untouched}:rate": {time.Minute - time.Second, time.Minute},
		"kb:{sl:spent}:rate":     {keep - time.Minute, keep},
		"hr:{sl:acme}:hold":      {2*time.Minute - time.Second, 2 * time.Minute},
		"hr:{sl}:alive":          {2*time.Minute - time.Second, 2 * time.Minute},
	} {
		if ttl, err := client.PTTL(ctx, key).Result(); err != nil || ttl <= span[0]-time.Second || ttl > span[1] {
			t.Errorf("PTTL %s = %v, %v; want within (%v, %v]", key, ttl, err, span[0]-time.Second, span[1])
		}
	}
	if ttl, err := client.PTTL(ctx, "hr:{sl}:epoch").Result(); err != nil || ttl != -1 {
		t.Errorf("PTTL of the epoch = %v, %v; want -1, no expiry: it must outlive the state it names", ttl, err)
	}
	if n, err := client.DBSize(ctx).Result(); err != nil || n != 8 {
		t.Errorf("DBSIZE = %d, %v; want the 8 keys above", n, err)
	}
	if _, err := g.Hold(ctx, slice.Concurrency{Key: "acme", Kind: "k", Max: 2}, "gw", 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := client.Exists(ctx, "hr:{sl:acme}:hold").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS of a ceiling's holds once every slot is given back = %d, %v; want 0", n, err)
	}
}

// A bucket's hash keeps only the wants made within slice.DemandWindow:
// every call, one that only adjusts included, deletes the older ones, so
// its size is bounded by the holders asking at once.
func TestWantsOlderThanTheDemandWindowAreDeleted(t *testing.T) {
	client := redistest.Start(t).Client()
	clock := slicetest.NewClock()
	g := newGranter(t, client, "hr", clock.Now)
	ctx := t.Context()
	r := slice.Rate{Key: "acme", Kind: "k", PerSecond: 1, Burst: 1}
	const key = "hr:{sl:acme}:rate"
	for i := range 50 { // the first gets the one token there, none what it asked for
		if _, _, _, err := g.Take(ctx, r, fmt.Sprint("gw-", i), 2, 0); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := client.HLen(ctx, key).Result(); err != nil || n != 3+50 {
		t.Fatalf("HLEN after 50 holders asked = %d, %v; want tokens, at, burst and 50 wants", n, err)
	}
	clock.Advance(slice.DemandWindow - time.Millisecond)
	if _, _, _, err := g.Take(ctx, r, "late", 0, 1); err != nil {
		t.Fatal(err)
	}
	if n, err := client.HLen(ctx, key).Result(); err != nil || n != 3+50 {
		t.Fatalf("HLEN a millisecond before the wants are stale = %d, %v; want them all still", n, err)
	}
	clock.Advance(time.Millisecond)
	if _, _, _, err := g.Take(ctx, r, "late", 0, 1); err != nil {
		t.Fatal(err)
	}
	if n, err := client.HLen(ctx, key).Result(); err != nil || n != 3 {
		t.Fatalf("HLEN once the wants are stale = %d, %v; want tokens, at and burst only", n, err)
	}
	if _, _, _, err := g.Take(ctx, r, "late", 2.5, 0); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("1.5:%d", clock.Now().UnixMilli())
	if got, err := client.HGet(ctx, key, "w:late").Result(); err != nil || got != want {
		t.Fatalf("HGET w:late = %q, %v; want %q, what it did not get of its want and when it asked", got, err, want)
	}
}

// A Redis restarted empty answers a new epoch, so the gateways learn that
// the budgets that never refill came back full and charge again what they
// spent of them; while it runs, the epoch stays.
func TestEpochChangesWhenRedisRestartsEmpty(t *testing.T) {
	srv := redistest.Start(t)
	clock := slicetest.NewClock()
	g := newGranter(t, srv.Client(), "", clock.Now)
	ctx := t.Context()
	window := slice.Rate{Key: "tenant:acme:spend:86400000:0", Kind: "tenant_spend", Burst: 100}
	_, before, err := g.Alive(ctx, "gw", time.Minute)
	if err != nil || before == "" {
		t.Fatalf("Alive = %q, %v; want an epoch", before, err)
	}
	if took, _, _, err := g.Take(ctx, window, "gw", 60, 0); err != nil || took != 60 {
		t.Fatalf("Take = %v, %v; want 60", took, err)
	}
	if _, again, err := g.Alive(ctx, "gw", time.Minute); err != nil || again != before {
		t.Fatalf("Alive again = %q, %v; want the same epoch %q", again, err, before)
	}

	srv.Kill()
	srv.Restart()
	// The pooled connections died with the server: the first calls may
	// fail before go-redis dials again.
	var after string
	for range 5 {
		if _, after, err = g.Alive(ctx, "gw", time.Minute); err == nil {
			break
		}
	}
	if err != nil || after == "" || after == before {
		t.Fatalf("Alive after an empty restart = %q, %v; want a new epoch, not %q", after, err, before)
	}
	if took, _, _, err := g.Take(ctx, window, "gw", 100, 0); err != nil || took != 100 {
		t.Fatalf("Take after the restart = %v, %v; want the whole 100: the state the new epoch names is empty", took, err)
	}
	if _, again, err := g.Alive(ctx, "gw", time.Minute); err != nil || again != after {
		t.Fatalf("Alive again after the restart = %q, %v; want %q", again, err, after)
	}
}

// New refuses a negative KeepBudgets.
func TestNewRefusesANegativeKeep(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer func() { _ = client.Close() }()
	if _, err := redisslice.New(client, redisslice.Options{KeepBudgets: -time.Second}); err == nil || !strings.HasPrefix(err.Error(), "redisslice: ") {
		t.Fatalf("New(KeepBudgets −1s) = %v; want a redisslice error", err)
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
	if _, _, _, err := g.Take(t.Context(), r, "gw", 0, 0); err != nil { // a pooled connection the kill breaks
		t.Fatal(err)
	}
	srv.Kill()
	const deadline = slice.DefaultTimeout
	calls := map[string]func(context.Context) error{
		"Take": func(ctx context.Context) error { _, _, _, err := g.Take(ctx, r, "gw", 1, 0); return err },
		"Hold": func(ctx context.Context) error { _, err := g.Hold(ctx, c, "gw", 1, time.Minute); return err },
		"Alive": func(ctx context.Context) error {
			_, _, err := g.Alive(ctx, "gw", time.Minute)
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
