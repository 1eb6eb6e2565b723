package slicetest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// A fresh bucket is full: it grants its burst, then refuses with the time
// until it holds one more token. Asking for nothing takes nothing and
// answers no wait.
func testFreshBucketGrantsItsBurst(f *fixture) {
	r := rate("acme", 2, 3)
	f.wantTake(r, 1, 0, 1, 0)
	f.wantTake(r, 2, 0, 2, 0)
	f.wantTake(r, 1, 0, 0, 500*time.Millisecond) // one token at 2/s
	f.wantTake(r, 0, 0, 0, 0)
}

// The bucket refills at PerSecond, continuously, and never past Burst
// however long it sits idle.
func testBucketRefillsAtItsRate(f *fixture) {
	r := rate("acme", 4, 2)
	f.wantTake(r, 2, 0, 2, 0)
	f.clock.Advance(100 * time.Millisecond)      // 0.4 of a token
	f.wantTake(r, 1, 0, 0, 150*time.Millisecond) // 0.6 to go at 4/s
	f.clock.Advance(200 * time.Millisecond)      // 1.2
	f.wantTake(r, 1, 0, 1, 0)
	f.clock.Advance(time.Hour) // refills to the burst, not past it
	f.wantTake(r, 5, 0, 2, 250*time.Millisecond)
}

// The wait is UntilToken's: the time until the bucket holds one whole
// token, rounded up to the millisecond, at least one.
func testWaitIsRoundedUp(f *fixture) {
	r := rate("acme", 3, 1)
	f.wantTake(r, 1, 0, 1, 0)
	f.clock.Advance(100 * time.Millisecond)      // 0.3
	f.wantTake(r, 1, 0, 0, 234*time.Millisecond) // 0.7 / 3 = 233.3 ms
	f.clock.Advance(233 * time.Millisecond)      // 0.999
	f.wantTake(r, 1, 0, 0, time.Millisecond)     // 0.33 ms, rounded up
	f.clock.Advance(time.Millisecond)
	f.wantTake(r, 1, 0, 1, 0)
}

// Given-back tokens go back into the bucket before the take, and never
// past its burst: a full bucket keeps none of them.
func testGiveBackNeverPastTheBurst(f *fixture) {
	r := rate("acme", 1, 5)
	f.wantTake(r, 5, 0, 5, 0)
	f.wantTake(r, 0, 3, 0, 0)
	f.wantTake(r, 5, 0, 3, time.Second)
	f.wantTake(r, 0, 100, 0, 0)
	f.wantTake(r, 10, 0, 5, time.Second)
	f.wantTake(r, 2, 2, 2, 0) // give back and take again in one call
	f.wantTake(r, 1, 0, 0, time.Second)

	full := rate("full", 1, 5)
	f.wantTake(full, 0, 10, 0, 0)
	f.wantTake(full, 10, 0, 5, time.Second)
}

// A want past what the bucket holds is granted the whole tokens there
// (the floor: a part of a token is never granted) with the wait to the
// next one; a part of a token wanted is never granted either.
func testWantPastWhatIsThere(f *fixture) {
	r := rate("acme", 10, 4)
	f.wantTake(r, 10, 0, 4, 100*time.Millisecond)
	f.clock.Advance(250 * time.Millisecond) // 2.5
	f.wantTake(r, 10, 0, 2, 50*time.Millisecond)
	f.clock.Advance(time.Second) // full again
	if took, _ := f.take(r, 1.5, 0); took != 1 {
		f.t.Fatalf("Take(want 1.5) of a full bucket of 4 took %v; want 1, the whole tokens wanted", took)
	}
	if took, _ := f.take(r, 0.5, 0); took != 0 {
		f.t.Fatalf("Take(want 0.5) took %v; want 0", took)
	}
	f.wantTake(r, 3, 0, 3, 0)

	frac := rate("frac", 2, 2.5) // a burst of 2.5 grants 2 and waits for the third
	f.wantTake(frac, 5, 0, 2, 250*time.Millisecond)
}

// A ceiling reloaded with a lower burst caps the tokens its bucket
// already holds; raised again, the bucket refills to the new burst.
func testLoweredBurstCapsTheTokens(f *fixture) {
	f.wantTake(rate("acme", 1, 10), 2, 0, 2, 0) // 8 left
	f.wantTake(rate("acme", 1, 3), 10, 0, 3, time.Second)
	f.clock.Advance(20 * time.Second)
	f.wantTake(rate("acme", 1, 10), 20, 0, 10, time.Second)
}

// A bucket refilled very slowly answers the wait to its next token, or
// the longest wait a time.Duration holds when that is longer: never a
// negative or wrapped-around one.
func testVerySlowBucketsWait(f *fixture) {
	slow := rate("slow", 0.001, 1)
	f.wantTake(slow, 1, 0, 1, 0)
	f.wantTake(slow, 1, 0, 0, 1000*time.Second)

	for _, perSecond := range []float64{1e-12, 1e-20} { // 10^15 and 10^23 ms to a token: past any Duration
		glacial := rate(fmt.Sprint("glacial-", perSecond), perSecond, 1)
		f.wantTake(glacial, 1, 0, 1, 0)
		f.wantTake(glacial, 1, 0, 0, time.Duration(math.MaxInt64))
	}
}

// However many callers ask, and whatever they give back, the tokens
// granted less those given back over any interval of calls are at most the
// burst plus PerSecond times the interval: a seeded sequence of takes and
// give-backs by three callers at uneven times, every interval checked.
// Each answer is whole, at most what was wanted, and waits exactly when it
// took less than wanted.
func testTokensOverAnyInterval(f *fixture) {
	const (
		callers = 3
		steps   = 500
	)
	r := rate("acme", 7.5, 12)
	rng := rand.New(rand.NewPCG(7, 0x511ce))
	type call struct {
		at  time.Time
		net float64 // took − given back
	}
	var calls []call
	holding := make([]float64, callers) // what each caller took and has not given back
	for i := range steps {
		f.clock.Advance(time.Duration(rng.IntN(250)) * time.Millisecond)
		c := rng.IntN(callers)
		want := float64(rng.IntN(6))
		if rng.IntN(4) == 0 {
			want += 0.5
		}
		back := 0.0
		if holding[c] >= 1 && rng.IntN(3) == 0 {
			back = float64(1 + rng.IntN(int(holding[c])))
		}
		took, wait := f.take(r, want, back)
		what := fmt.Sprintf("call %d (caller %d, want %v, give back %v) = took %v, wait %v", i, c, want, back, took, wait)
		switch {
		case took != math.Floor(took) || took < 0 || took > math.Floor(want):
			f.t.Fatalf("%s: want a whole number of tokens, at most the whole tokens wanted", what)
		case (took < want) != (wait > 0):
			f.t.Fatalf("%s: a wait comes with a take short of the want, and only then", what)
		case wait < 0:
			f.t.Fatalf("%s: a negative wait", what)
		}
		holding[c] += took - back
		calls = append(calls, call{at: f.clock.Now(), net: took - back})
	}
	for i := range calls {
		net := 0.0
		for j := i; j < len(calls); j++ {
			net += calls[j].net
			bound := r.Burst + r.PerSecond*calls[j].at.Sub(calls[i].at).Seconds()
			if net > bound+1e-9 {
				f.t.Fatalf("calls %d..%d granted %v net over %v; want at most burst + rate × interval = %v",
					i, j, net, calls[j].at.Sub(calls[i].at), bound)
			}
		}
	}
	// Idle for longer than the bucket takes to fill, it grants its burst.
	f.clock.Advance(2 * time.Second)
	f.wantTake(r, 20, 0, 12, 134*time.Millisecond)
}
