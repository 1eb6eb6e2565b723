package frontdoortest

import (
	"context"
	"testing"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
)

// The API keys of the two tenants TenantLimits configures.
const (
	AcmeKey  = "acme-secret-key"
	OtherKey = "other-secret-key"
)

// TenantLimits returns the keyring and limiter a door's tests share: tenant
// acme (key AcmeKey) held to limit and tenant other (key OtherKey)
// unlimited, spending from ceilings (a test's slices of an in-process
// granter).
func TenantLimits(t *testing.T, limit tenantlimit.Limit, ceilings tenantlimit.Ceilings) (*frontdoor.Keyring, *tenantlimit.Limiter) {
	t.Helper()
	l, err := tenantlimit.New(ceilings, tenantlimit.Options{Limits: map[string]tenantlimit.Limit{"acme": limit}})
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
