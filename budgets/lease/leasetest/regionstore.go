package leasetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets/lease"
)

// Clock is the time a region store under test reads: it stands still
// until the suite advances it, always by whole milliseconds (the
// resolution of a store that hands its clock to Redis in Unix
// milliseconds), and never sleeps.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock standing at the suite's epoch, a whole
// millisecond.
func NewClock() *Clock { return &Clock{now: t0} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// RegionStore runs the conformance suite of lease.RegionStore. newStore
// returns, for each subtest, an empty store no one else writes to (no
// leases held, no demand, the lock free; a Redis store under a key prefix
// of its own) and the Clock it reads on every call; it releases what it
// opened with t.Cleanup. Two subtests call the store from many goroutines:
// run the suite under -race.
func RegionStore(t *testing.T, newStore func(t *testing.T) (lease.RegionStore, *Clock)) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, s lease.RegionStore, c *Clock)
	}{
		{"a new store holds no lease and has no demand", regionStartsEmpty},
		{"a lease set is read back equal, its expiry compared with Equal", heldReadsBack},
		{"a lease set again replaces the last and leaves the other keys' alone", heldReplaces},
		{"the zero lease reads back as the zero lease, which Spending takes for none", zeroHeldReadsBackZero},
		{"held leases of different keys do not collide, keys with ':' '/' spaces and unicode included", heldKeysDoNotCollide},
		{"demand adds up by ceiling key until it is taken, keys kept apart", demandAddsUpByKey},
		{"a take starts the demand again from zero", takeStartsFromZero},
		{"demand added from many goroutines is taken once: the sum of every TakeDemand equals the sum added", concurrentDemandTakenOnce},
		{"held leases, demand and the lock do not touch one another", partsAreSeparate},
		{"the lock is one holder's until its ttl passes on the store's clock", lockIsOneHolders},
		{"another holder takes an expired lock", expiredLockIsTaken},
		{"a holder extends its own hold", holderExtends},
		{"an unlock frees the lock for another holder at once", unlockFrees},
		{"unlock by a holder that does not hold the lock changes nothing", foreignUnlockChangesNothing},
		{"of many holders locking at once exactly one gets the lock", oneOfManyLocks},
		{"a cancelled context fails every call and changes nothing", regionCancelledFails},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, c := newStore(t)
			tc.run(t, s, c)
		})
	}
}

// ttl is the suite's lock hold.
const ttl = 10 * time.Second

func mustHeld(t *testing.T, s lease.RegionStore) map[string]lease.Held {
	t.Helper()
	h, err := s.Held(ctxOf(t))
	if err != nil {
		t.Fatalf("held: %v", err)
	}
	return h
}

func mustSetHeld(t *testing.T, s lease.RegionStore, key string, h lease.Held) {
	t.Helper()
	if err := s.SetHeld(ctxOf(t), key, h); err != nil {
		t.Fatalf("set held %q: %v", key, err)
	}
}

func mustAddDemand(t *testing.T, s lease.RegionStore, units map[string]float64) {
	t.Helper()
	if err := s.AddDemand(ctxOf(t), units); err != nil {
		t.Fatalf("add demand %v: %v", units, err)
	}
}

func mustTakeDemand(t *testing.T, s lease.RegionStore) map[string]float64 {
	t.Helper()
	d, err := s.TakeDemand(ctxOf(t))
	if err != nil {
		t.Fatalf("take demand: %v", err)
	}
	return d
}

// locks reports whether holder gets (or keeps) the lock.
func locks(t *testing.T, s lease.RegionStore, holder string, d time.Duration) bool {
	t.Helper()
	ok, err := s.Lock(ctxOf(t), holder, d)
	if err != nil {
		t.Fatalf("lock as %q: %v", holder, err)
	}
	return ok
}

func mustUnlock(t *testing.T, s lease.RegionStore, holder string) {
	t.Helper()
	if err := s.Unlock(ctxOf(t), holder); err != nil {
		t.Fatalf("unlock as %q: %v", holder, err)
	}
}

// heldLease is a lease distinct per n, its expiry to the nanosecond and in
// a zone other than UTC, as a region's clock may read it.
func heldLease(n int) lease.Held {
	zone := time.FixedZone("UTC+5:30", 5*3600+30*60)
	return lease.Held{
		Share:   0.125 + float64(n)/1000,
		Expires: t0.Add(lease.DefaultValidity + time.Duration(n)*time.Second + 123456789*time.Nanosecond).In(zone),
	}
}

// sameHeld reports whether a and b are one lease, their expiries compared
// with Equal: a lease read back has lost its monotonic reading and may
// have another location.
func sameHeld(a, b lease.Held) bool { return a.Share == b.Share && a.Expires.Equal(b.Expires) }

// sameDemand reports whether a and b hold the same units by key.
func sameDemand(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, u := range a {
		if v, ok := b[k]; !ok || u != v {
			return false
		}
	}
	return true
}

// keys are pairs a careless encoding would map to one key: separators
// replaced, case folded, a trailing space trimmed, hash tags and JSON
// read as such.
var keys = []string{
	"tenant:acme:rate", "tenant/acme/rate", "tenant acme rate", "tenant.acme.rate", "tenant_acme_rate",
	"tenant:acme:rate ", "Tenant:Acme:Rate", "tenant:ácme:率", "tenant:🦔:concurrency", "*", ">", "a",
	"{lease}", "a}b{c", `{"share":1}`, "held", "demand", "lock",
}

func regionStartsEmpty(t *testing.T, s lease.RegionStore, _ *Clock) {
	if h := mustHeld(t, s); len(h) != 0 {
		t.Errorf("a new store holds %v, want no lease", h)
	}
	if d := mustTakeDemand(t, s); len(d) != 0 {
		t.Errorf("a new store has demand %v, want none", d)
	}
}

func heldReadsBack(t *testing.T, s lease.RegionStore, _ *Clock) {
	const key = "tenant:acme:rate"
	want := heldLease(1)
	mustSetHeld(t, s, key, want)
	got := mustHeld(t, s)
	if h, ok := got[key]; len(got) != 1 || !ok || !sameHeld(h, want) {
		t.Fatalf("held = %+v, want only %q: %+v", got, key, want)
	}
}

func heldReplaces(t *testing.T, s lease.RegionStore, _ *Clock) {
	mustSetHeld(t, s, "tenant:acme:rate", heldLease(1))
	mustSetHeld(t, s, "tenant:acme:concurrency", heldLease(2))
	mustSetHeld(t, s, "tenant:acme:rate", heldLease(3))
	got := mustHeld(t, s)
	if len(got) != 2 || !sameHeld(got["tenant:acme:rate"], heldLease(3)) || !sameHeld(got["tenant:acme:concurrency"], heldLease(2)) {
		t.Fatalf("held = %+v, want the rate's second lease %+v and the concurrency's %+v", got, heldLease(3), heldLease(2))
	}
}

func zeroHeldReadsBackZero(t *testing.T, s lease.RegionStore, _ *Clock) {
	const key = "tenant:acme:rate"
	mustSetHeld(t, s, key, heldLease(1))
	mustSetHeld(t, s, key, lease.Held{})
	h, ok := mustHeld(t, s)[key]
	if !ok || h != (lease.Held{}) {
		t.Fatalf("held %q = %+v (present %v), want the zero lease, equal with ==", key, h, ok)
	}
	o := lease.Options{Regions: []string{"east", "west"}, Fallback: 0.3}
	if got, err := lease.Spending(h, t0, o); err != nil || got != o.Fallback {
		t.Fatalf("Spending of the zero lease read back = %v, %v; want the fallback %v", got, err, o.Fallback)
	}
}

func heldKeysDoNotCollide(t *testing.T, s lease.RegionStore, _ *Clock) {
	for i, key := range keys {
		mustSetHeld(t, s, key, heldLease(i))
	}
	got := mustHeld(t, s)
	if len(got) != len(keys) {
		t.Errorf("%d keys set, %d read back: %+v", len(keys), len(got), got)
	}
	for i, key := range keys {
		if h, ok := got[key]; !ok || !sameHeld(h, heldLease(i)) {
			t.Errorf("key %q read back as %+v (present %v), want its own %+v", key, h, ok, heldLease(i))
		}
	}
}

func demandAddsUpByKey(t *testing.T, s lease.RegionStore, _ *Clock) {
	const every = "tenant:every:rate" // not one of keys: added to with each
	want := map[string]float64{}
	for i, key := range keys {
		mustAddDemand(t, s, map[string]float64{key: float64(i) + 0.25, every: 1})
		want[key] += float64(i) + 0.25
		want[every]++
	}
	mustAddDemand(t, s, map[string]float64{every: 2.5, "tenant:acme:rate": 0.5})
	want[every] += 2.5
	want["tenant:acme:rate"] += 0.5
	if got := mustTakeDemand(t, s); !sameDemand(got, want) {
		t.Fatalf("demand taken = %v, want %v", got, want)
	}
}

func takeStartsFromZero(t *testing.T, s lease.RegionStore, _ *Clock) {
	mustAddDemand(t, s, map[string]float64{"tenant:acme:rate": 3, "tenant:acme:concurrency": 2})
	if got := mustTakeDemand(t, s); !sameDemand(got, map[string]float64{"tenant:acme:rate": 3, "tenant:acme:concurrency": 2}) {
		t.Fatalf("first take = %v, want rate 3 and concurrency 2", got)
	}
	if got := mustTakeDemand(t, s); len(got) != 0 {
		t.Fatalf("a take right after a take = %v, want no demand", got)
	}
	mustAddDemand(t, s, map[string]float64{"tenant:acme:rate": 0.5})
	if got := mustTakeDemand(t, s); !sameDemand(got, map[string]float64{"tenant:acme:rate": 0.5}) {
		t.Fatalf("take after a new add = %v, want only the new 0.5 of the rate", got)
	}
}

func concurrentDemandTakenOnce(t *testing.T, s lease.RegionStore, _ *Clock) {
	// Quarters sum exactly in doubles (and in Redis' long doubles), so the
	// sums compare with ==.
	const adders, adds, takers = 8, 40, 2
	ctx := ctxOf(t)
	ceilings := []string{"tenant:acme:rate", "tenant:acme:concurrency", "tenant:🦔:rate"}
	added := map[string]float64{}
	for a := range adders {
		for i := range adds {
			added[ceilings[(a+i)%len(ceilings)]] += float64(1+(a*adds+i)%7) / 4
		}
	}
	stop := make(chan struct{})
	// A take that finds demand takes at least one add's: the channel
	// holds every one.
	takes := make(chan map[string]float64, adders*adds)
	errs := make(chan error, adders+takers)
	var adding, taking sync.WaitGroup
	for a := range adders {
		adding.Go(func() {
			for i := range adds {
				units := map[string]float64{ceilings[(a+i)%len(ceilings)]: float64(1+(a*adds+i)%7) / 4}
				if err := s.AddDemand(ctx, units); err != nil {
					errs <- fmt.Errorf("add %v: %w", units, err)
					return
				}
			}
		})
	}
	for range takers {
		taking.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, err := s.TakeDemand(ctx)
				if err != nil {
					errs <- fmt.Errorf("take: %w", err)
					return
				}
				if len(d) > 0 {
					takes <- d
				}
			}
		})
	}
	adding.Wait()
	close(stop)
	taking.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	close(takes)
	taken := map[string]float64{}
	n := 0
	for d := range takes {
		n++
		for k, u := range d {
			taken[k] += u
		}
	}
	for k, u := range mustTakeDemand(t, s) {
		taken[k] += u
	}
	if !sameDemand(taken, added) {
		t.Fatalf("the %d concurrent takes and a last one took %v, but %v was added: a unit was lost or counted twice", n, taken, added)
	}
}

func partsAreSeparate(t *testing.T, s lease.RegionStore, _ *Clock) {
	for _, key := range []string{"held", "demand", "lock", "tenant:acme:rate"} {
		mustSetHeld(t, s, key, heldLease(1))
		mustAddDemand(t, s, map[string]float64{key: 2})
	}
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a did not get the free lock")
	}
	if d := mustTakeDemand(t, s); len(d) != 4 {
		t.Fatalf("demand taken = %v, want 2 of each of the 4 keys", d)
	}
	mustUnlock(t, s, "gateway-a")
	if h := mustHeld(t, s); len(h) != 4 {
		t.Fatalf("after a take and an unlock the store holds %+v, want the 4 leases set", h)
	}
	mustSetHeld(t, s, "lock", heldLease(2))
	mustAddDemand(t, s, map[string]float64{"lock": 1})
	if !locks(t, s, "gateway-b", ttl) {
		t.Fatal("gateway-b did not get the lock gateway-a gave back: a lease or demand keyed \"lock\" took its place")
	}
	if d := mustTakeDemand(t, s); !sameDemand(d, map[string]float64{"lock": 1}) {
		t.Fatalf("demand taken = %v, want only the 1 added after the last take", d)
	}
}

func lockIsOneHolders(t *testing.T, s lease.RegionStore, c *Clock) {
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a did not get the free lock")
	}
	if locks(t, s, "gateway-b", ttl) {
		t.Fatal("gateway-b got the lock gateway-a holds")
	}
	c.Advance(ttl - time.Millisecond)
	if locks(t, s, "gateway-b", ttl) {
		t.Fatalf("gateway-b got the lock %v into gateway-a's hold of %v", ttl-time.Millisecond, ttl)
	}
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a lost the lock before its ttl passed")
	}
}

func expiredLockIsTaken(t *testing.T, s lease.RegionStore, c *Clock) {
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a did not get the free lock")
	}
	c.Advance(ttl)
	if !locks(t, s, "gateway-b", ttl) {
		t.Fatalf("gateway-b did not get the lock once gateway-a's hold of %v passed", ttl)
	}
	if locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a got the lock back while gateway-b holds it")
	}
	c.Advance(ttl - time.Millisecond)
	if locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a got the lock before gateway-b's hold passed")
	}
	c.Advance(time.Millisecond)
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a did not get the lock once gateway-b's hold passed")
	}
}

func holderExtends(t *testing.T, s lease.RegionStore, c *Clock) {
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a did not get the free lock")
	}
	c.Advance(ttl * 8 / 10)
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a could not extend its own hold")
	}
	c.Advance(ttl * 8 / 10) // past the first hold, within the extended one
	if locks(t, s, "gateway-b", ttl) {
		t.Fatal("gateway-b got the lock within gateway-a's extended hold: the extension did not count")
	}
	c.Advance(ttl * 2 / 10)
	if !locks(t, s, "gateway-b", ttl) {
		t.Fatal("gateway-b did not get the lock once gateway-a's extended hold passed")
	}
}

func unlockFrees(t *testing.T, s lease.RegionStore, _ *Clock) {
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a did not get the free lock")
	}
	mustUnlock(t, s, "gateway-a")
	if !locks(t, s, "gateway-b", ttl) {
		t.Fatal("gateway-b did not get the lock gateway-a gave back")
	}
}

func foreignUnlockChangesNothing(t *testing.T, s lease.RegionStore, _ *Clock) {
	mustUnlock(t, s, "gateway-b") // a free lock: nothing to give back, no error
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a did not get the free lock")
	}
	mustUnlock(t, s, "gateway-b")
	mustUnlock(t, s, "")
	if locks(t, s, "gateway-b", ttl) {
		t.Fatal("gateway-b got the lock after unlocking gateway-a's hold it never had")
	}
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a lost its hold to another holder's unlock")
	}
}

func oneOfManyLocks(t *testing.T, s lease.RegionStore, c *Clock) {
	const holders = 16
	ctx := ctxOf(t)
	for round := range 3 {
		won := make(chan string, holders)
		errs := make(chan error, holders)
		var wg sync.WaitGroup
		for i := range holders {
			holder := fmt.Sprintf("gateway-%d", i)
			wg.Go(func() {
				ok, err := s.Lock(ctx, holder, ttl)
				switch {
				case err != nil:
					errs <- err
				case ok:
					won <- holder
				}
			})
		}
		wg.Wait()
		close(won)
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: lock: %v", round, err)
		}
		var winners []string
		for h := range won {
			winners = append(winners, h)
		}
		if len(winners) != 1 {
			t.Fatalf("round %d: %d holders got the lock at once (%v), want exactly 1", round, len(winners), winners)
		}
		c.Advance(ttl) // the winner's hold passes: the next round starts free
	}
}

func regionCancelledFails(t *testing.T, s lease.RegionStore, c *Clock) {
	const key = "tenant:acme:rate"
	mustSetHeld(t, s, key, heldLease(1))
	mustAddDemand(t, s, map[string]float64{key: 2})
	if !locks(t, s, "gateway-a", ttl) {
		t.Fatal("gateway-a did not get the free lock")
	}
	c.Advance(ttl) // gateway-a's hold passed: a lock would succeed, but for the context
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for op, err := range map[string]error{
		"held":        func() error { _, err := s.Held(ctx); return err }(),
		"set held":    s.SetHeld(ctx, key, heldLease(2)),
		"add demand":  s.AddDemand(ctx, map[string]float64{key: 5}),
		"no demand":   s.AddDemand(ctx, nil),
		"take demand": func() error { _, err := s.TakeDemand(ctx); return err }(),
		"lock":        func() error { _, err := s.Lock(ctx, "gateway-b", ttl); return err }(),
		"unlock":      s.Unlock(ctx, "gateway-a"),
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want an error wrapping %v", op, err, context.Canceled)
		}
	}
	if h := mustHeld(t, s); len(h) != 1 || !sameHeld(h[key], heldLease(1)) {
		t.Errorf("after cancelled calls the store holds %+v, want only the first lease %+v", h, heldLease(1))
	}
	if d := mustTakeDemand(t, s); !sameDemand(d, map[string]float64{key: 2}) {
		t.Errorf("after cancelled calls the demand is %v, want the 2 added before", d)
	}
	if !locks(t, s, "gateway-a", ttl) {
		t.Error("after a cancelled lock by gateway-b, gateway-a could not take the lock back")
	}
}
