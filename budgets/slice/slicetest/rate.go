package slicetest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/hedgerow/hedgerow/budgets/slice"
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

// The bucket refills at PerSecond, continuously — a part of a token is
// there to be granted — and never past Burst however long it sits idle.
func testBucketRefillsAtItsRate(f *fixture) {
	r := rate("acme", 4, 2)
	f.wantTake(r, 2, 0, 2, 0)
	f.clock.Advance(125 * time.Millisecond)        // half a token
	f.wantTake(r, 1, 0, 0.5, 250*time.Millisecond) // the half there; a whole one in 1/4 s
	f.clock.Advance(250 * time.Millisecond)
	f.wantTake(r, 1, 0, 1, 0)
	f.clock.Advance(time.Hour) // refills to the burst, not past it
	f.wantTake(r, 5, 0, 2, 250*time.Millisecond)
}

// The wait is UntilToken's: the time until the bucket holds one whole
// token, rounded up to the millisecond; once it has passed, the token is
// there.
func testWaitIsRoundedUp(f *fixture) {
	r := rate("acme", 3, 1)
	f.wantTake(r, 1, 0, 1, 0)
	f.wantTake(r, 1, 0, 0, 334*time.Millisecond) // 1/3 s = 333.3 ms
	f.clock.Advance(334 * time.Millisecond)
	f.wantTake(r, 1, 0, 1, 0)
}

// A want past what the bucket holds is granted all there is, a part of a
// token included, with the wait to the next whole one; a want of parts of
// a token is granted as it is.
func testWantPastWhatIsThere(f *fixture) {
	r := rate("acme", 10, 4)
	f.wantTake(r, 10, 0, 4, 100*time.Millisecond)
	f.clock.Advance(250 * time.Millisecond) // 2.5
	f.wantTake(r, 10, 0, 2.5, 100*time.Millisecond)
	f.clock.Advance(time.Second) // full again
	f.wantTake(r, 1.5, 0, 1.5, 0)
	f.wantTake(r, 0.5, 0, 0.5, 0)
	f.wantTake(r, 3, 0, 2, 100*time.Millisecond)

	frac := rate("frac", 2, 2.5) // a burst of 2.5 grants 2.5
	f.wantTake(frac, 5, 0, 2.5, 500*time.Millisecond)
}

// A positive adjust puts tokens back into the bucket before the take, and
// never past its burst: a full bucket keeps none of them.
func testPositiveAdjustNeverPastTheBurst(f *fixture) {
	r := rate("acme", 1, 5)
	f.wantTake(r, 5, 0, 5, 0)
	f.wantTake(r, 0, 3, 0, 0)
	f.wantTake(r, 5, 0, 3, time.Second)
	f.wantTake(r, 0, 100, 0, 0)
	f.wantTake(r, 10, 0, 5, time.Second)
	f.wantTake(r, 2, 2, 2, 0) // put back and take again in one call
	f.wantTake(r, 1, 0, 0, time.Second)

	full := rate("full", 1, 5)
	f.wantTake(full, 0, 10, 0, 0)
	f.wantTake(full, 10, 0, 5, time.Second)
}

// A negative adjust charges what a gateway spent without asking: the
// tokens go down, below zero when they must, and that debt is paid by the
// refill before any token is granted again; the wait counts it. A charge
// comes off a bucket capped at its burst, never off a refill past it.
func testNegativeAdjustLeavesDebt(f *fixture) {
	r := rate("acme", 2, 4)
	f.wantTake(r, 0, -6, 0, 0)                     // 4 − 6 = −2
	f.wantTake(r, 1, 0, 0, 1500*time.Millisecond)  // 3 tokens to a whole one at 2/s
	f.clock.Advance(time.Second)                   // the debt paid, 0 there
	f.wantTake(r, 1, 0, 0, 500*time.Millisecond)   // still no grant
	f.clock.Advance(500 * time.Millisecond)        // 1
	f.wantTake(r, 1, 0, 1, 0)                      // the first grant since the charge
	f.clock.Advance(2 * time.Second)               // full: 4
	f.wantTake(r, 3, -2, 2, 500*time.Millisecond)  // charged, then granted what is left
	f.clock.Advance(time.Hour)                     // full, whatever the refill
	f.wantTake(r, 0, -5, 0, 0)                     // 4 − 5 = −1
	f.wantTake(r, 1, 0, 0, 1000*time.Millisecond)  // 2 tokens to a whole one
	f.wantTake(r, 1, -1, 0, 1500*time.Millisecond) // a charge with a take: −2
}

// When the live wants of the holders of a bucket exceed what it holds,
// each asker is granted its part of what is there in proportion to its
// want — another holder's want being what it asked for and did not get —:
// the holder asking first does not take it all, and one that got all it
// asked for takes no part from the next asker. A holder granted less than
// it wanted while tokens are left waits the least (1 ms).
func testContendedBucketIsShared(f *fixture) {
	r := rate("acme", 8, 8)
	f.wantTakeAs(r, "a", 8, 0, 8, 0)                    // alone: all it wants, nothing left wanting
	f.wantTakeAs(r, "b", 8, 0, 0, 125*time.Millisecond) // b goes without: it still wants 8
	f.clock.Advance(time.Second)                        // 8 there
	f.wantTakeAs(r, "a", 8, 0, 4, time.Millisecond)     // 8 × 8/16; a still wants 4
	f.wantTakeAs(r, "b", 4, 0, 2, time.Millisecond)     // 4 × 4/8; b still wants 2
	f.wantTakeAs(r, "a", 2, 0, 1, time.Millisecond)     // 2 × 2/4
	f.wantTakeAs(r, "b", 1, 0, 0.5, 63*time.Millisecond)
	// 1 × 1/2, leaving 0.5: a token in 62.5 ms
	f.clock.Advance(500 * time.Millisecond)               // 4.5 there; a wants 1, b 0.5
	f.wantTakeAs(r, "a", 1, 0, 1, 0)                      // the wants fit: all a wants
	f.wantTakeAs(r, "b", 4, 0, 3.5, 125*time.Millisecond) // a got all it asked for: b gets all there
}

// What a holder asked for and did not get counts in the sharing for
// slice.DemandWindow after it asked, to the millisecond, and no longer;
// once no other live want contends, an asker is granted all it wants. (A
// bucket that never refills keeps the tokens exact; a positive adjust puts
// some back.)
func testStaleWantTakesNoPart(f *fixture) {
	r := rate("acme", 0, 8)
	f.wantTakeAs(r, "b", 12, 0, 8, 0) // all there; b still wants 4
	f.clock.Advance(slice.DemandWindow - time.Millisecond)
	f.wantTakeAs(r, "a", 4, 4, 2, 0) // b's want still counts: 4 × 4/8; a still wants 2
	f.clock.Advance(time.Millisecond)
	f.wantTakeAs(r, "c", 2, 0, 1, 0) // b's no longer: 2 × 2/(2 + 2), not 2 × 2/8
	f.clock.Advance(slice.DemandWindow)
	f.wantTakeAs(r, "d", 1, 0, 1, 0) // nobody else's: all it wants
}

// A call that wants nothing only adjusts: it records no want, so what its
// holder still wants counts as it was.
func testAdjustOnlyCallRecordsNoWant(f *fixture) {
	r := rate("acme", 0, 8)
	f.wantTakeAs(r, "a", 8, 0, 8, 0)
	f.wantTakeAs(r, "b", 8, 0, 0, 0)
	f.wantTakeAs(r, "b", 0, 4, 0, 0) // b puts back 4 and still wants 8
	f.wantTakeAs(r, "a", 8, 0, 2, 0) // 4 × 8/16, not all 4
}

// A refilling bucket asked with a lower burst caps the tokens it holds;
// asked with a higher one it gains no token, only the room to refill to it.
func testLoweredBurstCapsTheTokens(f *fixture) {
	f.wantTake(rate("acme", 1, 10), 2, 0, 2, 0) // 8 left
	f.wantTake(rate("acme", 1, 3), 10, 0, 3, time.Second)
	f.clock.Advance(20 * time.Second)
	f.wantTake(rate("acme", 1, 10), 20, 0, 10, time.Second)
	f.wantTake(rate("acme", 1, 20), 1, 0, 0, time.Second)
	f.clock.Advance(30 * time.Second)
	f.wantTake(rate("acme", 1, 20), 30, 0, 20, time.Second)
}

// A bucket with PerSecond 0 is a budget (a window's, keyed by the window):
// it grants its burst once and never refills however long it waits, and
// a take short of its want answers no wait (UntilToken's 0). Only a
// positive adjust puts tokens back, paying a charge's debt first.
func testBudgetNeverRefills(f *fixture) {
	r := rate("window", 0, 5)
	f.wantTake(r, 3, 0, 3, 0)
	f.wantTake(r, 5, 0, 2, 0)
	f.clock.Advance(1000 * time.Hour)
	f.wantTake(r, 1, 0, 0, 0)
	f.wantTake(r, 0, 2, 0, 0)
	f.wantTake(r, 5, 0, 2, 0)
	f.wantTake(r, 0, -1.5, 0, 0) // in debt: −1.5
	f.wantTake(r, 1, 1, 0, 0)    // −0.5
	f.wantTake(r, 1, 1, 0.5, 0)
}

// A budget that never refills asked with a changed burst gains, or loses,
// the difference (slice.Rebudget): a window's limit raised by a reload
// grants the rise, a lowered one takes it off, into debt when the budget
// was spent past the new limit.
func testRebudget(f *fixture) {
	f.wantTake(rate("window", 0, 10), 4, 0, 4, 0)    // 6 left
	f.wantTake(rate("window", 0, 15), 0, 0, 0, 0)    // 6 + 5
	f.wantTake(rate("window", 0, 15), 20, 0, 11, 0)  // 0 left
	f.wantTake(rate("window", 0, 12), 1, 0, 0, 0)    // −3
	f.wantTake(rate("window", 0, 14), 1, 0, 0, 0)    // −1
	f.wantTake(rate("window", 0, 16), 5, 0, 1, 0)    // 1
	f.wantTake(rate("lowered", 0, 10), 2, 0, 2, 0)   // 8 left
	f.wantTake(rate("lowered", 0, 6), 10, 0, 4, 0)   // 8 − 4
	f.wantTake(rate("full", 0, 10), 0, 0, 0, 0)      // full at 10
	f.wantTake(rate("full", 0, 20), 30, 0, 20, 0)    // full at 20
	f.wantTake(rate("full", 0, 20), 0, 100, 0, 0)    // never past the burst
	f.wantTake(rate("full", 0, 20), 1, 0, 1, 0)      // 19 left
	f.wantTake(rate("full", 0, 10.5), 30, 0, 9.5, 0) // 19 − 9.5
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

// However many holders ask, and whatever they put back or are charged,
// over any interval of calls the tokens granted less those put back are at
// most the burst plus PerSecond times the interval; so are they plus what
// was charged, over an interval ending in a grant (a bucket in debt grants
// nothing). A seeded sequence of takes, put-backs and charges by three
// holders at uneven times, every interval checked. Each answer takes at
// most the want, parts of a token included, and waits exactly when it
// took less.
func testTokensOverAnyInterval(f *fixture) {
	const (
		holders = 3
		steps   = 500
	)
	r := rate("acme", 7.5, 12)
	rng := rand.New(rand.NewPCG(7, 0x511ce))
	type call struct {
		at                  time.Time
		took, back, charged float64
	}
	var calls []call
	holding := make([]float64, holders) // what each holder took and has not put back
	for i := range steps {
		f.clock.Advance(time.Duration(rng.IntN(250)) * time.Millisecond)
		h := rng.IntN(holders)
		holder := fmt.Sprint("h", h)
		want := float64(rng.IntN(6)) + float64(rng.IntN(4))/4
		adjust := 0.0
		switch rng.IntN(6) {
		case 0:
			adjust = holding[h] * float64(1+rng.IntN(4)) / 4 // put back part of what it holds
		case 1:
			adjust = -float64(1+rng.IntN(8)) / 2 // charge an over-use
		}
		took, wait := f.takeAs(r, holder, want, adjust)
		what := fmt.Sprintf("call %d (%s, want %v, adjust %v) = took %v, wait %v", i, holder, want, adjust, took, wait)
		switch {
		case took < 0 || took > want:
			f.t.Fatalf("%s: want 0 to the want", what)
		case (took < want) != (wait > 0):
			f.t.Fatalf("%s: a wait comes with a take short of the want, and only then", what)
		}
		c := call{at: f.clock.Now(), took: took}
		if adjust > 0 {
			c.back = adjust
			holding[h] -= adjust
		} else {
			c.charged = -adjust
		}
		holding[h] += took
		calls = append(calls, c)
	}
	const slack = 1e-9 // the sums' rounding
	grants := 0
	for i := range calls {
		net, charged := 0.0, 0.0
		for j := i; j < len(calls); j++ {
			net += calls[j].took - calls[j].back
			charged += calls[j].charged
			interval := calls[j].at.Sub(calls[i].at)
			bound := r.Burst + r.PerSecond*interval.Seconds()
			if net > bound+slack {
				f.t.Fatalf("calls %d..%d granted %v net of put-backs over %v; want at most burst + rate × interval = %v",
					i, j, net, interval, bound)
			}
			if calls[j].took > 0 && net+charged > bound+slack {
				f.t.Fatalf("calls %d..%d, the last a grant, granted %v net of put-backs and charged %v over %v; want at most burst + rate × interval = %v",
					i, j, net, charged, interval, bound)
			}
		}
		if calls[i].took > 0 {
			grants++
		}
	}
	if grants < steps/4 {
		f.t.Fatalf("only %d of %d calls granted tokens: the sequence does not check the bound", grants, steps)
	}
	// Idle for longer than the bucket takes to pay its debts and fill, it
	// grants its burst.
	f.clock.Advance(time.Hour)
	f.wantTakeAs(r, "h0", 20, 0, 12, 134*time.Millisecond)
}
