package lease_test

import (
	"testing"

	"github.com/hedgerow/hedgerow/budgets/lease"
	"github.com/hedgerow/hedgerow/budgets/lease/leasetest"
)

func TestMemoryIsAnAuthority(t *testing.T) {
	leasetest.Authority(t, func(*testing.T) lease.Authority { return lease.NewMemory() })
}
