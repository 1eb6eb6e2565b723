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

// One user action through the budgets: its primary is admitted, a hedge takes
// the cohort's duplicate-rate token, a second hedge finds the bucket empty,
// and when the primary wins before the hedge launched, the primary is settled
// with its usage and the hedge's grant released whole. The store reads a fixed
// clock, so the decisions are the same on every run.
func ExampleMemory() {
	ctx := context.Background()
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	store := budgets.NewMemory(func() time.Time { return now })

	attempts := budgets.AttemptPolicy{Max: 3, TTL: time.Minute}
	spend := budgets.SpendPolicy{InputUnits: 100, OutputUnits: 200, UserActionCeiling: 1000, ReservationTTL: time.Minute}
	bucket := budgets.DuplicateBucket{Ratio: 0.1, Capacity: 10, InitialFill: 1}

	primary, err := store.Admit(ctx, budgets.AdmitRequest{
		UserAction: "order-2291", Pool: "general", Cohort: "general/short",
		Attempts: attempts, Spend: spend, Bucket: bucket,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("primary: allowed=%v attempts=%d reserved=%d\n", primary.Allowed, primary.AttemptsUsed, primary.ReservedUnits)

	hedgeReq := budgets.ExtraRequest{
		Role: schemas.RoleHedge, UserAction: "order-2291", Route: "west",
		Pool: "general", Cohort: "general/short",
		Attempts: attempts, Spend: spend, Bucket: bucket,
	}
	hedge, err := store.ReserveExtra(ctx, hedgeReq)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("hedge: allowed=%v attempts=%d reserved=%d token=%s\n", hedge.Allowed, hedge.AttemptsUsed, hedge.ReservedUnits, hedge.Token)

	// The primary's deposit (0.1) and what is left of the initial fill do not
	// make a whole token: a denial is a decision with a reason, not an error.
	again, err := store.ReserveExtra(ctx, hedgeReq)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("second hedge: allowed=%v reason=%s\n", again.Allowed, again.Reason)

	// The primary answered first: it is charged what it used, and the hedge,
	// which never launched, gives back its slot, its spend and its token.
	if err := store.Settle(ctx, primary.Reservation, schemas.Usage{InputUnits: 100, OutputUnits: 42}); err != nil {
		log.Fatal(err)
	}
	if err := store.Release(ctx, hedge.Reservation); err != nil {
		log.Fatal(err)
	}
	fmt.Println("settled the primary, released the hedge")

	// Released means given back whole: another extra attempt of the user
	// action finds the slot and the token again.
	retry, err := store.ReserveExtra(ctx, hedgeReq)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("hedge after the release: allowed=%v attempts=%d token=%s\n", retry.Allowed, retry.AttemptsUsed, retry.Token)

	// Ending a reservation is exactly-once: a second settle changes nothing.
	err = store.Settle(ctx, primary.Reservation, schemas.Usage{InputUnits: 100, OutputUnits: 42})
	fmt.Println("settle again: unknown reservation:", errors.Is(err, budgets.ErrUnknownReservation))

	// Output:
	// primary: allowed=true attempts=1 reserved=300
	// hedge: allowed=true attempts=2 reserved=300 token=cohort
	// second hedge: allowed=false reason=duplicate_rate
	// settled the primary, released the hedge
	// hedge after the release: allowed=true attempts=2 token=cohort
	// settle again: unknown reservation: true
}
