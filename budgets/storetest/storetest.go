// Package storetest is the conformance suite every budgets.Store must pass:
// the memory store in its own tests, the Redis store against a real
// redis-server (standalone and cluster). Each subtest is named after the rule
// of docs/architecture.md §7 it checks.
//
// Contract for a factory:
//   - it returns a store with no state of its own: no ledgers, windows,
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
		{"TakeoverForgivesTheDeadGroupsSlotsOnce", testTakeoverForgivesTheDeadGroupsSlotsOnce},
		{"LostAttemptsSlotIsForgivenWithinTheBound", testLostAttemptsSlotIsForgivenWithinTheBound},
		{"FullLedgerOfEndedAttemptsNamesNoRetry", testFullLedgerOfEndedAttemptsNamesNoRetry},
		{"HedgeIsAllowedOnlyUnderTheWindowCeiling", testHedgeIsAllowedOnlyUnderTheWindowCeiling},
		{"BurstOfHedgesWithinAWindowIsAllowed", testBurstOfHedgesWithinAWindowIsAllowed},
		{"BurstBoundCapsHedgesWithinTheWindowsRoom", testBurstBoundCapsHedgesWithinTheWindowsRoom},
		{"HedgesLeaveTheReplacementReserve", testHedgesLeaveTheReplacementReserve},
		{"ReplacementsAreNeverRefusedByTheCeilingButCount", testReplacementsAreNeverRefusedByTheCeilingButCount},
		{"ContinuationCountsInTheWindowIsNeverRefusedByTheCeilingAndTakesALedgerSlot", testContinuationCountsInTheWindowIsNeverRefusedByTheCeilingAndTakesALedgerSlot},
		{"WindowSlidesAndForgetsOldSlots", testWindowSlidesAndForgetsOldSlots},
		{"ReleasedHedgeIsUncounted", testReleasedHedgeIsUncounted},
		{"CeilingHoldsOverEveryWindowOfASeededSequence", testCeilingHoldsOverEveryWindowOfASeededSequence},
		{"PoolReserveLetsLowTrafficHedge", testPoolReserveLetsLowTrafficHedge},
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

// primary is a plain primary request: 100 units, no ceilings, and a
// duplicate-rate ceiling of 0, under which its cohort never hedges.
func primary(ua string) budgets.AdmitRequest {
	return budgets.AdmitRequest{
		UserAction: ua,
		Tenant:     tenant,
		Pool:       pool,
		Window:     cohort,
		Attempts:   budgets.AttemptPolicy{Max: 4, TTL: longTTL},
		Spend:      budgets.SpendPolicy{InputUnits: 20, OutputUnits: 80, TenantWindow: oneWindow, ReservationTTL: longTTL},
		Duplicates: ceilingOf(0),
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
		Window:     p.Window,
		Attempts:   p.Attempts,
		Spend:      p.Spend,
		Duplicates: p.Duplicates,
	}
}

func hedge(ua string) budgets.ExtraRequest        { return extra(schemas.RoleHedge, ua) }
func replacement(ua string) budgets.ExtraRequest  { return extra(schemas.RoleReplacement, ua) }
func continuation(ua string) budgets.ExtraRequest { return extra(schemas.RoleContinuation, ua) }

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
	if g.Allowed && (g.Token == budgets.TokenNone) != req.FollowsAnEndedAttempt() {
		f.t.Fatalf("ReserveExtra(%s %s) = %+v: a granted hedge names what allowed it, a replacement or continuation nothing", req.Role, req.UserAction, g)
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
	bucket := ceilingOf(1) // group 1's primary makes room for one hedge
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

func (f *fixture) admitMax(ua string, dup budgets.DuplicateCeiling, max int) budgets.Reason {
	req := primary(ua)
	req.Attempts.Max = max
	req.Duplicates = dup
	return f.admit(req).Reason
}

func (f *fixture) extraMax(req budgets.ExtraRequest, dup budgets.DuplicateCeiling, max int) budgets.Reason {
	req.Attempts.Max = max
	req.Duplicates = dup
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
