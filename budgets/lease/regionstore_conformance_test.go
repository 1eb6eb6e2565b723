package lease_test

import (
	"testing"

	"github.com/hedgerow/hedgerow/budgets/lease"
	"github.com/hedgerow/hedgerow/budgets/lease/leasetest"
)

func TestMemoryRegionIsARegionStore(t *testing.T) {
	leasetest.RegionStore(t, func(*testing.T) (lease.RegionStore, *leasetest.Clock) {
		clock := leasetest.NewClock()
		return lease.NewMemoryRegion(clock.Now), clock
	})
}
