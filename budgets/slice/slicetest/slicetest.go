// Package slicetest is the conformance suite of slice.Granter
// implementations: slice.Memory in its own tests, redisslice against a real
// redis-server (standalone and cluster). Each subtest is named after the
// rule of the Granter's contract (budgets/slice, docs/architecture.md §7
// "Slices") it checks.
//
// Contract for a factory:
//   - it returns a granter with no state of its own: no buckets, holds or
//     live holders (a Redis factory uses a fresh key prefix per call), and
//     releases what it opened with t.Cleanup;
//   - the granter's clock is the Clock it is given, read on every call; the
//     suite only advances it, never sleeps, and always by whole
//     milliseconds, the resolution of a store that hands its clock to Redis
//     in Unix milliseconds; so every answer is exact, waits and parts of a
//     token included (the fixed cases use rates, times and wants whose
//     doubles are exact);
//   - the granter must be safe for concurrent use: two subtests drive it
//     from many goroutines and must be run under -race.
package slicetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets/slice"
)

// Epoch is where every suite clock starts, on a whole millisecond.
var Epoch = time.Date(2025, 1, 1, 0, 10, 0, 0, time.UTC)

// Clock is the time a granter under test reads. The suite moves it only by
// calling Advance.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock standing at Epoch.
func NewClock() *Clock { return &Clock{now: Epoch} }

// Now returns the clock's current time.
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

// Factory returns an empty granter whose time is clock.
type Factory func(t *testing.T, clock *Clock) slice.Granter

// Run runs the whole conformance suite against the granters newGranter
// returns, one fresh granter (and clock) per subtest.
func Run(t *testing.T, newGranter Factory) {
	tests := []struct {
		name string
		run  func(*fixture)
	}{
		{"FreshBucketGrantsItsBurstThenRefusesWithTheWaitToTheNextToken", testFreshBucketGrantsItsBurst},
		{"BucketRefillsAtItsRateNeverPastItsBurst", testBucketRefillsAtItsRate},
		{"WaitIsTheTimeToTheNextWholeTokenRoundedUpToTheMillisecond", testWaitIsRoundedUp},
		{"WantPastWhatIsThereGrantsAllThereIsPartsOfATokenIncluded", testWantPastWhatIsThere},
		{"PositiveAdjustPutsTokensBackNeverPastTheBurst", testPositiveAdjustNeverPastTheBurst},
		{"NegativeAdjustChargesIntoDebtThatTheRefillPaysBeforeAGrant", testNegativeAdjustLeavesDebt},
		{"ContendedBucketIsSharedInProportionToTheLiveWants", testContendedBucketIsShared},
		{"WantOlderThanTheDemandWindowTakesNoPart", testStaleWantTakesNoPart},
		{"AdjustOnlyCallRecordsNoWant", testAdjustOnlyCallRecordsNoWant},
		{"LoweredBurstCapsARefillingBucketAndARaisedOneAddsNoToken", testLoweredBurstCapsTheTokens},
		{"BudgetThatNeverRefillsGrantsItsBurstOnceAndAnswersNoWait", testBudgetNeverRefills},
		{"RaisedOrLoweredBurstOfABudgetThatNeverRefillsAddsOrRemovesTheDifference", testRebudget},
		{"VerySlowBucketsWaitIsLongNeverNegative", testVerySlowBucketsWait},
		{"TokensGrantedOverAnyIntervalStayWithinBurstPlusRefill", testTokensOverAnyInterval},
		{"HoldGrantsUpToMaxAcrossHolders", testHoldGrantsUpToMax},
		{"ReHoldingSetsTheHoldersSlotsNotAdds", testReHoldingSets},
		{"ShrinkingAHoldFreesSlotsForOthers", testShrinkingFreesSlots},
		{"WantZeroGivesEverySlotBack", testWantZeroGivesBack},
		{"ExpiredHoldFreesItsSlotsAndARenewedOneOutlivesItsFirstTTL", testExpiredHoldFreesItsSlots},
		{"LoweredMaxCapsTheNextHold", testLoweredMaxCapsTheNextHold},
		{"HeldSlotsOfLiveHoldersNeverExceedMaxOverASeededSequence", testHeldNeverExceedsMax},
		{"AliveCountsLiveHoldersAndForgetsExpiredOnes", testAliveCountsLiveHolders},
		{"EpochNamesTheGrantersStateAndStaysWhileItLives", testEpochStays},
		{"RateAndConcurrencyCeilingsOfEveryKeyAreSeparate", testCeilingsAreSeparate},
		{"InvalidCeilingOrCallIsAnErrorAndChangesNothing", testInvalidIsAnError},
		{"ConcurrentTakesNeverGrantMoreThanTheBucketHolds", testConcurrentTakes},
		{"ConcurrentHoldsNeverHoldMoreThanMax", testConcurrentHolds},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := NewClock()
			g := newGranter(t, clock)
			tt.run(&fixture{t: t, ctx: t.Context(), clock: clock, g: g})
		})
	}
}

// fixture is one subtest's granter, clock and helpers.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	clock *Clock
	g     slice.Granter
}

// rate is a rate ceiling of the suite.
func rate(key string, perSecond, burst float64) slice.Rate {
	return slice.Rate{Key: key, Kind: "test_rate", PerSecond: perSecond, Burst: burst}
}

// conc is a concurrency ceiling of the suite.
func conc(key string, max int) slice.Concurrency {
	return slice.Concurrency{Key: key, Kind: "test_concurrency", Max: max}
}

// take calls Take as holder "h" and fails the test on an error.
func (f *fixture) take(r slice.Rate, want, adjust float64) (float64, time.Duration) {
	f.t.Helper()
	return f.takeAs(r, "h", want, adjust)
}

// takeAs calls Take as holder and fails the test on an error.
func (f *fixture) takeAs(r slice.Rate, holder string, want, adjust float64) (float64, time.Duration) {
	f.t.Helper()
	took, _, wait, err := f.g.Take(f.ctx, r, holder, want, adjust)
	if err != nil {
		f.t.Fatalf("Take(%s, %s, want %v, adjust %v): %v", r.Key, holder, want, adjust, err)
	}
	return took, wait
}

// wantTake calls Take as holder "h" and checks what it took and the wait
// it answered.
func (f *fixture) wantTake(r slice.Rate, want, adjust, wantTook float64, wantWait time.Duration) {
	f.t.Helper()
	f.wantTakeAs(r, "h", want, adjust, wantTook, wantWait)
}

// wantTakeAs calls Take as holder and checks what it took, exactly, and
// the wait it answered.
func (f *fixture) wantTakeAs(r slice.Rate, holder string, want, adjust, wantTook float64, wantWait time.Duration) {
	f.t.Helper()
	took, wait := f.takeAs(r, holder, want, adjust)
	if took != wantTook || wait != wantWait {
		f.t.Fatalf("Take(%s, %s, want %v, adjust %v) = took %v, wait %v; want took %v, wait %v",
			r.Key, holder, want, adjust, took, wait, wantTook, wantWait)
	}
}

// hold calls Hold and fails the test on an error.
func (f *fixture) hold(c slice.Concurrency, holder string, want int, ttl time.Duration) int {
	f.t.Helper()
	held, err := f.g.Hold(f.ctx, c, holder, want, ttl)
	if err != nil {
		f.t.Fatalf("Hold(%s, %s, want %d): %v", c.Key, holder, want, err)
	}
	return held
}

// wantHold calls Hold and checks what holder now holds.
func (f *fixture) wantHold(c slice.Concurrency, holder string, want int, ttl time.Duration, wantHeld int) {
	f.t.Helper()
	if held := f.hold(c, holder, want, ttl); held != wantHeld {
		f.t.Fatalf("Hold(%s, %s, want %d) = %d; want %d", c.Key, holder, want, held, wantHeld)
	}
}

// wantAlive calls Alive and checks the count of live holders; it
// returns the epoch answered.
func (f *fixture) wantAlive(holder string, ttl time.Duration, want int) string {
	f.t.Helper()
	n, epoch, err := f.g.Alive(f.ctx, holder, ttl)
	if err != nil {
		f.t.Fatalf("Alive(%s): %v", holder, err)
	}
	if n != want {
		f.t.Fatalf("Alive(%s) = %d; want %d", holder, n, want)
	}
	return epoch
}

// Slices is one gateway's slices over granter on now, for the tests of
// what spends from them (tenant limits, budgets.Sliced, the doors): their
// background round is left to the requests (a lead of an hour), so the
// test decides every refill on its clock. They close with the test.
func Slices(t testing.TB, granter slice.Granter, now func() time.Time) *slice.Slices {
	t.Helper()
	return RegionSlices(t, granter, now, nil)
}

// RegionSlices is Slices of a gateway whose global ceilings are scaled by
// its region's leases (a lease.Region; nil: the only region).
func RegionSlices(t testing.TB, granter slice.Granter, now func() time.Time, leases slice.Leases) *slice.Slices {
	t.Helper()
	s, err := slice.New(granter, slice.Options{Now: now, Lead: time.Hour, TTL: 2 * time.Hour, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
