package storetest

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

func testDenialCompensatesEarlierReservations(f *fixture) {
	// Each case is denied by a later entity after earlier ones granted, then
	// proves with a follow-up that the earlier grants were given back: the
	// follow-up only passes if the slot (max 1), the room (a window with
	// room for one hedge) and the user action's spend are all still there.
	tests := []struct {
		name  string
		deny  func(f *fixture, k key) budgets.Reason
		want  budgets.Reason
		check func(f *fixture, k key)
	}{
		{
			name: "tenant refuses a primary: slot and user-action spend return and the primary is not counted",
			deny: func(f *fixture, k key) budgets.Reason {
				req := k.primary(100)
				req.Spend.UserActionCeiling, req.Spend.TenantCeiling = 100, 50
				return f.admit(req).Reason
			},
			want: budgets.ReasonSpendTenant,
			check: func(f *fixture, k key) {
				if n := f.hedgesIn(k, 3); n != 1 {
					f.t.Errorf("%s: %d hedges granted, want the 1 of the window's one counted primary", k.name, n)
				}
				req := k.primary(100)
				req.Spend.UserActionCeiling = 100
				a := f.admit(req)
				f.wantAttempt(k.name+": primary", a.Reason, a.AttemptsUsed, budgets.TokenNone, budgets.TokenNone)
			},
		},
		{
			name: "user action refuses a primary: slot returns and the primary is not counted",
			deny: func(f *fixture, k key) budgets.Reason {
				req := k.primary(100)
				req.Spend.UserActionCeiling = 50
				return f.admit(req).Reason
			},
			want: budgets.ReasonSpendUserAction,
			check: func(f *fixture, k key) {
				if n := f.hedgesIn(k, 3); n != 1 {
					f.t.Errorf("%s: %d hedges granted, want the 1 of the window's one counted primary", k.name, n)
				}
				a := f.admit(k.primary(100))
				f.wantAttempt(k.name+": primary", a.Reason, a.AttemptsUsed, budgets.TokenNone, budgets.TokenNone)
			},
		},
		{
			name: "tenant refuses a hedge: slot, count and user-action spend return",
			deny: func(f *fixture, k key) budgets.Reason {
				req := k.hedge(100, budgets.ReserveBucket{})
				req.Spend.UserActionCeiling, req.Spend.TenantCeiling = 100, 50
				return f.extra(req).Reason
			},
			want: budgets.ReasonSpendTenant,
			check: func(f *fixture, k key) {
				req := k.hedge(100, budgets.ReserveBucket{})
				req.Spend.UserActionCeiling = 100
				g := f.extra(req)
				f.wantAttempt(k.name+": hedge", g.Reason, g.AttemptsUsed, g.Token, budgets.TokenCohort)
			},
		},
		{
			name: "user action refuses a hedge: slot and count return",
			deny: func(f *fixture, k key) budgets.Reason {
				req := k.hedge(100, budgets.ReserveBucket{})
				req.Spend.UserActionCeiling = 50
				return f.extra(req).Reason
			},
			want: budgets.ReasonSpendUserAction,
			check: func(f *fixture, k key) {
				g := f.extra(k.hedge(100, budgets.ReserveBucket{}))
				f.wantAttempt(k.name+": hedge", g.Reason, g.AttemptsUsed, g.Token, budgets.TokenCohort)
			},
		},
		{
			name: "user action refuses a hedge: the reserve token returns",
			deny: func(f *fixture, k key) budgets.Reason {
				req := k.hedge(100, budgets.ReserveBucket{Capacity: 1})
				req.Duplicates.Ceiling = 0
				req.Spend.UserActionCeiling = 50
				return f.extra(req).Reason
			},
			want: budgets.ReasonSpendUserAction,
			check: func(f *fixture, k key) {
				req := k.hedge(100, budgets.ReserveBucket{Capacity: 1})
				req.Duplicates.Ceiling = 0
				g := f.extra(req)
				f.wantAttempt(k.name+": hedge", g.Reason, g.AttemptsUsed, g.Token, budgets.TokenReserve)
			},
		},
		{
			name: "duplicate rate refuses a hedge: the slot returns",
			deny: func(f *fixture, k key) budgets.Reason {
				req := k.hedge(100, budgets.ReserveBucket{})
				req.Duplicates.Ceiling = 0
				return f.extra(req).Reason
			},
			want: budgets.ReasonDuplicateRate,
			check: func(f *fixture, k key) {
				req := k.hedge(100, budgets.ReserveBucket{})
				req.Role, req.Duplicates.Ceiling = schemas.RoleReplacement, 0
				g := f.extra(req)
				f.wantAttempt(k.name+": replacement", g.Reason, g.AttemptsUsed, g.Token, budgets.TokenNone)
			},
		},
		{
			name: "a route in pushback refuses before anything is taken",
			deny: func(f *fixture, k key) budgets.Reason {
				f.mark(k.route, budgets.RoutePushback, longTTL)
				return f.extra(k.hedge(100, budgets.ReserveBucket{})).Reason
			},
			want: budgets.ReasonRoutePushback,
			check: func(f *fixture, k key) {
				req := k.hedge(100, budgets.ReserveBucket{})
				req.Route = k.route + "-other"
				g := f.extra(req)
				f.wantAttempt(k.name+": hedge elsewhere", g.Reason, g.AttemptsUsed, g.Token, budgets.TokenCohort)
			},
		},
	}
	for i, tt := range tests {
		k := key{
			name:   tt.name,
			ua:     f.fresh("ua"),
			tenant: f.fresh("tenant"),
			pool:   fmt.Sprintf("pool-%d", i),
			cohort: fmt.Sprintf("cohort-%d", i),
			route:  fmt.Sprintf("route-%d", i),
		}
		room := primary(f.fresh("ua")) // room for one hedge
		room.Pool, room.Window, room.Duplicates = k.pool, k.cohort, ceilingOf(1)
		f.admit(room)
		if got := tt.deny(f, k); got != tt.want {
			f.t.Errorf("%s: denied with %q, want %q", tt.name, got, tt.want)
			continue
		}
		tt.check(f, k)
	}
}

// key names the entities of one compensation case: one user action with a
// single attempt slot, a cohort window with room for one hedge, its own
// tenant.
type key struct{ name, ua, tenant, pool, cohort, route string }

func (k key) primary(n int64) budgets.AdmitRequest {
	req := primary(k.ua)
	req.Tenant, req.Pool, req.Window = k.tenant, k.pool, k.cohort
	req.Attempts.Max = 1
	req.Duplicates = ceilingOf(1)
	units(&req.Spend, n)
	return req
}

func (k key) hedge(n int64, reserve budgets.ReserveBucket) budgets.ExtraRequest {
	req := hedge(k.ua)
	req.Tenant, req.Pool, req.Window, req.Route = k.tenant, k.pool, k.cohort, k.route
	req.Attempts.Max = 1
	req.Duplicates = ceilingOf(1)
	req.Reserve = reserve
	units(&req.Spend, n)
	return req
}

// hedgesIn counts the hedges k's cohort grants to other user actions.
func (f *fixture) hedgesIn(k key, limit int) int {
	f.t.Helper()
	for n := 0; n <= limit; n++ {
		req := hedge(f.fresh("other"))
		req.Pool, req.Window, req.Duplicates = k.pool, k.cohort, ceilingOf(1)
		if g := f.extra(req); !g.Allowed {
			return n
		}
	}
	return limit
}

func (f *fixture) wantAttempt(what string, reason budgets.Reason, used int, token, wantToken budgets.TokenSource) {
	f.t.Helper()
	if reason != budgets.ReasonNone || used != 1 || token != wantToken {
		f.t.Errorf("%s: reason %q, %d attempts used, token %q; want allowed as the first attempt with token %q",
			what, reason, used, token, wantToken)
	}
}

func (f *fixture) mark(route string, state budgets.RouteState, ttl time.Duration) {
	f.t.Helper()
	if err := f.store.MarkRoute(f.ctx, route, state, ttl); err != nil {
		f.t.Fatalf("MarkRoute(%s, %s, %v): %v", route, state, ttl, err)
	}
}

func (f *fixture) wantStates(step string, want map[string]budgets.RouteState) {
	f.t.Helper()
	routes := make([]string, 0, len(want))
	for r := range want {
		routes = append(routes, r)
	}
	got, err := f.store.RouteStates(f.ctx, routes)
	if err != nil {
		f.t.Fatalf("%s: RouteStates: %v", step, err)
	}
	for r, w := range want {
		if got[r] != w {
			f.t.Errorf("%s: route %s is %q, want %q", step, r, got[r], w)
		}
	}
}

func testPushbackSuppressesRouteUntilTTL(f *fixture) {
	f.mark(routeB, budgets.RoutePushback, shortTTL)
	f.wantStates("just marked", map[string]budgets.RouteState{routeA: budgets.RouteHealthy, routeB: budgets.RoutePushback})

	steps := []struct {
		name    string
		advance time.Duration
		role    schemas.Role
		route   string
		want    budgets.Reason
	}{
		{"hedge towards the pushed-back route", 0, schemas.RoleHedge, routeB, budgets.ReasonRoutePushback},
		{"replacement towards the pushed-back route", 0, schemas.RoleReplacement, routeB, budgets.ReasonRoutePushback},
		{"continuation towards the pushed-back route", 0, schemas.RoleContinuation, routeB, budgets.ReasonRoutePushback},
		{"hedge towards another route", 0, schemas.RoleHedge, routeA, budgets.ReasonNone},
		{"hedge before the ttl", shortTTL / 3, schemas.RoleHedge, routeB, budgets.ReasonRoutePushback},
	}
	for _, s := range steps {
		f.clock.Advance(s.advance)
		req := extra(s.role, f.fresh("ua"))
		req.Route = s.route
		req.Reserve = budgets.ReserveBucket{Capacity: 10}
		f.wantGrant(s.name, f.extra(req), s.want)
	}

	// A shorter second pushback does not cut the first one short.
	f.mark(routeB, budgets.RoutePushback, shortTTL/6)
	f.clock.Advance(shortTTL / 3) // two thirds of the first ttl have passed
	f.wantStates("after a shorter second mark expired", map[string]budgets.RouteState{routeB: budgets.RoutePushback})

	f.clock.Advance(shortTTL / 2)
	f.wantStates("after the ttl", map[string]budgets.RouteState{routeB: budgets.RouteHealthy})
	req := hedge(f.fresh("ua"))
	req.Route, req.Reserve = routeB, budgets.ReserveBucket{Capacity: 10}
	f.wantGrant("hedge after the ttl", f.extra(req), budgets.ReasonNone)
}

func testQuarantineExpires(f *fixture) {
	f.mark(routeB, budgets.RouteQuarantined, shortTTL)
	f.mark(routeB, budgets.RoutePushback, 2*shortTTL)
	f.wantStates("quarantine outranks pushback", map[string]budgets.RouteState{routeA: budgets.RouteHealthy, routeB: budgets.RouteQuarantined})
	req := replacement(f.fresh("ua"))
	req.Route, req.Reserve = routeB, budgets.ReserveBucket{Capacity: 10}
	f.wantGrant("replacement towards a quarantined route", f.extra(req), budgets.ReasonRouteQuarantined)

	f.clock.Advance(shortTTL / 3)
	f.wantStates("before the quarantine ttl", map[string]budgets.RouteState{routeB: budgets.RouteQuarantined})
	f.clock.Advance(shortTTL)
	f.wantStates("the quarantine expired, the pushback not", map[string]budgets.RouteState{routeB: budgets.RoutePushback})
	f.clock.Advance(shortTTL)
	f.wantStates("both expired", map[string]budgets.RouteState{routeB: budgets.RouteHealthy})
	req.UserAction = f.fresh("ua")
	f.wantGrant("replacement after both expired", f.extra(req), budgets.ReasonNone)
}

// testEjectedRouteTakesNoExtraAttemptUntilTTL: an ejected route (outlier
// ejection, docs/architecture.md §7) refuses hedges, replacements and
// continuations until its flag expires; pushback and quarantine outrank it while they last, and
// it outlives them when its ttl is longer.
func testEjectedRouteTakesNoExtraAttemptUntilTTL(f *fixture) {
	f.mark(routeB, budgets.RouteEjected, 3*shortTTL)
	f.wantStates("just ejected", map[string]budgets.RouteState{routeA: budgets.RouteHealthy, routeB: budgets.RouteEjected})
	for _, role := range []schemas.Role{schemas.RoleHedge, schemas.RoleReplacement, schemas.RoleContinuation} {
		req := extra(role, f.fresh("ua"))
		req.Route, req.Reserve = routeB, budgets.ReserveBucket{Capacity: 10}
		f.wantGrant(string(role)+" towards the ejected route", f.extra(req), budgets.ReasonRouteEjected)
	}
	states, _, err := f.store.RouteSnapshot(f.ctx, []string{routeA, routeB})
	if err != nil {
		f.t.Fatalf("RouteSnapshot: %v", err)
	}
	if states[routeB] != budgets.RouteEjected || states[routeA] != budgets.RouteHealthy {
		f.t.Errorf("snapshot of an ejected route: %v, want %s ejected and %s healthy", states, routeB, routeA)
	}

	f.mark(routeB, budgets.RoutePushback, shortTTL)
	f.mark(routeB, budgets.RouteQuarantined, shortTTL/2)
	f.wantStates("quarantine outranks pushback and ejection", map[string]budgets.RouteState{routeB: budgets.RouteQuarantined})
	f.clock.Advance(shortTTL * 3 / 4)
	f.wantStates("pushback outranks ejection", map[string]budgets.RouteState{routeB: budgets.RoutePushback})
	f.clock.Advance(shortTTL / 2)
	f.wantStates("the ejection outlives the pushback", map[string]budgets.RouteState{routeB: budgets.RouteEjected})

	// A shorter second ejection does not cut the first one short.
	f.mark(routeB, budgets.RouteEjected, shortTTL/4)
	f.clock.Advance(shortTTL / 2)
	f.wantStates("after a shorter second ejection expired", map[string]budgets.RouteState{routeB: budgets.RouteEjected})

	f.clock.Advance(shortTTL * 3 / 2) // past the first ejection's 3 × shortTTL
	f.wantStates("after the ejection's ttl", map[string]budgets.RouteState{routeB: budgets.RouteHealthy})
	req := replacement(f.fresh("ua"))
	req.Route, req.Reserve = routeB, budgets.ReserveBucket{Capacity: 10}
	f.wantGrant("replacement after the ejection expired (probed back in)", f.extra(req), budgets.ReasonNone)
}

func testLeaseOfDeadHolderExpires(f *fixture) {
	lease := func(route, holder string) {
		f.t.Helper()
		if err := f.store.AcquireLease(f.ctx, route, holder, shortTTL); err != nil {
			f.t.Fatalf("AcquireLease(%s, %s): %v", route, holder, err)
		}
	}
	release := func(route, holder string) {
		f.t.Helper()
		if err := f.store.ReleaseLease(f.ctx, route, holder); err != nil {
			f.t.Fatalf("ReleaseLease(%s, %s): %v", route, holder, err)
		}
	}
	wantInFlight := func(step string, want map[string]int) {
		f.t.Helper()
		got, err := f.store.InFlight(f.ctx, []string{routeA, routeB})
		if err != nil {
			f.t.Fatalf("%s: InFlight: %v", step, err)
		}
		for r, w := range want {
			if got[r] != w {
				f.t.Errorf("%s: %d in flight on %s, want %d", step, got[r], r, w)
			}
		}
	}

	lease(routeA, "live")
	lease(routeA, "dead")
	lease(routeA, "done")
	lease(routeB, "other")
	wantInFlight("three leases on a, one on b", map[string]int{routeA: 3, routeB: 1})
	release(routeA, "done")
	release(routeA, "done") // releasing twice is harmless
	release(routeA, "never-leased")
	wantInFlight("after a release", map[string]int{routeA: 2, routeB: 1})

	f.clock.Advance(shortTTL * 2 / 3)
	lease(routeA, "live") // the live holder renews; the dead one cannot
	f.clock.Advance(shortTTL * 2 / 3)
	wantInFlight("the dead holder's lease expired", map[string]int{routeA: 1, routeB: 0})
	f.clock.Advance(shortTTL)
	wantInFlight("the renewed lease expired too", map[string]int{routeA: 0, routeB: 0})
}

func testInvalidRequestIsAnError(f *fixture) {
	admits := []struct {
		name  string
		spoil func(*budgets.AdmitRequest)
	}{
		{"no user action", func(r *budgets.AdmitRequest) { r.UserAction = "" }},
		{"no cohort", func(r *budgets.AdmitRequest) { r.Window = "" }},
		{"zero max attempts", func(r *budgets.AdmitRequest) { r.Attempts.Max = 0 }},
		{"no ledger ttl", func(r *budgets.AdmitRequest) { r.Attempts.TTL = 0 }},
		{"negative estimate", func(r *budgets.AdmitRequest) { r.Spend.OutputUnits = -1 }},
		{"an output estimate of 2^63-1 (max_tokens overflow)", func(r *budgets.AdmitRequest) { r.Spend.OutputUnits = math.MaxInt64 }},
		{"an output estimate of 2^53, past exact doubles", func(r *budgets.AdmitRequest) { r.Spend.OutputUnits = 1 << 53 }},
		{"an input estimate over MaxUnits", func(r *budgets.AdmitRequest) { r.Spend.InputUnits = budgets.MaxUnits + 1 }},
		{"a tenant ceiling over MaxUnits", func(r *budgets.AdmitRequest) { r.Spend.TenantCeiling = math.MaxInt64 }},
		{"no reservation ttl", func(r *budgets.AdmitRequest) { r.Spend.ReservationTTL = 0 }},
		{"tenant ceiling without tenant", func(r *budgets.AdmitRequest) { r.Tenant, r.Spend.TenantCeiling = "", 10 }},
		{"tenant ceiling without window", func(r *budgets.AdmitRequest) { r.Spend.TenantCeiling, r.Spend.TenantWindow = 10, 0 }},
		{"negative ceiling", func(r *budgets.AdmitRequest) { r.Duplicates.Ceiling = -0.1 }},
		{"ceiling above one", func(r *budgets.AdmitRequest) { r.Duplicates.Ceiling = 1.5 }},
		{"no window", func(r *budgets.AdmitRequest) { r.Duplicates.Window = 0 }},
		{"no slots", func(r *budgets.AdmitRequest) { r.Duplicates.Slots = 0 }},
		{"slots shorter than a millisecond", func(r *budgets.AdmitRequest) { r.Duplicates.Window, r.Duplicates.Slots = 5*time.Millisecond, 10 }},
		{"negative reserve", func(r *budgets.AdmitRequest) { r.Duplicates.ReplacementReserve = -1 }},
	}
	for _, tt := range admits {
		req := primary("ua-invalid")
		tt.spoil(&req)
		if _, err := f.store.Admit(f.ctx, req); !errors.Is(err, budgets.ErrInvalidRequest) {
			f.t.Errorf("Admit with %s: %v, want ErrInvalidRequest", tt.name, err)
		}
	}
	extras := []struct {
		name  string
		spoil func(*budgets.ExtraRequest)
	}{
		{"primary role", func(r *budgets.ExtraRequest) { r.Role = schemas.RolePrimary }},
		{"no role", func(r *budgets.ExtraRequest) { r.Role = "" }},
		{"an unknown role", func(r *budgets.ExtraRequest) { r.Role = "rescue" }},
		{"no route", func(r *budgets.ExtraRequest) { r.Route = "" }},
		{"hedge without pool", func(r *budgets.ExtraRequest) { r.Pool = "" }},
		{"negative reserve refill", func(r *budgets.ExtraRequest) { r.Reserve.RefillPerSecond = -1 }},
		{"an output estimate of 2^63-1", func(r *budgets.ExtraRequest) { r.Spend.OutputUnits = math.MaxInt64 }},
	}
	for _, tt := range extras {
		req := hedge("ua-invalid")
		tt.spoil(&req)
		if _, err := f.store.ReserveExtra(f.ctx, req); !errors.Is(err, budgets.ErrInvalidRequest) {
			f.t.Errorf("ReserveExtra with %s: %v, want ErrInvalidRequest", tt.name, err)
		}
	}
	if err := f.store.MarkRoute(f.ctx, routeA, budgets.RouteHealthy, time.Second); !errors.Is(err, budgets.ErrInvalidRequest) {
		f.t.Errorf("MarkRoute healthy: %v, want ErrInvalidRequest", err)
	}
	if err := f.store.AcquireLease(f.ctx, routeA, "", time.Second); !errors.Is(err, budgets.ErrInvalidRequest) {
		f.t.Errorf("AcquireLease without holder: %v, want ErrInvalidRequest", err)
	}

	// None of the invalid requests took a slot, and an invalid settle leaves
	// the reservation live.
	req := primary("ua-invalid")
	req.Attempts.Max = 1
	a := f.admit(req)
	if !a.Allowed || a.AttemptsUsed != 1 {
		f.t.Errorf("first valid admission after invalid ones: %+v, want the first slot", a)
	}
	if err := f.store.Settle(f.ctx, a.Reservation, schemas.Usage{OutputUnits: -5}); !errors.Is(err, budgets.ErrInvalidRequest) {
		f.t.Errorf("Settle with negative usage: %v, want ErrInvalidRequest", err)
	}
	if err := f.store.Settle(f.ctx, a.Reservation, schemas.Usage{OutputUnits: math.MaxInt64}); !errors.Is(err, budgets.ErrInvalidRequest) {
		f.t.Errorf("Settle with 2^63-1 units: %v, want ErrInvalidRequest", err)
	}
	f.settle(a.Reservation, 5)
}

// testRouteSnapshotReadsWhatRouteStatesAndInFlightRead: the snapshot a
// dispatcher's route refresh takes each tick agrees with the two calls it
// stands for, expired flags and leases included.
func testRouteSnapshotReadsWhatRouteStatesAndInFlightRead(f *fixture) {
	pushed, quarantined, lapsed, idle, unseen := f.fresh("pushed"), f.fresh("quarantined"), f.fresh("lapsed"), f.fresh("idle"), f.fresh("unseen")
	must := func(err error) {
		f.t.Helper()
		if err != nil {
			f.t.Fatal(err)
		}
	}
	must(f.store.MarkRoute(f.ctx, pushed, budgets.RoutePushback, time.Minute))
	must(f.store.MarkRoute(f.ctx, quarantined, budgets.RouteQuarantined, time.Minute))
	must(f.store.MarkRoute(f.ctx, lapsed, budgets.RouteQuarantined, shortTTL))
	for _, h := range []string{"w1/g/1", "w2/g/2", "w3/g/1"} {
		must(f.store.AcquireLease(f.ctx, pushed, h, time.Minute))
	}
	must(f.store.AcquireLease(f.ctx, idle, "w1/g/9", shortTTL))
	must(f.store.AcquireLease(f.ctx, lapsed, "w4/g/1", time.Minute))
	f.clock.Advance(2 * shortTTL)

	routes := []string{pushed, quarantined, lapsed, idle, unseen}
	states, counts, err := f.store.RouteSnapshot(f.ctx, routes)
	must(err)
	wantStates, err := f.store.RouteStates(f.ctx, routes)
	must(err)
	wantCounts, err := f.store.InFlight(f.ctx, routes)
	must(err)
	if !maps.Equal(states, wantStates) || !maps.Equal(counts, wantCounts) {
		f.t.Fatalf("snapshot %v %v, want what RouteStates and InFlight read: %v %v", states, counts, wantStates, wantCounts)
	}
	want := map[string]int{pushed: 3, quarantined: 0, lapsed: 1, idle: 0, unseen: 0}
	if !maps.Equal(counts, want) || states[pushed] != budgets.RoutePushback ||
		states[quarantined] != budgets.RouteQuarantined || states[lapsed] != budgets.RouteHealthy || states[unseen] != budgets.RouteHealthy {
		f.t.Fatalf("snapshot %v %v: want pushback, quarantine, an expired flag and an unseen route healthy, counts %v", states, counts, want)
	}
}
