package frontdoortest

import (
	"context"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
)

// The API keys of the two tenants TenantLimits configures.
const (
	AcmeKey  = "acme-secret-key"
	OtherKey = "other-secret-key"
)

// Clock is the time TenantLimits' slices read; a test's SettableClock
// satisfies it.
type Clock interface {
	Now() time.Time
}

// TenantLimits returns the keyring and limiter a door's tests share: tenant
// acme (key AcmeKey) held to limit and tenant other (key OtherKey)
// unlimited, on one gateway's slices of an in-process granter that read
// clock. Their background round is left to the requests (a lead of an
// hour), so the test decides every refill.
func TenantLimits(t *testing.T, limit tenantlimit.Limit, clock Clock) (*frontdoor.Keyring, *tenantlimit.Limiter) {
	t.Helper()
	slices, err := slice.New(slice.NewMemory(clock.Now), slice.Options{Now: clock.Now, Lead: time.Hour, TTL: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slices.Close)
	l, err := tenantlimit.New(slices, tenantlimit.Options{Limits: map[string]tenantlimit.Limit{"acme": limit}})
	if err != nil {
		t.Fatal(err)
	}
	keys := frontdoor.NewKeyring(map[string][]string{"acme": {policy.HashAPIKey(AcmeKey)}, "other": {policy.HashAPIKey(OtherKey)}})
	return keys, l
}

// SlotsFree reports whether acme can have n more requests in flight under
// l, without keeping them.
func SlotsFree(l *tenantlimit.Limiter, n int) bool {
	var releases []func()
	defer func() {
		for _, release := range releases {
			release()
		}
	}()
	for range n {
		release, err := l.Admit(context.Background(), "acme")
		if err != nil {
			return false
		}
		releases = append(releases, release)
	}
	return true
}
