// Package storetest is the conformance suite every budgets.Store must pass:
// the memory store in its own tests, the Redis store against a real
// redis-server (standalone and cluster). Each subtest is named after the rule
// of docs/architecture.md §7 it checks.
//
// Contract for a factory:
//   - it returns a store with no state of its own: no ledgers, buckets,
//     reservations, flags or leases (a Redis factory uses a fresh key prefix or
//     database per call), and releases it with t.Cleanup;
//   - the store's notion of time is the Clock it is given (see Clock for the
//     two ways to wire it);
//   - the store must be safe for concurrent use: one subtest drives it from
//     many goroutines and must be run under -race.
package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// Factory returns an empty store whose time is clock.
type Factory func(t *testing.T, clock *Clock) budgets.Store

// Run runs the whole conformance suite against the stores newStore returns,
// one fresh store (and clock) per subtest.
func Run(t *testing.T, newStore Factory) {
	tests := []struct {
		name string
		run  func(*fixture)
	}{
		{"AdmitTakesAttemptSlotFromLedger", testAdmitTakesAttemptSlotFromLedger},
		{"LedgerCapsAttemptsAcrossGroupsOfOneUserAction", testLedgerCapsAttemptsAcrossGroups},
		{"LedgerExpiresAfterTTL", testLedgerExpiresAfterTTL},
		{"DuplicateBucketRefusesHedgeWhenEmpty", testDuplicateBucketRefusesHedgeWhenEmpty},
		{"HedgesLeaveTheReplacementReserve", testHedgesLeaveTheReplacementReserve},
		{"EachPrimaryDepositsRatio", testEachPrimaryDepositsRatio},
		{"BucketNeverExceedsCapacity", testBucketNeverExceedsCapacity},
		{"PoolFloorLetsLowTrafficHedge", testPoolFloorLetsLowTrafficHedge},
		{"SpendReserveSettleRefunds", testSpendReserveSettleRefunds},
		{"SettleChargesOverUse", testSettleChargesOverUse},
		{"ReleaseRefundsWholeReservation", testReleaseRefundsWholeReservation},
		{"SettleTwiceIsRefused", testSettleTwiceIsRefused},
		{"EndAllEndsEachAsItsOwnCallWould", testEndAllEndsEachAsItsOwnCallWould},
		{"ExpiredReservationReturnsToCeiling", testExpiredReservationReturnsToCeiling},
		{"TenantWindowRollsOver", testTenantWindowRollsOver},
		{"DenialCompensatesEarlierReservations", testDenialCompensatesEarlierReservations},
		{"PushbackSuppressesRouteUntilTTL", testPushbackSuppressesRouteUntilTTL},
		{"QuarantineExpires", testQuarantineExpires},
		{"EjectedRouteTakesNoExtraAttemptUntilTTL", testEjectedRouteTakesNoExtraAttemptUntilTTL},
		{"LeaseOfDeadHolderExpires", testLeaseOfDeadHolderExpires},
		{"RouteSnapshotReadsWhatRouteStatesAndInFlightRead", testRouteSnapshotReadsWhatRouteStatesAndInFlightRead},
		{"InvalidRequestIsAnErrorNotADenial", testInvalidRequestIsAnError},
		{"ConcurrentUseConservesEveryCeiling", testConcurrentUseConservesEveryCeiling},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := NewClock()
			store := newStore(t, clock)
			tt.run(&fixture{t: t, ctx: t.Context(), clock: clock, store: store})
		})
	}
}

const (
	pool      = "pool-a"
	cohort    = "chat"
	tenant    = "tenant-a"
	routeA    = "route-a"
	routeB    = "route-b"
	shortTTL  = 300 * time.Millisecond
	longTTL   = time.Minute
	oneWindow = time.Hour
)

// fixture is one subtest's store, clock and helpers.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	clock *Clock
	store budgets.Store
	seq   int
}

// fresh returns a user action name not used before in this subtest.
func (f *fixture) fresh(prefix string) string {
	f.seq++
	return fmt.Sprintf("%s-%d", prefix, f.seq)
}

// primary is a plain primary request: 100 units, no ceilings, an empty
// duplicate-rate bucket that primaries do not fill.
func primary(ua string) budgets.AdmitRequest {
	return budgets.AdmitRequest{
		UserAction: ua,
		Tenant:     tenant,
		Pool:       pool,
		Cohort:     cohort,
		Attempts:   budgets.AttemptPolicy{Max: 4, TTL: longTTL},
		Spend:      budgets.SpendPolicy{InputUnits: 20, OutputUnits: 80, TenantWindow: oneWindow, ReservationTTL: longTTL},
		Bucket:     budgets.DuplicateBucket{Capacity: 10},
	}
}

// extra is the hedge or replacement counterpart of primary, towards routeA.
func extra(role schemas.Role, ua string) budgets.ExtraRequest {
	p := primary(ua)
	return budgets.ExtraRequest{
		Role:       role,
		UserAction: ua,
		Tenant:     p.Tenant,
		Route:      routeA,
		Pool:       p.Pool,
		Cohort:     p.Cohort,
		Attempts:   p.Attempts,
		Spend:      p.Spend,
		Bucket:     p.Bucket,
	}
}

func hedge(ua string) budgets.ExtraRequest       { return extra(schemas.RoleHedge, ua) }
func replacement(ua string) budgets.ExtraRequest { return extra(schemas.RoleReplacement, ua) }

// units sets a spend estimate of n units.
func units(p *budgets.SpendPolicy, n int64) { p.InputUnits, p.OutputUnits = 0, n }

func (f *fixture) admit(req budgets.AdmitRequest) budgets.Admission {
	f.t.Helper()
	a, err := f.store.Admit(f.ctx, req)
	if err != nil {
		f.t.Fatalf("Admit(%s): %v", req.UserAction, err)
	}
	if a.Allowed == (a.Reason != budgets.ReasonNone) || a.Allowed == (a.Reservation == "") {
		f.t.Fatalf("Admit(%s) = %+v: allowed must come with a reservation and no reason", req.UserAction, a)
	}
	return a
}

func (f *fixture) extra(req budgets.ExtraRequest) budgets.Grant {
	f.t.Helper()
	g, err := f.store.ReserveExtra(f.ctx, req)
	if err != nil {
		f.t.Fatalf("ReserveExtra(%s %s): %v", req.Role, req.UserAction, err)
	}
	if g.Allowed == (g.Reason != budgets.ReasonNone) || g.Allowed == (g.Reservation == "") {
		f.t.Fatalf("ReserveExtra(%s %s) = %+v: allowed must come with a reservation and no reason", req.Role, req.UserAction, g)
	}
	if g.Allowed && g.Token == budgets.TokenNone {
		f.t.Fatalf("ReserveExtra(%s %s) = %+v: every extra attempt takes a token", req.Role, req.UserAction, g)
	}
	return g
}

func (f *fixture) settle(id budgets.ReservationID, used int64) {
	f.t.Helper()
	if err := f.store.Settle(f.ctx, id, schemas.Usage{OutputUnits: used}); err != nil {
		f.t.Fatalf("Settle(%s, %d): %v", id, used, err)
	}
}

func (f *fixture) release(id budgets.ReservationID) {
	f.t.Helper()
	if err := f.store.Release(f.ctx, id); err != nil {
		f.t.Fatalf("Release(%s): %v", id, err)
	}
}

func (f *fixture) wantAdmission(step string, a budgets.Admission, want budgets.Reason) {
	f.t.Helper()
	if a.Reason != want {
		f.t.Errorf("%s: reason %q, want %q", step, a.Reason, want)
	}
}

func (f *fixture) wantGrant(step string, g budgets.Grant, want budgets.Reason) {
	f.t.Helper()
	if g.Reason != want {
		f.t.Errorf("%s: reason %q, want %q", step, g.Reason, want)
	}
}

// wantTenantRoom checks that exactly room units can still be reserved under
// the suite tenant's ceiling.
func (f *fixture) wantTenantRoom(ceiling, room int64) {
	f.t.Helper()
	f.wantRoomOf(tenant, ceiling, room)
}

// wantUserActionRoom checks that exactly room units can still be reserved
// under one user action's ceiling, by probing room+1 (denied) and room
// (allowed, then released).
func (f *fixture) wantUserActionRoom(ua string, ceiling, room int64) {
	f.t.Helper()
	req := primary(ua)
	req.Attempts.Max = 1000
	req.Spend.UserActionCeiling = ceiling
	units(&req.Spend, room+1)
	if a := f.admit(req); a.Allowed {
		f.release(a.Reservation)
		f.t.Errorf("user action %s: room exceeds %d of ceiling %d", ua, room, ceiling)
	}
	units(&req.Spend, room)
	a := f.admit(req)
	if !a.Allowed {
		f.t.Errorf("user action %s: room is below %d of ceiling %d (%s)", ua, room, ceiling, a.Reason)
		return
	}
	f.release(a.Reservation)
}

func testAdmitTakesAttemptSlotFromLedger(f *fixture) {
	for _, max := range []int{1, 2, 4} {
		ua := f.fresh("ua")
		req := primary(ua)
		req.Attempts.Max = max
		for i := 1; i <= max; i++ {
			a := f.admit(req)
			if !a.Allowed || a.AttemptsUsed != i {
				f.t.Fatalf("max %d, admit %d: %+v, want allowed with %d attempts used", max, i, a, i)
			}
		}
		f.wantAdmission(fmt.Sprintf("max %d, admit %d", max, max+1), f.admit(req), budgets.ReasonAttempts)
		other := primary(f.fresh("other"))
		other.Attempts.Max = max
		if a := f.admit(other); !a.Allowed || a.AttemptsUsed != 1 {
			f.t.Errorf("another user action after %s's ledger filled: %+v, want its own first slot", ua, a)
		}
	}
}

func testLedgerCapsAttemptsAcrossGroups(f *fixture) {
	// One user action, max 3: group 1 launches a primary and a hedge, the
	// caller retries as group 2, and then every kind of attempt is refused.
	const ua = "ua-retried"
	bucket := budgets.DuplicateBucket{Capacity: 10, InitialFill: 10}
	steps := []struct {
		name string
		do   func() budgets.Reason
		want budgets.Reason
	}{
		{"group 1 primary", func() budgets.Reason { return f.admitMax(ua, bucket, 3) }, budgets.ReasonNone},
		{"group 1 hedge", func() budgets.Reason { return f.extraMax(hedge(ua), bucket, 3) }, budgets.ReasonNone},
		{"group 2 primary (caller retry)", func() budgets.Reason { return f.admitMax(ua, bucket, 3) }, budgets.ReasonNone},
		{"group 2 replacement", func() budgets.Reason { return f.extraMax(replacement(ua), bucket, 3) }, budgets.ReasonAttempts},
		{"group 2 hedge", func() budgets.Reason { return f.extraMax(hedge(ua), bucket, 3) }, budgets.ReasonAttempts},
		{"group 3 primary", func() budgets.Reason { return f.admitMax(ua, bucket, 3) }, budgets.ReasonAttempts},
	}
	for _, s := range steps {
		if got := s.do(); got != s.want {
			f.t.Errorf("%s: reason %q, want %q", s.name, got, s.want)
		}
	}
}

func (f *fixture) admitMax(ua string, bucket budgets.DuplicateBucket, max int) budgets.Reason {
	req := primary(ua)
	req.Attempts.Max = max
	req.Bucket = bucket
	return f.admit(req).Reason
}

func (f *fixture) extraMax(req budgets.ExtraRequest, bucket budgets.DuplicateBucket, max int) budgets.Reason {
	req.Attempts.Max = max
	req.Bucket = bucket
	return f.extra(req).Reason
}

func testLedgerExpiresAfterTTL(f *fixture) {
	// The ledger outlives a reservation that ended early...
	req := primary("ua-expiring")
	req.Attempts = budgets.AttemptPolicy{Max: 1, TTL: shortTTL}
	req.Spend.ReservationTTL = shortTTL / 6
	f.settle(f.admit(req).Reservation, 100)
	f.clock.Advance(shortTTL / 3)
	f.wantAdmission("before the ledger ttl", f.admit(req), budgets.ReasonAttempts)
	f.clock.Advance(shortTTL)
	if a := f.admit(req); !a.Allowed || a.AttemptsUsed != 1 {
		f.t.Errorf("after the ledger ttl: %+v, want a fresh ledger", a)
	}

	// ...and a live reservation keeps its user action past the ledger ttl.
	req = primary("ua-long-reservation")
	req.Attempts = budgets.AttemptPolicy{Max: 1, TTL: shortTTL / 3}
	req.Spend.ReservationTTL = 3 * shortTTL
	held := f.admit(req)
	f.clock.Advance(shortTTL)
	f.wantAdmission("past the ledger ttl, within the reservation's", f.admit(req), budgets.ReasonAttempts)
	f.settle(held.Reservation, 100)
}

func testHedgesLeaveTheReplacementReserve(f *fixture) {
	bucket := budgets.DuplicateBucket{Capacity: 4, InitialFill: 3, ReplacementReserve: 2}
	steps := []struct {
		name string
		role schemas.Role
		want budgets.Reason
	}{
		{"a hedge down to the reserve", schemas.RoleHedge, budgets.ReasonNone},
		{"a hedge into the reserve", schemas.RoleHedge, budgets.ReasonDuplicateRate},
		{"a replacement from the reserve", schemas.RoleReplacement, budgets.ReasonNone},
		{"a replacement taking the last token", schemas.RoleReplacement, budgets.ReasonNone},
		{"a replacement on the empty bucket", schemas.RoleReplacement, budgets.ReasonDuplicateRate},
	}
	for _, st := range steps {
		req := extra(st.role, f.fresh("ua"))
		req.Cohort, req.Bucket = "reserve-cohort", bucket
		f.wantGrant(st.name, f.extra(req), st.want)
	}
}

func testDuplicateBucketRefusesHedgeWhenEmpty(f *fixture) {
	tests := []struct {
		name   string
		role   schemas.Role
		fill   float64
		want   budgets.Reason
		source budgets.TokenSource
	}{
		{"hedge on an empty bucket", schemas.RoleHedge, 0, budgets.ReasonDuplicateRate, budgets.TokenNone},
		{"hedge on half a token", schemas.RoleHedge, 0.5, budgets.ReasonDuplicateRate, budgets.TokenNone},
		{"hedge on one token", schemas.RoleHedge, 1, budgets.ReasonNone, budgets.TokenCohort},
		{"replacement on an empty bucket", schemas.RoleReplacement, 0, budgets.ReasonDuplicateRate, budgets.TokenNone},
		{"replacement on one token", schemas.RoleReplacement, 1, budgets.ReasonNone, budgets.TokenCohort},
	}
	for i, tt := range tests {
		req := extra(tt.role, f.fresh("ua"))
		req.Cohort = fmt.Sprintf("cohort-%d", i)
		req.Bucket = budgets.DuplicateBucket{Capacity: 10, InitialFill: tt.fill}
		g := f.extra(req)
		f.wantGrant(tt.name, g, tt.want)
		if g.Token != tt.source {
			f.t.Errorf("%s: token from %q, want %q", tt.name, g.Token, tt.source)
		}
	}
}

func testEachPrimaryDepositsRatio(f *fixture) {
	tests := []struct {
		ratio     float64
		primaries int
		hedges    int
	}{
		{ratio: 0, primaries: 5, hedges: 0},
		{ratio: 1, primaries: 3, hedges: 3},
		{ratio: 0.5, primaries: 3, hedges: 1},
		{ratio: 0.25, primaries: 8, hedges: 2},
		{ratio: 0.1, primaries: 10, hedges: 1},  // ten tenths make exactly one token
		{ratio: 0.05, primaries: 20, hedges: 1}, // and so do twenty twentieths
		{ratio: 0.05, primaries: 19, hedges: 0},
	}
	for i, tt := range tests {
		bucket := budgets.DuplicateBucket{Ratio: tt.ratio, Capacity: 100}
		c := fmt.Sprintf("cohort-%d", i)
		for range tt.primaries {
			req := primary(f.fresh("ua"))
			req.Cohort, req.Bucket = c, bucket
			f.admit(req)
		}
		got := f.hedgesAvailableIn(c, bucket, budgets.FloorBucket{}, tt.primaries+1)
		if got != tt.hedges {
			f.t.Errorf("ratio %v after %d primaries: %d hedges granted, want %d", tt.ratio, tt.primaries, got, tt.hedges)
		}
	}
}

// hedgesAvailableIn counts the hedges cohort c grants before the first
// duplicate-rate denial, each from a user action of its own. The grants are
// settled, so their tokens stay taken.
func (f *fixture) hedgesAvailableIn(c string, bucket budgets.DuplicateBucket, floor budgets.FloorBucket, limit int) int {
	f.t.Helper()
	for n := 0; n <= limit; n++ {
		req := hedge(f.fresh("hedge"))
		req.Cohort, req.Bucket, req.Floor = c, bucket, floor
		g := f.extra(req)
		if !g.Allowed {
			f.wantGrant(fmt.Sprintf("cohort %s hedge %d", c, n+1), g, budgets.ReasonDuplicateRate)
			return n
		}
		f.settle(g.Reservation, 0)
	}
	f.t.Fatalf("cohort %s: more than %d hedges granted", c, limit)
	return limit
}

func testBucketNeverExceedsCapacity(f *fixture) {
	tests := []struct {
		name      string
		bucket    budgets.DuplicateBucket
		primaries int
		hedges    int
	}{
		{"deposits stop at capacity", budgets.DuplicateBucket{Ratio: 1, Capacity: 2}, 5, 2},
		{"a full bucket takes no deposit", budgets.DuplicateBucket{Ratio: 1, Capacity: 3, InitialFill: 3}, 4, 3},
		{"fractional capacity", budgets.DuplicateBucket{Ratio: 0.5, Capacity: 1.5}, 10, 1},
	}
	for i, tt := range tests {
		c := fmt.Sprintf("cohort-%d", i)
		for range tt.primaries {
			req := primary(f.fresh("ua"))
			req.Cohort, req.Bucket = c, tt.bucket
			f.admit(req)
		}
		if got := f.hedgesAvailableIn(c, tt.bucket, budgets.FloorBucket{}, tt.primaries+5); got != tt.hedges {
			f.t.Errorf("%s: %d hedges granted, want %d", tt.name, got, tt.hedges)
		}
	}
	// A capacity lowered by configuration caps a fuller bucket at once.
	full := primary(f.fresh("ua"))
	full.Cohort, full.Bucket = "cohort-shrunk", budgets.DuplicateBucket{Capacity: 5, InitialFill: 5}
	f.admit(full)
	shrunk := budgets.DuplicateBucket{Capacity: 2}
	if got := f.hedgesAvailableIn(full.Cohort, shrunk, budgets.FloorBucket{}, 6); got != 2 {
		f.t.Errorf("bucket of 5 tokens with its capacity lowered to 2: %d hedges granted, want 2", got)
	}

	// A released hedge's token goes back, but not above capacity either.
	bucket := budgets.DuplicateBucket{Ratio: 1, Capacity: 1}
	req := hedge(f.fresh("ua"))
	req.Cohort, req.Bucket = "cohort-release", budgets.DuplicateBucket{Ratio: 1, Capacity: 1, InitialFill: 1}
	g := f.extra(req)
	p := primary(f.fresh("ua"))
	p.Cohort, p.Bucket = req.Cohort, bucket
	f.admit(p) // refills the bucket while the hedge holds its token
	f.release(g.Reservation)
	if got := f.hedgesAvailableIn(req.Cohort, bucket, budgets.FloorBucket{}, 5); got != 1 {
		f.t.Errorf("release into a full bucket: %d hedges granted, want 1", got)
	}
}

func testPoolFloorLetsLowTrafficHedge(f *fixture) {
	floor := budgets.FloorBucket{Capacity: 1, RefillPerSecond: 1}
	bucket := budgets.DuplicateBucket{Capacity: 10, InitialFill: 1}
	steps := []struct {
		name    string
		cohort  string
		advance time.Duration
		want    budgets.Reason
		source  budgets.TokenSource
	}{
		{"the cohort's own token goes first", "quiet", 0, budgets.ReasonNone, budgets.TokenCohort},
		{"then the pool's floor pays", "quiet", 0, budgets.ReasonNone, budgets.TokenFloor},
		{"an empty floor refuses", "quiet", 0, budgets.ReasonDuplicateRate, budgets.TokenNone},
		{"the floor is the pool's, not the cohort's", "quieter", 0, budgets.ReasonNone, budgets.TokenCohort},
		{"another drained cohort shares the empty floor", "quieter", 0, budgets.ReasonDuplicateRate, budgets.TokenNone},
		{"the floor refills over time", "quiet", 1100 * time.Millisecond, budgets.ReasonNone, budgets.TokenFloor},
	}
	for _, s := range steps {
		f.clock.Advance(s.advance)
		req := hedge(f.fresh("ua"))
		req.Cohort, req.Bucket, req.Floor = s.cohort, bucket, floor
		g := f.extra(req)
		f.wantGrant(s.name, g, s.want)
		if g.Token != s.source {
			f.t.Errorf("%s: token from %q, want %q", s.name, g.Token, s.source)
		}
	}
}
