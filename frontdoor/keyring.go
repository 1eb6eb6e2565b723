package frontdoor

import (
	"crypto/subtle"
	"maps"
	"slices"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
)

// Keyring authenticates callers: it maps an API key to the tenant holding
// it. The zero Keyring admits nobody.
type Keyring struct {
	keys []tenantKey
}

type tenantKey struct {
	hash   []byte
	tenant string
}

// NewKeyring builds the keyring of the tenants' key hashes (policy.HashAPIKey
// forms), given by tenant name.
func NewKeyring(hashesByTenant map[string][]string) *Keyring {
	k := &Keyring{}
	for _, tenant := range slices.Sorted(maps.Keys(hashesByTenant)) {
		for _, h := range hashesByTenant[tenant] {
			k.keys = append(k.keys, tenantKey{hash: []byte(h), tenant: tenant})
		}
	}
	return k
}

// Tenant returns the tenant holding key.
func (k *Keyring) Tenant(key string) (string, bool) { return k.TenantOfHash(policy.HashAPIKey(key)) }

// TenantOfHash returns the tenant holding the key of that hash, compared as
// given. It compares the presented hash with every configured one in
// constant time and never stops early, so how long it takes says nothing
// about how close a guess came.
func (k *Keyring) TenantOfHash(hash string) (string, bool) {
	presented := []byte(hash)
	found := -1
	for i, key := range k.keys {
		// Configured hashes are unique (configuration validation), so at
		// most one matches; every one is compared regardless.
		if subtle.ConstantTimeCompare(presented, key.hash) == 1 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return k.keys[found].tenant, true
}
