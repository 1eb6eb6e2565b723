package frontdoortest

import (
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
)

// The API keys of the two tenants TenantLimits configures.
const (
	AcmeKey  = "acme-secret-key"
	OtherKey = "other-secret-key"
)

// Clock is the time TenantLimits' memory store reads; a test's settable
// clock (tenantlimittest.NewClock's) satisfies it.
type Clock interface {
	Now() time.Time
}

// TenantLimits returns the keyring and limiter a door's tests share: tenant
// acme (key AcmeKey) held to limit and tenant other (key OtherKey)
// unlimited, on a memory store that reads clock, returned too.
func TenantLimits(t *testing.T, limit tenantlimit.Limit, clock Clock) (*frontdoor.Keyring, *tenantlimit.Limiter, *tenantlimit.Memory) {
	t.Helper()
	store := tenantlimit.NewMemory(clock.Now)
	l, err := tenantlimit.New(store, tenantlimit.Options{Limits: map[string]tenantlimit.Limit{"acme": limit}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	keys := frontdoor.NewKeyring(map[string][]string{"acme": {policy.HashAPIKey(AcmeKey)}, "other": {policy.HashAPIKey(OtherKey)}})
	return keys, l, store
}
