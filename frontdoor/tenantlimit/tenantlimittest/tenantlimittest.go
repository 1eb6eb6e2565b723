// Package tenantlimittest is the conformance suite of tenantlimit.Store
// implementations: the memory store and the Redis one run the same
// behaviour checks, on a clock the suite advances (never a sleep).
package tenantlimittest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
)

// Clock is the settable clock the suite's stores read; the suite only
// advances it.
type Clock = frontdoortest.SettableClock

// NewClock returns a clock at a fixed instant.
func NewClock() *Clock { return frontdoortest.NewSettableClock() }

// Factory returns a fresh, empty store on clock.
type Factory func(t *testing.T, clock *Clock) tenantlimit.Store

// Run runs the suite against the stores newStore makes.
func Run(t *testing.T, newStore Factory) {
	ctx := context.Background()
	take := func(t *testing.T, s tenantlimit.Store, key string, rate float64, burst int) (bool, time.Duration) {
		t.Helper()
		ok, wait, err := s.Take(ctx, key, rate, burst)
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		return ok, wait
	}
	acquire := func(t *testing.T, s tenantlimit.Store, key, holder string, max int, ttl time.Duration) bool {
		t.Helper()
		ok, err := s.Acquire(ctx, key, holder, max, ttl)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return ok
	}

	t.Run("a full bucket gives its burst then refuses with the time to the next token", func(t *testing.T) {
		s := newStore(t, NewClock())
		for i := range 3 {
			if ok, _ := take(t, s, "acme", 2, 3); !ok {
				t.Fatalf("take %d of a burst of 3 refused", i+1)
			}
		}
		ok, wait := take(t, s, "acme", 2, 3)
		if ok || wait != 500*time.Millisecond {
			t.Fatalf("4th take = %v, wait %v; want refused, wait 500ms (one token at 2/s)", ok, wait)
		}
	})
	t.Run("the bucket refills at its rate and never past its burst", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		for range 2 {
			take(t, s, "acme", 4, 2)
		}
		clock.Advance(100 * time.Millisecond) // 0.4 of a token
		if ok, wait := take(t, s, "acme", 4, 2); ok || wait != 150*time.Millisecond {
			t.Fatalf("take after 100ms = %v, wait %v; want refused, wait 150ms", ok, wait)
		}
		clock.Advance(150 * time.Millisecond)
		if ok, _ := take(t, s, "acme", 4, 2); !ok {
			t.Fatal("take once a token refilled was refused")
		}
		clock.Advance(time.Hour) // refills to the burst, not past it
		for i := range 2 {
			if ok, _ := take(t, s, "acme", 4, 2); !ok {
				t.Fatalf("take %d after an idle hour refused", i+1)
			}
		}
		if ok, _ := take(t, s, "acme", 4, 2); ok {
			t.Fatal("a bucket idle for an hour gave more than its burst")
		}
	})
	t.Run("tenants have buckets of their own", func(t *testing.T) {
		s := newStore(t, NewClock())
		take(t, s, "a", 1, 1)
		if ok, _ := take(t, s, "a", 1, 1); ok {
			t.Fatal("tenant a's second take in a burst of 1 admitted")
		}
		if ok, _ := take(t, s, "b", 1, 1); !ok {
			t.Fatal("tenant b refused for tenant a's bucket")
		}
	})
	t.Run("slots are held up to max and freed by release", func(t *testing.T) {
		s := newStore(t, NewClock())
		for i := range 2 {
			if !acquire(t, s, "acme", fmt.Sprint("h", i), 2, time.Minute) {
				t.Fatalf("slot %d of 2 refused", i+1)
			}
		}
		if acquire(t, s, "acme", "h2", 2, time.Minute) {
			t.Fatal("a third slot of 2 was given")
		}
		if !acquire(t, s, "other", "h2", 2, time.Minute) {
			t.Fatal("another tenant refused for acme's slots")
		}
		if err := s.Release(ctx, "acme", "h0"); err != nil {
			t.Fatal(err)
		}
		if !acquire(t, s, "acme", "h2", 2, time.Minute) {
			t.Fatal("a released slot was not given again")
		}
		if err := s.Release(ctx, "acme", "never-held"); err != nil {
			t.Fatalf("releasing a slot never held: %v", err)
		}
	})
	t.Run("a lease not refreshed expires and frees its slot", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		acquire(t, s, "acme", "dead", 1, 10*time.Second)
		clock.Advance(9 * time.Second)
		if acquire(t, s, "acme", "next", 1, 10*time.Second) {
			t.Fatal("a live lease's slot was given away")
		}
		clock.Advance(time.Second)
		if !acquire(t, s, "acme", "next", 1, 10*time.Second) {
			t.Fatal("the slot of a lease past its TTL was not freed")
		}
		if ok, err := s.Refresh(ctx, "acme", "dead", 10*time.Second); err != nil || ok {
			t.Fatalf("Refresh of an expired lease = %v, %v; want false", ok, err)
		}
	})
	t.Run("a refreshed lease outlives its first TTL", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		acquire(t, s, "acme", "alive", 1, 10*time.Second)
		for range 3 {
			clock.Advance(6 * time.Second)
			if ok, err := s.Refresh(ctx, "acme", "alive", 10*time.Second); err != nil || !ok {
				t.Fatalf("Refresh of a live lease = %v, %v", ok, err)
			}
		}
		if acquire(t, s, "acme", "other", 1, 10*time.Second) {
			t.Fatal("the slot of a refreshed lease was given away")
		}
		if ok, err := s.Refresh(ctx, "acme", "never", 10*time.Second); err != nil || ok {
			t.Fatalf("Refresh of a lease never held = %v, %v; want false", ok, err)
		}
	})
	t.Run("concurrent acquires never give more than max", func(t *testing.T) {
		s := newStore(t, NewClock())
		const callers, slots = 16, 5
		var wg sync.WaitGroup
		var mu sync.Mutex
		granted := 0
		for i := range callers {
			wg.Go(func() {
				ok, err := s.Acquire(ctx, "acme", fmt.Sprint("h", i), slots, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					granted++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if granted != slots {
			t.Fatalf("%d of %d concurrent acquires granted; want exactly %d", granted, callers, slots)
		}
	})
	t.Run("concurrent takes never give more than the burst", func(t *testing.T) {
		s := newStore(t, NewClock())
		const callers, burst = 16, 5
		var wg sync.WaitGroup
		var mu sync.Mutex
		granted := 0
		for range callers {
			wg.Go(func() {
				ok, _, err := s.Take(ctx, "acme", 1, burst)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					granted++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if granted != burst {
			t.Fatalf("%d of %d concurrent takes granted; want exactly the burst, %d", granted, callers, burst)
		}
	})
}
