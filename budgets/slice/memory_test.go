package slice_test

import (
	"testing"

	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/budgets/slice/slicetest"
)

// TestMemoryConformsToGranter runs the conformance suite on the memory
// granter, wired to the suite's clock so every answer is exact.
func TestMemoryConformsToGranter(t *testing.T) {
	slicetest.Run(t, func(t *testing.T, clock *slicetest.Clock) slice.Granter {
		return slice.NewMemory(clock.Now)
	})
}
