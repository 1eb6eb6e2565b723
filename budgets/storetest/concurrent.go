package storetest

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// testConcurrentUseConservesEveryCeiling drives one store from many goroutines
// that admit primaries, reserve hedges, settle and release, racing for one
// tenant ceiling, one duplicate-rate window and their own user actions'
// ceilings. Once every reservation has ended, each ceiling must hold exactly
// what was settled: nothing leaked by a compensation, nothing refunded twice.
func testConcurrentUseConservesEveryCeiling(f *fixture) {
	const (
		workers       = 8
		rounds        = 60
		maxHeld       = 3
		unitsEach     = 100
		uaCeiling     = maxHeld * unitsEach // held reservations fill it exactly
		tenantCeiling = 1500                // less than workers × maxHeld × unitsEach
		busyTenant    = "tenant-busy"
		busyCohort    = "busy"
	)
	// A window of an hour, which the suite's clock never leaves, at a
	// ceiling of 1: a primary earns one hedge.
	bucket := budgets.DuplicateCeiling{Ceiling: 1, Window: time.Hour, Slots: 1}

	// tally is what one worker saw granted and ended.
	type tally struct {
		settledUnits    int64
		settledAttempts int
		primaries       int
		settledHedges   int
		err             error
	}
	type held struct {
		id    budgets.ReservationID
		hedge bool
	}
	userAction := func(w int) string { return fmt.Sprintf("ua-busy-%d", w) }
	spend := budgets.SpendPolicy{
		OutputUnits:       unitsEach,
		UserActionCeiling: uaCeiling,
		TenantCeiling:     tenantCeiling,
		TenantWindow:      oneWindow,
		ReservationTTL:    longTTL,
	}
	attempts := budgets.AttemptPolicy{Max: 1_000_000, TTL: longTTL}

	work := func(w int, t *tally) {
		rng := rand.New(rand.NewPCG(uint64(w), 0x5eed))
		var holding []held
		end := func(h held, final bool) error {
			if final || rng.IntN(3) == 0 {
				return f.store.Release(f.ctx, h.id)
			}
			used := rng.Int64N(3) // 0, 1 or 2 units
			if err := f.store.Settle(f.ctx, h.id, schemas.Usage{OutputUnits: used}); err != nil {
				return err
			}
			t.settledUnits += used
			t.settledAttempts++
			if h.hedge {
				t.settledHedges++
			}
			return nil
		}
		for range rounds {
			if len(holding) == maxHeld || (len(holding) > 0 && rng.IntN(2) == 0) {
				i := rng.IntN(len(holding))
				h := holding[i]
				holding = append(holding[:i], holding[i+1:]...)
				if err := end(h, false); err != nil {
					t.err = fmt.Errorf("ending %s: %w", h.id, err)
					return
				}
				continue
			}
			if rng.IntN(2) == 0 {
				a, err := f.store.Admit(f.ctx, budgets.AdmitRequest{
					UserAction: userAction(w), Tenant: busyTenant, Pool: pool, Window: busyCohort,
					Attempts: attempts, Spend: spend, Duplicates: bucket,
				})
				if err != nil {
					t.err = fmt.Errorf("admit: %w", err)
					return
				}
				if a.Allowed {
					t.primaries++
					holding = append(holding, held{id: a.Reservation})
				}
				continue
			}
			g, err := f.store.ReserveExtra(f.ctx, budgets.ExtraRequest{
				Role: schemas.RoleHedge, UserAction: userAction(w), Tenant: busyTenant, Route: routeA,
				Pool: pool, Window: busyCohort, Attempts: attempts, Spend: spend, Duplicates: bucket,
			})
			if err != nil {
				t.err = fmt.Errorf("reserve hedge: %w", err)
				return
			}
			if g.Allowed {
				holding = append(holding, held{id: g.Reservation, hedge: true})
			}
		}
		for _, h := range holding {
			if err := end(h, true); err != nil {
				t.err = fmt.Errorf("releasing %s: %w", h.id, err)
				return
			}
		}
	}

	tallies := make([]tally, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() { work(w, &tallies[w]) })
	}
	wg.Wait()

	var total tally
	for w, t := range tallies {
		if t.err != nil {
			f.t.Fatalf("worker %d: %v", w, t.err)
		}
		total.settledUnits += t.settledUnits
		total.primaries += t.primaries
		total.settledHedges += t.settledHedges
	}
	if total.primaries == 0 || total.settledHedges == 0 {
		f.t.Fatalf("the run granted %d primaries and settled %d hedges; it exercised nothing", total.primaries, total.settledHedges)
	}

	f.wantRoomOf(busyTenant, tenantCeiling, tenantCeiling-total.settledUnits)
	for w, t := range tallies {
		ua := userAction(w)
		f.wantUserActionRoom(ua, uaCeiling, uaCeiling-t.settledUnits)
		// Released grants gave their slots back; settled ones keep them.
		req := primary(ua)
		req.Attempts.Max = t.settledAttempts + 1
		a := f.admit(req)
		if !a.Allowed || a.AttemptsUsed != t.settledAttempts+1 {
			f.t.Errorf("%s: ledger admission %+v, want slot %d after %d settled attempts", ua, a, t.settledAttempts+1, t.settledAttempts)
		}
	}
	wantHedges := total.primaries - total.settledHedges
	if got := f.hedgesAvailableIn(busyCohort, bucket, budgets.ReserveBucket{}, wantHedges+1); got != wantHedges {
		f.t.Errorf("duplicate-rate window has room for %d hedges, want %d primaries − %d settled hedges = %d",
			got, total.primaries, total.settledHedges, wantHedges)
	}
}
