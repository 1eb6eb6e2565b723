package budgets_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/budgets/slice/slicetest"
	"github.com/hedgerow/hedgerow/budgets/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMemoryConformsToStore runs the conformance suite on the memory store,
// wired to the suite's clock so every expiry is deterministic.
func TestMemoryConformsToStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) budgets.Store {
		return budgets.NewMemory(clock.Now)
	})
}

// TestSlicedConformsToStore runs the conformance suite on a gateway's
// Sliced store (over a region kept in Memory, tenant spend on slices of a
// slice.Memory), all on the suite's clock: one gateway's slices must
// decide as the region's store would. Its slices' background round is
// left to the requests (a lead of an hour), so the run is deterministic.
func TestSlicedConformsToStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) budgets.Store {
		slices := slicetest.Slices(t, slice.NewMemory(clock.Now), clock.Now)
		return budgets.NewSliced(budgets.NewMemory(clock.Now), slices, clock.Now)
	})
}
