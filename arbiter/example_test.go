package arbiter_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
)

// Two attempts of one user action reach the gate: the hedge of the caller's
// first request (group grp-1, attempt 2) and the primary of the caller's retry
// (group grp-2, attempt 1). The first claim wins; the second loses and learns
// the holder, which its group names when it fails already_committed. The gate
// reads a fixed clock, so the values are the same on every run.
func ExampleLocalGate() {
	ctx := context.Background()
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{Now: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}

	hedge, err := gate.Claim(ctx, "order-2291", "grp-1", 2)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("grp-1 attempt 2: won=%v value=%s\n", hedge.Won, hedge.Value)

	retry, err := gate.Claim(ctx, "order-2291", "grp-2", 1)
	if err != nil {
		log.Fatal(err)
	}
	holder, err := arbiter.ParseGateValue(retry.Holder)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("grp-2 attempt 1: won=%v holder=%s (group %s, attempt %d, epoch %d)\n",
		retry.Won, retry.Holder, holder.Group, holder.Attempt, holder.Epoch)

	// Claiming again is idempotent: the winner keeps its value and epoch.
	again, err := gate.Claim(ctx, "order-2291", "grp-1", 2)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("grp-1 attempt 2 again: won=%v value=%s\n", again.Won, again.Value)

	// Clear is compare-and-delete: a loser cannot remove the winner's claim.
	err = gate.Clear(ctx, retry)
	fmt.Println("grp-2 clears: not holder:", errors.Is(err, arbiter.ErrNotHolder))

	// Output:
	// grp-1 attempt 2: won=true value=grp-1/2/1
	// grp-2 attempt 1: won=false holder=grp-1/2/1 (group grp-1, attempt 2, epoch 1)
	// grp-1 attempt 2 again: won=true value=grp-1/2/1
	// grp-2 clears: not holder: true
}
