package storetest

import (
	"errors"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// ceilingCase runs a spend check once against the user action's ceiling and
// once against the tenant's, each probed with its own denial reason.
type ceilingCase struct {
	name   string
	reason budgets.Reason
	// request returns a primary of n units under a ceiling of c; the user
	// action stays the same for the user-action case and is fresh otherwise.
	request func(f *fixture, n, c int64) budgets.AdmitRequest
	room    func(f *fixture, c, want int64)
}

func ceilingCases() []ceilingCase {
	return []ceilingCase{
		{
			name:   "user action",
			reason: budgets.ReasonSpendUserAction,
			request: func(_ *fixture, n, c int64) budgets.AdmitRequest {
				req := primary("ua-spender")
				req.Attempts.Max = 100
				req.Spend.UserActionCeiling = c
				units(&req.Spend, n)
				return req
			},
			room: func(f *fixture, c, want int64) { f.wantUserActionRoom("ua-spender", c, want) },
		},
		{
			name:   "tenant",
			reason: budgets.ReasonSpendTenant,
			request: func(f *fixture, n, c int64) budgets.AdmitRequest {
				req := primary(f.fresh("ua"))
				req.Spend.TenantCeiling = c
				units(&req.Spend, n)
				return req
			},
			room: func(f *fixture, c, want int64) { f.wantTenantRoom(c, want) },
		},
	}
}

func testSpendReserveSettleRefunds(f *fixture) {
	for _, tc := range ceilingCases() {
		first := f.admit(tc.request(f, 600, 1000))
		if !first.Allowed || first.ReservedUnits != 600 {
			f.t.Fatalf("%s: first reservation %+v, want 600 units", tc.name, first)
		}
		f.wantAdmission(tc.name+": 500 more while 600 are held", f.admit(tc.request(f, 500, 1000)), tc.reason)
		f.settle(first.Reservation, 300) // 300 of the 600 return
		if a := f.admit(tc.request(f, 500, 1000)); !a.Allowed {
			f.t.Errorf("%s: 500 after the refund: denied (%s)", tc.name, a.Reason)
		}
		tc.room(f, 1000, 200)
	}
}

func testSettleChargesOverUse(f *fixture) {
	for _, tc := range ceilingCases() {
		a := f.admit(tc.request(f, 400, 1000))
		f.settle(a.Reservation, 900) // 500 more than reserved
		f.wantAdmission(tc.name+": 200 after over-use", f.admit(tc.request(f, 200, 1000)), tc.reason)
		tc.room(f, 1000, 100)
	}
}

func testReleaseRefundsWholeReservation(f *fixture) {
	for _, tc := range ceilingCases() {
		req := tc.request(f, 1000, 1000)
		a := f.admit(req)
		f.wantAdmission(tc.name+": the whole ceiling", a, budgets.ReasonNone)
		f.release(a.Reservation)
		tc.room(f, 1000, 1000)
	}

	// The attempt slot goes back too: the released grant launched nothing.
	req := primary("ua-one-slot")
	req.Attempts.Max = 1
	f.release(f.admit(req).Reservation)
	if a := f.admit(req); !a.Allowed || a.AttemptsUsed != 1 {
		f.t.Errorf("admit after release with max 1: %+v, want the slot back", a)
	}

	// And so does a hedge's count in its cohort's window.
	h := hedge("ua-hedge")
	h.Window, h.Duplicates = "cohort-of-one", ceilingOf(1)
	f.primaries(h.Window, h.Duplicates, 1)
	f.release(f.extra(h).Reservation)
	if g := f.extra(h); !g.Allowed || g.Token != budgets.TokenCohort {
		f.t.Errorf("hedge after a released hedge: %+v, want the cohort's room back", g)
	}
}

func testSettleTwiceIsRefused(f *fixture) {
	type end func(id budgets.ReservationID) error
	settle := func(id budgets.ReservationID) error {
		return f.store.Settle(f.ctx, id, schemas.Usage{InputUnits: 250, OutputUnits: 250})
	}
	release := func(id budgets.ReservationID) error { return f.store.Release(f.ctx, id) }
	tests := []struct {
		name          string
		first, second end
		room          int64 // tenant room after the first end
	}{
		{"settle then settle", settle, settle, 500},
		{"settle then release", settle, release, 500},
		{"release then release", release, release, 1000},
		{"release then settle", release, settle, 1000},
	}
	const ceiling = 1000
	for _, tt := range tests {
		req := primary(f.fresh("ua"))
		req.Spend.TenantCeiling = ceiling
		units(&req.Spend, 400)
		// A fresh tenant per case keeps the cases apart.
		req.Tenant = f.fresh("tenant")
		a := f.admit(req)
		if err := tt.first(a.Reservation); err != nil {
			f.t.Fatalf("%s: first end: %v", tt.name, err)
		}
		if err := tt.second(a.Reservation); !errors.Is(err, budgets.ErrUnknownReservation) {
			f.t.Errorf("%s: second end returned %v, want ErrUnknownReservation", tt.name, err)
		}
		f.wantRoomOf(req.Tenant, ceiling, tt.room)
	}
	for _, id := range []budgets.ReservationID{"", "never-granted"} {
		if err := settle(id); !errors.Is(err, budgets.ErrUnknownReservation) {
			f.t.Errorf("Settle(%q) = %v, want ErrUnknownReservation", id, err)
		}
		if err := release(id); !errors.Is(err, budgets.ErrUnknownReservation) {
			f.t.Errorf("Release(%q) = %v, want ErrUnknownReservation", id, err)
		}
	}
}

// wantRoomOf checks that exactly room units can still be reserved under a
// tenant's ceiling, by probing room+1 (denied) and room (allowed, then
// released) from user actions of their own.
func (f *fixture) wantRoomOf(tenantID string, ceiling, room int64) {
	f.t.Helper()
	req := primary(f.fresh("probe"))
	req.Tenant = tenantID
	req.Spend.TenantCeiling = ceiling
	units(&req.Spend, room+1)
	if a := f.admit(req); a.Allowed {
		f.release(a.Reservation)
		f.t.Errorf("tenant %s: room exceeds %d of ceiling %d", tenantID, room, ceiling)
	}
	units(&req.Spend, room)
	if a := f.admit(req); !a.Allowed {
		f.t.Errorf("tenant %s: room is below %d of ceiling %d (%s)", tenantID, room, ceiling, a.Reason)
	} else {
		f.release(a.Reservation)
	}
}

func testExpiredReservationReturnsToCeiling(f *fixture) {
	for _, tc := range ceilingCases() {
		req := tc.request(f, 1000, 1000)
		req.Spend.ReservationTTL = shortTTL
		held := f.admit(req)
		f.wantAdmission(tc.name+": the whole ceiling", held, budgets.ReasonNone)
		f.clock.Advance(shortTTL / 3)
		f.wantAdmission(tc.name+": 1 unit before the ttl", f.admit(tc.request(f, 1, 1000)), tc.reason)
		f.clock.Advance(shortTTL)
		tc.room(f, 1000, 1000)
		if err := f.store.Settle(f.ctx, held.Reservation, schemas.Usage{OutputUnits: 1}); !errors.Is(err, budgets.ErrUnknownReservation) {
			f.t.Errorf("%s: settling the expired reservation: %v, want ErrUnknownReservation", tc.name, err)
		}
		if err := f.store.Release(f.ctx, held.Reservation); !errors.Is(err, budgets.ErrUnknownReservation) {
			f.t.Errorf("%s: releasing the expired reservation: %v, want ErrUnknownReservation", tc.name, err)
		}
		tc.room(f, 1000, 1000)
	}
}

func testTenantWindowRollsOver(f *fixture) {
	if f.clock.followsRealTime() {
		f.t.Skip("needs an hour's advance: only for stores that read the suite's clock")
	}
	req := primary(f.fresh("ua"))
	req.Spend.TenantCeiling = 1000
	units(&req.Spend, 1000)
	f.settle(f.admit(req).Reservation, 1000)
	f.wantAdmission("the spent window", f.admit(primaryOf(req, f.fresh("ua"))), budgets.ReasonSpendTenant)

	// A reservation made at the end of one window settles into that window,
	// not into the next.
	windowEnd := f.clock.Now().Truncate(oneWindow).Add(oneWindow)
	f.clock.Advance(windowEnd.Sub(f.clock.Now()) - time.Nanosecond)
	req.Spend.TenantCeiling = 2000
	late := f.admit(primaryOf(req, f.fresh("ua")))
	f.wantAdmission("the last moment of the window", late, budgets.ReasonNone)
	f.clock.Advance(time.Nanosecond)
	f.settle(late.Reservation, 1000)
	f.wantTenantRoom(1000, 1000)
}

// primaryOf is req for another user action.
func primaryOf(req budgets.AdmitRequest, ua string) budgets.AdmitRequest {
	req.UserAction = ua
	return req
}

// testEndAllEndsEachAsItsOwnCallWould checks the batch form of Settle and
// Release: every ending takes effect or fails on its own, in order.
func testEndAllEndsEachAsItsOwnCallWould(f *fixture) {
	const ceiling = 1000
	tenantID := f.fresh("tenant")
	admit := func(n int64) budgets.ReservationID {
		req := primary(f.fresh("ua"))
		req.Tenant, req.Spend.TenantCeiling = tenantID, ceiling
		units(&req.Spend, n)
		return f.admit(req).Reservation
	}
	settled, released, untouched := admit(400), admit(300), admit(100)
	ends := []budgets.Ending{
		{Reservation: settled, Usage: schemas.Usage{InputUnits: 50, OutputUnits: 200}},
		{Reservation: released, Release: true},
		{Reservation: "never-granted"},
		{Reservation: settled, Release: true},                           // already ended in this batch
		{Reservation: untouched, Usage: schemas.Usage{OutputUnits: -1}}, // invalid: fails alone
	}
	want := []error{nil, nil, budgets.ErrUnknownReservation, budgets.ErrUnknownReservation, budgets.ErrInvalidRequest}
	errs := f.store.EndAll(f.ctx, ends)
	if len(errs) != len(ends) {
		f.t.Fatalf("EndAll returned %d errors for %d endings", len(errs), len(ends))
	}
	for i, err := range errs {
		if (want[i] == nil) != (err == nil) || (want[i] != nil && !errors.Is(err, want[i])) {
			f.t.Errorf("ending %d: %v, want %v", i, err, want[i])
		}
	}
	// 250 settled and the untouched 100 still held.
	f.wantRoomOf(tenantID, ceiling, ceiling-250-100)
	if errs := f.store.EndAll(f.ctx, nil); len(errs) != 0 {
		f.t.Errorf("EndAll of nothing = %v, want no errors", errs)
	}
}
