package budgets_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/budgets"
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
