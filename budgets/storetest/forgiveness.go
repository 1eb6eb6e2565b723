package storetest

import (
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// Forgiveness of the slots a death spent (docs/architecture.md §7): a
// takeover forgives the dead group's slots once, a lost attempt's slot is
// forgiven at its settle, both within Max per ledger lifetime, and a full
// ledger says when a retry may be admitted only when a death may be why.

// groupAdmit is primary(ua) with Max max, charged to group, forgiving dead.
func groupAdmit(ua, group, dead string, max int) budgets.AdmitRequest {
	req := primary(ua)
	req.Attempts.Max, req.Group, req.Forgive = max, group, dead
	req.Duplicates = ceilingOf(1)
	return req
}

// groupHedge is hedge(ua) with Max max, charged to group.
func groupHedge(ua, group string, max int) budgets.ExtraRequest {
	req := hedge(ua)
	req.Attempts.Max, req.Group = max, group
	req.Duplicates = ceilingOf(1)
	return req
}

func (f *fixture) settleLost(id budgets.ReservationID) {
	f.t.Helper()
	if err := f.store.EndAll(f.ctx, []budgets.Ending{{Reservation: id, Usage: schemas.Usage{OutputUnits: 10}, Lost: true}})[0]; err != nil {
		f.t.Fatalf("EndAll(lost %s): %v", id, err)
	}
}

func testTakeoverForgivesTheDeadGroupsSlotsOnce(f *fixture) {
	const ua, max = "ua-taken-over", 2
	// Group 1 takes both slots, then its gateway dies holding them.
	g1 := f.admit(groupAdmit(ua, "g1", "", max))
	g1Hedge := f.extra(groupHedge(ua, "g1", max))
	if !g1.Allowed || !g1Hedge.Allowed {
		f.t.Fatalf("group 1: %+v, %+v; want both allowed", g1, g1Hedge)
	}
	plain := f.admit(groupAdmit(ua, "g2", "", max))
	f.wantAdmission("a retry that takes nothing over", plain, budgets.ReasonAttempts)
	if plain.RetryAfter <= 0 || plain.RetryAfter > longTTL {
		f.t.Errorf("a full ledger holding live reservations says retry after %v; want within the ledger's %v", plain.RetryAfter, longTTL)
	}
	g2 := f.admit(groupAdmit(ua, "g2", "g1", max))
	if !g2.Allowed || g2.AttemptsUsed != 1 {
		f.t.Fatalf("the takeover of group 1: %+v; want allowed as the first slot", g2)
	}
	if g := f.extra(groupHedge(ua, "g2", max)); !g.Allowed {
		f.t.Fatalf("the takeover's hedge: %+v; want allowed", g)
	}
	// Group 1's slots were forgiven once: naming it again, or releasing
	// its never-launched hedge late, gives nothing more back.
	f.release(g1Hedge.Reservation)
	f.wantAdmission("group 1 forgiven a second time", f.admit(groupAdmit(ua, "g3", "g1", max)), budgets.ReasonAttempts)
	// The bound: Max slots forgiven per ledger lifetime, already spent.
	f.wantAdmission("group 2 forgiven past the bound", f.admit(groupAdmit(ua, "g3", "g2", max)), budgets.ReasonAttempts)
}

func testLostAttemptsSlotIsForgivenWithinTheBound(f *fixture) {
	const ua, max = "ua-lost", 1
	for i, group := range []string{"g1", "g2"} {
		a := f.admit(groupAdmit(ua, group, "", max))
		if !a.Allowed {
			f.t.Fatalf("group %s, after %d lost attempts: %+v; want allowed", group, i, a)
		}
		f.settleLost(a.Reservation)
	}
	// Two lost, one forgiven (Max 1): the ledger is full, and says when it
	// lapses since it forgave.
	a := f.admit(groupAdmit(ua, "g3", "", max))
	f.wantAdmission("past the forgiveness bound", a, budgets.ReasonAttempts)
	if a.RetryAfter <= 0 || a.RetryAfter > longTTL {
		f.t.Errorf("a full ledger that forgave says retry after %v; want within the ledger's %v", a.RetryAfter, longTTL)
	}
	f.clock.Advance(a.RetryAfter)
	if a := f.admit(groupAdmit(ua, "g3", "", max)); !a.Allowed {
		f.t.Errorf("at the RetryAfter the full ledger named: %+v; want a fresh ledger", a)
	}
}

func testFullLedgerOfEndedAttemptsNamesNoRetry(f *fixture) {
	const ua, max = "ua-spent", 2
	for _, group := range []string{"g1", "g2"} {
		f.settle(f.admit(groupAdmit(ua, group, "", max)).Reservation, 100)
	}
	a := f.admit(groupAdmit(ua, "g3", "", max))
	f.wantAdmission("every slot spent by an attempt that ended", a, budgets.ReasonAttempts)
	if a.RetryAfter != 0 {
		f.t.Errorf("RetryAfter %v; want none: no death, no live attempt", a.RetryAfter)
	}
}
