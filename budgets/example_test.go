package budgets_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// One user action through the budgets: its primary is admitted into a
// cohort whose window already counts nine primaries, a hedge fits under the
// ceiling (ten primaries at 10% earn one), a second hedge does not, and
// when the primary wins before the hedge launched, the primary is settled
// with its usage and the hedge's grant released whole. A replacement is
// never refused by the ceiling. The store reads a fixed clock, so the
// decisions are the same on every run.
func ExampleMemory() {
	ctx := context.Background()
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	store := budgets.NewMemory(func() time.Time { return now })

	attempts := budgets.AttemptPolicy{Max: 3, TTL: time.Minute}
	spend := budgets.SpendPolicy{InputUnits: 100, OutputUnits: 200, UserActionCeiling: 1000, ReservationTTL: time.Minute}
	dup := budgets.DuplicateCeiling{Ceiling: 0.1, Window: 10 * time.Second, Slots: 10}

	for i := range 9 { // the cohort's earlier traffic
		if _, err := store.Admit(ctx, budgets.AdmitRequest{
			UserAction: fmt.Sprint("earlier-", i), Pool: "general", Window: "general/short",
			Attempts: attempts, Spend: spend, Duplicates: dup,
		}); err != nil {
			log.Fatal(err)
		}
	}
	primary, err := store.Admit(ctx, budgets.AdmitRequest{
		UserAction: "order-2291", Pool: "general", Window: "general/short",
		Attempts: attempts, Spend: spend, Duplicates: dup,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("primary: allowed=%v attempts=%d reserved=%d\n", primary.Allowed, primary.AttemptsUsed, primary.ReservedUnits)

	hedgeReq := budgets.ExtraRequest{
		Role: schemas.RoleHedge, UserAction: "order-2291", Route: "west",
		Pool: "general", Window: "general/short",
		Attempts: attempts, Spend: spend, Duplicates: dup,
	}
	hedge, err := store.ReserveExtra(ctx, hedgeReq)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("hedge: allowed=%v attempts=%d reserved=%d token=%s\n", hedge.Allowed, hedge.AttemptsUsed, hedge.ReservedUnits, hedge.Token)

	// The window's ten primaries earn one extra attempt and the hedge took
	// it: a denial is a decision with a reason, not an error.
	again, err := store.ReserveExtra(ctx, hedgeReq)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("second hedge: allowed=%v reason=%s\n", again.Allowed, again.Reason)

	// The primary answered first: it is charged what it used, and the hedge,
	// which never launched, gives back its slot, its spend and its count.
	if err := store.Settle(ctx, primary.Reservation, schemas.Usage{InputUnits: 100, OutputUnits: 42}); err != nil {
		log.Fatal(err)
	}
	if err := store.Release(ctx, hedge.Reservation); err != nil {
		log.Fatal(err)
	}
	fmt.Println("settled the primary, released the hedge")

	// Released means given back whole: another extra attempt of the user
	// action finds the slot and the room again.
	retry, err := store.ReserveExtra(ctx, hedgeReq)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("hedge after the release: allowed=%v attempts=%d token=%s\n", retry.Allowed, retry.AttemptsUsed, retry.Token)

	// The window is at its ceiling, yet the replacement of a failed attempt
	// goes: the ceiling never refuses one (the user action's ledger bounds it).
	replacement := hedgeReq
	replacement.Role = schemas.RoleReplacement
	repl, err := store.ReserveExtra(ctx, replacement)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("replacement: allowed=%v attempts=%d\n", repl.Allowed, repl.AttemptsUsed)

	// Ending a reservation is exactly-once: a second settle changes nothing.
	err = store.Settle(ctx, primary.Reservation, schemas.Usage{InputUnits: 100, OutputUnits: 42})
	fmt.Println("settle again: unknown reservation:", errors.Is(err, budgets.ErrUnknownReservation))

	// Output:
	// primary: allowed=true attempts=1 reserved=300
	// hedge: allowed=true attempts=2 reserved=300 token=cohort
	// second hedge: allowed=false reason=duplicate_rate
	// settled the primary, released the hedge
	// hedge after the release: allowed=true attempts=2 token=cohort
	// replacement: allowed=true attempts=3
	// settle again: unknown reservation: true
}
