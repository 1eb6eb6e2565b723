package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// endingsRecorder is a budgets.Store that notes the size of every EndAll.
type endingsRecorder struct {
	budgets.Store
	mu      sync.Mutex
	batches []int
}

func (r *endingsRecorder) EndAll(ctx context.Context, ends []budgets.Ending) []error {
	r.mu.Lock()
	r.batches = append(r.batches, len(ends))
	r.mu.Unlock()
	return r.Store.EndAll(ctx, ends)
}

func TestSettlesWaitingTogetherReachTheStoreAsOneBatch(t *testing.T) {
	store := &endingsRecorder{Store: budgets.NewMemory(nil)}
	d := &Dispatcher{store: store, log: testLogger(), now: time.Now}
	books := startBookkeeping(d)

	// A call that holds the bookkeeping goroutine while the endings queue up.
	held, release := make(chan struct{}), make(chan struct{})
	books.later(func(context.Context) { close(held); <-release })
	<-held

	var ids []budgets.ReservationID
	for i := range 10 {
		a, err := store.Admit(t.Context(), budgets.AdmitRequest{
			UserAction: fmt.Sprintf("ua-%d", i), Pool: "general", Window: "c",
			Attempts:   budgets.AttemptPolicy{Max: 2, TTL: time.Minute},
			Spend:      budgets.SpendPolicy{InputUnits: 10, OutputUnits: 10, ReservationTTL: time.Minute},
			Duplicates: budgets.DuplicateCeiling{Ceiling: 0.08, Window: 10 * time.Second, Slots: 10},
		})
		if err != nil || !a.Allowed {
			t.Fatalf("Admit: %+v, %v", a, err)
		}
		ids = append(ids, a.Reservation)
		books.end(fmt.Sprintf("group-%d", i), budgets.Ending{Reservation: a.Reservation, Usage: schemas.Usage{OutputUnits: 5}, Release: i%3 == 0})
	}
	close(release)
	books.close()

	if len(store.batches) != 1 || store.batches[0] != 10 {
		t.Fatalf("EndAll batches %v, want one of all 10 endings", store.batches)
	}
	for _, id := range ids {
		if err := store.Settle(t.Context(), id, schemas.Usage{}); !errors.Is(err, budgets.ErrUnknownReservation) {
			t.Errorf("reservation %s after the batch: Settle = %v, want it already ended", id, err)
		}
	}
}
