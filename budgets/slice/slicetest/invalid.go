package slicetest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/budgets/slice"
)

// A ceiling that cannot hold or a call no granter could mean is an error
// wrapping slice.ErrInvalidRequest, answered with zeros, and changes no
// state: not a refusal, which would read as an empty bucket.
func testInvalidIsAnError(f *fixture) {
	nan, inf := math.NaN(), math.Inf(1)
	valid := rate("acme", 1, 2)
	withRate := func(mod func(*slice.Rate)) slice.Rate { r := valid; mod(&r); return r }
	takes := []struct {
		name         string
		r            slice.Rate
		holder       string
		want, adjust float64
	}{
		{"empty key", withRate(func(r *slice.Rate) { r.Key = "" }), "x", 1, 0},
		{"empty kind", withRate(func(r *slice.Rate) { r.Kind = "" }), "x", 1, 0},
		{"per second negative", withRate(func(r *slice.Rate) { r.PerSecond = -1 }), "x", 1, 0},
		{"per second NaN", withRate(func(r *slice.Rate) { r.PerSecond = nan }), "x", 1, 0},
		{"per second Inf", withRate(func(r *slice.Rate) { r.PerSecond = inf }), "x", 1, 0},
		{"burst below 1", withRate(func(r *slice.Rate) { r.Burst = 0.5 }), "x", 1, 0},
		{"burst 0", withRate(func(r *slice.Rate) { r.Burst = 0 }), "x", 1, 0},
		{"burst negative", withRate(func(r *slice.Rate) { r.Burst = -1 }), "x", 1, 0},
		{"burst NaN", withRate(func(r *slice.Rate) { r.Burst = nan }), "x", 1, 0},
		{"burst Inf", withRate(func(r *slice.Rate) { r.Burst = inf }), "x", 1, 0},
		{"empty holder", valid, "", 1, 0},
		{"empty holder adjusting only", valid, "", 0, -1},
		{"want negative", valid, "x", -1, 0},
		{"want NaN", valid, "x", nan, 0},
		{"want Inf", valid, "x", inf, 0},
		{"adjust NaN", valid, "x", 1, nan},
		{"adjust Inf", valid, "x", 1, inf},
		{"adjust −Inf", valid, "x", 1, -inf},
		{"adjust NaN adjusting only", valid, "x", 0, nan},
	}
	for _, c := range takes {
		took, _, wait, err := f.g.Take(f.ctx, c.r, c.holder, c.want, c.adjust)
		if !errors.Is(err, slice.ErrInvalidRequest) || took != 0 || wait != 0 {
			f.t.Errorf("Take with %s = took %v, wait %v, %v; want 0, 0 and an error wrapping ErrInvalidRequest", c.name, took, wait, err)
		}
	}
	// The bucket is still full, and x recorded no want (one would share it).
	f.wantTake(valid, 5, 0, 2, time.Second) // the bucket is still full

	validConc := conc("acme", 2)
	withConc := func(mod func(*slice.Concurrency)) slice.Concurrency { c := validConc; mod(&c); return c }
	holds := []struct {
		name   string
		c      slice.Concurrency
		holder string
		want   int
		ttl    time.Duration
	}{
		{"empty key", withConc(func(c *slice.Concurrency) { c.Key = "" }), "h", 1, ttl},
		{"empty kind", withConc(func(c *slice.Concurrency) { c.Kind = "" }), "h", 1, ttl},
		{"max 0", withConc(func(c *slice.Concurrency) { c.Max = 0 }), "h", 1, ttl},
		{"max negative", withConc(func(c *slice.Concurrency) { c.Max = -1 }), "h", 1, ttl},
		{"empty holder", validConc, "", 1, ttl},
		{"want negative", validConc, "h", -1, ttl},
		{"TTL 0", validConc, "h", 1, 0},
		{"TTL negative", validConc, "h", 1, -time.Second},
	}
	for _, c := range holds {
		held, err := f.g.Hold(f.ctx, c.c, c.holder, c.want, c.ttl)
		if !errors.Is(err, slice.ErrInvalidRequest) || held != 0 {
			f.t.Errorf("Hold with %s = %d, %v; want 0 and an error wrapping ErrInvalidRequest", c.name, held, err)
		}
	}
	f.wantHold(validConc, "other", 2, ttl, 2) // no slot was held

	alive := []struct {
		name   string
		holder string
		ttl    time.Duration
	}{
		{"empty holder", "", ttl},
		{"TTL 0", "h", 0},
		{"TTL negative", "h", -time.Second},
	}
	for _, c := range alive {
		n, epoch, err := f.g.Alive(f.ctx, c.holder, c.ttl)
		if !errors.Is(err, slice.ErrInvalidRequest) || n != 0 || epoch != "" {
			f.t.Errorf("Alive with %s = %d, %q, %v; want 0, no epoch and an error wrapping ErrInvalidRequest", c.name, n, epoch, err)
		}
	}
	f.wantAlive("other", ttl, 1) // no holder was recorded
}

// Many goroutines taking from one bucket at one instant are granted
// exactly what it holds between them, never more: as one holder, or as
// holders of their own, each granted its share.
func testConcurrentTakes(f *fixture) {
	const (
		callers = 16
		calls   = 5
		burst   = 20
	)
	for _, shared := range []bool{true, false} {
		r := rate(fmt.Sprint("shared-holder-", shared), 1, burst)
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			total float64
		)
		for i := range callers {
			holder := "h"
			if !shared {
				holder = fmt.Sprint("h", i)
			}
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), 0x511ce))
				for range calls {
					took, _, _, err := f.g.Take(f.ctx, r, holder, float64(1+rng.IntN(3)), 0)
					if err != nil {
						f.t.Error(err)
						return
					}
					mu.Lock()
					total += took
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		switch {
		case shared && total != burst:
			f.t.Fatalf("%d goroutines of one holder took %v tokens from a bucket of %d with at least twice that wanted; want exactly %d",
				callers, total, burst, burst)
		case !shared && (total > burst+1e-9 || total <= 0):
			f.t.Fatalf("%d holders took %v tokens from a bucket of %d at once; want some, at most %d",
				callers, total, burst, burst)
		}
	}
}

// Many holders holding, re-holding and shrinking at once never hold more
// than Max between them: each holder's last answer is what it holds, and a
// late holder is granted exactly what they leave.
func testConcurrentHolds(f *fixture) {
	const (
		holders = 16
		rounds  = 4
		maxHeld = 10
	)
	c := conc("acme", maxHeld)
	var wg sync.WaitGroup
	last := make([]int, holders)
	for i := range holders {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 0x511ce))
			for range rounds {
				held, err := f.g.Hold(f.ctx, c, fmt.Sprint("h", i), rng.IntN(4), time.Minute)
				if err != nil {
					f.t.Error(err)
					return
				}
				last[i] = held
			}
		})
	}
	wg.Wait()
	total := 0
	for _, n := range last {
		total += n
	}
	if total > maxHeld {
		f.t.Fatalf("%d concurrent holders hold %d slots; want at most %d", holders, total, maxHeld)
	}
	f.wantHold(c, "late", maxHeld, time.Minute, maxHeld-total)
}
