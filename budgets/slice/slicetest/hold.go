package slicetest

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// ttl is the hold and liveness TTL of the suite's fixed checks.
const ttl = 10 * time.Second

// Holders share Max: each is granted what it wants or what the others
// leave free, whichever is fewer, possibly nothing.
func testHoldGrantsUpToMax(f *fixture) {
	c := conc("acme", 5)
	f.wantHold(c, "a", 3, ttl, 3)
	f.wantHold(c, "b", 3, ttl, 2)
	f.wantHold(c, "c", 1, ttl, 0)
	f.wantHold(c, "a", 3, ttl, 3) // a still holds its three
}

// A holder's hold is set, not added to: asking again for what it holds
// holds no more, and it is granted up to what the others leave free.
func testReHoldingSets(f *fixture) {
	c := conc("acme", 5)
	f.wantHold(c, "a", 2, ttl, 2)
	f.wantHold(c, "a", 2, ttl, 2)
	f.wantHold(c, "b", 3, ttl, 3)
	f.wantHold(c, "a", 3, ttl, 2) // b holds 3 of 5
	f.wantHold(c, "a", 1, ttl, 1)
	f.wantHold(c, "b", 4, ttl, 4)
}

// A holder that shrinks its hold frees the difference for the others at
// once.
func testShrinkingFreesSlots(f *fixture) {
	c := conc("acme", 5)
	f.wantHold(c, "a", 5, ttl, 5)
	f.wantHold(c, "b", 1, ttl, 0)
	f.wantHold(c, "a", 2, ttl, 2)
	f.wantHold(c, "b", 3, ttl, 3)
	f.wantHold(c, "c", 1, ttl, 0)
}

// Want 0 gives every slot back; a holder holding nothing may ask it too.
func testWantZeroGivesBack(f *fixture) {
	c := conc("acme", 5)
	f.wantHold(c, "a", 5, ttl, 5)
	f.wantHold(c, "a", 0, ttl, 0)
	f.wantHold(c, "b", 5, ttl, 5)
	f.wantHold(c, "never", 0, ttl, 0)
}

// A hold lapses at its TTL and its slots are free for the others; a hold
// renewed within its TTL stays.
func testExpiredHoldFreesItsSlots(f *fixture) {
	c := conc("acme", 3)
	f.wantHold(c, "dead", 3, ttl, 3)
	f.clock.Advance(ttl - time.Millisecond)
	f.wantHold(c, "next", 1, ttl, 0)
	f.clock.Advance(time.Millisecond) // the TTL, to the millisecond
	f.wantHold(c, "next", 3, ttl, 3)

	renewed := conc("renewed", 1)
	f.wantHold(renewed, "alive", 1, ttl, 1)
	for range 3 {
		f.clock.Advance(6 * time.Second)
		f.wantHold(renewed, "alive", 1, ttl, 1)
	}
	f.wantHold(renewed, "other", 1, ttl, 0)
	f.clock.Advance(ttl)
	f.wantHold(renewed, "other", 1, ttl, 1)
}

// A ceiling reloaded with a lower Max grants no slot while the holds
// already there fill it, and caps a holder's next hold.
func testLoweredMaxCapsTheNextHold(f *fixture) {
	f.wantHold(conc("acme", 5), "a", 5, ttl, 5)
	f.wantHold(conc("acme", 3), "b", 1, ttl, 0)
	f.wantHold(conc("acme", 3), "a", 5, ttl, 3)
	f.wantHold(conc("acme", 3), "b", 1, ttl, 0)
	f.wantHold(conc("acme", 5), "b", 2, ttl, 2)
}

// A seeded sequence of holds, re-holds, give-backs and expiries by five
// holders at uneven times: every answer is what the holder wanted or what
// the other live holders left free, whichever is fewer, and the slots held
// by live holders never exceed Max.
func testHeldNeverExceedsMax(f *fixture) {
	const (
		holders  = 5
		maxSlots = 7
		steps    = 600
	)
	c := conc("acme", maxSlots)
	rng := rand.New(rand.NewPCG(11, 0x511ce))
	type hold struct {
		slots   int
		expires time.Time
	}
	model := map[string]hold{}
	liveOthers := func(now time.Time, except string) int {
		n := 0
		for h, hd := range model {
			if h != except && hd.expires.After(now) {
				n += hd.slots
			}
		}
		return n
	}
	for i := range steps {
		f.clock.Advance(time.Duration(rng.IntN(500)) * time.Millisecond)
		holder := fmt.Sprint("h", rng.IntN(holders))
		want := rng.IntN(6)
		ttl := time.Duration(100+rng.IntN(1900)) * time.Millisecond
		now := f.clock.Now()
		expect := max(0, min(want, maxSlots-liveOthers(now, holder)))
		held := f.hold(c, holder, want, ttl)
		if held != expect {
			f.t.Fatalf("step %d: Hold(%s, want %d) = %d; want %d (min of the want and what the other live holders leave free)",
				i, holder, want, held, expect)
		}
		if held == 0 {
			delete(model, holder)
		} else {
			model[holder] = hold{slots: held, expires: now.Add(ttl)}
		}
		if total := liveOthers(now, ""); total > maxSlots {
			f.t.Fatalf("step %d: live holders hold %d slots; want at most %d", i, total, maxSlots)
		}
	}
}

// Alive counts the live holders, the caller included, each once; a holder
// not renewed within its TTL is forgotten.
func testAliveCountsLiveHolders(f *fixture) {
	f.wantAlive("a", ttl, 1)
	f.wantAlive("b", 5*time.Second, 2)
	f.wantAlive("a", ttl, 2) // a is counted once
	f.clock.Advance(5 * time.Second)
	f.wantAlive("a", ttl, 1) // b lapsed at its TTL, to the millisecond
	f.wantAlive("b", 5*time.Second, 2)
	f.clock.Advance(ttl + time.Millisecond)
	f.wantAlive("c", ttl, 1)
}

// Alive names the granter's epoch: not empty, and the same on every call
// while the granter keeps its state, whatever was taken or held meanwhile
// and after every live holder lapsed. (A granter whose state is lost, a
// Redis restarted empty, answers another: redisslice's own tests.)
func testEpochStays(f *fixture) {
	epoch := f.wantAlive("a", ttl, 1)
	if epoch == "" {
		f.t.Fatal("Alive answered no epoch")
	}
	f.wantTake(rate("acme", 1, 2), 1, 0, 1, 0)
	f.wantTake(rate("window", 0, 2), 3, -1, 1, 0)
	f.wantHold(conc("acme", 2), "a", 1, ttl, 1)
	if again := f.wantAlive("b", ttl, 2); again != epoch {
		f.t.Fatalf("Alive's epoch went from %q to %q while the granter kept its state", epoch, again)
	}
	f.clock.Advance(10 * ttl)
	if again := f.wantAlive("c", ttl, 1); again != epoch {
		f.t.Fatalf("Alive's epoch went from %q to %q once the live holders lapsed; want it to name the state, not the living", epoch, again)
	}
}

// Each ceiling is its own: another key's bucket or slots are untouched,
// and a rate and a concurrency ceiling of one key share nothing.
func testCeilingsAreSeparate(f *fixture) {
	f.wantTake(rate("a", 1, 1), 1, 0, 1, 0)
	f.wantTake(rate("a", 1, 1), 1, 0, 0, time.Second)
	f.wantTake(rate("b", 1, 1), 1, 0, 1, 0)
	f.wantHold(conc("a", 1), "h", 1, ttl, 1)
	f.wantHold(conc("a", 1), "g", 1, ttl, 0)
	f.wantHold(conc("b", 1), "g", 1, ttl, 1)
}
