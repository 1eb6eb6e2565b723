package frontdoor

import (
	"testing"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
)

func TestKeyringFindsTheTenantOfAKey(t *testing.T) {
	keyring := NewKeyring(map[string][]string{
		"acme":   {policy.HashAPIKey("acme-1"), policy.HashAPIKey("acme-2")},
		"globex": {policy.HashAPIKey("globex-1")},
		"ghost":  nil,
	})
	for _, tc := range []struct {
		key, tenant string
		ok          bool
	}{
		{"acme-1", "acme", true},
		{"acme-2", "acme", true},
		{"globex-1", "globex", true},
		{"acme-3", "", false},
		{"", "", false},
	} {
		if tenant, ok := keyring.Tenant(tc.key); tenant != tc.tenant || ok != tc.ok {
			t.Errorf("key %q: tenant %q %t, want %q %t", tc.key, tenant, ok, tc.tenant, tc.ok)
		}
	}
	// A hash is compared as given: a truncated one or a plaintext key is
	// no key.
	for _, presented := range []string{policy.HashAPIKey("acme-1")[:20], "acme-1", ""} {
		if tenant, ok := keyring.TenantOfHash(presented); ok {
			t.Errorf("TenantOfHash(%q) = %q", presented, tenant)
		}
	}
	if tenant, ok := NewKeyring(nil).Tenant("acme-1"); ok {
		t.Errorf("an empty keyring admitted %q", tenant)
	}
	if tenant, ok := (&Keyring{}).Tenant("acme-1"); ok {
		t.Errorf("the zero keyring admitted %q", tenant)
	}
}
