package node

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
)

// A gateway of region east, of two regions sharing its tenants' request
// rates, spends east's lease of them: with west not yet seen, west is
// reserved its safe share (half), so a tenant's burst of 10 admits 5 here,
// and the region renews its lease at the authority — the leases' bucket on
// serve's own JetStream — and says so in its metrics.
func TestAGatewayOfOneOfTwoRegionsSpendsItsRegionsLeaseOfATenantsRate(t *testing.T) {
	const key = "sk-global-tenant"
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), `deployment: {region: east}
global: {regions: [east, west]}
tenants:
  acme: {api_key_hashes: [`+config.HashAPIKey(key)+`], requests_per_second: 0.001, burst: 10}
`)
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	t.Cleanup(func() { stop(t, s) })

	admitted := 0
	for range 10 {
		req, err := http.NewRequest(http.MethodPost, "http://"+s.HTTPAddr().String()+"/v1/chat/completions",
			strings.NewReader(`{"model":"general","max_tokens":20,"messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		switch status, body := do(t, req); {
		case status == http.StatusOK:
			admitted++
		case status != http.StatusTooManyRequests || !strings.Contains(string(body), "tenant_rate_limited"):
			t.Fatalf("request %d: %d %s; want 200 or 429 tenant_rate_limited", admitted+1, status, body)
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d of 10 against a burst of 10; want 5, east's half while west holds its safe share", admitted)
	}
	renewed := regexp.MustCompile(`(?m)^hedgerow_lease_renewals_total\{region="east",result="ok"\} (\S+)$`)
	eventually.True(t, wait, "east renews its lease at the authority and holds half of the tenant's rate", func() bool {
		_, metrics := get(t, "http://"+s.HTTPAddr().String()+"/metrics")
		m := renewed.FindSubmatch(metrics)
		if m == nil {
			return false
		}
		n, _ := strconv.ParseFloat(string(m[1]), 64)
		return n >= 1 && strings.Contains(string(metrics), `hedgerow_lease_share{kind="tenant_rate",region="east"} 0.5`)
	})
}
